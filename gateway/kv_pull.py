"""The gateway's side of prefix pull (issue 34): after placement, a request whose backend lacks a
prefix another backend holds is sent with `GenerateRequest.kv_source` naming that peer, when
`scheduler.kv_cost` says pulling beats recomputing. The rates come from the backends themselves:
`BackendInfo` (KV layout, bytes per block, device<->host copy rate) and each `LoadReport`
(measured prefill rate, measured pull rate, step time: how long a peer takes to answer).

    pool = BackendPool(addresses, PoolConfig(kv_pull=PullConfig()))   # `tidegate serve --kv-pull`

Only our own backends take part (an HTTP server reports no layout); only backends with equal
layouts pull from each other; a backend with no measured prefill rate yet is never told to pull.
"""
from __future__ import annotations

from dataclasses import replace

from proto import tidegate_pb2 as pb
from scheduler.kv_cost import KVRates, PullConfig, PullPlanner


class GatewayPulls:
    def __init__(self, config: PullConfig, block_size: int = 16) -> None:
        self.config = config
        self.planner = PullPlanner(config, block_size)
        self._rates: dict[int, KVRates] = {}
        self._step_s: dict[int, float] = {}
        self.num_sent = 0

    def on_info(self, pid: int, info: pb.BackendInfo) -> None:
        if not info.kv_layout or not info.block_size:
            self._rates.pop(pid, None)
            self.planner.set_rates(pid, KVRates())  # unknown: never pulls, never a peer
            return
        self.planner.block_size = info.block_size
        rates = replace(self.config.default_rates, layout=info.kv_layout,
                        bytes_per_token=info.kv_block_bytes / info.block_size,
                        copy_bytes_per_s=info.kv_copy_bytes_per_s,
                        prefill_tokens_per_s=(info.prefill_tokens_per_s or
                                              self.config.default_rates.prefill_tokens_per_s))
        self._set(pid, rates)

    def on_report(self, pid: int, report: pb.LoadReport) -> None:
        rates = self._rates.get(pid)
        # a busy peer answers after its step in progress; an idle one at once
        busy = report.num_running or report.num_waiting
        self._step_s[pid] = report.recent_step_time_ms / 1e3 if busy else 0.0
        if rates is None:
            return
        changes = {}
        if report.prefill_tokens_per_s > 0:
            changes["prefill_tokens_per_s"] = report.prefill_tokens_per_s
        if report.kv_pull_bytes_per_s > 0:  # measured end to end: it already holds the copies
            changes["link_bytes_per_s"] = report.kv_pull_bytes_per_s
            changes["copy_bytes_per_s"] = 0.0
        if changes:
            self._set(pid, replace(rates, **changes))

    def _set(self, pid: int, rates: KVRates) -> None:
        self._rates[pid] = rates
        self.planner.set_rates(pid, rates)

    def peer_wait_s(self, pid: int) -> float:
        return self._step_s.get(pid, 0.0)

    def plan(self, policy, items, now: float, address_of) -> None:
        """Set `kv_source` on the dispatches (item payloads) worth a pull; `address_of(pid)`:
        the peer's endpoint."""
        index = getattr(policy, "index", None)
        if index is None:
            return
        accepting = policy.loads.accepting
        for it in items:
            d = it.payload
            d.kv_source = None
            if it.backend < 0 or not it.prefix:
                continue
            plan = self.planner.plan(index, it.prefix, it.backend, len(d.prompt_ids), now,
                                     self.peer_wait_s, accepting)
            if plan is None:
                continue
            d.kv_source = pb.KvSource(endpoint=address_of(plan.peer), num_tokens=plan.peer_tokens,
                                      timeout_s=self.config.timeout_s)
            self.num_sent += 1
