"""The HTTP API of ``corral serve``: the app and its routes (:mod:`corral.live.api.app`), its wire models
(:mod:`~corral.live.api.models`) and the HTTP status of each refusal (:mod:`~corral.live.api.errors`)."""

from corral.live.api.app import create_app, decode_cursor, encode_cursor
from corral.live.api.errors import http_status
from corral.live.api.models import MAX_ECHO_CHARS, utf8_cut

__all__ = ["MAX_ECHO_CHARS", "create_app", "decode_cursor", "encode_cursor", "http_status", "utf8_cut"]
