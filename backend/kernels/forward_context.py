"""Per-step forward metadata: one object, built by the runner, read by the attention backend.

Token layout of one step (packed, no padding between sequences; the step plan's order):

    tokens:  | decode 0 | decode 1 | ... | prefill seq 0 (q0 tokens) | prefill seq 1 | ... | pad |
             |<- num_decode_tokens ->|<------------ num_prefill_tokens ------------->|
    seqs:    | 0 .. num_decodes-1    | num_decodes .. num_seqs-1                     |

A sequence's query tokens are `query_start_loc[i] : query_start_loc[i+1]`; its context after
this step is `context_lens[i]` tokens (cached prefix + the new ones), stored in the KV pages
listed by `block_tables[i]`. The new tokens sit at the end of the context, so query token j of
sequence i has absolute position `context_lens[i] - query_len_i + j` and attends causally to
positions `<=` its own. Padding tokens (the tail of a static buffer) have slot -1: nothing is
written for them and their outputs are ignored. Decodes come first so that a decode-only step
is a prefix of the static buffers (the shape a CUDA graph replays).

With a fill buffer (int4-fp8 keys, `backend.kv.fill_slots`), sequence i's keys at positions
`fill_lo[i] .. context_lens[i] - 1` (inside its last block) are read from rows
`fill_slot[i] * block_size + position % block_size` of the buffer at full precision, and each
token whose `fill_index` is >= 0 writes its key there as well as into the pages.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    # device tensors ----------------------------------------------------------------------
    positions: torch.Tensor        # [num_tokens] int64 absolute position of each token
    slot_mapping: torch.Tensor     # [num_tokens] int64 block * block_size + offset; -1 = skip
    block_tables: torch.Tensor     # [num_seqs, max_blocks_per_seq] int32, padded with 0
    context_lens: torch.Tensor     # [num_seqs] int32 tokens of context after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32 cumulative query lengths (cu_seqlens)
    # host values (python ints / lists; no device sync needed to read them) -----------------
    num_decode_tokens: int         # == number of decode sequences (one token each; first)
    num_prefills: int              # sequences with a prefill chunk (after the decodes)
    num_prefill_tokens: int
    query_start_loc_host: list[int]
    context_lens_host: list[int]
    max_context_len: int
    block_size: int
    # the block being filled at full precision (int4 keys with a fill buffer,
    # `backend.kv.fill_slots`); None: every key read from the pages --------------------------
    fill_index: torch.Tensor | None = None  # [num_tokens] int64 fill row of each token; -1 none
    fill_slot: torch.Tensor | None = None   # [num_seqs] int32 the sequence's fill slot; -1 none
    fill_lo: torch.Tensor | None = None     # [num_seqs] int32 first position read from its slot

    @property
    def num_decodes(self) -> int:
        return self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return self.num_decode_tokens + self.num_prefills

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in this step."""
        return self.num_prefill_tokens + self.num_decode_tokens
