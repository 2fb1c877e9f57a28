"""Frozen records for validated OpenAI requests (the output of `gateway.validation`).

A request body is parsed once into these records; nothing downstream looks at the raw JSON.
Prompts are kept as given (text or token ids); tokenization happens later, against the
tokenizer of the backend that serves the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the one sampling record (defaults: the wire's, greedy; the HTTP API's are applied by
# gateway.sampling_fields): a request's `sampling`
from proto.sampling import SamplingParams

# One prompt: text, or token ids.
Prompt = str | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SpeculationControl:
    """Per-request speculative decoding (the `speculation` extension field): `off` never
    drafts for this request; `max_draft_tokens` caps the draft tokens a step verifies for it
    (0: the server's policy decides alone). Absent (None on ServingOptions): the server default."""

    off: bool = False
    max_draft_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ServingOptions:
    """Request options that are about serving, not sampling."""

    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    priority: int = 0
    deadline_ms: float | None = None
    return_token_ids: bool = False
    speculation: SpeculationControl | None = None  # None: the server's default policy
    slo_ttft_ms: float | None = None  # None: its queue class's target (scheduler.slo)
    slo_tpot_ms: float | None = None
    # agent sessions (issue 30, gateway.sessions): the session key placement keeps together
    # (None: found from the prompt), and a pin of the prompt's first pin_tokens tokens (0: all)
    # for pin_ttl_s seconds (0: no pin)
    session_key: str | None = None
    pin_ttl_s: float = 0.0
    pin_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompts: tuple[Prompt, ...]
    sampling: SamplingParams
    options: ServingOptions
    echo: bool = False
    suffix: str | None = None  # fill-in-the-middle: the text after the hole
    add_special_tokens: bool = True  # BOS etc. when tokenizing text prompts
    request_id: str | None = None  # the caller's id, shown in the response's "id"
    structured: Any = None  # gateway.structured.Structured: grammar, tools
    prediction: str | tuple[int, ...] | None = None  # Predicted Outputs: text (or token ids)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str
    tool_calls: tuple[dict, ...] = ()  # an assistant's calls: {id, name, arguments}
    tool_call_id: str | None = None  # role tool: the call this result answers


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str | None
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams
    options: ServingOptions
    add_generation_prompt: bool = True
    top_logprobs_requested: bool = field(default=False)
    echo: bool = False  # prepend the last message's content when it is the assistant's
    add_special_tokens: bool = False  # the template places the special tokens itself
    request_id: str | None = None
    structured: Any = None  # gateway.structured.Structured: grammar, tools
    prediction: str | tuple[int, ...] | None = None  # Predicted Outputs: text (or token ids)


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """POST /tokenize (vLLM's shape): a text prompt, or chat messages rendered by the template."""
    model: str | None
    prompt: str | None
    messages: tuple[ChatMessage, ...] | None
    add_special_tokens: bool
    add_generation_prompt: bool = True
    return_token_strs: bool = False
