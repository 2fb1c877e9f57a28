"""Lazy decode accounting for `StepScheduler`, and a stretch of pure decode steps in one call.

Every running decoding sequence advances one token per step, so the scheduler keeps, per
decoding sequence, only an offset against its `DecodeClock` (scheduler.sequence) and two keys:

    boundary_step   the clock step whose slot starts a new KV block: at the schedule() made at
                    that step it gets a block; at the update() that reaches it, its last block
                    has just filled and is registered in the prefix cache
    finish_step     the clock step at which (after update) it has max_tokens outputs or
                    max_model_len tokens, and finishes by length

held in dicts keyed by step (``boundaries``, ``finishing``; a heap of finishing keys). Work per
step is O(sequences due at that step), always applied in plan order: (queue class of the
remaining tokens at that step's schedule, priority, arrival, admission). A sequence that leaves
decoding (finish, preemption, abort) is taken out of both dicts at once, so they hold no stale
entries. The block manager's slot count of a decoding sequence is only refreshed by
`sync_slot_counts` (check_integrity, stats) and by a listed schedule(); its block tables, free
list, prefix cache and counters are always exact.

Assumption: the scheduler never forks, so a decoding sequence's last partly filled block is
private and a decode never needs a copy-on-write.

`max_pure_decode_steps(s)` is the largest k such that the next k `schedule()` calls would each
plan exactly one decode for every running sequence and nothing else:

* at least one running sequence and none prefilling;
* the pool covers the blocks the k steps start (the boundary buckets of the next k steps);
* no waiting request is admitted: none waits, or the running set or the token budget is full
  (they stay full), or the head cannot be allocated now. Free blocks only shrink during the
  stretch, but a running sequence registering a new cached block could extend the head's prefix
  hit; k stops at the first step where a running sequence whose hash chain agrees with the
  head's registers its next block;
* no sequence finishes before step k (the next finishing key); the k-th step may finish some.
  With `past_finishes` and nobody waiting, finishes do not end the stretch (a finish only frees
  blocks and a running slot, which matter to no one when nothing waits): k is then bounded by the
  last finishing key (all decoding sequences done) and by `max_steps`.

`advance_decode_steps(s, k, token_id)` replays those k steps' allocations, registrations and
finishes in the order single steps make them: O(k + events), not O(k * running).
"""
from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING

from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step_plan import FinishedSequence, StepPlan

if TYPE_CHECKING:
    from scheduler.step_scheduler import StepScheduler

RUNNING = SequenceStatus.RUNNING


def plan_key(seq: Sequence, step: int, bounds: tuple[int, int]) -> tuple:
    """A decode's position in the plan of the step scheduled at clock `step`."""
    remaining = seq.max_tokens + seq.num_prompt_tokens - 1 - seq._computed - step
    cls = 0 if remaining <= bounds[0] else 1 if remaining <= bounds[1] else 2
    return (cls, seq.rank)


def join_decoding(s: StepScheduler, seq: Sequence, step: int) -> None:
    """`seq` sampled its first token after a (re)prefill at the update that reached `step`."""
    computed = seq._computed
    seq._computed = computed - step
    seq.decoding = True
    s.num_decoding += 1
    s.offset_sum += computed - step
    bucket_step = step + (-computed) % s.config.block_size
    seq.boundary_step = bucket_step
    bucket = s.boundaries.get(bucket_step)
    if bucket is None:
        s.boundaries[bucket_step] = bucket = {}
    bucket[seq] = None
    # len(token_ids) == computed + 1 now and grows by one per step
    finish = step + min(seq.max_tokens + seq.num_prompt_tokens, s.config.max_model_len) - computed - 1
    seq.finish_step = finish
    bucket = s.finishing.get(finish)
    if bucket is None:
        s.finishing[finish] = bucket = {}
        heappush(s.finish_heap, finish)
    bucket[seq] = None


def leave_decoding(s: StepScheduler, seq: Sequence) -> None:
    """Back to an absolute count (finish, preemption, abort), tokens filled in."""
    seq.token_ids  # noqa: B018 -- fills in unlisted decodes
    for buckets, key in ((s.boundaries, seq.boundary_step), (s.finishing, seq.finish_step)):
        bucket = buckets.get(key)
        if bucket is not None and bucket.pop(seq, 0) is None and not bucket:
            del buckets[key]
    s.num_decoding -= 1
    s.offset_sum -= seq._computed
    seq._computed += s.clock.step
    seq.decoding = False


def allocate_due(s: StepScheduler, due: dict[Sequence, None], step: int, plan: StepPlan) -> None:
    """schedule() at clock `step`: a block for each due decode in plan order (preempting when
    the pool is short), then its next boundary is one block later.

    When the pool covers every due decode nobody is preempted, and which of the taken blocks goes
    to which sequence changes nothing but the block ids (the same blocks leave the free list in
    the same order, the same keys are evicted): the blocks are taken in one batch and handed out in
    bucket order, with no plan-order sort. `due` itself (popped by the caller) becomes the next
    bucket when there is none yet."""
    bm = s.block_manager
    nxt = step + s.config.block_size
    bucket = s.boundaries.get(nxt)
    if len(due) <= len(bm._free_uncached) + len(bm._free_cached):  # bm.num_free_blocks
        tables, num_tokens = bm._tables, bm._num_tokens
        n = step + 1
        for seq, block in zip(due, bm._take_blocks(len(due))):
            rid = seq.request_id
            tables[rid].append(block)
            num_tokens[rid] = seq._computed + n
            seq.boundary_step = nxt
        if bucket is None:
            s.boundaries[nxt] = due
        else:
            bucket.update(due)
        return
    seqs = list(due)
    bounds = s.config.class_bounds
    seqs.sort(key=lambda q: plan_key(q, step, bounds))
    for seq in seqs:
        if seq.status is not RUNNING:
            continue  # preempted as a victim for an earlier decode
        if not bm.num_free_blocks and not s.preempt_for(seq, plan):
            continue
        bm._append_block(seq.request_id, seq._computed + step + 1)
        seq.boundary_step = nxt
        if bucket is None:
            s.boundaries[nxt] = bucket = {}
        bucket[seq] = None


def update_due(s: StepScheduler, step: int, stopped, finished: list[FinishedSequence]) -> None:
    """update() of an unlisted-decode step, now at clock `step`: registrations of blocks that
    just filled, stop tokens and length finishes, in plan order."""
    reg = s.boundaries.get(step) if s.block_manager.enable_prefix_caching else None
    fin = s.finishing.pop(step, None)
    stop = None
    if stopped:
        get = s.requests.get
        stop = {q for q in map(get, stopped) if q is not None and q.decoding}
    if not (reg or fin or stop):
        return
    if stop or (reg and fin):
        seqs = set(reg or ()) | set(fin or ()) | (stop or set())
    else:
        seqs = reg or fin
    bounds = s.config.class_bounds
    order = sorted(seqs, key=lambda q: plan_key(q, step - 1, bounds)) if len(seqs) > 1 else seqs
    bm = s.block_manager
    for seq in order:
        if reg and seq in reg:
            bm.cache_blocks(seq.request_id, seq.token_ids, seq._computed + step)
        if stop and seq in stop:
            finished.append(s._finish(seq, "stop"))
        elif fin and seq in fin:
            finished.append(s._finish(seq, "length"))


def set_fill_token(s: StepScheduler, token: int) -> None:
    if token != s.clock.fill_token:
        for seq in s.running:
            seq.token_ids  # noqa: B018 -- fill in with the old token first
        s.clock.fill_token = token


def sync_slot_counts(s: StepScheduler) -> None:
    """Bring the block manager's slot count of every decoding sequence up to date."""
    num_tokens, step = s.block_manager._num_tokens, s.clock.step
    for seq in s.running:
        if seq.decoding:
            num_tokens[seq.request_id] = seq._computed + step


def check_buckets(s: StepScheduler) -> None:
    step, bs = s.clock.step, s.config.block_size
    decoding = [q for q in s.running if q.decoding]
    assert len(decoding) == s.num_decoding, "decoding count"
    assert sum(q._computed for q in decoding) == s.offset_sum, "offset sum"
    assert sum(map(len, s.boundaries.values())) == len(decoding), "boundary buckets"
    assert sum(map(len, s.finishing.values())) == len(decoding), "finishing buckets"
    assert set(s.finishing) <= set(s.finish_heap), "finishing key missing from the heap"
    for q in decoding:
        b, f = q.boundary_step, q.finish_step
        assert q in s.boundaries[b] and step <= b < step + bs, f"{q.request_id!r}: boundary {b}"
        assert (q._computed + b) % bs == 0, f"{q.request_id!r}: boundary not at a block start"
        assert q in s.finishing[f] and f > step, f"{q.request_id!r}: finish step {f}"


def _head_hit_limit(s: StepScheduler, limit: int) -> int:
    """Cap `limit` so that no registration can extend the waiting head's prefix hit."""
    bm, bs = s.block_manager, s.config.block_size
    if not bm.enable_prefix_caching:
        return limit
    tokens = s.waiting[0]._token_ids
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


def max_pure_decode_steps(s: StepScheduler, past_finishes: bool = False,
                          max_steps: int | None = None) -> int:
    running, cfg, bm = s.running, s.config, s.block_manager
    if not running or s.prefilling:
        return 0
    step = s.clock.step
    heap, finishing = s.finish_heap, s.finishing
    while heap and heap[0] not in finishing:
        heappop(heap)
    # decoding sequences always finish
    limit = (max(finishing) if past_finishes and not s.waiting else heap[0]) - step
    limit = min(cfg.max_model_len, limit)
    if max_steps is not None and max_steps < limit:
        limit = max_steps
    if s.waiting and len(running) < cfg.max_num_seqs and cfg.max_num_batched_tokens > len(running):
        if bm.can_allocate(s.waiting[0]._token_ids):
            return 0
        limit = _head_hit_limit(s, limit)
    num_free = bm.num_free_blocks
    if s.num_decoding * -(-limit // cfg.block_size) <= num_free:
        return max(limit, 0)
    # every decoding sequence has its next boundary in [step, step + bs), then one each bs steps
    need = k = 0
    get, bs = s.boundaries.get, cfg.block_size
    while k < limit:
        bucket = get(step + k % bs)
        if bucket:
            need += len(bucket)
            if need > num_free:
                break
        k += 1
    return k


def advance_decode_steps(s: StepScheduler, num_steps: int, token_id: int = 0,
                         past_finishes: bool = False) -> list[FinishedSequence]:
    """Apply `num_steps` pure decode steps; raises ValueError past max_pure_decode_steps().
    Finished sequences come in the order single steps finish them (step, then plan order)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    allowed = max_pure_decode_steps(s, past_finishes, num_steps)
    if num_steps > allowed:
        raise ValueError(f"cannot advance {num_steps} pure decode steps; at most {allowed}")
    set_fill_token(s, token_id)
    clock, boundaries = s.clock, s.boundaries
    plan = StepPlan()  # never used: the pool covers every block (checked above)
    finished: list[FinishedSequence] = []
    for _ in range(num_steps):
        step = clock.step
        due = boundaries.pop(step, None)
        if due:
            allocate_due(s, due, step, plan)
        clock.step = step + 1
        update_due(s, step + 1, (), finished)
    s.num_steps += num_steps
    return finished
