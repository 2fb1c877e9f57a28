"""Sampling fields of a request body (OpenAI's and vLLM's logit processors) into
`openai_schema.SamplingParams`; the HTTP routes and the ZMQ front door share it.
"""
from __future__ import annotations

from typing import Any

from gateway.body_checks import (
    LIMITS,
    RequestLimits,
    check_text,
    is_token_list,
    json_type,
    scalar,
    short,
    type_error,
)
from gateway.errors import bad_request
from gateway.openai_schema import SamplingParams
from gateway.request_fields import INT32_MAX


def _parse_stop(body: dict, limits: RequestLimits) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise type_error("stop", "a string or an array of strings", value)
    if len(value) > limits.max_stop_strings:
        raise bad_request(f"'stop' has {len(value)} strings; at most {limits.max_stop_strings} "
                          "are allowed.", "stop")
    if any(s == "" for s in value):
        raise bad_request("'stop' strings must not be empty.", "stop")
    if any(len(s) > limits.max_stop_len for s in value):
        raise bad_request(f"'stop' strings must be at most {limits.max_stop_len} characters.",
                          "stop")
    for s in value:
        check_text(s, "stop")
    return tuple(dict.fromkeys(value))


def parse_sampling(body: dict, logprobs: int | None, max_tokens_default: int | None,
                    max_tokens_name: str = "max_tokens",
                    limits: RequestLimits = LIMITS) -> SamplingParams:
    max_tokens = scalar(body, max_tokens_name, max_tokens_default, limits)
    processors = _parse_processors(body, max_tokens, limits)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=scalar(body, "temperature", 1.0, limits),
        top_p=scalar(body, "top_p", 1.0, limits),
        top_k=scalar(body, "top_k", -1, limits),
        seed=scalar(body, "seed", None, limits),
        stop=_parse_stop(body, limits),
        ignore_eos=scalar(body, "ignore_eos", False, limits),
        logprobs=logprobs,
        **processors,
    )


def parse_sampling_fields(body: dict, logprobs: int | None,
                          limits: RequestLimits = LIMITS) -> SamplingParams:
    """Sampling fields given as a request body would give them (the ZMQ front door's path)."""
    return parse_sampling(body, logprobs, max_tokens_default=16, limits=limits)


# --- sampling processors, n, and the fields of vLLM's requests we do not implement ------------
def _parse_processors(body: dict, max_tokens: int | None, limits: RequestLimits) -> dict[str, Any]:
    """The logit processors and output options beyond OpenAI's basics (as vLLM names them)."""
    out: dict[str, Any] = {}
    for name, default in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0), ("min_p", 0.0)):
        out[name] = scalar(body, name, default, limits)
    min_tokens = scalar(body, "min_tokens", 0, limits)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"'min_tokens' must be in [0, max_tokens], got {min_tokens}.",
                          "min_tokens")
    out["min_tokens"] = min_tokens
    out["logit_bias"] = _parse_logit_bias(body, limits)
    out["stop_token_ids"] = _parse_token_ids(body, "stop_token_ids", limits.max_stop_token_ids)
    out["skip_special_tokens"] = scalar(body, "skip_special_tokens", True, limits)
    out["include_stop_str_in_output"] = scalar(body, "include_stop_str_in_output", False, limits)
    n = scalar(body, "n", 1, limits)
    best_of = scalar(body, "best_of", None, limits)
    # vLLM V1 dropped best_of: only the value that changes nothing (== n) is taken
    if best_of is not None and best_of != n:
        raise bad_request(f"'best_of' is not supported (as in vLLM V1); got {best_of}, only "
                          f"best_of = n ({n}) is accepted.", "best_of", "unsupported_value")
    out["n"] = n
    return out


def _parse_logit_bias(body: dict, limits: RequestLimits) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise type_error("logit_bias", "an object mapping token ids to biases", value)
    if len(value) > limits.max_logit_bias:
        raise bad_request(f"'logit_bias' has {len(value)} entries; at most "
                          f"{limits.max_logit_bias} are allowed.", "logit_bias")
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)  # JSON keys are strings: "50256"
        except ValueError:
            raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}.",
                              "logit_bias") from None
        if not 0 <= token <= INT32_MAX:
            raise bad_request(f"'logit_bias' token ids must be in [0, {INT32_MAX}], got "
                              f"{short(token)}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise bad_request(f"'logit_bias' values must be numbers, not {json_type(bias)}.",
                              "logit_bias")
        # compared, never converted first: an integer past the float range (10**400) has no
        # float, and NaN fails both comparisons
        if not -100.0 <= bias <= 100.0:
            raise bad_request(f"'logit_bias' values must be in [-100, 100], got {short(bias)}.",
                              "logit_bias")
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _parse_token_ids(body: dict, name: str, max_len: int) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not is_token_list(value):
        raise type_error(name, "an array of token ids", value)
    if len(value) > max_len:
        raise bad_request(f"'{name}' has {len(value)} ids; at most {max_len} are allowed.", name)
    if any(not 0 <= t <= INT32_MAX for t in value):
        raise bad_request(f"'{name}' ids must be in [0, {INT32_MAX}].", name)
    return tuple(dict.fromkeys(value))
