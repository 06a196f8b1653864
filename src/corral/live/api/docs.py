"""The API's interactive docs (Swagger UI at ``/docs``, ReDoc at ``/redoc``), served from files installed with
corral, so that the pages work on a cluster with no way out to the internet.

FastAPI's default pages load Swagger UI's and ReDoc's scripts from a CDN: offline they are blank. Here the files
come from the ``fastapi-offline`` package (Swagger UI 5, which renders FastAPI's OpenAPI 3.1 schema, and ReDoc),
mounted at ``/docs/assets``, and the pages name only them. Only the files are used: the app stays corral's own.

None of these routes needs a token (the schema says nothing secret), and none appears in the schema.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"  # swagger-ui-bundle.js, swagger-ui.css, ...


def add_offline_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` from local files, for an ``app`` built with
    ``docs_url=None, redoc_url=None``."""
    app.mount(ASSETS_URL, StaticFiles(directory=str(ASSETS_DIR)), name="docs-assets")

    def prefix(request: Request) -> str:
        # Behind a proxy that serves the API under a prefix, the pages' URLs need it too (as FastAPI's own).
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get(DOCS_URL, include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        root = prefix(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=None,  # no OAuth2 flow (the API takes bearer tokens): no redirect page
        )

    @app.get(REDOC_URL, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = prefix(request)
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API reference",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,  # fonts from Google: not offline
        )
