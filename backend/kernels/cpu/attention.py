"""Attention for the CPU engine: a paged kernel in C behind the model's attention seam.

`CpuAttention` has `TorchAttention`'s call signature. Per layer it writes the step's K/V rows
into their pages (one C call), then:

- a fresh prefill (a chunk that is its sequence's whole context: nothing cached) attends over
  its own q/k/v with torch's fused CPU attention (`scaled_dot_product_attention`, causal, GQA),
  one call for each run of consecutive fresh prefills of the same length; that kernel is tiled
  and uses the CPU's matrix units (AMX / AVX-512 BF16 for bf16): measured 6.5x (bf16) and 2.6x
  (fp32) faster than the paged kernel on 16 prompts of 128 tokens;
- a chunk of at least `CONTINUED_MIN_QUERY` tokens after a cached prefix (an agent's follow-up
  turn) also takes the fused attention, over its context's K/V gathered from the pages, with
  the causal mask aligned to the end (query j sees positions <= context - query_len + j): the
  paged kernel walks it one query row at a time (bf16, one layer, one thread, same process:
  the 1.3B's heads, 16 x 128 MHA, 32-1,024 tokens after 752-3,072: 7.6-17x faster, 254 after
  752 181 -> 17 ms; tiny-coder's 6 q / 2 kv x 64: 0.9x at 32 tokens, 1.4-2.8x at 64-1,024);
- every other sequence (decodes, short chunks after a cached prefix) goes to
  `cpu_kernels/paged_attention.c` in one call per run of such sequences: K/V are read in place
  from the pages, so nothing is gathered or padded, and there is no Python loop over them; on
  CPUs with AMX, bf16 runs take `paged_attention_amx.c` (the scores by tile dot products).

fp32 and bf16 (the model's dtype: q, pages and output; scores in fp32). The reference
(`backend.kernels.reference.attention`) stays the oracle and the fallback for what the kernels do
not take (other dtypes, quantized pools, no C compiler).

The kernel is built at first use for this CPU (`backend.kernels.cpu`); set
`TIDEGATE_CPU_KERNELS=off` to use the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from backend.kernels.cpu import load_library
from backend.kernels.forward_context import ForwardContext
from backend.kernels.reference.attention import TorchAttention, write_kv

I32_BYTES = 4
# a chunk after a cached prefix with at least this many query tokens takes the fused attention
CONTINUED_MIN_QUERY = 32
# the continued chunk's queries go in slices whose fp32 scores (heads x rows x keys) fit this
CONTINUED_SCORE_BYTES = 64 << 20


class CpuAttention(TorchAttention):
    """`TorchAttention` with the step's attention in C and torch's fused CPU attention."""

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        lib = load_library()
        self._lib = lib
        self._kernels = {} if lib is None else {torch.float32: lib.paged_attention_f32,
                                                torch.bfloat16: lib.paged_attention_bf16}

    @property
    def uses_kernel(self) -> bool:
        return bool(self._kernels)

    def _write_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        n = slot_mapping.shape[0]
        if (k.stride(2) != 1 or k.stride(1) != k.shape[2] or v.stride(2) != 1
                or v.stride(1) != v.shape[2] or not k_cache.is_contiguous()
                or not v_cache.is_contiguous() or slot_mapping.dtype != torch.int64
                or not slot_mapping.is_contiguous() or k.dtype != k_cache.dtype
                or v.dtype != v_cache.dtype or k.shape[0] < n):
            write_kv(k, v, k_cache, v_cache, slot_mapping)
            return
        elem = k.element_size()
        self._lib.write_kv_rows(k.data_ptr(), k.stride(0) * elem, v.data_ptr(), v.stride(0) * elem,
                                slot_mapping.data_ptr(), n, k.shape[1] * k.shape[2] * elem,
                                k_cache.data_ptr(), v_cache.data_ptr())

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        kernel = self._kernels.get(q.dtype)
        if (kernel is None or not isinstance(k_cache, torch.Tensor)
                or k_cache.dtype != q.dtype or k_cache.device.type != "cpu"):
            return super().__call__(q, k, v, k_cache, v_cache, ctx)
        self._write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        num_tokens, num_heads, head_dim = q.shape
        out = torch.empty(q.shape, dtype=q.dtype)
        n = ctx.num_tokens
        if n < num_tokens:
            out[n:].zero_()  # padding rows, as the reference
        tables = ctx.block_tables
        if tables.stride(1) != 1:
            tables = tables.contiguous()
        qsl, lens = ctx.query_start_loc_host, ctx.context_lens_host
        num_seqs = ctx.num_seqs
        i = 0
        def fused(j: int) -> bool:  # a fresh prefill, or a long chunk after a cached prefix
            n_q = qsl[j + 1] - qsl[j]
            # (a row whose context is shorter than its queries is no such chunk: padding rows
            # of context 0 stay with the paged kernel, which writes them as it always did)
            return n_q > 1 and (lens[j] == n_q or (n_q >= CONTINUED_MIN_QUERY and lens[j] > n_q))

        while i < num_seqs:
            q_len = qsl[i + 1] - qsl[i]
            fresh = q_len > 1 and lens[i] == q_len
            if not fresh and fused(i):
                self._continued_prefill(q, k_cache, v_cache, tables, out, qsl[i], q_len,
                                        lens[i], i)
                i += 1
                continue
            j = i + 1  # the run: consecutive sequences of the same kind (and fresh: same length)
            while j < num_seqs and (
                    (qsl[j + 1] - qsl[j] == q_len and lens[j] == q_len) if fresh
                    else not fused(j)):
                j += 1
            if fresh:
                self._fresh_prefills(q, k, v, out, qsl[i], j - i, q_len)
            else:
                rc = kernel(
                    q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                    tables.data_ptr() + i * tables.stride(0) * I32_BYTES, tables.stride(0),
                    ctx.query_start_loc.data_ptr() + i * I32_BYTES,
                    ctx.context_lens.data_ptr() + i * I32_BYTES, j - i, num_heads,
                    k_cache.shape[2], head_dim, k_cache.shape[1], self.scale, out.data_ptr())
                if rc != 0:
                    raise ValueError(f"CPU attention kernel refused the shapes (code {rc})")
            i = j
        return out

    def _fresh_prefills(self, q, k, v, out, start: int, num_seqs: int, q_len: int) -> None:
        """`num_seqs` prompts of `q_len` tokens from token `start`, nothing cached: causal
        attention over their own q/k/v, written into `out`."""
        end = start + num_seqs * q_len

        def heads_first(x):  # [n * L, H, D] -> [n, H, L, D] (a view)
            return x[start:end].view(num_seqs, q_len, x.shape[1], x.shape[2]).transpose(1, 2)

        o = F.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v),
                                           is_causal=True, scale=self.scale,
                                           enable_gqa=k.shape[1] != q.shape[1])
        out[start:end].view(num_seqs, q_len, q.shape[1], q.shape[2]).copy_(o.transpose(1, 2))

    def _continued_prefill(self, q, k_cache, v_cache, tables, out, start: int, q_len: int,
                           ctx_len: int, row: int) -> None:
        """Sequence `row`'s `q_len` query tokens from token `start`, the last of its `ctx_len`
        (their K/V already in the pages): its context gathered from the pages, causal from the
        end, in query slices whose scores stay under CONTINUED_SCORE_BYTES; into `out`."""
        bs = k_cache.shape[1]
        ids = tables[row, :-(-ctx_len // bs)].long()
        # [1, Hkv, L, D]: with a batch dimension torch takes its flash kernel (3-D inputs went
        # to the math path, 6-8x slower)
        kk = k_cache.index_select(0, ids).flatten(0, 1)[:ctx_len].transpose(0, 1)[None]
        vv = v_cache.index_select(0, ids).flatten(0, 1)[:ctx_len].transpose(0, 1)[None]
        off = ctx_len - q_len
        heads = q.shape[1]
        rows = max(1, CONTINUED_SCORE_BYTES // (4 * heads * ctx_len))
        keys = torch.arange(ctx_len)
        for a in range(0, q_len, rows):
            b = min(q_len, a + rows)
            n_keys = off + b  # keys past the slice's last query are masked anyway
            mask = keys[:n_keys] <= (off + torch.arange(a, b))[:, None]
            o = F.scaled_dot_product_attention(
                q[start + a:start + b].transpose(0, 1)[None], kk[:, :, :n_keys],
                vv[:, :, :n_keys], attn_mask=mask, scale=self.scale,
                enable_gqa=kk.shape[1] != heads)
            out[start + a:start + b].copy_(o[0].transpose(0, 1))
