"""Rank 0's step plan, sent to the other ranks, and the loop in which they follow it.

The scheduler runs once, on rank 0. Before each step runs, rank 0 broadcasts its chunks (over
the group's gloo control group: host data) and every rank then runs the same
`ModelRunner.launch` on them, so all ranks take the same path (eager, decode graph, mixed graph)
and call the same collectives in the same order. Only rank 0 samples; the logits it samples from
are the gathered ones (`TPGroup.gather_vocab`), the same on every rank.

Wire format (int64, no pickle): a header `[op, n]`, then n values. STOP ends the group; PROBE
`[tokens, repeats, graph]` times the model's all-reduce on every rank (`TPGroup.time_all_reduce`,
for `bench.engine.tensor_parallel`); COPIES `[kind, src, dst] * k` runs the host KV tier's block
copies on every rank before the step that needs them (`LeaderHostKV`); STEP:

    per chunk:  n_tokens, start_pos, request serial, flags (1 prefill | 2 sample),
                n_kept, n_new, token ids (n_tokens), new block ids (n_new)

A chunk's block table (the blocks its step reaches) is the first `n_kept` blocks the followers
already hold for that serial, then the `n_new` sent: a decode sends a block only when it starts
one, not its whole table every step. At batch 256 with 512 tokens of context that cuts the payload
from 10.0k to 1.8k ints and rank 0's host time to build it 3.0-3.9x (1.73 -> 0.57 ms on the
loaded 2-core CPU; `python -m bench.engine.tp_plan`, BENCHMARKS.md issue 19).

Request serials stand in for request ids: the decode graphs rewrite a block-table row only when
the request in it changed (`backend.runner.cuda_graphs`), so a follower needs to know "same request".
A serial is given at a request's first chunk and forgotten once it is not in a step; one that
comes back gets a new serial (and its whole table), which at worst rewrites a row that did not
need it. So does a request whose table no longer starts with what was sent (preempted and
scheduled again).
"""
from __future__ import annotations

import array
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from backend.distributed.group import TPGroup

STEP, STOP, PROBE, COPIES = 1, 2, 3, 4
_COPY_KINDS = ("d2h", "h2d")  # the host tier's copies (backend.kv.host_tier), as 0 / 1
VERDICT_WAIT_S = 1.0  # a failed collective waits this long for the watchdog to name the rank
_PREFILL, _SAMPLE = 1, 2


class RankFailure(RuntimeError):
    """Another rank of the group died or stopped answering: this backend cannot step."""


@dataclass
class FollowedChunk:
    """A chunk as a follower sees it (`backend.runner.step_io.Chunk`)."""
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    is_prefill: bool
    sample: bool


class PlanEncoder:
    """Rank 0's side of the format: serials and the block tables the followers hold."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._next = itertools.count()
        self._held: dict[str, tuple[int, list[int]]] = {}  # request id -> (serial, table sent)

    def encode(self, chunks: Sequence) -> array.array:
        # one Python list, one conversion: per-chunk array.extend calls cost 1.7x this
        out: list[int] = []
        held: dict[str, tuple[int, list[int]]] = {}
        bs, get = self.block_size, self._held.get
        for c in chunks:
            tokens, start, table, rid = c.token_ids, c.start_pos, c.block_table, c.request_id
            n = len(tokens)
            nb = -(-(start + n) // bs)
            prev = get(rid)
            if prev is not None:
                serial, sent = prev
                kept = len(sent)
                if kept <= nb and table[:kept] == sent:  # the same table, maybe grown
                    if kept < nb:
                        sent = sent + table[kept:nb]
                else:
                    prev = None
            if prev is None:
                serial, kept, sent = next(self._next), 0, table[:nb]
            held[rid] = (serial, sent)
            out += (n, start, serial, (_PREFILL if c.is_prefill else 0)
                    | (_SAMPLE if c.sample else 0), kept, nb - kept)
            out += tokens
            if kept < nb:
                out += sent[kept:nb]
        self._held = held  # forget requests that are not in this step
        return array.array("q", out)


class PlanDecoder:
    """A follower's side: the tables it holds per serial (forgotten as rank 0 forgets them)."""

    def __init__(self) -> None:
        self._tables: dict[int, list[int]] = {}

    def decode(self, values: list[int]) -> list[FollowedChunk]:
        chunks, tables, i = [], {}, 0
        while i < len(values):
            n, start, serial, flags, kept, new = values[i:i + 6]
            i += 6
            tokens = values[i:i + n]
            i += n
            table = self._tables[serial][:kept] + values[i:i + new] if kept else values[i:i + new]
            i += new
            tables[serial] = table
            chunks.append(FollowedChunk(f"r{serial}", tokens, start, table,
                                        bool(flags & _PREFILL), bool(flags & _SAMPLE)))
        self._tables = tables
        return chunks


class StepSender:
    """Rank 0's end: one header and one payload broadcast per step."""

    def __init__(self, group: TPGroup, block_size: int) -> None:
        self.group = group
        self.encoder = PlanEncoder(block_size)

    def send(self, chunks: Sequence) -> None:
        payload = self.encoder.encode(chunks)
        self.group.broadcast_ints(torch.tensor([STEP, len(payload)], dtype=torch.int64))
        if payload:
            self.group.broadcast_ints(torch.frombuffer(payload, dtype=torch.int64))

    def stop(self) -> None:
        self.group.broadcast_ints(torch.tensor([STOP, 0], dtype=torch.int64))

    def copies(self, copies: Sequence[tuple[str, int, int]]) -> None:
        payload = [x for kind, src, dst in copies for x in (_COPY_KINDS.index(kind), src, dst)]
        self.group.broadcast_ints(torch.tensor([COPIES, len(payload)], dtype=torch.int64))
        self.group.broadcast_ints(torch.tensor(payload, dtype=torch.int64))

    def probe(self, tokens: int, repeats: int, graph: bool) -> None:
        self.group.broadcast_ints(torch.tensor([PROBE, 3], dtype=torch.int64))
        self.group.broadcast_ints(torch.tensor([tokens, repeats, int(graph)], dtype=torch.int64))


def receive(group: TPGroup) -> tuple[int, list[int]]:
    """A follower's end: the next (op, payload) from rank 0."""
    header = group.broadcast_ints(torch.zeros(2, dtype=torch.int64))
    op, n = int(header[0]), int(header[1])
    if op not in (STEP, STOP, PROBE, COPIES):
        raise RankFailure(f"unknown step op {op} from rank 0")
    if not n:
        return op, []
    return op, group.broadcast_ints(torch.zeros(n, dtype=torch.int64)).tolist()


def _probe(runner, group: TPGroup, tokens: int, repeats: int, graph: bool) -> float:
    w = runner.model.embed_tokens.weight
    return group.time_all_reduce(tokens, w.shape[1], w.dtype, repeats, graph)


def follow(runner, group: TPGroup, host_kv=None) -> int:
    """Run rank 0's steps (and host-tier copies) until it stops the group; returns the number
    of steps run."""
    steps = 0
    decoder = PlanDecoder()
    while True:
        op, payload = receive(group)
        if op == STOP:
            return steps
        if op == PROBE:
            _probe(runner, group, payload[0], payload[1], bool(payload[2]))
            continue
        if op == COPIES:
            if host_kv is None:
                raise RankFailure("rank 0 sent host-tier copies to a rank without a host tier")
            host_kv.run([(_COPY_KINDS[payload[i]], payload[i + 1], payload[i + 2])
                         for i in range(0, len(payload), 3)])
            continue
        try:
            with torch.inference_mode():
                runner.launch(decoder.decode(payload))
        except ValueError as exc:
            # a step the runner refuses while preparing it, before any collective: rank 0 refused
            # the same step the same way (its worker fails those requests and carries on)
            print(f"tidegate backend: rank {group.rank}: step refused: {exc}", file=sys.stderr,
                  flush=True)
            continue
        if runner.device.type == "cuda":
            # the staging buffers are reused by the next step only after this one's copies;
            # rank 0 waits on its token read-back, a follower here
            torch.cuda.current_stream(runner.device).synchronize()
        steps += 1


class LeaderRunner:
    """Rank 0's runner: sends each step's chunks to the other ranks, then runs it. Everything
    else is the wrapped `ModelRunner`'s (attributes read and `graphs` set go through)."""

    def __init__(self, runner, group: TPGroup, failure=lambda: None) -> None:
        object.__setattr__(self, "inner", runner)
        object.__setattr__(self, "sender", StepSender(group, runner.block_size))
        # -> str | None: why a rank is gone (the watchdog's verdict), checked before each step
        object.__setattr__(self, "failure", failure)
        object.__setattr__(self, "last_send_s", 0.0)  # host time of the last plan broadcast

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.inner, name, value)

    def launch(self, chunks: Sequence, sampling=None, keep_logits: bool = False):
        reason = self.failure()
        if reason is not None:
            raise RankFailure(reason)
        try:
            t0 = time.perf_counter()
            self.sender.send(chunks)
            object.__setattr__(self, "last_send_s", time.perf_counter() - t0)
            return self.inner.launch(chunks, sampling, keep_logits)
        except RuntimeError as exc:  # a collective failed: say which rank, if it is known
            if isinstance(exc, RankFailure):
                raise
            deadline = time.monotonic() + VERDICT_WAIT_S
            while self.failure() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            raise RankFailure(self.failure() or f"tensor-parallel collective failed: "
                              f"{(str(exc).splitlines() or [''])[0]}") from exc

    def finish(self, step):
        return self.inner.finish(step)

    def execute(self, chunks: Sequence, sampling=None, keep_logits: bool = False):
        return self.finish(self.launch(chunks, sampling, keep_logits))

    def stop(self) -> None:
        self.sender.stop()

    def time_all_reduce(self, tokens: int, repeats: int = 50, graph: bool = False) -> float:
        """Seconds per all-reduce of the model's [tokens, hidden] activations, every rank
        taking part (benchmarks; not while serving)."""
        self.sender.probe(tokens, repeats, graph)
        return _probe(self.inner, self.sender.group, tokens, repeats, graph)


class LeaderHostKV:
    """Rank 0's host KV tier: each batch of block copies goes to the other ranks (which copy
    their slices of the same blocks), then runs here. Everything else is the wrapped
    `backend.kv.host_tier.HostKVCache`'s (its bandwidth is measured on rank 0 alone)."""

    def __init__(self, host_kv, sender: StepSender) -> None:
        self.inner, self.sender = host_kv, sender

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def run(self, copies) -> None:
        if copies:
            self.sender.copies(copies)
        self.inner.run(copies)
