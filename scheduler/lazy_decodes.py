"""Lazy decode accounting for `StepScheduler`, and a stretch of pure decode steps in one call.

`LazyDecodes` owns all of it: the decode clock the sequences read, the per-step buckets, the
counts, and the lazy fields of each decoding `Sequence` (it is their only writer). The
scheduler hands it the lists it owns (running, waiting) and callbacks for preemption and
finishing, so this module never imports the scheduler.

Every running decoding sequence advances one token per step, so the scheduler keeps, per
decoding sequence, only an offset against the clock (`step`, here) and two keys:

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
`sync_slot_counts` (check_integrity, stats), listed steps included; its block tables, free list,
prefix cache and counters are always exact.

Assumption: the scheduler never forks, so a decoding sequence's last partly filled block is
private and a decode never needs a copy-on-write.

`max_pure_decode_steps(...)` is the largest k such that the next k `schedule()` calls would each
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

`StepScheduler.advance_decode_steps(k, token_id)` replays those k steps' allocations, registrations and
finishes in the order single steps make them: O(k + events), not O(k * running).
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from collections.abc import Sequence as Seq
from heapq import heappop, heappush

from scheduler.block_manager import BlockManager
from scheduler.classes import class_index
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step_plan import FinishedSequence, SchedulerConfig, StepPlan

RUNNING = SequenceStatus.RUNNING


def plan_key(seq: Sequence, step: int, bounds: tuple[int, int]) -> tuple:
    """A decode's position in the plan of the step scheduled at clock `step`."""
    remaining = seq.max_tokens + seq.num_prompt_tokens - 1 - seq._computed - step
    return (class_index(remaining, bounds), seq.rank)


class LazyDecodes:
    """The decode clock (what `Sequence.clock` points at) plus the decoding sequences' buckets."""

    __slots__ = ("block_manager", "boundaries", "config", "fill_token", "finish_heap",
                 "finishing", "num_decoding", "offset_sum", "step")

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.step = 0  # decode steps applied so far
        self.fill_token = 0  # token of decodes that were not listed (simulated steps)
        self.num_decoding = 0
        self.offset_sum = 0  # sum of _computed over decoding sequences
        self.boundaries: dict[int, dict[Sequence, None]] = {}  # step -> slot starts a block
        self.finishing: dict[int, dict[Sequence, None]] = {}  # step -> finishes by length
        self.finish_heap: list[int] = []  # keys of `finishing` (lazily cleaned)

    @property
    def num_context_tokens(self) -> int:
        """Sum of num_computed_tokens over the decoding sequences (O(1))."""
        return self.offset_sum + self.num_decoding * self.step

    def join(self, seq: Sequence, step: int) -> None:
        """`seq` sampled its first token after a (re)prefill at the update that reached `step`."""
        computed = seq._computed
        seq._computed = computed - step
        seq.decoding = True
        self.num_decoding += 1
        self.offset_sum += computed - step
        bucket_step = step + (-computed) % self.config.block_size
        seq.boundary_step = bucket_step
        bucket = self.boundaries.get(bucket_step)
        if bucket is None:
            self.boundaries[bucket_step] = bucket = {}
        bucket[seq] = None
        # len(token_ids) == computed + 1 now and grows by one per step
        finish = step + min(seq.max_tokens + seq.num_prompt_tokens,
                            self.config.max_model_len) - computed - 1
        seq.finish_step = finish
        bucket = self.finishing.get(finish)
        if bucket is None:
            self.finishing[finish] = bucket = {}
            heappush(self.finish_heap, finish)
        bucket[seq] = None

    def leave(self, seq: Sequence) -> None:
        """Back to an absolute count (finish, preemption, abort), tokens filled in."""
        seq.materialize_tokens()
        # out of its two buckets (written out twice, not looped: once per finished request)
        boundaries, key = self.boundaries, seq.boundary_step
        bucket = boundaries.get(key)
        if bucket is not None and bucket.pop(seq, 0) is None and not bucket:
            del boundaries[key]
        finishing, key = self.finishing, seq.finish_step
        bucket = finishing.get(key)
        if bucket is not None and bucket.pop(seq, 0) is None and not bucket:
            del finishing[key]
        self.num_decoding -= 1
        self.offset_sum -= seq._computed
        seq._computed += self.step
        seq.decoding = False

    def allocate_due(self, step: int, plan: StepPlan,
                     preempt_for: Callable[[Sequence, StepPlan], bool]) -> None:
        """schedule() at clock `step`: a block for each decode whose slot starts one, in plan
        order (preempting through `preempt_for` when the pool is short); its next boundary is
        then one block later.

        When the pool covers every due decode nobody is preempted, and which of the taken blocks
        goes to which sequence changes nothing but the block ids (the same blocks leave the free
        list in the same order, the same keys are evicted): the blocks are taken in one batch and
        handed out in bucket order, with no plan-order sort. The due bucket itself becomes the
        next bucket when there is none yet."""
        due = self.boundaries.pop(step, None)
        if not due:
            return
        bm = self.block_manager
        nxt = step + self.config.block_size
        bucket = self.boundaries.get(nxt)
        if len(due) <= bm.num_free_blocks:
            n = step + 1
            bm.append_block_each([q.request_id for q in due], [q._computed + n for q in due])
            for seq in due:
                seq.boundary_step = nxt
            if bucket is None:
                self.boundaries[nxt] = due
            else:
                bucket.update(due)
            return
        seqs = sorted(due, key=lambda q: plan_key(q, step, self.config.class_bounds))
        for seq in seqs:
            if seq.status is not RUNNING:
                continue  # preempted as a victim for an earlier decode
            if not bm.num_free_blocks and not preempt_for(seq, plan):
                continue
            bm.append_block(seq.request_id, seq._computed + step + 1)
            seq.boundary_step = nxt
            if bucket is None:
                self.boundaries[nxt] = bucket = {}
            bucket[seq] = None

    def allocate_until(self, end: int) -> None:
        """`allocate_due(t)` for every step t from the clock to `end` - 1, as one batch. Only when
        nothing else happens in between (no registrations, no finishes, no joins) and the pool
        covers every block (the caller checked both: a stretch of pure decode steps, prefix
        caching off, not past finishes): then the same blocks go to the same sequences in the
        same order as step by step, but the free list is read once.

        Every boundary key lies in [step, step + block_size), so the keys are distinct modulo
        block_size and stay so: bucket b gets a block at b, b + bs, ... < end, and its next
        boundary is the first of those at or past `end` (no other bucket is there)."""
        boundaries = self.boundaries
        due = [b for b in boundaries if b < end]
        if not due:
            return
        bs = self.config.block_size
        seq_ids: list[object] = []
        counts: list[int] = []
        if len(due) == 1:  # one bucket (e.g. one sequence per backend): its steps in order
            b = due[0]
            bucket = boundaries.pop(b)
            slots = range(b + 1, end + 1, bs)  # the slots after each schedule() at b, b + bs, ...
            if len(bucket) == 1:  # one sequence (one request per backend): one call
                (q,) = bucket
                self.block_manager.append_blocks(q.request_id, len(slots), q._computed + slots[-1])
            else:
                self.block_manager.append_block_each(
                    [q.request_id for q in bucket] * len(slots),
                    [q._computed + n for n in slots for q in bucket])
            nxt = b + len(slots) * bs  # the first of b, b + bs, ... at or past `end`
            for q in bucket:
                q.boundary_step = nxt
            boundaries[nxt] = bucket
            return
        due.sort()
        if end - due[0] <= bs:  # one block each (a stretch shorter than a block)
            for b in due:
                bucket = boundaries[b]
                n = b + 1  # the slots after the schedule() at clock b
                seq_ids += [q.request_id for q in bucket]
                counts += [q._computed + n for q in bucket]
        else:  # round after round, each bucket's sequences every block_size steps
            rounds = [(b, [q.request_id for q in boundaries[b]], [q._computed for q in boundaries[b]])
                      for b in due]
            for shift in range(0, end - due[0], bs):
                for b, ids, offsets in rounds:
                    n = b + shift + 1
                    if n > end:
                        break
                    seq_ids += ids
                    counts += [c + n for c in offsets]
        self.block_manager.append_block_each(seq_ids, counts)
        for b in due:
            bucket = boundaries.pop(b)
            nxt = b + -(-(end - b) // bs) * bs
            for q in bucket:
                q.boundary_step = nxt
            boundaries[nxt] = bucket

    def update_due(self, step: int, stop: Collection[Sequence] | None, finished: list,
                   finish: Callable[[Sequence, str], FinishedSequence]) -> None:
        """update() of an unlisted-decode step, now at clock `step`: registrations of blocks that
        just filled, stop tokens (`stop`: decoding sequences) and length finishes, in plan order."""
        bm = self.block_manager
        reg = self.boundaries.get(step) if bm.enable_prefix_caching else None
        fin = self.finishing.pop(step, None)
        if not (reg or fin or stop):
            return
        if stop or (reg and fin):
            seqs = set(reg or ()) | set(fin or ()) | set(stop or ())
        else:
            seqs = reg or fin
        bounds = self.config.class_bounds
        order = sorted(seqs, key=lambda q: plan_key(q, step - 1, bounds)) if len(seqs) > 1 else seqs
        for seq in order:
            if reg and seq in reg:
                bm.cache_blocks(seq.request_id, seq.materialize_tokens(), seq._computed + step)
            if stop and seq in stop:
                finished.append(finish(seq, "stop"))
            elif fin and seq in fin:
                finished.append(finish(seq, "length"))

    def next_due_step(self, end: int, registers: bool) -> int:
        """The first clock step t >= step whose schedule() (`allocate_due(t)`) or following
        update() (`update_due(t + 1)`) has work — t is a boundary, or t + 1 is a boundary and
        `registers` (prefix caching: the update registers the blocks that just filled), or t + 1
        a finishing step — or `end` when there is none before it. O(block_size + log heap): every
        boundary key lies in [step, step + block_size), finishing keys are > step."""
        step = self.step
        t = min(self.boundaries, default=end)
        if registers and t > step:
            t -= 1
        heap, finishing = self.finish_heap, self.finishing
        while heap and heap[0] not in finishing:
            heappop(heap)
        if heap and heap[0] <= t:
            t = heap[0] - 1
        return min(end, t)

    def set_fill_token(self, token: int, running: Seq[Sequence]) -> None:
        if token != self.fill_token:
            for seq in running:
                seq.materialize_tokens()  # fill in with the old token first
            self.fill_token = token

    def sync_slot_counts(self, running: Seq[Sequence]) -> None:
        """Bring the block manager's slot count of every decoding sequence up to date."""
        step = self.step
        self.block_manager.set_slot_counts({q.request_id: q._computed + step
                                            for q in running if q.decoding})

    def check(self, running: Seq[Sequence]) -> None:
        step, bs = self.step, self.config.block_size
        decoding = [q for q in running if q.decoding]
        assert len(decoding) == self.num_decoding, "decoding count"
        assert sum(q._computed for q in decoding) == self.offset_sum, "offset sum"
        assert sum(map(len, self.boundaries.values())) == len(decoding), "boundary buckets"
        assert sum(map(len, self.finishing.values())) == len(decoding), "finishing buckets"
        assert set(self.finishing) <= set(self.finish_heap), "finishing key missing from the heap"
        for q in decoding:
            b, f = q.boundary_step, q.finish_step
            assert q in self.boundaries[b] and step <= b < step + bs, f"{q.request_id!r}: boundary {b}"
            assert (q._computed + b) % bs == 0, f"{q.request_id!r}: boundary not at a block start"
            assert q in self.finishing[f] and f > step, f"{q.request_id!r}: finish step {f}"

    def _head_hit_limit(self, head: Sequence, running: Seq[Sequence], limit: int) -> int:
        """Cap `limit` so that no registration can extend the waiting head's prefix hit."""
        bm, bs = self.block_manager, self.config.block_size
        if not bm.enable_prefix_caching:
            return limit
        tokens = head._token_ids
        num_usable = (len(tokens) - 1) // bs  # blocks a hit may cover
        matched, chain = bm.match_prefix(tokens)
        num_matched = len(matched)
        if num_matched >= num_usable:
            return limit
        for seq in running:
            hashes = bm.block_hashes(seq.request_id)
            j = len(hashes)
            if j <= num_matched and (j == 0 or hashes[j - 1] == chain[j - 1]):
                limit = min(limit, (j + 1) * bs - seq.num_computed_tokens)
        return limit

    def max_pure_decode_steps(self, running: Seq[Sequence], num_prefilling: int,
                              waiting: Seq[Sequence], past_finishes: bool = False,
                              max_steps: int | None = None) -> int:
        cfg, bm = self.config, self.block_manager
        if not running or num_prefilling:
            return 0
        step = self.step
        heap, finishing = self.finish_heap, self.finishing
        while heap and heap[0] not in finishing:
            heappop(heap)
        # decoding sequences always finish
        limit = (max(finishing) if past_finishes and not waiting else heap[0]) - step
        limit = min(cfg.max_model_len, limit)
        if max_steps is not None and max_steps < limit:
            limit = max_steps
        if waiting and len(running) < cfg.max_num_seqs and cfg.max_num_batched_tokens > len(running):
            if bm.can_allocate(waiting[0]._token_ids):
                return 0
            limit = self._head_hit_limit(waiting[0], running, limit)
        num_free = bm.num_free_blocks
        if self.num_decoding * -(-limit // cfg.block_size) <= num_free:
            return max(limit, 0)
        # every decoding sequence has its next boundary in [step, step + bs), then one each bs steps
        need = k = 0
        get, bs = self.boundaries.get, cfg.block_size
        while k < limit:
            bucket = get(step + k % bs)
            if bucket:
                need += len(bucket)
                if need > num_free:
                    break
            k += 1
        return k
