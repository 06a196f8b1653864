"""The API's pages at ``/docs`` (Swagger UI) and ``/redoc`` work with no internet: each names only this server's own
files, each of them is served, the pages read ``/openapi.json``, and none of the docs routes needs a token or
appears in the schema."""

from __future__ import annotations

import re
import tempfile
import warnings
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi import FastAPI

with warnings.catch_warnings():  # newer Starlette nags about httpx; the client works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from corral.live.api import create_app
from corral.live.api.docs import add_offline_docs
from corral.live.config import ServeConfig, TenantConfig
from corral.live.controller import Controller

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN = "admin-token-0123456789"
BASE = "http://testserver"


@pytest.fixture(scope="module")
def api() -> Iterator[TestClient]:
    # The docs never reach the controller; it is started as `corral serve` starts it all the same. A short state
    # dir: the agent's Unix socket lives there.
    with tempfile.TemporaryDirectory(prefix="d") as state:
        config = ServeConfig(
            state_dir=Path(state),
            gpus=1,
            tenants=(TenantConfig("alice", 1, token="alice-token-0123456789"),),
            admin_token=ADMIN,
            policy="fifo",
        )
        controller = Controller.from_config(config)
        controller.start()
        try:
            yield TestClient(create_app(controller), base_url=BASE)
        finally:
            controller.stop()


class _Links(HTMLParser):
    """Every ``src`` and ``href`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value is not None]


def page_urls(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize(("page", "least_urls"), [("/docs", 3), ("/redoc", 2)])
def test_the_docs_pages_name_only_this_servers_files(api: TestClient, page: str, least_urls: int) -> None:
    r = api.get(page)  # no token
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = page_urls(r.text)
    assert len(urls) >= least_urls, r.text  # the script, the icon (and Swagger UI's stylesheet)
    for url in urls:
        split = urlsplit(urljoin(f"{BASE}/docs", url))
        assert (split.scheme, split.netloc) == ("http", "testserver"), f"{url} is on another host"
    # Nothing else in the page reaches out either (a script's URL, a font in an inline style).
    assert not re.search(r"https?://(?!testserver)", r.text), r.text
    assert "cdn" not in r.text.lower()


@pytest.mark.parametrize(
    ("suffix", "kind", "least_bytes"),
    [(".js", "javascript", 100_000), (".css", "text/css", 10_000), (".png", "image/png", 200)],
)
def test_every_asset_of_the_pages_is_served(api: TestClient, suffix: str, kind: str, least_bytes: int) -> None:
    html = api.get("/docs").text + api.get("/redoc").text
    urls = [u for u in page_urls(html) if urlsplit(u).path.endswith(suffix)]
    assert urls, f"the page names no {suffix} file"
    for url in urls:
        r = api.get(url)
        assert r.status_code == 200, url
        assert kind in r.headers["content-type"], (url, r.headers["content-type"])
        assert len(r.content) >= least_bytes, (url, len(r.content))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_pages_read_the_apis_own_schema(api: TestClient, page: str) -> None:
    html = api.get(page).text
    assert "/openapi.json" in html
    schema = api.get("/openapi.json").json()
    assert schema["openapi"].startswith("3.1.")  # Swagger UI 5 renders it as it is


def test_the_schema_is_unchanged_and_lists_no_docs_route(api: TestClient) -> None:
    schema = api.get("/openapi.json").json()
    assert schema["info"]["title"] == "corral"
    assert all(path.startswith("/v1/") for path in schema["paths"]), list(schema["paths"])
    assert api.get("/v1/jobs").status_code == 401  # the API still wants its token


def test_behind_a_proxy_the_page_names_the_prefix() -> None:
    # A proxy that serves the API under /corral sets root_path: the page's URLs must carry it.
    app = FastAPI(docs_url=None, redoc_url=None)  # the docs alone, and one route for them to describe
    add_offline_docs(app)

    @app.get("/v1/ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    client = TestClient(app, root_path="/corral", base_url=BASE)
    html = client.get("/docs").text
    urls = page_urls(html)
    assert urls and all(u.startswith("/corral/docs/assets/") for u in urls), urls
    assert "url: '/corral/openapi.json'" in html
    assert client.get("/openapi.json").json()["paths"].keys() == {"/v1/ping"}
    redoc = page_urls(client.get("/redoc").text)
    assert redoc and all(u.startswith("/corral/docs/assets/") for u in redoc), redoc
