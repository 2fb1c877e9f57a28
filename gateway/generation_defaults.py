"""The model's sampling defaults for the fields a request leaves out, as vLLM's
`--generation-config auto` applies them.

The backend reads the model's `generation_config.json` (`backend.model.generation_config`;
`tidegate backend/serve --generation-config auto|none|DIR`) and announces the sampling fields it
sets in `BackendInfo.generation_defaults`. Here, after a request has been parsed with the API's
own defaults:

* temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty:
  the model's value replaces the API default when the request does not give the field (absent or
  null); a value the request gives always wins;
* max_tokens (the file's `max_new_tokens`): a cap, as in vLLM (`get_max_tokens` takes the least
  of the request's max_tokens, the room left in the context and the generation config's): the
  completion is at most that long whatever the request asked for.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gateway.errors import bad_request
from gateway.openai_schema import SamplingParams

FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty")


def apply_generation_defaults(body: Mapping, sampling: SamplingParams,
                              defaults: Mapping[str, float]) -> SamplingParams:
    """`sampling` (parsed from `body`) with the model's defaults applied (module docstring)."""
    if not defaults:
        return sampling
    changes: dict = {}
    for name in FLOAT_FIELDS:
        if name in defaults and body.get(name) is None:
            changes[name] = float(defaults[name])
    if "top_k" in defaults and body.get("top_k") is None:
        changes["top_k"] = int(defaults["top_k"])
    cap = defaults.get("max_tokens")
    if cap is not None:
        cap = int(cap)
        if sampling.max_tokens is None or sampling.max_tokens > cap:
            changes["max_tokens"] = cap
        if sampling.min_tokens > cap:
            raise bad_request(f"'min_tokens' ({sampling.min_tokens}) is over this model's "
                              f"max_new_tokens ({cap}, its generation config).", "min_tokens")
    return replace(sampling, **changes) if changes else sampling
