"""The request fields of our HTTP API: which endpoint takes which, each one's type, bounds and
default. One table, read by two users: `gateway.validation` (what a body may hold: the checks
and the 400s) and `gateway.openapi` (the description served at GET /openapi.json, which the
fuzzer generates bodies from). A bound that names a `RequestLimits` field (e.g. "max_n") is the
gateway's configured limit.

Scalars are checked by `body_checks.scalar` from `SCALARS` alone; composite fields (prompt,
messages, stop, ...) have a hand-written parser in `validation` and their schema here, next to
the limits that parser applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.structured_schema import STRUCTURED_FIELDS, TOOL_FIELDS, structured_schemas
from proto.sampling import (  # noqa: F401 -- the wire's integer ranges, re-exported
    BOUNDS,
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    UINT32_MAX,
)

INT32_MIN = -(1 << 31)
MAX_LOGPROBS = 20

Bound = int | float | str | None  # a number, or the name of a RequestLimits field


@dataclass(frozen=True, slots=True)
class Scalar:
    """One scalar field. Integers default to the int32 range (what most wire fields hold): a
    value that does not fit its protobuf field must be a 400, never an exception while a Batch
    is built."""

    kind: str  # "integer" | "number" | "boolean" | "string"
    doc: str
    minimum: Bound = None
    maximum: Bound = None
    exclusive_minimum: bool = False  # (minimum, maximum] instead of [minimum, maximum]

    def bounds(self, limits: Any) -> tuple[float | None, float | None]:
        """(minimum, maximum) with limit names resolved against `limits` (a RequestLimits)."""
        lo, hi = self.minimum, self.maximum
        if self.kind == "integer":
            lo = INT32_MIN if lo is None else lo
            hi = INT32_MAX if hi is None else hi
        return (getattr(limits, lo) if isinstance(lo, str) else lo,
                getattr(limits, hi) if isinstance(hi, str) else hi)


def _sampling(kind: str, doc: str, name: str) -> Scalar:
    """A sampling field: its range is `proto.sampling.BOUNDS`' (checked by check_sampling)."""
    return Scalar(kind, doc, *BOUNDS[name])


_MAX_TOKENS = _sampling("integer", "Tokens to generate at most (completions default 16; chat: "
                        "fill the context).", "max_tokens")
SCALARS: dict[str, Scalar] = {
    "model": Scalar("string", "The served model's name (/v1/models); any value is accepted."),
    "max_tokens": _MAX_TOKENS,
    "max_completion_tokens": _MAX_TOKENS,
    "temperature": _sampling("number", "Sampling temperature; 0 is greedy.", "temperature"),
    "top_p": _sampling("number", "Nucleus sampling mass.", "top_p"),
    "top_k": _sampling("integer", "Keep the k most likely tokens; -1 or 0: off.", "top_k"),
    "seed": _sampling("integer", "Per-request seed: the same seed gives the same tokens.",
                      "seed"),
    "ignore_eos": Scalar("boolean", "Keep generating past the end-of-sequence token."),
    "stream": Scalar("boolean", "Server-sent events, one per new piece of text."),
    "user": Scalar("string", "The caller's end-user id: a session key when no other is given "
                   "(gateway.sessions)."),
    "prompt_cache_key": Scalar("string", "A session key (OpenAI's): placement keeps requests "
                               "with the same key on the backend holding their KV while it has "
                               "slack (gateway.sessions)."),
    "priority": Scalar("integer", "Within a queue class, lower is served first."),
    "deadline_ms": Scalar("number", "Fail with 504 if not finished this many ms after arrival.",
                          0.0, None, exclusive_minimum=True),
    "slo_ttft_ms": Scalar("number", "This request's time-to-first-token target, ms (default: "
                          "its queue class's --slo-ttft-ms). With a target, a request predicted "
                          "to miss it is refused at once: 429 with Retry-After.",
                          0.0, None, exclusive_minimum=True),
    "slo_tpot_ms": Scalar("number", "This request's time-per-output-token target, ms (default: "
                          "its class's --slo-tpot-ms): counted in SLO attainment.",
                          0.0, None, exclusive_minimum=True),
    "return_token_ids": Scalar("boolean", "Also return the prompt's and completion's token ids."),
    "presence_penalty": _sampling("number", "Subtracted once from the logits of tokens already "
                                  "in the output.", "presence_penalty"),
    "frequency_penalty": _sampling("number", "Subtracted per occurrence in the output.",
                                   "frequency_penalty"),
    "repetition_penalty": _sampling("number", "> 1 discourages tokens of the prompt and output.",
                                    "repetition_penalty"),
    "min_p": _sampling("number", "Keep tokens with p >= min_p * p_max.", "min_p"),
    "min_tokens": _sampling("integer", "End-of-sequence and stop ids cannot end the output "
                            "before this many tokens; at most max_tokens.", "min_tokens"),
    "skip_special_tokens": Scalar("boolean", "Leave special tokens out of the text."),
    "include_stop_str_in_output": Scalar("boolean", "Keep the matched stop string in the text."),
    "spaces_between_special_tokens": Scalar("boolean", "Only true (the default) is supported."),
    "n": Scalar("integer", "Choices per prompt.", 1, "max_n"),
    "best_of": Scalar("integer", "Only best_of = n is accepted (as in vLLM V1).", 1, "max_n"),
    "add_special_tokens": Scalar("boolean", "Add the tokenizer's special tokens (BOS) to text "
                                 "prompts (completions default true, chat false)."),
    "request_id": Scalar("string", "The caller's id, shown in the response's id."),
    "echo": Scalar("boolean", "Return the prompt (completions) or the last assistant message "
                   "(chat) before the completion."),
    "suffix": Scalar("string", "Fill-in-the-middle: the text after the hole."),
    "top_logprobs": Scalar("integer", "Top alternatives per token; needs logprobs = true.",
                           0, MAX_LOGPROBS),
    "add_generation_prompt": Scalar("boolean", "End the rendered chat with the assistant's turn."),
    "parallel_tool_calls": Scalar("boolean", "tool_choice required: one or more calls "
                                  "(default true) or exactly one."),
    "return_token_strs": Scalar("boolean", "/tokenize: also return each token's text."),
}
# /v1/completions' `logprobs` is a count; chat's is a switch (then `top_logprobs` is the count).
COMPLETION_LOGPROBS = Scalar("integer", "Top alternatives per token.", 0, MAX_LOGPROBS)
CHAT_LOGPROBS = Scalar("boolean", "Return the sampled tokens' logprobs.")


def _token_ids(max_items: int | None = None) -> dict:
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": INT32_MAX}}
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


SPECULATION_MODES = ("off", "auto")


def prediction_schema(limits: Any) -> dict:
    text_part = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"const": "text"}, "text": {"type": "string"}}}
    return {"type": "object", "required": ["type", "content"], "properties": {
        "type": {"const": "content"},
        "content": {"anyOf": [{"type": "string", "maxLength": limits.max_prediction_chars},
                              {"type": "array", "items": text_part},
                              {**_token_ids(limits.max_prediction_chars), "minItems": 1}]}},
        "description": "Predicted Outputs (OpenAI): the expected output; the engine drafts from "
                       "it. Not with n > 1."}


def speculation_schema(limits: Any) -> dict:
    return {"anyOf": [
        {"enum": list(SPECULATION_MODES)},
        {"type": "object", "additionalProperties": False, "properties": {
            "max_draft_tokens": {"type": "integer", "minimum": 0,
                                 "maximum": limits.max_draft_tokens}}}],
        "description": "Speculative decoding for this request: 'off', 'auto' (the server's "
                       "policy) or at most max_draft_tokens draft tokens a step (0: off)."}


def cache_control_schema() -> dict:
    return {"type": "object", "additionalProperties": False, "properties": {
        "type": {"const": "ephemeral"},
        "ttl": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?[smh]$"}},
        "description": "tidegate: pin the prompt's KV blocks on its backend for ttl (default "
                       "'5m', at most '1h'), Anthropic's cache_control on the whole prompt; "
                       "usage.pin says whether it was pinned (a backend's pin budget may refuse)."}


def composite_schemas(limits: Any) -> dict[str, dict]:
    """JSON Schemas of the fields `validation` parses by hand, with the configured limits."""
    text = {"type": "string", "minLength": 1}
    text_part = {"type": "object", "required": ["type", "text"], "properties": {
        "type": {"const": "text"}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": text_part},
                              {"type": "null"}],
                    "description": "Required except for an assistant message."}}}
    return {
        "prompt": {"anyOf": [
            text,
            {"type": "array", "minItems": 1, "maxItems": limits.max_prompts, "items": text},
            {**_token_ids(), "minItems": 1},
            {"type": "array", "minItems": 1, "maxItems": limits.max_prompts,
             "items": {**_token_ids(), "minItems": 1}}],
            "description": "Text, token ids, or several of either (one choice set each)."},
        "messages": {"type": "array", "minItems": 1, "items": message},
        "stop": {"anyOf": [
            {**text, "maxLength": limits.max_stop_len},
            {"type": "array", "maxItems": limits.max_stop_strings,
             "items": {**text, "maxLength": limits.max_stop_len}}],
            "description": "Strings that end the output (not included unless "
                           "include_stop_str_in_output)."},
        "stop_token_ids": {**_token_ids(limits.max_stop_token_ids),
                           "description": "Token ids that end the output."},
        "logit_bias": {"type": "object", "maxProperties": limits.max_logit_bias,
                       "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": {"type": "number", "minimum": -100,
                                                "maximum": 100},
                       "description": "Token id (as a string) -> bias added to its logit."},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                           "description": "Only with stream = true."},
        **structured_schemas(),
        "tokens": {**_token_ids(), "description": "/detokenize: the ids to turn into text."},
        "prediction": prediction_schema(limits),
        "cache_control": cache_control_schema(),
        "speculation": speculation_schema(limits),
    }


# Which endpoint takes which field (vLLM's request bodies, by what we do with them). Every field
# not listed anywhere is unknown: a warning once per name (as vLLM logs "ignored fields"), a 400
# under --strict-api.
COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
    "stream_options", "user", "priority", "ignore_eos", "n", "best_of", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logit_bias",
    "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "return_token_ids",
    "deadline_ms", "logprobs", "spaces_between_special_tokens", "add_special_tokens",
    "request_id", "prediction", "speculation", "slo_ttft_ms", "slo_tpot_ms",
    "prompt_cache_key", "cache_control",
})
COMPLETION_FIELDS = COMMON_FIELDS | STRUCTURED_FIELDS | {"prompt", "echo", "suffix"}
CHAT_FIELDS = COMMON_FIELDS | STRUCTURED_FIELDS | TOOL_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "add_generation_prompt", "echo"}
TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens",
                             "add_generation_prompt", "return_token_strs"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})


def _empty_list(value: Any) -> bool:
    return value == []


# Known fields we do not implement: accepted at their neutral value, else a 400 naming them.
# name -> the neutral value (or a predicate that says a value is neutral)
UNSUPPORTED_FIELDS: dict[str, Any] = {
    "use_beam_search": False,
    "length_penalty": 1.0,
    "allowed_token_ids": _empty_list,
    "bad_words": _empty_list,
    "prompt_logprobs": 0,
    "truncate_prompt_tokens": None,
    "logits_processors": _empty_list,
    "return_tokens_as_token_ids": False,
    "prompt_embeds": None,
    "cache_salt": None,
    "kv_transfer_params": None,
    "vllm_xargs": None,
    "continue_final_message": False,
    "chat_template": None,
    "chat_template_kwargs": lambda v: v == {},
    "documents": None,
    "mm_processor_kwargs": None,
    "reasoning_effort": None,
    "include_reasoning": lambda v: True,  # nothing to include: no reasoning parser
    "functions": _empty_list,
    "function_call": lambda v: v in ("none", "auto"),
    "logprobs_mode": None,
    "thinking_token_budget": None,
}
