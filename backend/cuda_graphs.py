"""CUDA-graph decode: one captured graph per batch-size bucket, replayed on padded batches.

A graph runner from outside the model (the model and the eager runner know nothing of it). The
runner hands a step here first (`try_execute`); a decode-only step of at most the largest bucket
replays the graph of the smallest bucket >= its batch size, anything else runs eagerly.

Static inputs: one pinned host array and its device twin, one row per sequence slot, so a step
is a single host->device copy of `bucket` rows (int32):

    row r:  | token id | position | slot | context len | block table (max_blocks_per_seq) |
            |    0     |    1     |  2   |      3      | 4 ...                            |

Rows [batch, bucket) are padding: context len 0 (attention writes zeros), slot -1 (nothing is
written to the KV pool), token 0 at position 0. Inside the graph the columns are cast to the
dtypes the model reads (int64 ids/positions/slots, contiguous int32 context lens), the model
runs on all `bucket` rows, then the LM head and a greedy argmax:

    packed [bucket, 4 + W] --graph--> logits [bucket, vocab] fp32, greedy ids [bucket] int64

All-greedy steps read the ids (one device->host copy, which also synchronizes); other steps
sample from the static logits with the runner's `Sampler`. Per step there is no device
allocation: one copy, one graph launch. Block-table rows are rewritten only where they changed
(a row that kept its request since the last graph step gets its new and last entries; every
eager step forgets that, since preemption re-prefills eagerly).

The pinned staging rows are rewritten by the next step only after this step synchronized (the
token read-back), so an in-flight copy never sees them change.

Graphs share one memory pool and are captured largest first. On the CPU (tests) a stand-in
"graph" re-runs the captured function on the same static buffers, which checks everything here
but the capture itself.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from backend.context import ForwardContext
from backend.sampler import SamplingParams
from backend.step_io import RunnerOutput, SampleSpec

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
NUM_WARMUPS = 2
_ID, _POS, _SLOT, _CTX, _TABLE = 0, 1, 2, 3, 4


class EagerGraph:
    """CPU stand-in for `torch.cuda.CUDAGraph`: replay re-runs the function into the same
    output tensors, reading the same static inputs."""

    def __init__(self, fn: Callable[[], tuple[torch.Tensor, ...]]) -> None:
        self.fn = fn
        self.outputs = fn()

    @torch.inference_mode()
    def replay(self) -> None:
        for dst, src in zip(self.outputs, self.fn()):
            dst.copy_(src)


@dataclass
class _Captured:
    graph: object            # torch.cuda.CUDAGraph | EagerGraph
    logits: torch.Tensor     # [bucket, vocab] fp32
    token_ids: torch.Tensor  # [bucket] int64 (greedy)


@dataclass
class Launched:
    """A replayed step whose results are not read yet."""
    captured: _Captured
    num_seqs: int


def parse_buckets(text: str | Sequence[int] | None) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_BUCKETS
    items = text.split(",") if isinstance(text, str) else text
    buckets = tuple(sorted({int(x) for x in items if str(x).strip()}))
    if not buckets or buckets[0] < 1:
        raise ValueError(f"CUDA-graph buckets must be positive integers, got {text!r}")
    return buckets


class DecodeGraphs:
    """Decode graphs for `runner` (a `backend.runner.ModelRunner`). `use_cuda_graphs=False`
    gives the CPU stand-in (tests)."""

    def __init__(self, runner, buckets: Sequence[int] | None = None,
                 use_cuda_graphs: bool | None = None) -> None:
        self.runner = runner
        self.model = runner.model
        self.device = runner.device
        self.use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None \
            else use_cuda_graphs
        self.buckets = tuple(b for b in parse_buckets(buckets) if b <= runner.max_num_seqs)
        if not self.buckets:
            raise ValueError(f"no CUDA-graph bucket fits max_num_seqs={runner.max_num_seqs}")
        self.max_bucket = self.buckets[-1]
        self.block_size = runner.block_size
        self.width = runner.max_blocks_per_seq
        self.max_model_len = runner.max_model_len
        pin = self.device.type == "cuda"
        shape = (self.max_bucket, _TABLE + self.width)
        self.packed_host = torch.zeros(shape, dtype=torch.int32, pin_memory=pin)
        self.rows = self.packed_host.numpy()
        self.packed = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.query_start_loc = torch.arange(self.max_bucket + 1, dtype=torch.int32,
                                            device=self.device)
        # bucket lookup for every batch size 1..max_bucket
        self._bucket_of = np.zeros(self.max_bucket + 1, dtype=np.int64)
        b = 0
        for n in range(1, self.max_bucket + 1):
            while self.buckets[b] < n:
                b += 1
            self._bucket_of[n] = self.buckets[b]
        self._row_req: list[str | None] = [None] * self.max_bucket  # request of each table row
        self._row_blocks = [0] * self.max_bucket                      # entries written for it
        self.graphs: dict[int, _Captured] = {}
        self._pool = None
        self.capture_s: dict[int, float] = {}

    # ---- capture ---------------------------------------------------------------------------
    def _forward(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.packed[:bucket]
        input_ids = rows[:, _ID].long()
        positions = rows[:, _POS].long()
        ctx = ForwardContext(
            positions=positions, slot_mapping=rows[:, _SLOT].long(),
            block_tables=rows[:, _TABLE:], context_lens=rows[:, _CTX].contiguous(),
            query_start_loc=self.query_start_loc[:bucket + 1],
            num_decode_tokens=bucket, num_prefills=0, num_prefill_tokens=0,
            query_start_loc_host=list(range(bucket + 1)), context_lens_host=[],
            max_context_len=self.max_model_len, block_size=self.block_size)
        hidden = self.model(input_ids, positions, ctx, self.runner.kv)   # [bucket, hidden]
        logits = self.model.compute_logits(hidden)                      # [bucket, vocab] fp32
        return logits, logits.argmax(dim=-1)

    def _fill_dummy(self, bucket: int) -> None:
        """Padding-like rows that read one token of block 0 and write nothing."""
        self.rows[:bucket, :_TABLE] = (0, 0, -1, 1)
        self.rows[:bucket, _TABLE:] = 0
        self._row_req[:bucket] = [None] * bucket
        self.packed[:bucket].copy_(self.packed_host[:bucket])

    @torch.inference_mode()
    def capture(self, bucket: int) -> float:
        """Capture (or recapture) one bucket; returns the seconds it took (warm-ups included)."""
        t0 = time.perf_counter()
        self._fill_dummy(bucket)
        if not self.use_cuda_graphs:
            graph = EagerGraph(lambda: self._forward(bucket))
            logits, ids = graph.outputs
        else:
            for _ in range(NUM_WARMUPS):  # compiles the kernels, sets up cuBLAS, outside capture
                self._forward(bucket)
            torch.cuda.synchronize(self.device)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits, ids = self._forward(bucket)
            torch.cuda.synchronize(self.device)
        self.graphs[bucket] = _Captured(graph, logits, ids)
        self.capture_s[bucket] = time.perf_counter() - t0
        return self.capture_s[bucket]

    def capture_all(self, buckets: Sequence[int] | None = None) -> float:
        """Capture every bucket (largest first, so smaller ones reuse its pool); total seconds."""
        t0 = time.perf_counter()
        for b in sorted(buckets or self.buckets, reverse=True):
            if b not in self.graphs:
                self.capture(b)
        return time.perf_counter() - t0

    def release(self) -> None:
        """Drop every graph and its memory pool (e.g. before transforming the model)."""
        self.graphs.clear()
        self._pool = None

    # ---- replay ----------------------------------------------------------------------------
    def can_replay(self, chunks: Sequence) -> bool:
        if not chunks or len(chunks) > self.max_bucket:
            return False
        for c in chunks:
            if c.is_prefill:
                return False
        return True

    def forget_rows(self) -> None:
        """Called for every eager step: block tables may have been rebuilt (preemption)."""
        self._row_req = [None] * self.max_bucket

    def _fill(self, chunks: Sequence, bucket: int) -> None:
        rows, bs = self.rows, self.block_size
        row_req, row_blocks = self._row_req, self._row_blocks
        num = len(chunks)
        ids = [0] * num
        pos = [0] * num
        for i, c in enumerate(chunks):
            p = c.start_pos
            if p >= self.max_model_len:
                raise ValueError(f"request {c.request_id!r} reaches position {p + 1} > max_model_len")
            ids[i] = c.token_ids[0]
            pos[i] = p
            nb = p // bs + 1
            table = c.block_table
            done = row_blocks[i] if row_req[i] == c.request_id else 0
            if done < nb:
                rows[i, _TABLE + done:_TABLE + nb] = table[done:nb]
            else:  # the last entry may be a fresh copy-on-write block
                rows[i, _TABLE + nb - 1] = table[nb - 1]
            row_req[i] = c.request_id
            row_blocks[i] = nb
        p = np.asarray(pos, dtype=np.int64)
        rows[:num, _ID] = ids
        rows[:num, _POS] = p
        rows[:num, _CTX] = p + 1
        blocks = rows[np.arange(num), _TABLE + p // bs].astype(np.int64)
        rows[:num, _SLOT] = blocks * bs + p % bs
        if bucket > num:
            rows[num:bucket, :_TABLE] = (0, 0, -1, 0)

    @torch.inference_mode()
    def launch(self, chunks: Sequence) -> Launched:
        """Fill the static inputs and replay (asynchronously) the step's graph."""
        num = len(chunks)
        bucket = int(self._bucket_of[num])
        captured = self.graphs.get(bucket)
        if captured is None:
            self.capture(bucket)
            captured = self.graphs[bucket]
        self._fill(chunks, bucket)
        self.packed[:bucket].copy_(self.packed_host[:bucket], non_blocking=True)
        captured.graph.replay()
        return Launched(captured, num)

    @torch.inference_mode()
    def finish(self, launched: Launched, chunks: Sequence, sampling: Mapping | None = None,
               keep_logits: bool = False):
        """Read the launched step's tokens (synchronizes) into a `RunnerOutput`."""
        out = RunnerOutput()
        num = launched.num_seqs
        cap = launched.captured
        rows = [i for i, c in enumerate(chunks) if c.sample]
        if sampling is None:  # defaults: greedy, no logprobs
            specs = None
            greedy = True
        else:
            specs = [sampling[chunks[i].request_id] for i in rows]
            greedy = all(s.params.greedy and not s.params.logprobs and not s.params.changes_logits
                         for s in specs)
        if greedy and len(rows) == num:  # the in-graph argmax: one device->host read
            ids = [c.request_id for c in chunks]
            out.token_ids = dict(zip(ids, cap.token_ids[:num].tolist()))
            out.logprobs = dict.fromkeys(ids)
            if keep_logits:
                out.logits = cap.logits[:num].clone()
            return out
        if specs is None:
            specs = [SampleSpec(SamplingParams(), 0, 0) for _ in rows]
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        logits = cap.logits[:num].index_select(0, index)
        tokens, logprobs = self.runner.sampler.sample_specs(logits, specs)
        for i, tok, lp in zip(rows, tokens, logprobs):
            rid = chunks[i].request_id
            out.token_ids[rid] = tok
            out.logprobs[rid] = lp
        if keep_logits:
            out.logits = logits
        return out

    def try_execute(self, chunks: Sequence, sampling: Mapping | None = None,
                    keep_logits: bool = False):
        """The step's `RunnerOutput` if it is a graph step, else None (run it eagerly)."""
        if not self.can_replay(chunks):
            self.forget_rows()
            return None
        return self.finish(self.launch(chunks), chunks, sampling, keep_logits)
