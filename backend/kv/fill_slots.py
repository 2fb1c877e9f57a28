"""Which rows of the full-precision fill buffer each sequence's last block lives in.

int4 keys lose ~2% perplexity on tiny-coder; most of it comes back (+2.06% -> +1.29%, CPU
reference, BENCHMARKS "Attention sinks and the block being filled") if each query reads the
keys of its own, partly filled block at full precision. The pages keep every key's codes (a
token's int4 scales are its own, so its codes are final the moment they are written); a second
copy of the last block's keys, in the model dtype, lives in a small per-layer buffer
`QuantizedPages.fill [num_slots, block_size, Hkv, D]`. One slot per running sequence:

    fill row of position p  =  slot * block_size + p % block_size

A slot holds only the sequence's *current last block*: when the sequence crosses into a new
block its rows are overwritten from offset 0, and the previous block is read from the codes.

The runner owns the slots (nothing in the scheduler or engine knows about them). It sees each
step's chunks, so it can tell on its own when a slot's rows stop describing a sequence:

- a request seen for the first time, or whose slot was given to another since, gets a slot
  (a never-used one, else the least recently used) with `fill_from = start_pos`: positions
  before that were written by nobody into this slot (a prefix-cache hit, a swap-in), so they
  are read from the codes;
- a chunk that does not continue where the request's last chunk ended (a preempted request
  recomputed from its start, or from a cached prefix) restarts `fill_from` at its start;
  except a step back inside the block the last chunk ended in (speculative decoding: a verify's
  rejected drafts are given back and the next chunk starts after the accepted ones; the
  scheduler keeps a verify inside one block, `SchedulerConfig.draft_within_block`, so every key
  it wrote went to the slot).

Slots are never freed explicitly (the runner does not see requests finish); with more slots than
sequences in any step, the least recently used slot is never one this step uses. The buffer is
read for positions `fill_lo = max(fill_from, start of the last block)` up to the context end.
Only the tokens in the last block after the step write their key (two tokens of one chunk a
block apart would otherwise race for one row); queries earlier in a long chunk read codes for
their own block, as they would from a finished block.
"""
from __future__ import annotations

import numpy as np


class FillSlots:
    """Request id -> fill slot, and the per-step fill metadata (see the module docstring)."""

    def __init__(self, num_slots: int, block_size: int) -> None:
        if num_slots < 1:
            raise ValueError("FillSlots needs at least one slot")
        self.num_slots = num_slots
        self.block_size = block_size
        self._owner: list[str | None] = [None] * num_slots
        self._last_used = np.full(num_slots, -1, dtype=np.int64)  # step counter; -1 never
        # request id -> [slot, fill_from, next_pos]
        self._state: dict[str, list[int]] = {}
        self._step = 0

    def begin_step(self) -> None:
        self._step += 1

    def _take_slot(self) -> int:
        slot = int(np.argmin(self._last_used))
        if self._last_used[slot] == self._step:
            raise RuntimeError(f"more sequences in one step than the {self.num_slots} fill slots")
        old = self._owner[slot]
        if old is not None:
            del self._state[old]
        return slot

    def assign(self, request_id: str, start_pos: int, num_tokens: int) -> tuple[int, int]:
        """The chunk `start_pos .. start_pos + num_tokens - 1` of `request_id` in this step ->
        (slot, fill_lo): the slot its last block's keys go to, and the first position of the
        context after the step that is read from the slot."""
        st = self._state.get(request_id)
        if st is None:
            slot = self._take_slot()
            self._owner[slot] = request_id
            st = self._state[request_id] = [slot, start_pos, start_pos]
        elif st[2] != start_pos and not (
                start_pos < st[2] and start_pos // self.block_size == (st[2] - 1) // self.block_size):
            # not a continuation: the slot's rows say nothing of it. A step back inside the
            # block last written (a verify's rejected drafts given back) keeps them: rows
            # before start_pos hold that block's accepted keys
            st[1] = start_pos
        slot = st[0]
        end = start_pos + num_tokens
        st[2] = end
        self._last_used[slot] = self._step
        last_block_start = (end - 1) // self.block_size * self.block_size
        return slot, max(st[1], last_block_start)

    def rows(self, slot: int, fill_lo: int, start_pos: int, num_tokens: int) -> np.ndarray:
        """Fill rows [num_tokens] int64 of a chunk's tokens: the slot's row for tokens at
        positions >= fill_lo (the last block), -1 for the others."""
        p = np.arange(start_pos, start_pos + num_tokens, dtype=np.int64)
        return np.where(p >= fill_lo, slot * self.block_size + p % self.block_size, -1)
