"""Advance a stretch of pure decode steps in one call (for the simulator).

`max_pure_decode_steps(s)` is the largest k such that the next k `schedule()` calls would each
plan exactly one decode for every running sequence and nothing else, which holds when

* there is at least one running sequence and none is prefilling;
* no running sequence's last block is shared and partly filled (its next append would be a
  copy-on-write, which the plan must report);
* the pool covers every block the k steps take: sum over sequences of the blocks their next k
  slots start, <= free blocks (so no preemption);
* no waiting request is admitted: either there is none, or the running set or the token budget
  is full (they stay full), or the head of the queue cannot be allocated now. Free blocks only
  shrink during the stretch, but a running sequence registering a new cached block could extend
  the head's prefix hit; k stops at the first step where a running sequence whose hash chain
  agrees with the head's registers its next block (only the same prefix can extend a hit);
* no sequence finishes before step k: k <= min(max_tokens - generated, max_model_len - length).
  The k-th step may finish sequences (by length); their records are returned.

Stop tokens are the engine's business and do not occur: every step samples `token_id`.

`advance_decode_steps(s, k, token_id)` replays the k steps' block-manager calls in the order the
single steps make them, so block tables, the free list (LRU order), the prefix cache and every
counter end up identical: within step t, allocations in plan order (queue class of the
remaining tokens *at step t*, then priority, arrival, admission), then, in the same order,
registration of newly full blocks and, on the last step, finishing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.sequence import SequenceStatus
from scheduler.step_plan import FinishedSequence

if TYPE_CHECKING:
    from scheduler.step_scheduler import StepScheduler

_ALLOC, _AFTER = 0, 1  # phases within one step: schedule() allocations, then update()


def _blocks_started(num_computed: int, num_steps: int, bs: int) -> int:
    """Blocks a decoding sequence with `num_computed` slots starts in its next `num_steps` slots."""
    return (num_computed + num_steps - 1) // bs - (num_computed - 1) // bs


def _head_hit_limit(s: StepScheduler, limit: int) -> int:
    """Cap `limit` so that no registration can extend the waiting head's prefix hit."""
    bm, bs = s.block_manager, s.config.block_size
    if not bm.enable_prefix_caching:
        return limit
    tokens = s.waiting[0].token_ids
    num_usable = (len(tokens) - 1) // bs  # blocks a hit may cover
    matched, chain = bm._match(tokens)
    num_matched = len(matched)
    if num_matched >= num_usable:
        return limit
    for seq in s.running:
        hashes = bm._hashes[seq.request_id]
        j = len(hashes)
        if j <= num_matched and (j == 0 or hashes[j - 1] == chain[j - 1]):
            limit = min(limit, (j + 1) * bs - seq.num_computed_tokens)
    return limit


def max_pure_decode_steps(s: StepScheduler) -> int:
    running, cfg, bm = s.running, s.config, s.block_manager
    if not running:
        return 0
    bs = cfg.block_size
    limit = cfg.max_model_len  # no stretch is longer than a sequence can grow
    for seq in running:
        if seq.num_computed_tokens < seq.num_prefill_tokens:
            return 0
        n = seq.num_computed_tokens
        if n % bs and bm.ref_count(bm.block_table(seq.request_id)[-1]) > 1:
            return 0  # copy-on-write on the next append
        limit = min(limit, seq.max_tokens - seq.num_output_tokens,
                    cfg.max_model_len - len(seq.token_ids))
    if s.waiting and len(running) < cfg.max_num_seqs and cfg.max_num_batched_tokens > len(running):
        if bm.can_allocate(s.waiting[0].token_ids):
            return 0
        limit = _head_hit_limit(s, limit)
    num_free = bm.num_free_blocks
    computed = [seq.num_computed_tokens for seq in running]
    if sum(_blocks_started(n, limit, bs) for n in computed) <= num_free:
        return max(limit, 0)
    lo, hi = 0, limit  # need(lo) <= free < need(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sum(_blocks_started(n, mid, bs) for n in computed) <= num_free:
            lo = mid
        else:
            hi = mid
    return lo


def advance_decode_steps(s: StepScheduler, num_steps: int, token_id: int = 0) -> list[FinishedSequence]:
    """Apply `num_steps` pure decode steps; raises ValueError past max_pure_decode_steps()."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    allowed = max_pure_decode_steps(s)
    if num_steps > allowed:
        raise ValueError(f"cannot advance {num_steps} pure decode steps; at most {allowed}")
    bm, cfg, running = s.block_manager, s.config, s.running
    bs, k, num = cfg.block_size, num_steps, len(running)
    fast_max, normal_max = cfg.class_bounds
    caching = bm.enable_prefix_caching
    # One int per event, sorting as (step, phase, class at that step, index in running, what);
    # running is in (priority, arrival, admission) order, so the index stands for that tail.
    events: list[int] = []
    push = events.append
    for idx, seq in enumerate(running):
        n = seq.num_computed_tokens
        rem = seq.max_tokens - len(seq.token_ids) + seq.num_prompt_tokens
        for t in range((-n) % bs, k, bs):  # steps whose slot starts a block
            cls = 0 if rem - t <= fast_max else 1 if rem - t <= normal_max else 2
            push((((t * 2 + _ALLOC) * 3 + cls) * num + idx) * 2)
        if caching:  # without the cache, update()'s registrations do nothing
            for t in range((-n - 1) % bs, k, bs):  # steps after which a block is full
                cls = 0 if rem - t <= fast_max else 1 if rem - t <= normal_max else 2
                push((((t * 2 + _AFTER) * 3 + cls) * num + idx) * 2)
        if rem == k or cfg.max_model_len - len(seq.token_ids) == k:
            t = k - 1
            cls = 0 if rem - t <= fast_max else 1 if rem - t <= normal_max else 2
            push((((t * 2 + _AFTER) * 3 + cls) * num + idx) * 2 + 1)
    events.sort()

    dummy = [token_id] * k
    for seq in running:
        seq.token_ids.extend(dummy)
    finished: list[FinishedSequence] = []
    for e in events:
        finish = e & 1
        step_phase, idx = divmod(e >> 1, num)
        step_phase //= 3
        seq = running[idx]
        rid = seq.request_id
        target = seq.num_computed_tokens + (step_phase >> 1) + 1  # computed after that step
        if finish:
            seq.num_computed_tokens += k
            finished.append(s._finish(seq, "length"))
        elif step_phase & 1:
            bm.cache_blocks(rid, seq.token_ids, target)
        else:  # the slot at position target - 1 starts a block; room was checked above
            bm._append_block(rid, target)
    for seq in running:
        if seq.status is SequenceStatus.RUNNING:
            seq.num_computed_tokens += k
            grow = seq.num_computed_tokens - bm.num_tokens(seq.request_id)
            if grow:
                bm.append_slots(seq.request_id, grow)
    if finished:
        s.running = [x for x in running if x.status is SequenceStatus.RUNNING]
    s.num_steps += k
    return finished
