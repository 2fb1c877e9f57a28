"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`.

Every failure the gateway reports goes through `APIError`, so the HTTP layer, the SSE error
event and the ZMQ front door all carry the same (status, type, param, code) quadruple.
"""
from __future__ import annotations

import json
import math
from typing import Any


class APIError(Exception):
    """A request failure with its HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"


def bad_request(message: str, param: str | None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(
        401, "Invalid or missing API key.", type="authentication_error", code="invalid_api_key"
    )


def not_found(message: str, param: str | None = None, code: str = "not_found") -> APIError:
    return APIError(404, message, type="invalid_request_error", param=param, code=code)


def too_large(limit: int) -> APIError:
    return APIError(
        413, f"Request body is larger than the limit of {limit} bytes.", code="body_too_large"
    )


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` (whole seconds, rounded up, at least 1: RFC 9110 allows no fraction) and
    `retry-after-ms` (what the OpenAI and Anthropic SDKs read first) for a computed wait."""
    seconds = max(0.0, seconds) if math.isfinite(seconds) else 60.0
    return {"Retry-After": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}


def queue_full(queue_name: str, retry_after_s: float = 1.0) -> APIError:
    return APIError(
        429,
        f"The {queue_name} queue is full; retry later.",
        type="rate_limit_error",
        code="queue_full",
        headers=retry_after_headers(retry_after_s),
    )


def slo_unattainable(message: str, retry_after_s: float) -> APIError:
    """Admission (scheduler.admission): the request's predicted time to first token passes its
    deadline, so it is refused before any prefill; retry after the predicted wait."""
    return APIError(429, message, type="rate_limit_error", code="slo_unattainable",
                    headers=retry_after_headers(retry_after_s))


def unavailable(message: str = "No healthy backend is available.") -> APIError:
    return APIError(503, message, type="service_unavailable", code="no_healthy_backend")


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down.", type="service_unavailable",
                    code="shutting_down")


def deadline_exceeded(message: str = "The request deadline passed before it was served.") -> APIError:
    return APIError(504, message, type="timeout_error", code="deadline_exceeded")


def cancelled() -> APIError:
    """The client abandoned the request (closed the connection or sent an Abort)."""
    return APIError(499, "The request was cancelled by the client.", code="cancelled")


def backend_error(message: str, code: str = "backend_error") -> APIError:
    return APIError(502, message, type="server_error", code=code)


def internal_error(message: str = "Internal server error.") -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")
