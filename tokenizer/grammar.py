"""Grammars for structured output: what a request asks for, and its compiled form.

A `GrammarSpec` is the request's constraint as the user wrote it (a JSON schema, "any JSON
object", a regex, a list of choices, or a Lark / GBNF grammar). It crosses the wire as text
(`SamplingParams.grammar`), and both ends compile it with the same engine, llguidance:

    gateway                                   backend
    spec -> compile_grammar (400 if bad)      spec -> GrammarCompiler (cached, off the step loop)
                                                   -> matcher per sequence -> token bitmask

Why llguidance and not XGrammar (measured on this repository's CPU with the tiny-coder vocabulary,
`python -m bench.structured.engines`, numbers in BENCHMARKS.md): XGrammar computes a mask
in ~1.2 us median per token against llguidance's ~10 us, but compiles a schema in ~2.7 ms
against ~0.8 ms and imports torch. The gateway must compile every schema to answer a bad one
with a 400 before the first byte, and the gateway never imports torch; with one engine at both
ends a schema the gateway accepts is one the backend can run. A step's mask is computed while
that step's forward runs (backend/runner/grammar.py), so its ~10 us per row is hidden.

This module is part of the torch-free tokenizer leaf: llguidance (imported lazily) and nothing
of ours.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")

# JSON as json.dumps writes it: one space after ',' and ':', no other whitespace. A grammar that
# allows any whitespace lets a small model emit newlines until max_tokens (vLLM's
# `disable_any_whitespace`); fixed separators keep the output compact and always finishable.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_CHARS = 1 << 18  # a spec longer than this is refused (400) before compiling


class GrammarError(ValueError):
    """The spec cannot be compiled (bad schema, unsupported feature, bad regex or grammar)."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One request's output constraint. `text`: a schema's JSON (key order kept: an object's
    properties are written in the schema's order), the choices as a JSON array, a regex or a
    grammar as given; "" for json_object. Equal specs share one compiled grammar."""

    kind: str  # one of KINDS
    text: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, ensure_ascii=False))

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))


def to_llguidance(spec: GrammarSpec) -> str:
    """The llguidance grammar (its JSON form) for `spec`; GrammarError for what cannot be."""
    from llguidance import LLMatcher

    if len(spec.text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
    try:
        if spec.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
        if spec.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "choice":
            choices = json.loads(spec.text)
            # Lark string literals are JSON strings: json.dumps escapes every choice exactly
            alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
            return LLMatcher.grammar_from_lark(f"start: {alts}\n")
        if spec.kind == "grammar":
            return LLMatcher.grammar_from_lark(_as_lark(spec.text))
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    raise GrammarError(f"unknown grammar kind {spec.kind!r}")


def _as_lark(text: str) -> str:
    """vLLM's `guided_grammar` is GBNF (`root ::= ...`, as llama.cpp and XGrammar write it) or
    Lark; GBNF is translated by llguidance's own converter."""
    if "::=" not in text:
        return text
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare Exceptions
        raise GrammarError(f"GBNF grammar: {exc}") from None


def load_tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]):
    """llguidance's view of our tokenizer (~50 ms for tiny-coder's 8k vocabulary: build once).
    `vocab_size` is the model's row count (the logits' width), which may exceed the tokenizer's."""
    from llguidance import LLTokenizer

    eos = list(eos_token_ids) or None
    return LLTokenizer(tokenizer_json, n_vocab=vocab_size or None, eos_token=eos)


class GrammarCompiler:
    """Compiles specs against one tokenizer, remembering the last `capacity` results (errors
    too), so a schema every request repeats (a tool list, a response format) is compiled once.
    Thread-safe: the backend compiles on a worker thread, off the step loop."""

    def __init__(self, tokenizer, capacity: int = 512) -> None:
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._cache: OrderedDict[GrammarSpec, str | GrammarError] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0

    def compile(self, spec: GrammarSpec) -> str:
        """The checked llguidance grammar for `spec` (cached); GrammarError if it is bad."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
        if hit is None:
            hit = self._compile(spec)
            with self._lock:
                self._cache[spec] = hit
                self.num_compiled += 1
                while len(self._cache) > self.capacity:
                    self._cache.popitem(last=False)
        if isinstance(hit, GrammarError):
            raise hit
        return hit

    def _compile(self, spec: GrammarSpec) -> str | GrammarError:
        from llguidance import LLMatcher

        try:
            grammar = to_llguidance(spec)
        except GrammarError as exc:
            return exc
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            return GrammarError(messages[0] if messages else "invalid grammar")
        return grammar

    def matcher(self, spec: GrammarSpec):
        """A fresh llguidance matcher at the start of `spec`'s language."""
        from llguidance import LLMatcher

        m = LLMatcher(self.tokenizer, self.compile(spec), log_level=0)
        if m.is_error():
            raise GrammarError(m.get_error())
        return m
