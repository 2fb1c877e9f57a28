"""Prefix pull in the simulator (issue 34): the gateway's own planner (`scheduler.kv_cost`), the
backends' own block managers (`held_prefix` / `can_import` / `import_prefix`, what the live
backends run) and the transfer's time as the pulled request's delivery delay.

Per request placed on backend b (`EventLoop.send`): when the planner finds a peer holding more
of its prefix and the cost model says pull, the peer's blocks beyond b's own head are looked up
in the peer's block manager *now* and registered in b's as cached (free, most recently used),
and the request reaches b `pull_s` later (round trip + the peer's remaining step, none when it
serves pulls off its loop + bytes over the link and the copies); it then joins b's next step
like any arrival (live, an off-loop receiver holds that step for a pull about to land). A peer that no longer holds them costs a round trip, then the request
recomputes, as live (the peer answers "not held").

Disaggregated Slow prefill (`num_prefill_backends` > 0): a Slow request with a long prompt is
split when `KVCostModel.should_split` says so (the gateway's rule): its prompt is prefilled on a
prefill-only backend, modelled as a FIFO server running one whole-prompt prefill at a time
(`cost.step_time(0, n, n)`), and the request reaches its decode backend when that prefill and
the transfer are done, with every full block of its prompt registered there.

Simplifications, stated: the blocks are registered at dispatch, not when they arrive (another
request for the same prefix reaching b during the transfer finds them early); the peer's own
cost of reading its blocks out is not charged to its steps (one gather between two steps); a
prefill backend batches nothing (one prompt at a time, as long Slow prompts mostly run).
"""
from __future__ import annotations

from dataclasses import replace

from scheduler.kv_cost import KVRates, PullConfig, PullPlanner


def rates_for(cost, config: PullConfig, block_size: int, prefill_tokens: int = 2048) -> KVRates:
    """The simulated backends' rates: KV bytes per token from the cost model (the roofline's
    own figure; a measured profile's `kv_bytes_per_token` when it has one), the prefill rate
    from its step time of a `prefill_tokens` prefill; link and copy rates from the config."""
    per_token = getattr(cost, "kv_bytes_per_token", None) or config.default_rates.bytes_per_token
    if not per_token:
        raise ValueError("prefix pull needs the KV bytes per token: a roofline cost model, or "
                         "PullConfig.default_rates.bytes_per_token")
    rate = prefill_tokens / cost.step_time(0, prefill_tokens, prefill_tokens)
    return replace(config.default_rates, bytes_per_token=float(per_token), prefill_tokens_per_s=rate)


class PullSim:
    def __init__(self, loop, config: PullConfig, rates: KVRates,
                 num_prefill_backends: int = 0) -> None:
        self.loop = loop
        self.config = config
        self.cost = loop.cost
        self.prefill_free = [0.0] * num_prefill_backends  # when each prefill backend is free
        self.num_split = 0
        self.split_wait_s = 0.0
        self.block_size = loop.backends[0].sched.block_size if loop.backends else 16
        self.planner = PullPlanner(config, self.block_size)
        for be in loop.backends:
            self.planner.set_rates(be.idx, rates)
        self.prompt_len = loop.workload.prompt_len.tolist()
        self.num_pulls = 0
        self.num_pulled_tokens = 0
        self.num_not_held = 0       # planned, the peer no longer held it: a round trip lost
        self.num_no_room = 0        # the receiver had no free blocks for them
        self.num_here = 0           # planned, but the receiver held the prefix already
        self.pull_s = 0.0           # summed transfer times

    def _wait(self, p: int) -> float:
        """The rest of backend p's step in progress (the planner decides whether it counts)."""
        be = self.loop.backends[p]
        return max(0.0, be.end_time - self.now) if be.busy else 0.0

    def _peer_wait(self, p: int) -> float:
        """A peer that answers between its steps answers after the one in progress; one that
        serves pulls off its loop (`KVRates.off_loop`, backend.server.kv_serve) at once."""
        return 0.0 if self.planner.model(p).rates.off_loop else self._wait(p)

    def divert(self, be, part: list[int], now: float) -> list[int]:
        """Plan a pull for each request of a Batch to `be`; the pulled ones are delivered later
        (scheduled here), the rest returned to be sent at once."""
        loop = self.loop
        self.now = now
        index, prefix_of = loop.placement.index, loop.prefix_of
        accepting = loop.placement.loads.accepting
        keep: list[int] = []
        bm = be.sched.bm
        for i in part:
            if self.prefill_free and self._split(be, i, now):
                continue
            plan = self.planner.plan(index, prefix_of(i), be.idx, self.prompt_len[i], now,
                                     self._wait, accepting)
            if plan is None:
                keep.append(i)
                continue
            tokens = be.sched.prompt_tokens(i)
            start = len(bm.match_prefix(tokens)[0])
            if start * self.block_size >= plan.peer_tokens:  # here after all (a late report):
                self.num_here += 1                           # admitted at once, as live
                keep.append(i)
                continue
            held = loop.backends[plan.peer].sched.bm.held_prefix(tokens, start)
            model = self.planner.model(be.idx)
            wait = self._peer_wait(plan.peer)
            if not held:
                self.num_not_held += 1
                delay = model.pull_s(0, wait)
            elif not bm.can_import(tokens, len(held)):
                self.num_no_room += 1
                delay = model.pull_s(len(held) * self.block_size, wait)
            else:
                bm.import_prefix(tokens, start, len(held))
                n = len(held) * self.block_size
                delay = model.pull_s(n, wait)
                self.num_pulls += 1
                self.num_pulled_tokens += n
                self.pull_s += delay
            loop.deliver_later(be, [i], now + delay)
        return keep

    def _split(self, be, i: int, now: float) -> bool:
        """Disaggregated prefill of request i (module docstring); False: not split."""
        n = self.prompt_len[i]
        if n < self.config.split_min_tokens or self.loop.gateway.queue_class(i) != 2:
            return False
        p = min(range(len(self.prefill_free)), key=self.prefill_free.__getitem__)
        wait = max(0.0, self.prefill_free[p] - now)
        model = self.planner.model(be.idx)
        if not model.should_split(n, wait):
            return False
        done = now + wait + self.cost.step_time(0, n, n)
        self.prefill_free[p] = done
        tokens = be.sched.prompt_tokens(i)
        bm = be.sched.bm
        start = len(bm.match_prefix(tokens)[0])
        num = (n - 1) // self.block_size - start
        if num > 0 and bm.can_import(tokens, num):
            bm.import_prefix(tokens, start, num)
        self.num_split += 1
        self.split_wait_s += wait
        self.loop.deliver_later(be, [i], done + model.pull_s(n))
        return True

    def stats(self) -> dict:
        p = self.planner
        return {"planned": p.num_planned, "declined": p.num_declined, "pulls": self.num_pulls,
                "pulled_tokens": self.num_pulled_tokens, "not_held": self.num_not_held,
                "no_room": self.num_no_room, "already_here": self.num_here,
                "split": self.num_split, "prefill_backends": len(self.prefill_free),
                "mean_split_wait_ms": 1e3 * self.split_wait_s / max(1, self.num_split),
                "mean_pull_ms": 1e3 * self.pull_s / self.num_pulls if self.num_pulls else 0.0}
