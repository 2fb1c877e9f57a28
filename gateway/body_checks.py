"""The checks every request body shares: JSON parsing, one scalar field against its row of
`gateway.request_fields.SCALARS`, booleans, strings, token-id arrays, and the per-request size
limits (`RequestLimits`). Each failure is an `APIError(400)` naming the parameter.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.errors import APIError, bad_request
from gateway.request_fields import SCALARS, Scalar
from proto.sampling import range_text, short

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request size limits (each a 400 when exceeded). Stop strings are matched against the
    held-back text after every token, so their number and length bound that cost; prompts per
    request bound the work one body can start (and the event-loop time it takes)."""

    max_stop_strings: int = MAX_STOP_STRINGS
    max_stop_len: int = MAX_STOP_STRING_CHARS  # characters per stop string
    max_prompts: int = 256  # prompts in one /v1/completions request
    max_n: int = 16  # choices per prompt
    max_logit_bias: int = 1024  # logit_bias entries
    max_stop_token_ids: int = 256
    max_prediction_chars: int = 1 << 20  # Predicted Outputs: characters of `prediction`
    max_draft_tokens: int = 64  # `speculation.max_draft_tokens` at most
    strict_api: bool = False  # unknown request fields: 400 instead of a warning (--strict-api)


LIMITS = RequestLimits()


def parse_json_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"Request body is not valid UTF-8: {exc.reason} at byte {exc.start}.",
                          "body", "invalid_encoding") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_request(f"Request body is not valid JSON: {exc.msg} (line {exc.lineno}, "
                          f"column {exc.colno}).", "body", "invalid_json") from None
    except RecursionError:
        raise bad_request("Request body is nested too deeply.", "body", "invalid_json") from None
    except ValueError as exc:  # e.g. an integer literal over sys.get_int_max_str_digits()
        raise bad_request(f"Request body is not valid JSON: {exc}.", "body",
                          "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"Request body must be a JSON object, not {json_type(body)}.", "body",
                          "invalid_type")
    return body


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def type_error(param: str, expected: str, value: Any) -> APIError:
    return bad_request(f"'{param}' must be {expected}, not {json_type(value)}.", param,
                       "invalid_type")


def scalar(body: dict, name: str, default: Any, limits: RequestLimits = LIMITS,
            spec: Scalar | None = None, bounded: bool = True) -> Any:
    """Field `name` of `body` checked against its row of `request_fields.SCALARS` (type, then
    bounds unless `bounded` is false: a sampling field's range is `proto.sampling`'s check's);
    `default` when absent or null."""
    if body.get(name) is None:  # absent or null: the default, for every kind (the common case)
        return default
    spec = spec or SCALARS[name]
    if spec.kind == "boolean":
        return get_bool(body, name, default)
    if spec.kind == "string":
        value = get_str(body, name)
        return default if value is None else value
    if spec.kind == "integer":
        value = body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise type_error(name, "an integer", value)
    else:
        value = get_float(body, name, None)
        if value is None:
            return default
    if not bounded:
        return value
    lo, hi = spec.bounds(limits)
    low_ok = lo is None or (value > lo if spec.exclusive_minimum else value >= lo)
    if not (low_ok and (hi is None or value <= hi)):
        raise bad_request(f"'{name}' must be {range_text(lo, hi, spec.exclusive_minimum)}, "
                          f"got {short(value)}.", name)
    return value


def get_float(body: dict, name: str, default: float | None) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(name, "a number", value)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the float range (~1.8e308)
        raise bad_request(f"'{name}' is out of range.", name) from None
    if math.isnan(value) or math.isinf(value):
        raise bad_request(f"'{name}' must be a finite number, not {value}.", name)
    return value


def get_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise type_error(name, "a boolean", value)
    return value


def get_str(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise type_error(name, "a string", value)
    return check_text(value, name)


def check_text(value: str, param: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no UTF-8 tokenizer or writer accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"'{param}' is not valid Unicode (a lone surrogate at character "
                          f"{exc.start}).", param, "invalid_encoding") from None
    return value


def is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)
