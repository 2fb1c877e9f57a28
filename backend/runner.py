"""ModelRunner: a step plan's chunks -> static input buffers -> model -> sampled tokens.

The per-step inputs live in one named set of preallocated device buffers sized by
`max_num_batched_tokens` / `max_num_seqs` / `max_model_len` (the shapes CUDA graphs capture);
each step fills a prefix of them from pinned host staging arrays and runs the model on views
of that prefix. Only the rows that sample (each decode, the last chunk of a prefill) go
through the LM head and the sampler.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from backend.context import ForwardContext
from backend.kv_cache import KVCache
from backend.model import LlamaModel
from backend.sampler import Sampler, SamplingParams
from backend.step_io import Chunk, RunnerOutput, SampleSpec


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
        # tokens in an extra sequence of context 0 (backend.cuda_graphs)
        rows = max_num_seqs + 1
        self.block_tables, self.block_tables_host = pair((rows, max_blocks_per_seq), torch.int32)
        self.context_lens, self.context_lens_host = pair(rows, torch.int32)
        self.query_start_loc, self.query_start_loc_host = pair(rows + 1, torch.int32)
        # per sequence: the index of its last token (the row its logits come from)
        self.last_token, self.last_token_host = pair(rows, torch.int64)
        self.slot_mapping.fill_(-1)
        # CUDA: set once the last host->device copies are done; the host arrays are reused only
        # after it (a step that samples nothing never synchronizes otherwise)
        self.copy_done = torch.cuda.Event() if pin else None

    def wait_host_free(self) -> None:
        if self.copy_done is not None:
            self.copy_done.synchronize()

    def mark_copied(self) -> None:
        if self.copy_done is not None:
            self.copy_done.record()


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
        # CUDA: Triton kernels in the model and step CUDA graphs (backend.serving_setup)
        self.graphs = None
        if self.device.type == "cuda":
            from backend.serving_setup import setup_cuda_runner

            self.graphs = setup_cuda_runner(self, enforce_eager, cuda_graph_buckets,
                                            cuda_graph_token_buckets)

    # ---- inputs ----------------------------------------------------------------------------
    def prepare(self, chunks: Sequence[Chunk], pad_to: tuple[int, int] | None = None,
                ) -> tuple[int, ForwardContext, list[int]]:
        """Fill the static buffers for `chunks` (decodes first, then prefills, as planned).
        Returns (num_tokens, context, indices of the chunks' last tokens).

        `pad_to=(tokens, seqs)` (a captured mixed-step graph's shape) also fills the rows up to
        those sizes: padding tokens write no KV (slot -1), sit at position 0 and form one extra
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
            if c.is_prefill:
                break
            num_decodes += 1
        if any(not c.is_prefill for c in chunks[num_decodes:]) or any(n != 1 for n in lens[:num_decodes]):
            raise ValueError("step chunks must be one-token decodes first, then prefills")

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
            t += n
            qsl[i + 1] = t

        rows_t, rows_s = t, num_seqs  # rows copied to the device
        if pad_to is not None:
            rows_t, rows_s = pad_to
            if rows_t < t or not num_seqs < rows_s <= self.max_num_seqs + 1:
                raise ValueError(f"cannot pad {t} tokens / {num_seqs} seqs to {pad_to}")
            ids[t:rows_t] = 0
            pos[t:rows_t] = 0
            slots[t:rows_t] = -1
            ctx_lens[num_seqs:rows_s] = 0
            qsl[num_seqs + 1:rows_s + 1] = rows_t   # seq num_seqs holds every padding token
            last = b.last_token_host.numpy()
            last[:num_seqs] = qsl[1:num_seqs + 1] - 1
            last[num_seqs:rows_s] = 0
            b.last_token[:rows_s].copy_(b.last_token_host[:rows_s], non_blocking=True)

        # host -> device into prefixes of the static buffers
        b.input_ids[:rows_t].copy_(b.input_ids_host[:rows_t], non_blocking=True)
        b.positions[:rows_t].copy_(b.positions_host[:rows_t], non_blocking=True)
        b.slot_mapping[:rows_t].copy_(b.slot_mapping_host[:rows_t], non_blocking=True)
        b.block_tables[:rows_s].copy_(b.block_tables_host[:rows_s], non_blocking=True)
        b.context_lens[:rows_s].copy_(b.context_lens_host[:rows_s], non_blocking=True)
        b.query_start_loc[:rows_s + 1].copy_(b.query_start_loc_host[:rows_s + 1], non_blocking=True)
        b.mark_copied()
        qsl_list = qsl[:num_seqs + 1].tolist()
        ctx = ForwardContext(
            positions=b.positions[:t], slot_mapping=b.slot_mapping[:t],
            block_tables=b.block_tables[:num_seqs, :width], context_lens=b.context_lens[:num_seqs],
            query_start_loc=b.query_start_loc[:num_seqs + 1],
            num_decode_tokens=num_decodes, num_prefills=num_seqs - num_decodes,
            num_prefill_tokens=t - num_decodes, query_start_loc_host=qsl_list,
            context_lens_host=ctx_lens[:num_seqs].tolist(),
            max_context_len=int(ctx_lens[:num_seqs].max()) if num_seqs else 0, block_size=bs)
        last = [q - 1 for q in qsl_list[1:]]
        return t, ctx, last

    # ---- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None = None,
                keep_logits: bool = False) -> RunnerOutput:
        """Run one step. `sampling[request_id]` is needed for every chunk with `sample` set."""
        return self.finish(self.launch(chunks, sampling, keep_logits))

    @torch.inference_mode()
    def launch(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None = None,
               keep_logits: bool = False) -> LaunchedStep:
        """Start one step: inputs in, the model queued up to the logits. On CUDA this returns
        while the device still runs (nothing here waits for it); `finish` reads the tokens.
        On the CPU the forward pass runs here, to the end."""
        step = LaunchedStep(chunks, sampling, keep_logits)
        if self.graphs is not None:  # steps that fit a captured bucket replay a CUDA graph
            if self.graphs.can_replay(chunks):  # decode-only
                step.graph_launch = self.graphs.launch(chunks)
                return step
            self.graphs.forget_rows()
            tokens = self.graphs.token_bucket(chunks)
            if tokens:  # prefill chunks (+ decodes) of at most the largest token bucket
                step.graph_launch = self.graphs.launch_mixed(chunks, tokens)
                return step
        if not chunks:
            return step
        num_tokens, ctx, last = self.prepare(chunks)
        b = self.buffers
        hidden = self.model(b.input_ids[:num_tokens], b.positions[:num_tokens], ctx, self.kv)
        rows = [last[i] for i, c in enumerate(chunks) if c.sample]
        if rows:
            row_index = torch.tensor(rows, dtype=torch.long, device=self.device)
            step.logits = self.model.compute_logits(hidden.index_select(0, row_index))  # [S, V]
        return step

    @torch.inference_mode()
    def finish(self, step: LaunchedStep) -> RunnerOutput:
        """Sample the launched step's rows and read the tokens back (waits for the device)."""
        if step.graph_launch is not None:
            return self.graphs.finish(step.graph_launch, step.chunks, step.sampling, step.keep_logits)
        out = RunnerOutput()
        if step.logits is None:
            return out
        sampled = [c for c in step.chunks if c.sample]
        sampling = step.sampling
        specs = [sampling[c.request_id] for c in sampled] if sampling is not None else \
            [SampleSpec(SamplingParams(), 0, 0) for _ in sampled]
        ids, logprobs = self.sampler.sample_specs(step.logits, specs)
        for c, tok, lp in zip(sampled, ids, logprobs):
            out.token_ids[c.request_id] = tok
            out.logprobs[c.request_id] = lp
        if step.keep_logits:
            out.logits = step.logits
        return out


class LaunchedStep:
    """A step between `ModelRunner.launch` and `ModelRunner.finish`: what finish needs, and the
    device-side results it will read (a graph replay's handle, or the sampled rows' logits)."""

    __slots__ = ("chunks", "graph_launch", "keep_logits", "logits", "sampling")

    def __init__(self, chunks: Sequence[Chunk], sampling: Mapping[str, SampleSpec] | None,
                 keep_logits: bool) -> None:
        self.chunks = chunks
        self.sampling = sampling
        self.keep_logits = keep_logits
        self.graph_launch = None
        self.logits: torch.Tensor | None = None
