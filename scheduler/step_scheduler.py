"""Continuous batching, one `schedule()` / `update()` pair per model step.

    plan = scheduler.schedule()           # decodes first (Fast class first), then prefill chunks
    result = runner.execute(plan)         # -> StepResult(sampled={rid: token}, stopped={rid})
    finished = scheduler.update(plan, result)

Policy, in order, each step (budget = max_num_batched_tokens tokens, max_num_seqs running):

1. Running decodes, ordered by (queue class of remaining tokens, priority, arrival, admission).
   Each needs one KV slot; when the pool is short, the running sequence with the highest such key
   (lowest class, latest arrival) that is not already in this step's plan is preempted by
   recompute: its blocks are freed and it goes to the front of the waiting queue with its tokens
   kept. It may be the decoding sequence itself. With a host tier and a `swap_cost` rule, a
   victim whose copy out and back is cheaper than its recompute is *swapped* instead: its full
   blocks are saved (pinned) in host memory and its re-admission hits them (scheduler.host_tier).
2. Running sequences still prefilling get their next chunk (all their blocks were reserved at
   admission, so they never need new ones).
3. Waiting requests in FCFS order (preempted ones at the front; `waiting_by_class`: Fast, then
   Normal, then Slow, FCFS within a class, as the echo engine admits), while the budget, max_num_seqs
   and the pool allow; none when step 1 preempted (what was just freed is not handed back).
   Admission reserves blocks for the whole prompt, reusing prefix-cache hits, and schedules a
   first chunk of at most the remaining budget (chunked prefill).
   `deadline_order` (scheduler.deadline_order): for the last free slot, the waiting request with
   the earliest TTFT deadline goes before the queue's head when it would miss its deadline
   waiting for the next slot to free (the decoding sequences' length finishes or the taker's own
   tokens, `step_s` each, from the `now` given to `schedule()`) and the head would not miss its
   own; never before a preempted sequence.

Prefill budget by backlog (`SchedulerConfig.prefill_cap`, a `PrefillCap`; off by default): while
sequences decode and the prefill backlog — prompt tokens not yet computed, of the waiting queue
and of the running prefills — is small (by default at most one full budget in at most 4
requests), steps 2 and 3 share at most `max_tokens` tokens, so a lone arrival is prefilled in chunks that each stall the
running streams for a short step (ITL) instead of one long one. A deeper backlog (a burst) gets the
whole budget: there every step re-reads the weights whatever its size, and short steps would cost
throughput. No decodes: the whole budget (nobody's next token waits for the step). Every step with
a backlog still schedules prefill tokens, so capped prompts progress every step.

Decode work is O(what changes), not O(running) (scheduler.lazy_decodes): every decoding
sequence advances one token per step, so its length is an offset against a shared step counter;
the steps at which it starts a KV block or finishes by length are known when it starts decoding
and kept in buckets keyed by step. A step allocates only for the sequences in its bucket (in plan
order), registers only the blocks that just filled, finishes only the due sequences.
`schedule()` still lists one chunk per decode for the engine (O(running), it needs the tokens);
`schedule(list_decodes=False)` leaves them implicit (`plan.num_unlisted_decodes`) for the
simulator, whose steps then cost O(prefill chunks + block boundaries + completions).

Cost (``python -m bench.scheduler.step_scheduler``; a command, not a timed test), 256 decoding sequences of
512-token prompts on the shared 2-core VM: see the step_scheduler_bench docstring for the figures.
"""
from __future__ import annotations

import logging
from bisect import insort
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from heapq import heappop

from scheduler.block_manager import BlockManager
from scheduler.capacity import PrefillCap
from scheduler.classes import class_index
from scheduler.deadline_order import UrgentQueue, promote
from scheduler.host_tier import SwapCostModel
from scheduler.lazy_decodes import LazyDecodes
from scheduler.sequence import Sequence, SequenceStatus
from scheduler.step_plan import (
    FinishedSequence,
    Rejection,
    ScheduledChunk,
    SchedulerConfig,
    SchedulerStats,
    StepPlan,
    StepResult,
)

__all__ = [
    "FinishedSequence",
    "PrefillCap",
    "Rejection",
    "ScheduledChunk",
    "SchedulerConfig",
    "SchedulerStats",
    "StepPlan",
    "StepResult",
    "StepScheduler",
]

RUNNING, WAITING, FINISHED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.FINISHED
logger = logging.getLogger("tidegate.scheduler")


class StepScheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager | None = None) -> None:
        if block_manager is None:
            block_manager = BlockManager(config.num_blocks, config.block_size,
                                         config.enable_prefix_caching, config.num_host_blocks)
        if (block_manager.num_blocks, block_manager.block_size) != (config.num_blocks,
                                                                   config.block_size):
            raise ValueError("block manager and config disagree on num_blocks / block_size")
        self.config = config
        self.block_manager = block_manager
        self.requests: dict[str, Sequence] = {}  # waiting + running
        self.waiting: deque[Sequence] = deque()
        # prompt tokens of the waiting queue (a preempted sequence's whole recompute included):
        # the prefill backlog of the budget-by-backlog rule, kept as a count so that the rule
        # costs O(running prefills) a step, not O(waiting)
        self.num_waiting_tokens = 0
        self.running: list[Sequence] = []  # sorted by Sequence.order_key
        self.num_preemptions = 0
        self.num_promoted = 0  # admissions the deadline order moved before the queue's head
        self.num_swap_preemptions = 0  # of which swapped to host memory (the rest recompute)
        self.num_swapped_blocks = 0
        # swap-or-recompute rule for preemption victims; None: always recompute. Set by the owner
        # (the engine from its measurements, the simulator from its cost model).
        self.swap_cost: SwapCostModel | None = None
        self.num_steps = 0
        self._next_seq_no = 0
        self.prefilling: list[Sequence] = []  # running and still prefilling, in running order
        # lazy decode state: the clock every sequence reads, its buckets and counts
        self.decodes = LazyDecodes(config, block_manager)
        # deadline order: the waiting requests that carry a TTFT deadline, earliest first (a
        # preempted one has had its first token: no longer tracked)
        self.urgent: UrgentQueue[Sequence] | None = (
            UrgentQueue(config.deadline_margin_s, _never_started) if config.deadline_order else None)

    # ---- admission ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                    arrival_time: float, priority: int = 0,
                    deadline: float = 0.0) -> Rejection | None:
        """Queue a request, or refuse one that can never run. Lower `priority` is served first.
        `deadline`: its TTFT deadline on the clock of schedule()'s `now` (0: none), read only
        with `SchedulerConfig.deadline_order`."""
        cfg = self.config
        num_prompt = len(prompt_token_ids)
        reason = None
        if request_id in self.requests:
            reason = f"duplicate request id {request_id!r}"
        elif num_prompt == 0:
            reason = "empty prompt"
        elif max_tokens < 1:
            reason = f"max_tokens must be >= 1, got {max_tokens}"
        elif num_prompt + max_tokens > cfg.max_model_len:
            reason = (f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds "
                      f"max_model_len ({cfg.max_model_len})")
        else:  # the last sampled token is never fed, so it needs no slot
            num_blocks = self.block_manager.num_blocks_for(num_prompt + max_tokens - 1)
            if num_blocks > cfg.num_blocks:
                reason = (f"needs {num_blocks} KV blocks of {cfg.block_size} tokens, the pool has "
                          f"{cfg.num_blocks}")
        if reason is not None:
            return Rejection(request_id, reason)
        seq = Sequence(request_id, prompt_token_ids, max_tokens, arrival_time, priority,
                       self._next_seq_no, self.decodes)
        self._next_seq_no += 1
        self.requests[request_id] = seq
        if cfg.waiting_by_class:
            self._insert_by_class(seq)
        else:
            self.waiting.append(seq)
        self.num_waiting_tokens += num_prompt
        if self.urgent is not None and deadline > 0.0:
            seq.deadline = deadline
            self.urgent.add(deadline, seq)
        return None

    def _insert_by_class(self, seq: Sequence) -> None:
        """`waiting_by_class`: behind every waiting request of its class or a lower one (and
        every preempted one), ahead of the new requests of higher classes. From the back: the
        scan stops at the first request it may not jump (O(1) for arrivals of one class)."""
        w, bounds = self.waiting, self.config.class_bounds
        c = class_index(seq.max_tokens, bounds)
        i = len(w)
        while i and not w[i - 1].admitted and class_index(w[i - 1].max_tokens, bounds) > c:
            i -= 1
        if i == len(w):
            w.append(seq)
        else:
            w.insert(i, seq)

    def abort(self, request_id: str) -> FinishedSequence | None:
        """Drop a request in any state, freeing its blocks. None if it is unknown (or done)."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        if seq.status is RUNNING:
            self._leave_running(seq)
        else:
            self.waiting.remove(seq)
            self.num_waiting_tokens -= len(seq._token_ids)
            self.block_manager.release_swapped(request_id)
        return self._finish_record(seq, "abort")

    # ---- the step ----------------------------------------------------------------------------
    def schedule(self, list_decodes: bool = True,
                 drafts: Mapping[str, Seq[int]] | None = None,
                 now: float | None = None, step_s: float = 0.0) -> StepPlan:
        """Plan one step. With `list_decodes=False` the decodes are not listed as chunks (every
        decoding sequence still decodes: `plan.num_unlisted_decodes`); the simulator's mode.

        `drafts[request_id]`: draft tokens for that decoding sequence (speculative decoding,
        scheduler.speculation): its decode becomes a verify chunk of its last token and the
        drafts, fewer of them where its length limit, the token budget or the free blocks say
        so (drafts never preempt); slots for them are reserved and given back at `update`.

        `now`: the time on the deadlines' clock, `step_s` the time a step takes (the deadline
        order's; None: the queue's order alone)."""
        cfg, bm = self.config, self.block_manager
        decodes = self.decodes
        step = decodes.step
        plan = StepPlan(decode_step=step)
        chunks = plan.chunks
        budget = cfg.max_num_batched_tokens

        # 1. Slots: only decodes whose slot starts a block allocate, in plan order.
        decodes.allocate_due(step, plan, self.preempt_for)
        if list_decodes:
            self._list_decodes(step, chunks)
            budget -= len(chunks)
            if drafts:
                budget -= self._add_drafts(chunks, drafts, budget)
        else:
            plan.num_unlisted_decodes = decodes.num_decoding
            budget -= decodes.num_decoding

        # Prefill budget by backlog (module doc): the tokens withheld from this step's prefills.
        withheld = 0
        rule = cfg.prefill_cap
        cap = rule.max_tokens
        if (cap and budget > cap and decodes.num_decoding
                and len(self.waiting) + len(self.prefilling) <= rule.backlog_seqs):
            limit = rule.backlog_tokens
            if limit is None:
                limit = cfg.max_num_batched_tokens
            if self.prefill_backlog(limit) <= limit:
                withheld = budget - cap
                budget = cap

        # 2. Running prefills, then 3. admission.
        for seq in self.prefilling:
            if budget <= 0:
                break
            budget -= self._schedule_prefill(seq, budget, chunks)
        if not plan.preempted:
            by_count = not bm.enable_prefix_caching  # then only the token counts matter
            urgent = self.urgent if now is not None else None
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                seq = self.waiting[0]
                promoted = False
                # the last free slot, and no preempted sequence first
                if (urgent is not None and len(self.running) + 1 == cfg.max_num_seqs
                        and not seq.admitted):
                    first = urgent.earliest()
                    if first is not None and first[1] is not seq and promote(
                            first[0], seq.deadline, now + self.slot_frees_in(seq) * step_s,
                            now + self.slot_frees_in(first[1]) * step_s, step_s, urgent.margin_s):
                        seq, promoted = first[1], True
                        self.num_promoted += 1
                tokens = seq._token_ids
                if by_count:
                    if not bm.can_allocate_n(len(tokens)):
                        break
                    num_cached = bm.allocate_n(seq.request_id, len(tokens))
                elif bm.can_allocate(tokens):
                    num_cached = bm.allocate(seq.request_id, tokens)
                else:
                    break  # FCFS: the head waits for blocks; nothing jumps it
                if promoted:  # O(waiting), only where a deadline is near (rare)
                    self.waiting.remove(seq)
                else:
                    self.waiting.popleft()
                self.num_waiting_tokens -= len(tokens)
                if not seq.admitted:
                    seq.admitted = True
                    seq.num_cached_tokens = num_cached
                seq._computed = num_cached
                seq.num_prefill_tokens = len(seq._token_ids)
                seq.block_table = bm.block_table(seq.request_id)
                seq.status = RUNNING
                # arrivals come in rank order: the new sequence usually sorts last (insort's place)
                rank = seq.rank
                for lst in (self.running, self.prefilling):
                    if not lst or lst[-1].rank <= rank:
                        lst.append(seq)
                    else:
                        insort(lst, seq, key=Sequence.order_key)
                budget -= self._schedule_prefill(seq, budget, chunks)

        plan.num_batched_tokens = cfg.max_num_batched_tokens - budget - withheld
        self.num_steps += 1
        return plan

    def slot_frees_in(self, taker: Sequence) -> int:
        """Steps from this one's start to the next slot's freeing if `taker` took the last free
        one: the nearest length finish of a decoding sequence, or `taker`'s own tokens (a stop
        token may end one sooner). O(1) but for stale heap keys, each popped once."""
        d = self.decodes
        heap, finishing = d.finish_heap, d.finishing
        while heap and heap[0] not in finishing:
            heappop(heap)
        left = taker.max_tokens
        if heap and heap[0] - d.step < left:
            left = heap[0] - d.step
        return left

    def prefill_backlog(self, stop_above: int | None = None) -> int:
        """Prompt tokens still to prefill: the waiting queue's plus the running prefills' rest.
        With `stop_above`, the count may stop early once it is past that (the rule only compares)."""
        total = self.num_waiting_tokens
        for seq in self.prefilling:
            total += seq.num_prefill_tokens - seq._computed
            if stop_above is not None and total > stop_above:
                break
        return total

    def _list_decodes(self, step: int, chunks: list[ScheduledChunk]) -> None:
        """One decode chunk per decoding sequence, in plan order. The block manager's slot counts
        of decoding sequences stay lazy here too (scheduler.lazy_decodes): the chunk's position
        says where the token goes, and nothing reads the counts before a sync."""
        bounds = self.config.class_bounds
        groups: tuple[list[Sequence], ...] = ([], [], [])  # fast, normal, slow
        for seq in self.running:  # already in (priority, arrival, seq_no) order
            if seq.decoding:
                groups[class_index(seq.max_tokens + seq.num_prompt_tokens - 1 - seq._computed - step,
                                   bounds)].append(seq)
        fast, normal, slow = groups
        seqs = fast + normal + slow if fast or normal else slow
        fill = self.decodes.fill_token
        append = chunks.append
        for seq in seqs:
            tokens = seq._token_ids
            pos = seq._computed + step
            if len(tokens) <= pos:  # unlisted decodes before: fill them in
                tokens.extend([fill] * (pos + 1 - len(tokens)))
            append(ScheduledChunk(seq.request_id, [tokens[pos]], pos, seq.block_table, False, True))

    def _add_drafts(self, chunks: list[ScheduledChunk], drafts: Mapping[str, Seq[int]],
                    budget: int) -> int:
        """Turn the listed decodes that have drafts into verify chunks (after the plain decodes,
        in plan order); returns the draft tokens added."""
        cfg, bm = self.config, self.block_manager
        bs = cfg.block_size
        plain: list[ScheduledChunk] = []
        verifies: list[ScheduledChunk] = []
        used = 0
        for c in chunks:
            draft = drafts.get(c.request_id)
            if not draft or budget - used <= 0:
                plain.append(c)
                continue
            seq = self.requests[c.request_id]
            pos = c.start_pos
            # the verify yields up to k + 1 tokens after the pos + 1 there are
            limit = min(seq.max_tokens + seq.num_prompt_tokens, cfg.max_model_len)
            k = min(len(draft), limit - pos - 2, budget - used)
            if cfg.draft_within_block:
                k = min(k, bs - 1 - pos % bs)
            free = bm.num_free_blocks
            while k > 0 and bm.num_reserve_blocks_needed(c.request_id, pos + 1 + k) > free:
                k -= 1
            if k <= 0:
                plain.append(c)
                continue
            bm.reserve_slots(c.request_id, pos + 1 + k)
            c.token_ids = c.token_ids + [int(t) for t in draft[:k]]
            c.num_draft = k
            used += k
            verifies.append(c)
        if verifies:
            chunks[:] = plain + verifies
        return used

    def decoding_sequences(self) -> list[Sequence]:
        """The running sequences that decode next step (what the speculation policy weighs)."""
        return [s for s in self.running if s.decoding]

    def planned_prefill_tokens(self) -> int:
        """About how many prefill tokens the next step carries: the backlog, up to the budget
        the decodes leave (the speculation policy's load)."""
        room = self.config.max_num_batched_tokens - self.decodes.num_decoding
        return min(self.prefill_backlog(room), room) if room > 0 else 0

    def _schedule_prefill(self, seq: Sequence, budget: int, chunks: list[ScheduledChunk]) -> int:
        start = seq._computed
        n = min(seq.num_prefill_tokens - start, budget)
        chunks.append(ScheduledChunk(seq.request_id, seq._token_ids[start:start + n], start,
                                     seq.block_table, True, start + n == seq.num_prefill_tokens))
        return n

    def sort_key(self, seq: Sequence) -> tuple[int, float, float, int]:
        """Service order: lowest first; preemption takes the highest."""
        remaining = seq.max_tokens - seq.num_output_tokens
        return (class_index(remaining, self.config.class_bounds),) + seq.order_key()

    def preempt_for(self, seq: Sequence, plan: StepPlan) -> bool:
        """Preempt victims until a block is free for `seq`; False if `seq` itself was preempted.

        The victim is the running sequence with the highest sort_key: the sequences already given
        a slot this step sort below `seq` (plan order), so this is the highest not in the plan."""
        bm = self.block_manager
        while not bm.num_free_blocks:
            victim = max(self.running, key=self.sort_key)
            self._preempt(victim, plan)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self._leave_running(seq, swap=self.swap_cost is not None and self.block_manager.host is not None)
        seq.status = WAITING
        seq._computed = 0
        seq.num_prefill_tokens = 0
        self.waiting.appendleft(seq)
        self.num_waiting_tokens += len(seq._token_ids)
        self.num_preemptions += 1
        plan.preempted.append(seq.request_id)

    def _leave_running(self, seq: Sequence, swap: bool = False) -> None:
        if seq.decoding:
            self.decodes.leave(seq)  # fills in its tokens: swap_out keys blocks by them
        else:
            self.prefilling.remove(seq)
        bm, rid = self.block_manager, seq.request_id
        if swap:
            num_blocks = len(bm.block_hashes(rid))
            cost = self.swap_cost
            # a prefilling victim recomputes what it computed so far
            num_tokens = seq._computed
            if cost.should_swap(num_blocks, num_tokens):
                num_saved = bm.swap_out(rid, seq._token_ids)
                self.num_swap_preemptions += 1
                self.num_swapped_blocks += num_saved
                logger.info("preempt %s: swap %d blocks to host (copy %.3g s < recompute %.3g s)",
                            rid, num_saved, cost.swap_seconds(num_blocks),
                            cost.recompute_seconds(num_tokens))
            else:
                bm.free(rid)
                logger.info("preempt %s: recompute %d tokens (%.3g s <= copy %.3g s)", rid,
                            num_tokens, cost.recompute_seconds(num_tokens),
                            cost.swap_seconds(num_blocks))
        else:
            bm.free(rid)
        self.running.remove(seq)

    def update(self, plan: StepPlan, result: StepResult) -> list[FinishedSequence]:
        """Apply a step's outcome; returns the sequences that finished (their blocks are freed)."""
        decodes = self.decodes
        if plan.decode_step is not None and plan.decode_step != decodes.step:
            raise ValueError(f"stale plan: made at step {plan.decode_step}, the scheduler is at "
                             f"{decodes.step}")
        bm, bs = self.block_manager, self.config.block_size
        max_model_len = self.config.max_model_len
        sampled, stopped = result.sampled, result.stopped
        get_seq = self.requests.get
        caching = bm.enable_prefix_caching  # off: cache_blocks is a no-op, not called
        finished: list[FinishedSequence] = []
        if plan.num_unlisted_decodes:
            decodes.set_fill_token(result.decode_token, self.running)
            step = decodes.step = decodes.step + 1
            stop = None
            if stopped:
                stop = {q for q in map(get_seq, stopped) if q is not None and q.decoding}
            decodes.update_due(step, stop, finished, self._finish)
        else:
            step = decodes.step = decodes.step + 1
        fill = decodes.fill_token
        for chunk in plan.chunks:
            rid = chunk.request_id
            seq = get_seq(rid)
            if seq is None or seq.status is not RUNNING:
                continue  # aborted while the step ran
            tokens = seq._token_ids
            if chunk.is_prefill:
                computed = seq._computed
                if seq.decoding or chunk.start_pos != computed:
                    raise ValueError(f"stale plan for {rid!r}: chunk starts at {chunk.start_pos}, "
                                     f"{seq.num_computed_tokens} tokens computed")
                computed += len(chunk.token_ids)
                seq._computed = computed
                if caching:
                    bm.cache_blocks(rid, tokens, computed)
                if not chunk.sample:
                    continue
                self.prefilling.remove(seq)
            else:
                computed = seq._computed + step  # after this step
                if not seq.decoding or chunk.start_pos != computed - 1:
                    raise ValueError(f"stale plan for {rid!r}: decode at {chunk.start_pos}")
                if chunk.num_draft:
                    done = self._update_verify(seq, chunk, result, step)
                    if done is not None:
                        finished.append(done)
                    continue
                if len(tokens) < computed:
                    tokens.extend([fill] * (computed - len(tokens)))
                if caching and computed % bs == 0:
                    bm.cache_blocks(rid, tokens, computed)
            token = sampled.get(rid)
            if token is None:
                raise ValueError(f"step result has no sampled token for {rid!r}")
            tokens.append(token)
            if rid in stopped:
                finished.append(self._finish(seq, "stop"))
            elif (len(tokens) - seq.num_prompt_tokens >= seq.max_tokens
                  or len(tokens) >= max_model_len):
                finished.append(self._finish(seq, "length"))
            elif not seq.decoding:
                decodes.join(seq, step)
        return finished

    def _update_verify(self, seq: Sequence, chunk: ScheduledChunk, result: StepResult,
                       step: int) -> FinishedSequence | None:
        """A verify's outcome: the accepted drafts and the sampled token join the sequence, the
        slots of the rejected drafts are given back, and the sequence rejoins the lazy decodes
        at its new length (or finishes)."""
        rid = seq.request_id
        accepted = result.accepted.get(rid, ())
        a = len(accepted)
        if a > chunk.num_draft or list(accepted) != chunk.token_ids[1:1 + a]:
            raise ValueError(f"verify of {rid!r}: accepted tokens are not a prefix of its drafts")
        token = result.sampled.get(rid)
        if token is None:
            raise ValueError(f"step result has no sampled token for {rid!r}")
        tokens = seq._token_ids
        tokens.extend(accepted)
        tokens.append(token)
        self.decodes.leave(seq)  # back to an absolute count: the last token's slot is computed
        computed = chunk.start_pos + 1 + a
        seq._computed = computed
        bm = self.block_manager
        bm.truncate(rid, computed)
        if bm.enable_prefix_caching:
            bm.cache_blocks(rid, tokens, computed)
        if rid in result.stopped:
            return self._finish(seq, "stop")
        if (len(tokens) - seq.num_prompt_tokens >= seq.max_tokens
                or len(tokens) >= self.config.max_model_len):
            return self._finish(seq, "length")
        self.decodes.join(seq, step)
        return None

    def set_token(self, request_id: str, position: int, token: int) -> bool:
        """Overwrite the token at `position` of a live request; False if it is gone. Async
        scheduling (backend.engine.continuous) applies a step's update with placeholder tokens so that the
        next step can be planned while this one runs on the device, then sets the real tokens
        here once they are read back (before any later update hashes a block holding them)."""
        seq = self.requests.get(request_id)
        if seq is None or position >= len(seq._token_ids):
            return False
        seq._token_ids[position] = token
        return True

    def _finish(self, seq: Sequence, reason: str) -> FinishedSequence:
        if seq.decoding:
            self.decodes.leave(seq)
        self.block_manager.free(seq.request_id)
        self.running.remove(seq)
        del self.requests[seq.request_id]
        return self._finish_record(seq, reason)

    @staticmethod
    def _finish_record(seq: Sequence, reason: str) -> FinishedSequence:
        seq.status = FINISHED
        # not decoding any more (left), so its token list is complete: output_token_ids, direct
        return FinishedSequence(seq.request_id, reason, seq._token_ids[seq.num_prompt_tokens:],
                                seq.num_prompt_tokens, seq.num_cached_tokens)

    # ---- multi-step advance (the simulator) -----------------------------------------------------
    def max_pure_decode_steps(self, past_finishes: bool = False, max_steps: int | None = None) -> int:
        """How many next steps `advance_decode_steps` may apply at once (at most `max_steps`);
        with `past_finishes`, length finishes need not end them when nothing waits. See
        scheduler.lazy_decodes."""
        return self.decodes.max_pure_decode_steps(self.running, len(self.prefilling), self.waiting,
                                                  past_finishes, max_steps)

    def advance_decode_steps(self, num_steps: int, token_id: int = 0,
                             past_finishes: bool = False, allowed: int | None = None
                             ) -> list[FinishedSequence]:
        """Apply `num_steps` pure decode steps as one call (equal to that many schedule/update);
        raises ValueError past max_pure_decode_steps(). Finished sequences come in the order
        single steps finish them (step, then plan order): O(k + events), not O(k * running).

        `allowed`: what max_pure_decode_steps(past_finishes, ...) answered the caller, with no
        change to the scheduler since (the simulator asks at a stretch's start and advances at
        its end): then it is not computed twice."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if allowed is None:
            allowed = self.max_pure_decode_steps(past_finishes, num_steps)
        if num_steps > allowed:
            raise ValueError(f"cannot advance {num_steps} pure decode steps; at most {allowed}")
        decodes = self.decodes
        decodes.set_fill_token(token_id, self.running)
        finished: list[FinishedSequence] = []
        # Only steps where something is due do any work (LazyDecodes.next_due_step); every other
        # step changes nothing but the clock, so the clock jumps to the next step with work — the
        # same calls in the same order as stepping one by one, without O(k) no-op calls when few
        # sequences decode for many steps (e.g. one request per backend in a many-backend
        # simulation).
        end = decodes.step + num_steps
        registers = self.block_manager.enable_prefix_caching
        if not registers and not past_finishes:
            # nothing but allocations before the last update (no registrations; the first
            # finish is at `end` at the earliest): all of them at once, then that update
            decodes.allocate_until(end)
            decodes.step = end
            decodes.update_due(end, None, finished, self._finish)
            self.num_steps += num_steps
            return finished
        plan = StepPlan()  # never used: the pool covers every block (checked above)
        allocate_due, update_due, finish = decodes.allocate_due, decodes.update_due, self._finish
        preempt_for = self.preempt_for
        next_due_step = decodes.next_due_step
        while True:
            t = next_due_step(end, registers)
            if t >= end:
                decodes.step = end
                break
            allocate_due(t, plan, preempt_for)
            decodes.step = t + 1
            update_due(t + 1, None, finished, finish)
        self.num_steps += num_steps
        return finished

    # ---- counters ---------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_decode_context_tokens(self) -> int:
        """Sum of num_computed_tokens over the decoding sequences (O(1))."""
        return self.decodes.num_context_tokens

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def internal_fragmentation(self) -> float:
        self.decodes.sync_slot_counts(self.running)
        return self.block_manager.internal_fragmentation()

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions, num_steps=self.num_steps,
            num_used_blocks=bm.num_used_blocks, num_free_blocks=bm.num_free_blocks,
            num_cached_blocks=bm.num_cached_blocks, kv_usage=bm.usage,
            internal_fragmentation=self.internal_fragmentation(),
            num_prefix_query_tokens=bm.num_query_tokens, num_prefix_hit_tokens=bm.num_hit_tokens,
            prefix_hit_rate=bm.prefix_hit_rate, num_swap_preemptions=self.num_swap_preemptions,
            num_host_hit_tokens=bm.num_host_hit_tokens,
            num_host_used_blocks=bm.host.num_used_blocks if bm.host is not None else 0)

    def check_integrity(self) -> None:
        """The block manager's checks plus the scheduler's own; call between steps (after update)."""
        bm = self.block_manager
        self.decodes.sync_slot_counts(self.running)
        bm.check_integrity()
        running_ids = {s.request_id for s in self.running}
        waiting_ids = {s.request_id for s in self.waiting}
        assert len(running_ids) == len(self.running), "a sequence twice in running"
        assert len(waiting_ids) == len(self.waiting), "a sequence twice in waiting"
        assert self.num_waiting_tokens == sum(len(s._token_ids) for s in self.waiting), \
            "waiting token count out of sync"
        assert not running_ids & waiting_ids, f"both running and waiting: {running_ids & waiting_ids}"
        assert running_ids | waiting_ids == self.requests.keys(), "requests map out of sync"
        assert len(self.running) <= self.config.max_num_seqs, "more running than max_num_seqs"
        keys = [s.order_key() for s in self.running]
        assert keys == sorted(keys), "running list out of order"
        assert self.prefilling == [s for s in self.running if not s.decoding], "prefilling list"
        for seq in self.running:
            rid = seq.request_id
            assert seq.status is RUNNING and rid in bm, f"{rid!r}: running without blocks"
            want = seq.num_prefill_tokens if seq.is_prefilling else seq.num_computed_tokens
            assert bm.num_tokens(rid) == want, f"{rid!r}: {bm.num_tokens(rid)} slots, want {want}"
            assert seq.decoding == (not seq.is_prefilling), f"{rid!r}: decoding flag"
            if not seq.is_prefilling:
                assert seq.num_computed_tokens == len(seq.token_ids) - 1, f"{rid!r}: decode state"
        if bm.host is not None:
            swapped = set(bm.host.swapped_seq_ids())
            assert swapped <= waiting_ids, f"swapped out but not waiting: {swapped - waiting_ids}"
        for seq in self.waiting:
            assert seq.status is WAITING and seq.request_id not in bm, f"{seq.request_id!r}: waiting"
            assert seq.num_computed_tokens == 0, f"{seq.request_id!r}: waiting with computed tokens"
            assert not seq.decoding, f"{seq.request_id!r}: waiting but decoding"
        self.decodes.check(self.running)


def _never_started(seq: Sequence) -> bool:
    """UrgentQueue's test: still waiting for its first start (not admitted, not aborted)."""
    return seq.status is WAITING and not seq.admitted
