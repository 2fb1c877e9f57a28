"""Sampling fields of a request body (OpenAI's and vLLM's logit processors) into the one
sampling record, `proto.sampling.SamplingParams`: JSON types and the API's defaults here, the
ranges in `proto.sampling.check_sampling` (the check the front door and the backend run too),
the gateway's size limits in `check_request_sampling` (HTTP and the front door).
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any

from gateway.body_checks import (
    LIMITS,
    RequestLimits,
    check_text,
    is_token_list,
    json_type,
    scalar,
    type_error,
)
from gateway.errors import bad_request
from proto.sampling import API_DEFAULTS, SamplingError, SamplingParams, check_sampling

# The HTTP API's defaults for a field the body leaves out (OpenAI's, and vLLM's for its own
# fields), where they differ from the record's (greedy, the wire's: proto.sampling). The model's
# generation config then replaces some of them (gateway.generation_defaults).
HTTP_DEFAULTS = {**API_DEFAULTS, "top_k": -1}


def check_request_sampling(params: SamplingParams, limits: RequestLimits = LIMITS,
                           aliases: dict[str, str] | None = None) -> SamplingParams:
    """`params` if the gateway takes it: the gateway's size limits, then the one range check
    (proto.sampling.check_sampling); a 400 naming the field otherwise. `aliases`: the request's
    own name of a field (chat's max_completion_tokens, Anthropic's stop_sequences)."""
    err = _check_limits(params, limits) or check_sampling(params)
    if err is None:
        return params
    message, param = err
    alias = (aliases or {}).get(param)
    if alias is not None:
        message, param = message.replace(f"'{param}'", f"'{alias}'"), alias
    raise bad_request(message, param)


def _check_limits(p: SamplingParams, limits: RequestLimits) -> SamplingError | None:
    """The per-request size limits of the record's lists (gateway configuration)."""
    if p.stop:
        if len(p.stop) > limits.max_stop_strings:
            return SamplingError(f"'stop' has {len(p.stop)} strings; at most "
                                 f"{limits.max_stop_strings} are allowed.", "stop")
        if "" in p.stop:
            return SamplingError("'stop' strings must not be empty.", "stop")
        if max(map(len, p.stop)) > limits.max_stop_len:
            return SamplingError(f"'stop' strings must be at most {limits.max_stop_len} "
                                 "characters.", "stop")
    if len(p.logit_bias) > limits.max_logit_bias:
        return SamplingError(f"'logit_bias' has {len(p.logit_bias)} entries; at most "
                             f"{limits.max_logit_bias} are allowed.", "logit_bias")
    if len(p.stop_token_ids) > limits.max_stop_token_ids:
        return SamplingError(f"'stop_token_ids' has {len(p.stop_token_ids)} ids; at most "
                             f"{limits.max_stop_token_ids} are allowed.", "stop_token_ids")
    return None


def _parse_stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise type_error("stop", "a string or an array of strings", value)
    for s in value:
        check_text(s, "stop")
    return tuple(dict.fromkeys(value))


def parse_sampling(body: dict, logprobs: int | None, max_tokens_default: int | None,
                    max_tokens_name: str = "max_tokens",
                    limits: RequestLimits = LIMITS) -> SamplingParams:
    """The body's sampling fields (JSON types here), checked by `check_request_sampling`."""
    def typed(name: str, default: Any) -> Any:  # the type only: ranges are check_sampling's
        return scalar(body, name, default, limits, bounded=False)

    params = SamplingParams(
        max_tokens=typed(max_tokens_name, max_tokens_default),
        temperature=typed("temperature", HTTP_DEFAULTS["temperature"]),
        top_p=typed("top_p", 1.0),
        top_k=typed("top_k", HTTP_DEFAULTS["top_k"]),
        seed=typed("seed", None),
        stop=_parse_stop(body),
        ignore_eos=typed("ignore_eos", False),
        logprobs=logprobs,
        presence_penalty=typed("presence_penalty", 0.0),
        frequency_penalty=typed("frequency_penalty", 0.0),
        repetition_penalty=typed("repetition_penalty", 1.0),
        min_p=typed("min_p", 0.0),
        min_tokens=typed("min_tokens", 0),
        logit_bias=_parse_logit_bias(body),
        stop_token_ids=_parse_token_ids(body, "stop_token_ids"),
        **_parse_output_options(body, limits),
    )
    aliases = {"max_tokens": max_tokens_name} if max_tokens_name != "max_tokens" else None
    return check_request_sampling(params, limits, aliases)


# --- output options, n, and the fields of vLLM's requests we do not implement ----------------
def _parse_output_options(body: dict, limits: RequestLimits) -> dict[str, Any]:
    """The output options beyond OpenAI's basics (as vLLM names them), and n."""
    out: dict[str, Any] = {}
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


def _parse_logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise type_error("logit_bias", "an object mapping token ids to biases", value)
    pairs = []
    for key, bias in value.items():
        try:
            token = int(key)  # JSON keys are strings: "50256"
        except ValueError:
            raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}.",
                              "logit_bias") from None
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise bad_request(f"'logit_bias' values must be numbers, not {json_type(bias)}.",
                              "logit_bias")
        # a bias check_sampling will refuse stays as written (an integer past the float range,
        # 10**400, has no float; its message shows it as given)
        pairs.append((token, float(bias) if -100 <= bias <= 100 else bias))
    return tuple(sorted(pairs, key=itemgetter(0)))


def _parse_token_ids(body: dict, name: str) -> tuple[int, ...]:
    value = body.get(name)
    if value is None:
        return ()
    if not is_token_list(value):
        raise type_error(name, "an array of token ids", value)
    return tuple(dict.fromkeys(value))
