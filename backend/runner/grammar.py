"""Structured output in the engine: one llguidance matcher per constrained request; each step's
token bitmask computed on a worker thread while the step's forward runs; applied to the logits
of the constrained rows only.

    add_request   GrammarManager.start(spec) -> RequestGrammar   compile: cached per spec, on
                                                                  its own thread (off the loop)
    _launch(k)    masks = manager.submit(rows' grammars)          mask thread (llguidance drops
                  runner.launch(k)                                the GIL): runs beside the
                                                                  forward, CPU or device
    finish(k)     the sampler waits for `masks`, then logits[rows] = -inf where a bit is 0
    _outputs(k)   RequestGrammar.consume(the new tokens)

Rows without a grammar pay nothing: no mask is computed, copied or applied for them, and a step
without constrained rows never touches this module. A step with constrained rows samples on
the host path (`SamplingParams.changes_logits`), so its decodes are not pipelined (async
scheduling keeps running the steps that have none); nothing here runs inside a CUDA graph.

Length-safe output: a request started with a token budget (its max_tokens) looks, in its last
CLOSE_WINDOW tokens, for a short completion of its grammar (tokenizer/grammar_close.py); once
that completion with a margin (`_reserve`) fills the remaining budget, its tokens are the only
ones the mask allows, so the output ends inside the grammar, reported as finish_reason "length"
(`closed`). TIDEGATE_GRAMMAR_CLOSE=off turns it off (for an A/B measurement).

The bitmask is llguidance's (and XGrammar's) layout: int32 [rows, ceil(V / 32)], bit j of word w
allows token 32 w + j. `apply_token_bitmask` expands it on the logits' device with torch ops
(the same code on the CPU and on CUDA; the CPU test checks it against a per-token loop).
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property

import numpy as np
import torch

from proto import tidegate_pb2 as pb
from proto.sampling import from_wire
from tokenizer.grammar import GrammarCompiler, GrammarError, GrammarSpec, load_tokenizer
from tokenizer.grammar_close import Closer

log = logging.getLogger("tidegate.backend.grammar")
CLOSE_WINDOW = 96  # tokens before the budget's end from which a closing completion is sought
CLOSE_MARGIN = 4  # forced once the completion + this + half of it fills the remaining budget
CLOSE_MAX_TOKENS = 256  # longest completion searched for


def spec_from_wire(sampling: pb.SamplingParams) -> GrammarSpec | None:
    """The request's grammar; None when unset or of a kind this build does not know (read as
    NONE, the wire's rule for unknown enum values): proto.sampling.from_wire's reading."""
    return from_wire(sampling, GrammarSpec).grammar


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor,
                        bitmask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] with -inf at the tokens `bitmask` [G, W] int32 forbids in rows `rows` [G]
    (out of place; the other rows are untouched)."""
    sub = masked_logits(logits.index_select(0, rows), bitmask)
    return logits.index_copy(0, rows, sub)


def masked_logits(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [G, V] with -inf where `bitmask` [G, W] int32 (row for row) has a 0 bit."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1                    # [G, W, 32]
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()  # [G, V]
    if allowed.shape[1] < vocab:  # a mask narrower than the logits allows none of the rest
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    return logits.masked_fill(~allowed, float("-inf"))


class RequestGrammar:
    """One request's matcher (ready once its grammar is compiled) and the tokens it took."""

    __slots__ = ("_closer", "_forced", "_future", "_next_check", "_plan_len", "budget", "closed",
                 "error", "spec")

    def __init__(self, spec: GrammarSpec, future: Future, budget: int | None = None,
                 closer=None) -> None:
        """`budget`: the tokens the request may write (max_tokens), None: no closing;
        `closer`: a callable giving the vocabulary's tokenizer.grammar_close.Closer."""
        self.spec = spec
        self._future = future
        self.error: str | None = None
        self.budget = budget
        self._closer = closer
        self._forced: list[int] = []  # the closing completion still to write
        self._plan_len: int | None = None  # the last completion's length
        self._next_check = CLOSE_WINDOW  # look for a completion once budget <= this
        self.closed = False  # a closing completion was forced

    def matcher(self):
        """The llguidance matcher (waits for the compile); None if the grammar failed."""
        if self.error is not None:
            return None
        try:
            return self._future.result()
        except GrammarError as exc:
            self.error = str(exc)
            log.warning("grammar failed to compile (%s): the request ends at once", exc)
            return None

    def valid_prefix(self, tokens) -> int:
        """How many of `tokens` (draft tokens) the grammar accepts from its state, which is left
        as it is."""
        m = self.matcher()
        n = m.validate_tokens([int(t) for t in tokens]) if m is not None else 0
        if self.budget is not None and self.budget <= CLOSE_WINDOW:  # keep room to close
            n = 0 if self._forced else \
                min(n, max(0, self.budget - _reserve(self._plan_len or 0) - 1))
        return n

    @property
    def forced_token(self) -> int | None:
        """The only token the next step may write (closing), or None."""
        return self._forced[0] if self._forced else None

    def consume(self, tokens) -> None:
        """The tokens the request was given (each was allowed by its mask)."""
        m = self.matcher()
        if m is None:
            return
        for t in tokens:
            if not m.consume_token(int(t)):
                self.error = m.get_error() or "token rejected"
                log.warning("grammar rejected token %d: %s", t, self.error)
                return
        if self.budget is not None:
            self.budget -= len(tokens)
            if self._forced:
                if [int(t) for t in tokens] == self._forced[:len(tokens)]:
                    del self._forced[:len(tokens)]
                else:  # not what was forced (cannot happen under the mask): search again
                    self._forced = []
            if not self._forced:
                self._maybe_close(m)

    def _maybe_close(self, m) -> None:
        r = self.budget
        if r > self._next_check or r <= 0 or m.is_accepting() or m.is_error():
            return
        plan = self._closer().plan(m, CLOSE_MAX_TOKENS)
        if plan is None:  # none within the search's bounds (none this short): left as it is
            self._next_check = -1
            return
        # far from needing it, the completion's length says when to look again (every step
        # from twice its length on: the model's next tokens may lengthen it)
        self._plan_len, self._next_check = len(plan), 2 * len(plan) + 8
        if _reserve(len(plan)) >= r:
            self._forced, self.closed = plan, True


def _reserve(plan_len: int) -> int:
    """The budget at which a completion of `plan_len` tokens is forced: with a margin, as the
    model's next token can lengthen it (a new member opened: its key, value and comma)."""
    return plan_len + CLOSE_MARGIN + plan_len // 2


def _bases(grammars: list, drafts: list[list[int]] | None) -> list[int]:
    """Each grammar's first bitmask row: one row each, or 1 + its drafts' with drafts."""
    bases, row = [], 0
    for i in range(len(grammars)):
        bases.append(row)
        row += 1 + (len(drafts[i]) if drafts else 0)
    return bases


class StepMasks:
    """The bitmask of one step's constrained rows (int32 [R, W]): `finish()` runs once the
    mask thread's `future` (if any) is done, on the reading thread. `bases[i]`: grammar i's
    first row."""

    __slots__ = ("_finish", "_future", "_value", "bases")

    def __init__(self, future: Future | None, finish, bases: list[int] | None = None) -> None:
        self._future = future
        self._finish = finish
        self._value: np.ndarray | None = None
        self.bases = bases

    def result(self) -> np.ndarray:
        if self._value is None:
            if self._future is not None:
                self._future.result()
            self._value = self._finish()
        return self._value


class GrammarManager:
    """Compiles grammars and computes bitmasks for one engine (one vocabulary)."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 num_threads: int = 1) -> None:
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.num_threads = max(1, num_threads)
        self.width = bitmask_width(vocab_size)
        self._compile = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self.num_masked_rows = 0
        self.close_to_budget = os.environ.get("TIDEGATE_GRAMMAR_CLOSE", "on") != "off"

    # built at the first constrained request: a backend that never sees one pays nothing
    @cached_property
    def compiler(self) -> GrammarCompiler:
        return GrammarCompiler(load_tokenizer(self.tokenizer_json, self.vocab_size,
                                              self.eos_token_ids))

    @cached_property
    def _executor(self):
        from llguidance import LLExecutor

        return LLExecutor(self.num_threads)

    def start(self, spec: GrammarSpec, budget: int | None = None) -> RequestGrammar:
        """Begin compiling `spec` (or take it from the cache) for a new request that may write
        `budget` tokens (closed inside its grammar before it runs out; None: never closed)."""
        return RequestGrammar(spec, self._compile.submit(lambda: self.compiler.matcher(spec)),
                              budget if self.close_to_budget else None, lambda: self.closer)

    @cached_property
    def closer(self) -> Closer:
        return Closer(self.compiler.tokenizer)

    def submit(self, grammars: list[RequestGrammar],
               drafts: list[list[int]] | None = None) -> StepMasks:
        """Compute the next-token bitmask of each grammar on the mask thread; the caller reads
        it after the step's forward. With `drafts` (speculative decoding: grammar i's draft
        tokens this step) grammar i gets one row per position, the mask after each draft
        prefix: rows `masks.bases[i]` .. + len(drafts[i]). The matchers are gathered here, so
        the thread runs one native call that holds no GIL (a thread that needs the GIL while
        the step's Python runs waits up to the interpreter's 5 ms switch interval)."""
        self.num_masked_rows += len(grammars)
        bitmask, work, bases = self._prepare(grammars, drafts)
        future = self._masks.submit(self._fill_native, work, bitmask) if work else None
        return StepMasks(future, lambda: self._check(bitmask, work), bases)

    def later(self, grammars: list[RequestGrammar],
              drafts: list[list[int]] | None = None) -> StepMasks:
        """The bitmask computed when first read: for a step launched before the tokens its
        rows' masks depend on are read back (async scheduling)."""
        self.num_masked_rows += len(grammars)
        grammars = list(grammars)
        bases = _bases(grammars, drafts)
        return StepMasks(None, lambda: self._fill(grammars, drafts), bases)

    def _prepare(self, grammars: list[RequestGrammar], drafts: list[list[int]] | None,
                 ) -> tuple[np.ndarray, list, list[int]]:
        """The bitmask (failed grammars' rows: end-of-sequence only), the (matcher, first row,
        drafts) triples to fill, and each grammar's first row."""
        bases = _bases(grammars, drafts)
        num_rows = bases[-1] + 1 + (len(drafts[-1]) if drafts else 0) if grammars else 0
        bitmask = np.zeros((num_rows, self.width), dtype=np.int32)
        work = []
        for i, g in enumerate(grammars):
            d = list(drafts[i]) if drafts else []
            m = g.matcher()
            if m is None or m.is_error():  # a grammar that failed: only end-of-sequence is left
                bitmask[bases[i]:bases[i] + len(d) + 1] = self._eos_row
            elif g.forced_token is not None:  # closing: that token only (no drafts then)
                t = g.forced_token
                bitmask[bases[i]:bases[i] + len(d) + 1] = 0
                bitmask[bases[i], t // 32] = np.uint32(1 << (t % 32)).view(np.int32)
            else:
                work.append((m, bases[i], d))
        return bitmask, work, bases

    def _fill_native(self, work: list, bitmask: np.ndarray) -> None:
        from llguidance.numpy import (
            fill_next_token_bitmask_par,
            fill_next_token_bitmask_par_with_draft_tokens,
        )

        plain = [(m, i) for m, i, d in work if not d]
        drafted = [w for w in work if w[2]]  # (llguidance refuses an empty draft list)
        if plain:
            fill_next_token_bitmask_par(self._executor, plain, bitmask)
        if drafted:
            fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)

    def _check(self, bitmask: np.ndarray, work: list) -> np.ndarray:
        for m, i, d in work:
            if m.is_error():  # failed while computing this mask
                bitmask[i:i + len(d) + 1] = self._eos_row
        return bitmask

    def _fill(self, grammars: list[RequestGrammar],
              drafts: list[list[int]] | None = None) -> np.ndarray:
        """The bitmask of `grammars`, computed on the calling thread."""
        bitmask, work, _ = self._prepare(grammars, drafts)
        if work:
            self._fill_native(work, bitmask)
        return self._check(bitmask, work)

    @cached_property
    def _eos_row(self) -> np.ndarray:
        row = np.zeros(self.width, dtype=np.uint32)
        for e in self.eos_token_ids:
            row[e // 32] |= np.uint32(1 << (e % 32))
        return row.view(np.int32)

    def close(self) -> None:
        self._compile.shutdown(wait=False, cancel_futures=True)
        self._masks.shutdown(wait=False, cancel_futures=True)
