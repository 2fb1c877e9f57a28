"""CUDA graphs for every step: decode steps bucketed by batch size, mixed steps (prefill chunks
and decodes together) bucketed by scheduled tokens. Replayed on padded inputs.

A graph runner from outside the model (the model and the eager runner know nothing of it). The
runner's `launch` asks here first (`can_replay`, then `token_bucket`) and `finish` reads back
through `finish`:

    decode-only, batch <= the largest decode bucket      -> decode graph of the smallest bucket
                                                            >= the batch (default up to 256)
    any other step of <= the largest token bucket tokens  -> mixed graph of the smallest token
                                                            bucket >= its tokens (default 1024)
    anything larger                                       -> None: the runner runs it eagerly

Both kinds run the same model code with the Triton kernels; what a graph fixes is the shapes
(tokens, sequence rows) and the attention tiling (decode: a program per sequence; mixed: a
program per BLOCK_Q tokens of a sequence, `backend.kernels.paged_attention`). Nothing the
kernels launch depends on device data, so one capture serves any contents.

Decode graphs. Static inputs: one pinned host array and its device twin, one row per sequence
slot, so a step is a single host->device copy of `bucket` rows (int32):

    row r:  | token id | position | slot | context len | block table (max_blocks_per_seq) | src |
            |    0     |    1     |  2   |      3      | 4 ...                            |     |

followed by three fill columns (fill index, fill slot, fill lo: `backend.kv.fill_slots`), used
only when the key pools keep the block being filled at full precision.

`src` >= 0: the token id is the previous step's greedy output in that row of the runner's
`buffers.sampled` (async scheduling: not read back yet), gathered inside the graph; -1: `token id`.

Rows [batch, bucket) are padding: context len 0 (attention writes zeros), slot -1 (nothing is
written to the KV pool), token 0 at position 0. Inside the graph the columns are cast to the
dtypes the model reads (int64 ids/positions/slots, contiguous int32 context lens). Block-table
rows are rewritten only where they changed (a row that kept its request since the last decode
graph step gets its new and last entries; any other step forgets that, since preemption
re-prefills).

Mixed graphs (bucket T tokens, S = min(T, max_num_seqs) + 1 sequence rows) read the runner's
own static buffers, filled by `runner.prepare(chunks, pad_to=(T, S))`: the real tokens and
sequences first, then the padding tokens as one extra sequence of context 0 (slot -1, zero
attention rows), then empty sequences. Logits are taken at each sequence row's last token
(`last_token`), so a graph's outputs are per sequence row like a decode graph's.

    inputs --graph--> logits [rows, vocab] fp32, greedy ids [rows] int64 (also copied into
                      the runner's buffers.sampled: the next step's device-side inputs)

All-greedy steps read the ids (one device->host copy, which also synchronizes); other steps
sample from the static logits with the runner's `Sampler`. Per step there is no device
allocation: host->device copies and one graph launch. The pinned staging rows are rewritten by
the next step only after this step's copies are done (token read-back or the runner's copy
event), so an in-flight copy never sees them change.

Graphs share one memory pool and are captured largest first (mixed, then decode); capture
time and the memory they took are kept (`capture_s`, `capture_mem`). On the CPU (tests) a
stand-in "graph" re-runs the captured function on the same static buffers, which checks
everything here but the capture itself.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from backend.kernels.forward_context import ForwardContext
from backend.runner.sampler import SamplingParams
from backend.runner.step_io import RunnerOutput, SampleSpec, sample_rows

# decode batch sizes; the runner drops those above max_num_seqs (256 by default)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# scheduled tokens of a mixed step. Up to ~640 tokens an eager 33B step is host-bound (~60 ms
# of launches against ~0.09 ms of GPU time per token), so that is where graphs pay most. The
# buckets go on to the default max_num_batched_tokens (2,048) so that every step the scheduler
# can plan replays a graph: an eager step of a new token count compiled Triton specializations
# on first use (a 1,501-token step took 671 ms cold vs ~180 warm on the H200), and an eager step
# has no device-side input ids (async scheduling). Above 1,024 a whole-prompt step loses flash
# SDPA (the paged kernel: 2,048-token prompt 302 vs 134 µs a layer, ~1% of a 4 x 512-token step).
# Fine steps below 128, since short prompts arriving one by one are the common mixed step.
# Dropped above max_num_batched_tokens.
# Above 512 every 64-128 tokens: a graph's matmuls run at its bucket's size, ~0.1 ms a token
# for the 33B preset, so a 512-token prompt with 20-60 decodes padded to 640 paid ~10 ms of a
# ~70 ms step (576 now), and the 256-prompt burst's 1,083-token step ~20 ms (1,152 now: ~7).
DEFAULT_TOKEN_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 576, 640, 768, 896,
                         1024, 1152, 1280, 1408, 1536, 1664, 1792, 1920, 2048)
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
    # one replay's device time right after capture, on the dummy inputs (CUDA; None for the
    # stand-in): the engine's launch deadline before a real step of this graph has been timed.
    # The dummy rows attend to nothing (a little under a real step's time; the replay may also
    # carry the graph's upload, a little over)
    device_s: float | None = None


@dataclass
class Launched:
    """A replayed step whose results are not read yet."""
    captured: _Captured
    num_seqs: int


def parse_buckets(text: str | Sequence[int] | None,
                  default: tuple[int, ...] = DEFAULT_BUCKETS) -> tuple[int, ...]:
    """"1,2,4" or a sequence -> sorted distinct positive ints; None -> `default`; "" or
    "none" -> () (no graphs of that kind)."""
    if text is None:
        return default
    if isinstance(text, str) and text.strip().lower() in ("", "none"):
        return ()
    items = text.split(",") if isinstance(text, str) else text
    buckets = tuple(sorted({int(x) for x in items if str(x).strip()}))
    if buckets and buckets[0] < 1:
        raise ValueError(f"CUDA-graph buckets must be positive integers, got {text!r}")
    return buckets


class StepGraphs:
    """Decode and mixed-step graphs for `runner` (a `backend.runner.step.ModelRunner`).
    `buckets`: decode batch sizes; `token_buckets`: mixed-step token counts (either may be
    empty). `use_cuda_graphs=False` gives the CPU stand-in (tests)."""

    def __init__(self, runner, buckets: Sequence[int] | None = None,
                 use_cuda_graphs: bool | None = None,
                 token_buckets: Sequence[int] | None = None) -> None:
        self.runner = runner
        self.model = runner.model
        self.device = runner.device
        self.use_cuda_graphs = self.device.type == "cuda" if use_cuda_graphs is None \
            else use_cuda_graphs
        self.buckets = tuple(b for b in parse_buckets(buckets) if b <= runner.max_num_seqs)
        self.token_buckets = tuple(
            t for t in parse_buckets(token_buckets, DEFAULT_TOKEN_BUCKETS)
            if t <= runner.max_num_batched_tokens)
        if not self.buckets and not self.token_buckets:
            raise ValueError(f"no CUDA-graph bucket fits max_num_seqs={runner.max_num_seqs} / "
                             f"max_num_batched_tokens={runner.max_num_batched_tokens}")
        self.max_bucket = self.buckets[-1] if self.buckets else 0
        self.max_token_bucket = self.token_buckets[-1] if self.token_buckets else 0
        self._token_bucket_of = np.zeros(self.max_token_bucket + 1, dtype=np.int64)
        b = 0
        for n in range(1, self.max_token_bucket + 1):
            while self.token_buckets[b] < n:
                b += 1
            self._token_bucket_of[n] = self.token_buckets[b]
        self.mixed_graphs: dict[int, _Captured] = {}     # token bucket -> graph
        self.mixed_capture_s: dict[int, float] = {}
        self.capture_mem: dict[str, int] = {}
        self.block_size = runner.block_size
        self.width = runner.max_blocks_per_seq
        self.max_model_len = runner.max_model_len
        pin = self.device.type == "cuda"
        self.src_col = _TABLE + self.width  # see the module docstring
        self.fill_col = self.src_col + 1    # fill index, fill slot, fill lo (3 columns)
        shape = (max(1, self.max_bucket), self.fill_col + 3)
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
        sampled = self.runner.buffers.sampled
        src = rows[:, self.src_col].long()
        input_ids = torch.where(src >= 0, sampled.index_select(0, src.clamp(min=0)),
                                rows[:, _ID].long())
        positions = rows[:, _POS].long()
        fill = {}
        if self.runner.fill_slots is not None:
            f = self.fill_col
            fill = {"fill_index": rows[:, f].long(), "fill_slot": rows[:, f + 1].contiguous(),
                    "fill_lo": rows[:, f + 2].contiguous()}
        ctx = ForwardContext(
            positions=positions, slot_mapping=rows[:, _SLOT].long(),
            block_tables=rows[:, _TABLE:self.src_col], context_lens=rows[:, _CTX].contiguous(),
            query_start_loc=self.query_start_loc[:bucket + 1],
            num_decode_tokens=bucket, num_prefills=0, num_prefill_tokens=0,
            query_start_loc_host=list(range(bucket + 1)), context_lens_host=[],
            max_context_len=self.max_model_len, block_size=self.block_size, **fill)
        hidden = self.model(input_ids, positions, ctx, self.runner.kv)   # [bucket, hidden]
        logits = self.model.compute_logits(hidden)                      # [bucket, vocab] fp32
        ids = logits.argmax(dim=-1)
        sampled[:bucket].copy_(ids)
        return logits, ids

    def _fill_dummy(self, bucket: int) -> None:
        """Padding-like rows that read one token of block 0 and write nothing."""
        self.rows[:bucket, :_TABLE] = (0, 0, -1, 1)
        self.rows[:bucket, _TABLE:] = 0
        self.rows[:bucket, self.src_col] = -1
        self.rows[:bucket, self.fill_col:self.fill_col + 2] = -1
        self._row_req[:bucket] = [None] * bucket
        self.packed[:bucket].copy_(self.packed_host[:bucket])

    @torch.inference_mode()
    def capture(self, bucket: int) -> float:
        """Capture (or recapture) one bucket; returns the seconds it took (warm-ups included)."""
        t0 = time.perf_counter()
        self.runner.buffers.wait_host_free()
        self._fill_dummy(bucket)
        with self._keep_sampled():
            self.graphs[bucket] = self._record(lambda: self._forward(bucket))
        self.capture_s[bucket] = time.perf_counter() - t0
        return self.capture_s[bucket]

    def seq_rows(self, token_bucket: int) -> int:
        """Sequence rows of a mixed graph: every sequence has >= 1 token, plus the padding one."""
        return min(token_bucket, self.runner.max_num_seqs) + 1

    def _forward_mixed(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.runner.buffers
        seqs = self.seq_rows(tokens)
        qsl, lens = b.query_start_loc[:seqs + 1], b.context_lens[:seqs]
        # host copies of the metadata only for the CPU stand-in, whose attention backends read
        # them; the Triton kernels read the device tensors alone
        cpu = self.device.type == "cpu"
        ctx = ForwardContext(
            positions=b.positions[:tokens], slot_mapping=b.slot_mapping[:tokens],
            block_tables=b.block_tables[:seqs], context_lens=lens, query_start_loc=qsl,
            num_decode_tokens=0, num_prefills=seqs, num_prefill_tokens=tokens,
            query_start_loc_host=qsl.tolist() if cpu else [],
            context_lens_host=lens.tolist() if cpu else [],
            max_context_len=self.max_model_len, block_size=self.block_size,
            **self.runner.fill_context(tokens, seqs))
        hidden = self.model(b.device_input_ids(tokens), b.positions[:tokens], ctx, self.runner.kv)
        logits = self.model.compute_logits(hidden.index_select(0, b.last_token[:seqs]))
        ids = logits.argmax(dim=-1)
        b.sampled[:seqs].copy_(ids)
        return logits, ids

    def _fill_dummy_mixed(self, tokens: int) -> None:
        """All `tokens` padding (context 0, slot -1): reads and writes no KV."""
        self.runner.prepare([], pad_to=(tokens, self.seq_rows(tokens)))

    @contextmanager
    def _keep_sampled(self):
        """A capture (its warm-ups run the model on dummy inputs) must not clobber the ids a
        step launched before it left in `buffers.sampled` for the next one (a bucket captured
        lazily while async scheduling runs)."""
        sampled = self.runner.buffers.sampled
        kept = sampled.clone()
        try:
            yield
        finally:
            sampled.copy_(kept)

    def _record(self, fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> _Captured:
        if not self.use_cuda_graphs:
            graph = EagerGraph(fn)
            return _Captured(graph, *graph.outputs)
        for _ in range(NUM_WARMUPS):  # compiles the kernels, sets up cuBLAS, outside capture
            fn()
        torch.cuda.synchronize(self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits, ids = fn()
        torch.cuda.synchronize(self.device)
        # one timed replay (the first real step's time replaces a higher estimate at once:
        # backend.engine.continuous)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return _Captured(graph, logits, ids, start.elapsed_time(end) / 1e3)

    @torch.inference_mode()
    def capture_mixed(self, tokens: int) -> float:
        """Capture (or recapture) one token bucket; returns the seconds it took."""
        t0 = time.perf_counter()
        self._fill_dummy_mixed(tokens)
        with self._keep_sampled():
            self.mixed_graphs[tokens] = self._record(lambda: self._forward_mixed(tokens))
        self.mixed_capture_s[tokens] = time.perf_counter() - t0
        return self.mixed_capture_s[tokens]

    def capture_all(self, buckets: Sequence[int] | None = None,
                    token_buckets: Sequence[int] | None = None) -> float:
        """Capture every bucket, mixed then decode, each largest first (smaller graphs reuse
        the pool the larger one grew); total seconds. `capture_mem` records the device memory
        the graphs took (free memory before - after, and the caching allocator's reserve)."""
        t0 = time.perf_counter()
        cuda = self.use_cuda_graphs
        if cuda:
            torch.cuda.synchronize(self.device)
            free0 = torch.cuda.mem_get_info(self.device)[0]
            reserved0 = torch.cuda.memory_reserved(self.device)
        for t in sorted(self.token_buckets if token_buckets is None else token_buckets,
                        reverse=True):
            if t not in self.mixed_graphs:
                self.capture_mixed(t)
        for b in sorted(self.buckets if buckets is None else buckets, reverse=True):
            if b not in self.graphs:
                self.capture(b)
        if cuda:
            self.capture_mem = {
                "free_bytes_used": free0 - torch.cuda.mem_get_info(self.device)[0],
                "reserved_bytes_added": torch.cuda.memory_reserved(self.device) - reserved0}
        return time.perf_counter() - t0

    def release(self) -> None:
        """Drop every graph and its memory pool (e.g. before transforming the model)."""
        self.graphs.clear()
        self.mixed_graphs.clear()
        self._pool = None

    # ---- replay ----------------------------------------------------------------------------
    def can_replay(self, chunks: Sequence) -> bool:
        """A decode-only step that a decode graph serves."""
        if not chunks or len(chunks) > self.max_bucket:
            return False
        for c in chunks:
            if c.is_prefill or getattr(c, "num_draft", 0):  # a verify is a mixed step
                return False
        return True

    def token_bucket(self, chunks: Sequence) -> int:
        """The mixed graph's token bucket for this step, or 0 (too many tokens: eager)."""
        if not chunks:
            return 0
        num_tokens = 0
        for c in chunks:
            num_tokens += len(c.token_ids)
        if num_tokens > self.max_token_bucket or len(chunks) > self.runner.max_num_seqs:
            return 0
        return int(self._token_bucket_of[num_tokens])

    def forget_rows(self) -> None:
        """Called for every eager step: block tables may have been rebuilt (preemption)."""
        self._row_req = [None] * self.max_bucket

    def _fill(self, chunks: Sequence, bucket: int, gpu_src: Mapping[str, int] | None = None,
              ) -> None:
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
        src = rows[:bucket, self.src_col]
        src[:] = -1
        if gpu_src:
            get = gpu_src.get
            src[:num] = [get(c.request_id, -1) for c in chunks]
        fills = self.runner.fill_slots
        if fills is not None:  # a decode's one token is always in its last block
            fills.begin_step()
            fc = self.fill_col
            for i, c in enumerate(chunks):
                slot, lo = fills.assign(c.request_id, c.start_pos, 1)
                rows[i, fc:fc + 3] = (slot * bs + c.start_pos % bs, slot, lo)
            rows[num:bucket, fc:fc + 3] = (-1, -1, 0)
        if bucket > num:
            rows[num:bucket, :_TABLE] = (0, 0, -1, 0)

    @torch.inference_mode()
    def launch(self, chunks: Sequence, gpu_src: Mapping[str, int] | None = None) -> Launched:
        """Fill the static inputs and replay (asynchronously) the step's graph. `gpu_src`:
        requests whose input id is in that row of `buffers.sampled` (async scheduling)."""
        num = len(chunks)
        bucket = int(self._bucket_of[num])
        captured = self.graphs.get(bucket)
        if captured is None:
            self.capture(bucket)
            captured = self.graphs[bucket]
        # the staging rows are reused only once the last step's copy of them is done (with
        # async scheduling that step may still be queued behind the one running)
        buffers = self.runner.buffers
        buffers.wait_host_free()
        self._fill(chunks, bucket, gpu_src)
        self.packed[:bucket].copy_(self.packed_host[:bucket], non_blocking=True)
        buffers.mark_copied()
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
        if not rows:  # a step of mid-prompt chunks: nothing to read
            return out
        if any(getattr(c, "num_draft", 0) for c in chunks):
            # a verify step (mixed graph): the logits rows are `logit_rows`' (every position
            # of a verify), sampled on the host side like any non-greedy step
            row_of, r = [], 0
            for c in chunks:
                row_of.append(r)
                r += getattr(c, "num_draft", 0) + 1
            sample_rows(self.runner.sampler, cap.logits[:r], chunks, sampling, out, row_of)
            if keep_logits:
                out.logits = cap.logits[:r].clone()
            return out
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

    @torch.inference_mode()
    def launch_mixed(self, chunks: Sequence, tokens: int,
                     gpu_src: Mapping[str, int] | None = None) -> Launched:
        """Fill the runner's static buffers padded to the bucket and replay its graph."""
        captured = self.mixed_graphs.get(tokens)
        if captured is None:
            self.capture_mixed(tokens)
            captured = self.mixed_graphs[tokens]
        self.runner.prepare(chunks, pad_to=(tokens, self.seq_rows(tokens)), gpu_src=gpu_src)
        captured.graph.replay()
        return Launched(captured, len(chunks))
