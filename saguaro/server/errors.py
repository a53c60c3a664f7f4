"""OpenAI-shaped errors: ``APIError``, its JSON body and the app's exception handlers.

A body is ``{"error": {"message", "type", "param", "code"}}``. Its message is written by the
server, never taken from an unexpected exception: a traceback goes to the log, not the client.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """An error answered with HTTP ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = INVALID_REQUEST,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind  # OpenAI's error "type"
        self.headers = headers  # e.g. Retry-After on a 429


def error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    """The JSON body of an error response (also sent as an event when a stream fails)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.kind, e.param, e.code), e.status, headers)


def validation_error(e: ValidationError) -> APIError:
    """A 400 for a request body that does not fit its schema: the first problem, named by its
    full path; ``param`` is the top-level argument."""
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    param = loc[0] if loc else None
    if err["type"] == "json_invalid":
        return APIError(400, f"We could not parse the JSON body of your request: {err['msg']}")
    if err["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {'.'.join(loc)}", param)
    return APIError(400, f"Invalid value for '{'.'.join(loc) or 'body'}': {err['msg']}", param)


async def _api_error(_: Request, e: APIError) -> JSONResponse:
    return error_response(e, e.headers)


async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method) in OpenAI's shape."""
    message = (
        f"Invalid URL ({request.method} {request.url.path})"
        if e.status_code == 404
        else str(e.detail)
    )
    return error_response(APIError(e.status_code, message), e.headers)


async def _internal(_: Request, e: Exception) -> JSONResponse:
    return error_response(APIError(500, "internal server error", kind=SERVER_ERROR))


# For FastAPI(exception_handlers=...).
EXCEPTION_HANDLERS: dict[Any, Any] = {
    APIError: _api_error,
    HTTPException: _http_error,
    Exception: _internal,
}
