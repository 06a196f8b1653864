"""Which HTTP status answers each refusal of the controller: the controller raises domain errors
(:class:`~corral.live.records.BadRequest` and its kinds) and only the API knows them as status codes."""

from __future__ import annotations

from corral.live.records import (
    BadRequest,
    InvalidRequest,
    JobEnded,
    Malformed,
    NotFound,
    NotYours,
    TooLarge,
)

# The most specific kind first: a NeverFits is an InvalidRequest, an UnknownTenant a NotFound.
HTTP_STATUS: tuple[tuple[type[BadRequest], int], ...] = (
    (Malformed, 400),
    (NotYours, 403),
    (NotFound, 404),
    (JobEnded, 409),
    (TooLarge, 413),
    (InvalidRequest, 422),
)


def http_status(error: BadRequest) -> int:
    """The HTTP status the API answers ``error`` with (422 for a refusal of no more specific kind)."""
    for kind, status in HTTP_STATUS:
        if isinstance(error, kind):
            return status
    return 422
