"""One request's sampling parameters: the one record, its one check, its one wire conversion.

The gateway (HTTP routes, the ZMQ front door), the backend worker and the engines all hold this
record (`gateway.openai_schema` and `backend.runner.sampler` hand the same class on), check it
with `check_sampling`, and cross the socket with `to_wire` / `from_wire`:

    HTTP body ──gateway.sampling_fields (JSON types, API defaults)──┐
                                                                   ├─► SamplingParams ─ check_sampling
    ZMQ client ── pb.SamplingParams ── from_wire (front door) ─────┘         │  (+ the gateway's limits)
                                                                            ▼ to_wire
    backend worker ◄─────────────── pb.SamplingParams ── from_wire ─► SamplingParams ─ check_sampling
                                                                        (vocab size, backend=True)
                                                                            ▼
                                                              engine.add_request (same check)

Defaults. A field left out means what the wire means by an unset field: greedy decoding, 16
tokens, no processor. That is what an internal caller (tests, benchmarks, evaluations: they
build `SamplingParams(max_tokens=n)` and want the argmax) gets. The HTTP API's defaults are
OpenAI's (temperature 1.0, `API_DEFAULTS`; chat: fill the context) and are applied where a JSON
body is read, `gateway.sampling_fields.HTTP_DEFAULTS`, then the model's generation config over them
(`gateway.generation_defaults`). The client library (`gateway.client`) sends the HTTP API's
defaults too; a bare wire message's unset field keeps the wire's meaning.

proto/ imports nothing of ours: `grammar` holds a `tokenizer.grammar.GrammarSpec` (anything
with `kind` and `text`), and `from_wire` is told which type to build it as.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from proto import tidegate_pb2 as pb

# The API's defaults where they differ from the record's (OpenAI's): what the HTTP API and the
# client library (gateway.client) use for a field the caller leaves out.
API_DEFAULTS = {"temperature": 1.0}

INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
LOGIT_BIAS_LIMIT = 100.0  # |bias| at most (OpenAI's)


@dataclass(frozen=True)  # no slots: tests copy a record through its __dict__
class SamplingParams:
    """What one sequence is sampled with (and the gateway's output options, which travel with
    it on the wire). Defaults: greedy, as the wire's unset fields (module docstring)."""

    max_tokens: int | None = 16  # None: fill the context (the gateway resolves it, chat's default)
    temperature: float = 0.0    # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0              # <= 0: off (the HTTP API writes -1)
    seed: int | None = None     # None: a random seed at admission
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; n: the sampled token's logprob and n alternatives (a backend reads 0 as
    # None; the gateway asks it for max(1, n) and shows n)
    logprobs: int | None = None
    min_p: float = 0.0          # keep tokens with p >= min_p * p_max; 0 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens seen in prompt or output; 1 = off
    presence_penalty: float = 0.0    # subtracted once from tokens seen in the output
    frequency_penalty: float = 0.0   # subtracted per occurrence in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), sorted
    min_tokens: int = 0         # EOS and stop ids cannot end the output before this many tokens
    # structured output (tokenizer.grammar.GrammarSpec): the engine masks every token
    grammar: Any = None
    # output shaping at the gateway (the backend's sampler never reads them)
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    n: int = 1                  # choices per prompt

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def changes_logits(self) -> bool:
        """The processed logits differ from the model's (a plain argmax is then wrong)."""
        return bool(self.uses_penalties or self.logit_bias or self.min_tokens
                    or self.grammar is not None)

    def resolved_max_tokens(self, prompt_len: int, max_model_len: int) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return max(1, max_model_len - prompt_len)


# --- the check -----------------------------------------------------------------------------
class Bound(NamedTuple):
    """A numeric field's range: [minimum, maximum], or (minimum, maximum] when exclusive."""
    minimum: float
    maximum: float
    exclusive_minimum: bool = False


# The one table of the sampling fields' ranges (the HTTP API's OpenAPI description reads it
# through gateway.request_fields). The integer maxima are what the wire's fields hold.
BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, UINT32_MAX),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(0.0, 10.0, exclusive_minimum=True),
    "min_p": Bound(0.0, 1.0),
    "min_tokens": Bound(0, INT32_MAX),
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0, exclusive_minimum=True),
    "top_k": Bound(-1, INT32_MAX),
    "seed": Bound(INT64_MIN, INT64_MAX),
}
_RANGES = tuple((name, *bound) for name, bound in BOUNDS.items())  # in the check's order
_FLOATS = frozenset({"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                     "temperature", "top_p"})


class SamplingError(NamedTuple):
    """Why a record was refused: the message (the same words at every entry point) and the
    request field it names. The gateway answers 400 with it, the worker an INVALID_REQUEST
    Error, an engine's add_request returns the message."""
    message: str
    param: str


def check_sampling(p: SamplingParams, vocab_size: int | None = None,
                   max_logprobs: int | None = None, backend: bool = False
                   ) -> SamplingError | None:
    """The one check of a sampling record, called by the HTTP parser, the ZMQ front door, the
    backend worker and every engine's add_request. `vocab_size`: token ids must be below it
    (where the model is known); `max_logprobs`: the logprobs cap of the caller; `backend`:
    max_tokens must be a number (only the gateway resolves "fill the context")."""
    if p.max_tokens is None and backend:
        return SamplingError("'max_tokens' must be given.", "max_tokens")
    for name, lo, hi, exclusive in _RANGES:  # one loop, the messages only on a failure
        value = getattr(p, name)
        if value is None or ((value > lo if exclusive else value >= lo) and value <= hi):
            continue  # (None: max_tokens "fill the context", seed "random"; NaN fails both)
        return _out_of_range(name, value)
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        return SamplingError(f"'min_tokens' must be in [0, max_tokens], got {p.min_tokens}.",
                             "min_tokens")
    for token, bias in p.logit_bias:
        if not 0 <= token <= INT32_MAX:
            return SamplingError(f"'logit_bias' token ids must be in [0, {INT32_MAX}], got "
                                 f"{short(token)}.", "logit_bias")
        # compared, never converted first: an integer past the float range (10**400) has no
        # float, and NaN fails both comparisons
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            return SamplingError(f"'logit_bias' values must be in [-100, 100], got "
                                 f"{short(bias)}.", "logit_bias")
    if p.stop_token_ids and not 0 <= min(p.stop_token_ids) <= max(p.stop_token_ids) <= INT32_MAX:
        return SamplingError(f"'stop_token_ids' ids must be in [0, {INT32_MAX}].",
                             "stop_token_ids")
    if p.logprobs is not None and max_logprobs is not None and \
            not 0 <= p.logprobs <= max_logprobs:
        return SamplingError(f"'logprobs' must be in [0, {max_logprobs}], got "
                             f"{short(p.logprobs)}.", "logprobs")
    if vocab_size:
        return check_token_ids(p, vocab_size)
    return None


def check_token_ids(p: SamplingParams, vocab_size: int) -> SamplingError | None:
    """The vocabulary part of `check_sampling` (the gateway runs it alone once it knows the
    serving model's vocabulary; the rest was checked when the body was read)."""
    for name, ids in (("stop_token_ids", p.stop_token_ids),
                      ("logit_bias", [t for t, _ in p.logit_bias])):
        if ids and max(ids) >= vocab_size:
            return SamplingError(f"Token id {max(ids)} in '{name}' is out of range (vocabulary "
                                 f"size {vocab_size}).", name)
    return None


def _out_of_range(name: str, value: float) -> SamplingError:
    if name in _FLOATS and not math.isfinite(value):
        return SamplingError(f"'{name}' must be a finite number, not {value}.", name)
    lo, hi, exclusive = BOUNDS[name]
    return SamplingError(f"'{name}' must be {range_text(lo, hi, exclusive)}, got "
                         f"{short(value)}.", name)


def range_text(lo: float | None, hi: float | None, exclusive_minimum: bool = False) -> str:
    """"in [0, 2]", "in (0, 1]" or ">= 0": a range as the error messages write it."""
    if hi is None:
        return f"{'>' if exclusive_minimum else '>='} {_num(lo)}"
    return f"in {'(' if exclusive_minimum else '['}{_num(lo)}, {_num(hi)}]"


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def short(value: float) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


# --- the wire --------------------------------------------------------------------------------
GRAMMAR_KINDS = {"json_schema": pb.Grammar.JSON_SCHEMA, "json_object": pb.Grammar.JSON_OBJECT,
                 "regex": pb.Grammar.REGEX, "choice": pb.Grammar.CHOICE,
                 "grammar": pb.Grammar.GRAMMAR}
WIRE_GRAMMAR_KINDS = {wire: kind for kind, wire in GRAMMAR_KINDS.items()}


def wire_grammar(spec: Any) -> pb.Grammar:
    return pb.Grammar(kind=GRAMMAR_KINDS[spec.kind], text=spec.text)


def to_wire(p: SamplingParams, max_tokens: int | None = None,
            output_options: bool = False) -> pb.SamplingParams:
    """The record as the wire's message; unset fields where the record holds the default.
    `max_tokens`: the resolved count when the record says "fill the context". The gateway's
    output options (stop strings, include_stop_str_in_output, n) travel only with
    `output_options` (a client to the front door): the gateway applies them, never a backend."""
    max_tokens = p.max_tokens if max_tokens is None else max_tokens
    wire = pb.SamplingParams(max_tokens=max_tokens or 0, temperature=p.temperature,
                             top_p=p.top_p, top_k=max(p.top_k, 0), ignore_eos=p.ignore_eos,
                             logprobs=0 if p.logprobs is None else max(1, p.logprobs))
    if p.seed is not None:
        wire.seed = p.seed
    if p.stop_token_ids:
        wire.stop_token_ids.extend(p.stop_token_ids)
    if p.min_p:
        wire.min_p = p.min_p
    if p.repetition_penalty != 1.0:
        wire.repetition_penalty = p.repetition_penalty
    if p.presence_penalty:
        wire.presence_penalty = p.presence_penalty
    if p.frequency_penalty:
        wire.frequency_penalty = p.frequency_penalty
    if p.logit_bias:
        wire.logit_bias.update(dict(p.logit_bias))
    if p.min_tokens:
        wire.min_tokens = p.min_tokens
    if p.grammar is not None:
        wire.grammar.CopyFrom(wire_grammar(p.grammar))
    if not p.skip_special_tokens:  # read by a backend that detokenizes (HTTP, no tokenizer)
        wire.skip_special_tokens = False
    if output_options:
        wire.stop.extend(p.stop)
        wire.include_stop_str_in_output = p.include_stop_str_in_output
        if p.n != 1:
            wire.n = p.n
    return wire


def from_wire(s: pb.SamplingParams,
              grammar_type: Callable[[str, str], Any] | None = None) -> SamplingParams:
    """The wire's message as the record, unset fields read as the wire defines them (top_p and
    repetition_penalty 0 -> 1, top_k <= 0 -> 0, n 0 -> 1, logprobs 0 -> None). The grammar is built with
    `grammar_type(kind, text)` (a kind this build does not know reads as none); without a type
    it is left out (a caller that serves no grammar checks `s.grammar` itself)."""
    grammar = None
    if grammar_type is not None and s.HasField("grammar"):
        kind = WIRE_GRAMMAR_KINDS.get(s.grammar.kind)
        grammar = grammar_type(kind, s.grammar.text) if kind is not None else None
    return SamplingParams(
        max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p or 1.0,
        top_k=max(s.top_k, 0), seed=s.seed if s.HasField("seed") else None,
        stop_token_ids=tuple(dict.fromkeys(s.stop_token_ids)), ignore_eos=s.ignore_eos,
        logprobs=s.logprobs or None, min_p=s.min_p,
        repetition_penalty=s.repetition_penalty or 1.0, presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty, logit_bias=tuple(sorted(s.logit_bias.items())),
        min_tokens=s.min_tokens, grammar=grammar, stop=tuple(dict.fromkeys(s.stop)),
        skip_special_tokens=s.skip_special_tokens if s.HasField("skip_special_tokens") else True,
        include_stop_str_in_output=s.include_stop_str_in_output, n=s.n or 1)
