"""ModelRunner: a step plan's chunks -> static input buffers -> model -> sampled tokens.

The per-step inputs live in one named set of preallocated device buffers sized by
`max_num_batched_tokens` / `max_num_seqs` / `max_model_len` (the shapes CUDA graphs capture);
each step fills a prefix of them from pinned host staging arrays and runs the model on views
of that prefix. Only the rows that sample (each decode, the last chunk of a prefill) go
through the LM head and the sampler.

Greedy steps (every sampling row greedy, no logprobs, no logit processors) keep their token ids
on the device: every step path writes the argmax of each sequence row into `buffers.sampled`
and the runner queues one device->host copy of them into a pinned array (two, used in turn, so
the next step's copy never overwrites one not read yet). A step launched before the previous
step's tokens are read back (async scheduling, `backend.engine.continuous`) names, per request, the row of
`sampled` its input token is in (`gpu_src`); the step reads it there on the device
(`input_src`: -1 = the host-provided id). So the host never waits between two greedy steps.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from backend.kernels.forward_context import ForwardContext
from backend.kv.fill_slots import FillSlots
from backend.kv.pools import KVCache
from backend.model.llama import LlamaModel
from backend.runner.grammar import masked_logits
from backend.runner.sampler import Sampler
from backend.runner.step_io import Chunk, RunnerOutput, SampleSpec, logit_rows, sample_rows

TIMING_RING = 4  # steps whose timing events are kept (at most two are in flight at once)


class StaticBuffers:
    """The named input buffers (device) and their host staging twins."""

    def __init__(self, max_num_tokens: int, max_num_seqs: int, max_blocks_per_seq: int,
                 device: torch.device) -> None:
        pin = device.type == "cuda"

        def pair(shape, dtype):
            host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            return torch.zeros(shape, dtype=dtype, device=device), host

        self.input_ids, self.input_ids_host = pair(max_num_tokens, torch.int64)
        self.positions, self.positions_host = pair(max_num_tokens, torch.int64)
        self.slot_mapping, self.slot_mapping_host = pair(max_num_tokens, torch.int64)
        # one sequence row more than max_num_seqs: a padded (graph) step puts its padding
        # tokens in an extra sequence of context 0 (backend.runner.cuda_graphs)
        rows = max_num_seqs + 1
        self.block_tables, self.block_tables_host = pair((rows, max_blocks_per_seq), torch.int32)
        self.context_lens, self.context_lens_host = pair(rows, torch.int32)
        self.query_start_loc, self.query_start_loc_host = pair(rows + 1, torch.int32)
        # per sequence: the index of its last token (the row its logits come from)
        self.last_token, self.last_token_host = pair(rows, torch.int64)
        # per token: the row of `sampled` holding its id (the previous step's output, not read
        # back yet), or -1: the id in input_ids
        self.input_src, self.input_src_host = pair(max_num_tokens, torch.int64)
        self.input_src.fill_(-1)
        # per sequence row: the greedy id the last step sampled (written on the device)
        self.sampled = torch.zeros(rows, dtype=torch.int64, device=device)
        # its host copies, used in turn (a step's copy is read while the next one is queued)
        self.sampled_host = [torch.zeros(rows, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        # timing events of the last TIMING_RING greedy steps (ring index = the step's count): a
        # step's device time is the interval from its start (recorded before its input copies) to
        # its read-back copy, as the device saw it (backend.engine.continuous's launch deadline
        # needs the device time, which the host observes late when it is late itself); the
        # device's idle time before a step is the interval from the previous step's read-back
        # copy to its start, when the previous launched step was timed too (issue 32)
        self.sampled_ready = [torch.cuda.Event(enable_timing=True) if pin else None
                              for _ in range(TIMING_RING)]
        self.step_started = [torch.cuda.Event(enable_timing=True) if pin else None
                             for _ in range(TIMING_RING)]
        self._num_timed = 0  # greedy steps started so far: the next one's ring index
        self._follows_timed = [False] * TIMING_RING  # step i came right after step i - 1
        self._last_launch_timed = False
        self._start_pending = False  # a step was started and has not queued its read-back
        self._slot_ring = [-1, -1]  # read-back slot -> ring index of the step it holds
        self._next_readback = 0
        self.slot_mapping.fill_(-1)
        # the block being filled at full precision (backend.kv.fill_slots): per token its fill row
        # (-1 none), per sequence row its slot (-1 none) and first position read from it
        self.fill_index, self.fill_index_host = pair(max_num_tokens, torch.int64)
        self.fill_slot, self.fill_slot_host = pair(rows, torch.int32)
        self.fill_lo, self.fill_lo_host = pair(rows, torch.int32)
        self.fill_index.fill_(-1)
        self.fill_slot.fill_(-1)
        # CUDA: set once the last host->device copies are done; the host arrays are reused only
        # after it (a step that samples nothing never synchronizes otherwise)
        self.copy_done = torch.cuda.Event() if pin else None
        # pinned staging for small per-step inputs built on the host after a launch (the
        # structured-output masks): name -> two buffers used in turn, and which is next
        self._pin = pin
        self._staging: dict[str, list[torch.Tensor]] = {}
        self._staging_next: dict[str, int] = {}

    def stage(self, name: str, values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """`values` (a list, a NumPy array or a CPU tensor) as a tensor on `device`, copied
        without the host waiting for the device. A plain `torch.tensor(values, device=cuda)`
        copies from pageable memory, which returns only once the copy ran, after every kernel
        queued before it: called while a step runs (`mask_greedy`), it held the host for the
        whole forward (17.5 ms of a 19.7 ms step on the H200, issue 29) and the next step's
        launch with it. Here the values go through a pinned buffer of `name` (two in turn:
        a buffer is rewritten two calls later, after the step that read it was read back)."""
        src = torch.as_tensor(values, dtype=dtype)
        if not self._pin:
            return src.to(device)
        i = self._staging_next.get(name, 0)
        self._staging_next[name] = i ^ 1
        bufs = self._staging.setdefault(name, [torch.empty(0, dtype=dtype)] * 2)
        if bufs[i].numel() < src.numel() or bufs[i].dtype != dtype:
            bufs[i] = torch.empty(max(src.numel(), 2 * bufs[i].numel()), dtype=dtype,
                                  pin_memory=True)
        host = bufs[i][:src.numel()].view(src.shape)
        host.copy_(src)
        return host.to(device, non_blocking=True)

    def wait_host_free(self) -> None:
        if self.copy_done is not None:
            self.copy_done.synchronize()

    def mark_copied(self) -> None:
        if self.copy_done is not None:
            self.copy_done.record()

    def mark_step_start(self) -> None:
        """Record the start of a step whose ids will be read back (its `queue_readback` follows)."""
        i = self._num_timed % TIMING_RING
        # the step before was timed and read back (a greedy step that sampled nothing queues no
        # read-back: the device time between the two is not idle)
        self._follows_timed[i] = self._last_launch_timed and self._num_timed > 0 \
            and not self._start_pending
        self._last_launch_timed = True
        self._start_pending = True
        event = self.step_started[i]
        if event is not None:
            event.record()

    def mark_untimed_launch(self) -> None:
        """A step without timing events was launched: the next timed step's idle is unknown."""
        self._last_launch_timed = False

    def device_seconds(self, slot: int) -> float | None:
        """Device time of the step read back through `slot` (after `read_sampled`), or None."""
        i = self._slot_ring[slot]
        start, end = self.step_started[i % TIMING_RING], self.sampled_ready[i % TIMING_RING]
        if start is None or i < 0:
            return None
        return start.elapsed_time(end) / 1e3

    def device_idle_seconds(self, slot: int) -> float | None:
        """How long the device waited between the previous step's read-back copy and the start
        of the step read back through `slot` (after `read_sampled`): the host's lateness as the
        device saw it. None without timing events or when the previous launch was not timed."""
        i = self._slot_ring[slot]
        if i < 1 or self.step_started[0] is None or not self._follows_timed[i % TIMING_RING]:
            return None
        prev_end = self.sampled_ready[(i - 1) % TIMING_RING]
        return max(0.0, prev_end.elapsed_time(self.step_started[i % TIMING_RING]) / 1e3)

    def queue_readback(self, num_rows: int) -> int:
        """Queue the copy of `sampled[:num_rows]` to a pinned host array; returns its slot."""
        slot = self._next_readback
        self._next_readback ^= 1
        self.sampled_host[slot][:num_rows].copy_(self.sampled[:num_rows], non_blocking=True)
        i = self._num_timed
        self._num_timed += 1
        self._start_pending = False
        self._slot_ring[slot] = i
        if self.sampled_ready[i % TIMING_RING] is not None:
            self.sampled_ready[i % TIMING_RING].record()
        return slot

    def read_sampled(self, slot: int, num_rows: int) -> list[int]:
        """The ids a queued read-back copied (waits for that copy only)."""
        event = self.sampled_ready[self._slot_ring[slot] % TIMING_RING]
        if event is not None:
            event.synchronize()
        return self.sampled_host[slot][:num_rows].tolist()

    def device_input_ids(self, num_tokens: int) -> torch.Tensor:
        """Input ids with the device-sourced ones (`input_src` >= 0) taken from `sampled`:
        no host read, so a graph captures it."""
        src = self.input_src[:num_tokens]
        from_device = self.sampled.index_select(0, src.clamp(min=0))
        return torch.where(src >= 0, from_device, self.input_ids[:num_tokens])


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVCache, max_num_batched_tokens: int,
                 max_num_seqs: int, max_model_len: int, sampler: Sampler | None = None,
                 enforce_eager: bool = False, cuda_graph_buckets: Sequence[int] | None = None,
                 cuda_graph_token_buckets: Sequence[int] | None = None) -> None:
        self.model = model
        self.kv = kv
        self.device = model.embed_tokens.weight.device
        self.block_size = kv.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // kv.block_size)
        self.buffers = StaticBuffers(max_num_batched_tokens, max_num_seqs, self.max_blocks_per_seq,
                                     self.device)
        self.sampler = sampler or Sampler(model.config.vocab_size, self.device)
        # int4 keys with fill rows (KVCache.allocate(fill_slots=...)): which rows each
        # sequence's last block lives in
        fill = getattr(kv.k_caches[0], "fill", None) if kv.k_caches else None
        self.fill_slots = None if fill is None else FillSlots(fill.shape[0], kv.block_size)
        if self.fill_slots is not None and self.fill_slots.num_slots <= max_num_seqs:
            raise ValueError(f"{self.fill_slots.num_slots} fill slots for max_num_seqs "
                             f"{max_num_seqs}: needs more slots than sequences in a step")
        # CUDA: Triton kernels in the model and step CUDA graphs (backend.runner.serving)
        self.graphs = None
        if self.device.type == "cuda":
            from backend.runner.serving import setup_cuda_runner

            self.graphs = setup_cuda_runner(self, enforce_eager, cuda_graph_buckets,
                                            cuda_graph_token_buckets)

    # ---- inputs ----------------------------------------------------------------------------
    def prepare(self, chunks: Sequence[Chunk], pad_to: tuple[int, int] | None = None,
                gpu_src: Mapping[str, int] | None = None,
                ) -> tuple[int, ForwardContext, list[int]]:
        """Fill the static buffers for `chunks` (decodes first, then prefills, as planned).
        Returns (num_tokens, context, indices of the chunks' last tokens).

        `gpu_src[request_id]`: the row of `buffers.sampled` holding that decode's input token
        (its chunk carries a placeholder). `pad_to=(tokens, seqs)` (a captured mixed-step
        graph's shape) also fills the rows up to those sizes: padding tokens write no KV (slot -1), sit at position 0 and form one extra
        sequence of context 0 (attention gives them zero rows); the sequences after it are
        empty. `last_token` is filled for every sequence row (0 for padding)."""
        b, bs = self.buffers, self.block_size
        num_seqs = len(chunks)
        lens = [len(c.token_ids) for c in chunks]
        num_tokens = sum(lens)
        if num_tokens > self.max_num_batched_tokens or num_seqs > self.max_num_seqs:
            raise ValueError(f"step of {num_tokens} tokens / {num_seqs} seqs exceeds the runner's "
                             f"{self.max_num_batched_tokens} / {self.max_num_seqs}")
        num_decodes = 0
        for c in chunks:
            if c.is_prefill or getattr(c, "num_draft", 0):
                break
            num_decodes += 1
        if any(not c.is_prefill and not getattr(c, "num_draft", 0) for c in chunks[num_decodes:]) \
                or any(n != 1 for n in lens[:num_decodes]):
            raise ValueError("step chunks must be one-token decodes first, then verifies and "
                             "prefills")

        b.wait_host_free()
        ids = b.input_ids_host.numpy()
        pos = b.positions_host.numpy()
        slots = b.slot_mapping_host.numpy()
        tables = b.block_tables_host.numpy()
        ctx_lens = b.context_lens_host.numpy()
        qsl = b.query_start_loc_host.numpy()
        width = 1
        t = 0
        qsl[0] = 0
        fills = self.fill_slots
        if fills is not None:
            fills.begin_step()
            f_index = b.fill_index_host.numpy()
            f_slot = b.fill_slot_host.numpy()
            f_lo = b.fill_lo_host.numpy()
        for i, c in enumerate(chunks):
            n = lens[i]
            end = c.start_pos + n
            if end > self.max_model_len:
                raise ValueError(f"request {c.request_id!r} reaches position {end} > max_model_len")
            nb = -(-end // bs)
            table = np.asarray(c.block_table[:nb], dtype=np.int64)
            p = np.arange(c.start_pos, end, dtype=np.int64)
            ids[t:t + n] = c.token_ids
            pos[t:t + n] = p
            slots[t:t + n] = table[p // bs] * bs + p % bs
            tables[i, :nb] = table
            tables[i, nb:] = 0
            width = max(width, nb)
            ctx_lens[i] = end
            if fills is not None:
                slot, lo = fills.assign(c.request_id, c.start_pos, n)
                f_slot[i], f_lo[i] = slot, lo
                f_index[t:t + n] = fills.rows(slot, lo, c.start_pos, n)
            t += n
            qsl[i + 1] = t

        src = b.input_src_host.numpy()
        src[:t if pad_to is None else max(t, pad_to[0])] = -1
        if gpu_src:  # decodes are the first num_decodes tokens, one each
            for i in range(num_decodes):
                row = gpu_src.get(chunks[i].request_id)
                if row is not None:
                    src[i] = row
        rows_t, rows_s = t, num_seqs  # rows copied to the device
        if pad_to is not None:
            rows_t, rows_s = pad_to
            if rows_t < t or not num_seqs < rows_s <= self.max_num_seqs + 1:
                raise ValueError(f"cannot pad {t} tokens / {num_seqs} seqs to {pad_to}")
            ids[t:rows_t] = 0
            pos[t:rows_t] = 0
            slots[t:rows_t] = -1
            ctx_lens[num_seqs:rows_s] = 0
            if fills is not None:
                f_index[t:rows_t] = -1
                f_slot[num_seqs:rows_s] = -1
                f_lo[num_seqs:rows_s] = 0
            qsl[num_seqs + 1:rows_s + 1] = rows_t   # seq num_seqs holds every padding token
            last = b.last_token_host.numpy()
            rows = logit_rows(chunks, qsl[:num_seqs + 1].tolist())
            if len(rows) > rows_s:
                raise ValueError(f"{len(rows)} logit rows (verifies) > the graph's {rows_s}")
            last[:len(rows)] = rows
            last[len(rows):rows_s] = 0
            b.last_token[:rows_s].copy_(b.last_token_host[:rows_s], non_blocking=True)

        # host -> device into prefixes of the static buffers
        b.input_ids[:rows_t].copy_(b.input_ids_host[:rows_t], non_blocking=True)
        b.input_src[:rows_t].copy_(b.input_src_host[:rows_t], non_blocking=True)
        b.positions[:rows_t].copy_(b.positions_host[:rows_t], non_blocking=True)
        b.slot_mapping[:rows_t].copy_(b.slot_mapping_host[:rows_t], non_blocking=True)
        b.block_tables[:rows_s].copy_(b.block_tables_host[:rows_s], non_blocking=True)
        b.context_lens[:rows_s].copy_(b.context_lens_host[:rows_s], non_blocking=True)
        b.query_start_loc[:rows_s + 1].copy_(b.query_start_loc_host[:rows_s + 1], non_blocking=True)
        if fills is not None:
            b.fill_index[:rows_t].copy_(b.fill_index_host[:rows_t], non_blocking=True)
            b.fill_slot[:rows_s].copy_(b.fill_slot_host[:rows_s], non_blocking=True)
            b.fill_lo[:rows_s].copy_(b.fill_lo_host[:rows_s], non_blocking=True)
        b.mark_copied()
        qsl_list = qsl[:num_seqs + 1].tolist()
        ctx = ForwardContext(
            positions=b.positions[:t], slot_mapping=b.slot_mapping[:t],
            block_tables=b.block_tables[:num_seqs, :width], context_lens=b.context_lens[:num_seqs],
            query_start_loc=b.query_start_loc[:num_seqs + 1],
            num_decode_tokens=num_decodes, num_prefills=num_seqs - num_decodes,
            num_prefill_tokens=t - num_decodes, query_start_loc_host=qsl_list,
            context_lens_host=ctx_lens[:num_seqs].tolist(),
            max_context_len=int(ctx_lens[:num_seqs].max()) if num_seqs else 0, block_size=bs,
            **self.fill_context(t, num_seqs))
        last = [q - 1 for q in qsl_list[1:]]
        return t, ctx, last

    def fill_context(self, num_tokens: int, num_seqs: int) -> dict:
        """The ForwardContext fill fields over prefixes of the static buffers ({} without
        fill rows)."""
        if self.fill_slots is None:
            return {}
        b = self.buffers
        return {"fill_index": b.fill_index[:num_tokens], "fill_slot": b.fill_slot[:num_seqs],
                "fill_lo": b.fill_lo[:num_seqs]}

    # ---- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None = None,
                keep_logits: bool = False) -> RunnerOutput:
        """Run one step. `sampling[request_id]` is needed for every chunk with `sample` set."""
        return self.finish(self.launch(chunks, sampling, keep_logits))

    @torch.inference_mode()
    def launch(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None = None,
               keep_logits: bool = False, gpu_src: Mapping[str, int] | None = None,
               defer_readback: bool = False) -> LaunchedStep:
        """Start one step: inputs in, the model queued up to the logits. On CUDA this returns
        while the device still runs (nothing here waits for it); `finish` reads the tokens.
        On the CPU the forward pass runs here, to the end. `sampling=None`: every row greedy.
        `gpu_src`: requests whose input token is still on the device (see `prepare`).
        `defer_readback`: a greedy step's ids are not queued for the host yet: `mask_greedy`
        fixes the rows with a grammar first, then queues them (structured output)."""
        step = LaunchedStep(chunks, sampling, keep_logits)
        step.verifies = any(getattr(c, "num_draft", 0) for c in chunks)
        # a verify's targets are sampled on the host side (several rows per sequence): never
        # the device-side greedy ids of async scheduling
        step.greedy = not keep_logits and not step.verifies and (sampling is None or all(
            s.params.greedy and not s.params.logprobs and not s.params.changes_logits
            for s in sampling.values()))
        if step.greedy:
            self.buffers.mark_step_start()
        else:
            self.buffers.mark_untimed_launch()
        if self.graphs is not None:  # steps that fit a captured bucket replay a CUDA graph
            if self.graphs.can_replay(chunks):  # decode-only
                step.graph_launch = self.graphs.launch(chunks, gpu_src)
            else:
                self.graphs.forget_rows()
                tokens = self.graphs.token_bucket(chunks)
                if tokens:  # prefill chunks (+ decodes) of at most the largest token bucket
                    step.graph_launch = self.graphs.launch_mixed(chunks, tokens, gpu_src)
            if step.graph_launch is not None:
                if step.greedy and not defer_readback:  # the graph wrote its argmax ids
                    step.readback = self.buffers.queue_readback(len(chunks))
                return step
        if not chunks:
            return step
        num_tokens, ctx, last = self.prepare(chunks, gpu_src=gpu_src)
        b = self.buffers
        ids = b.device_input_ids(num_tokens) if gpu_src else b.input_ids[:num_tokens]
        hidden = self.model(ids, b.positions[:num_tokens], ctx, self.kv)
        rows = [i for i, c in enumerate(chunks) if c.sample]
        if rows:
            if step.verifies:  # every sampled position of a verify: its drafts and the one after
                index = [r for i in rows for r in range(last[i] - chunks[i].num_draft, last[i] + 1)]
            else:
                index = [last[i] for i in rows]
            row_index = torch.tensor(index, dtype=torch.long, device=self.device)
            step.logits = self.model.compute_logits(hidden.index_select(0, row_index))  # [S, V]
            if step.greedy:
                seq_rows = torch.tensor(rows, dtype=torch.long, device=self.device)
                # the CPU's max(dim).indices is argmax (first maximum on ties, documented) at a
                # third of argmax's time there ([200, 8192] fp32: 0.83 vs 2.4 ms, one thread)
                ids = step.logits.max(dim=-1).indices if self.device.type == "cpu" else \
                    step.logits.argmax(dim=-1)
                b.sampled.index_copy_(0, seq_rows, ids)
                if not defer_readback:
                    step.readback = b.queue_readback(len(chunks))
        return step

    @torch.inference_mode()
    def mask_greedy(self, step: LaunchedStep, rows: Sequence[int], bitmask) -> None:
        """Structured output on the device-greedy path: the argmax of chunks `rows` redone over
        their logits masked by `bitmask` (int32 [len(rows), ceil(V / 32)], host or device),
        written into `buffers.sampled` (where the next step reads its inputs, async scheduling),
        then the step's ids queued for the host (launched with `defer_readback`). Stream-ordered
        after the step's forward and before any later launch; the graph's logits are read in
        its static output, which only the next replay overwrites."""
        b = self.buffers
        if rows:
            if step.graph_launch is not None:  # decode and mixed graphs: logits row = chunk
                logits = step.graph_launch.captured.logits
                index = list(rows)
            else:  # eager: one logits row per sampling chunk, in chunk order
                pos = {c: j for j, c in enumerate(i for i, ch in enumerate(step.chunks)
                                                  if ch.sample)}
                logits, index = step.logits, [pos[r] for r in rows]
            # (the host must not wait here for the forward queued before: staged copies)
            n = len(rows)
            both = b.stage("mask_rows", index + list(rows), torch.long, logits.device)
            sel, out_rows = both[:n], both[n:]
            mask = bitmask if isinstance(bitmask, torch.Tensor) and bitmask.device == logits.device \
                else b.stage("mask_bits", bitmask, torch.int32, logits.device)
            ids = masked_logits(logits.index_select(0, sel), mask).argmax(dim=-1)
            b.sampled.index_copy_(0, out_rows.to(b.sampled.device), ids)
        step.readback = b.queue_readback(len(step.chunks))

    @torch.inference_mode()
    def finish(self, step: LaunchedStep) -> RunnerOutput:
        """Sample the launched step's rows and read the tokens back (waits for the device)."""
        if step.readback >= 0:  # greedy: the ids are on their way to the host already
            out = RunnerOutput()
            ids = self.buffers.read_sampled(step.readback, len(step.chunks))
            for c, tok in zip(step.chunks, ids):
                if c.sample:
                    out.token_ids[c.request_id] = tok
                    out.logprobs[c.request_id] = None
            return out
        if step.graph_launch is not None:
            return self.graphs.finish(step.graph_launch, step.chunks, step.sampling, step.keep_logits)
        out = RunnerOutput()
        if step.logits is None:
            return out
        sample_rows(self.sampler, step.logits, step.chunks, step.sampling, out)
        if step.keep_logits:
            out.logits = step.logits
        return out


class LaunchedStep:
    """A step between `ModelRunner.launch` and `ModelRunner.finish`: what finish needs, and the
    device-side results it will read (a graph replay's handle, or the sampled rows' logits)."""

    __slots__ = ("chunks", "graph_launch", "greedy", "keep_logits", "logits", "readback",
                 "sampling", "verifies")

    def __init__(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None,
                 keep_logits: bool) -> None:
        self.chunks = chunks
        self.sampling = sampling
        self.keep_logits = keep_logits
        self.graph_launch = None
        self.logits: torch.Tensor | None = None
        # every sampling row greedy: its ids are in buffers.sampled after the step (rows by
        # chunk index), the device source of the next step's inputs
        self.greedy = False
        self.readback = -1  # the read-back slot queued for those ids; -1: none
        self.verifies = False  # some chunk carries draft tokens (speculative decoding)

