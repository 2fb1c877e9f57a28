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
        self._rates: dict[int, KVRates] = {}  # backends that can pull (ours, a layout)
        self._step_s: dict[int, float] = {}
        self._kv_endpoint: dict[int, str] = {}  # BackendInfo.kv_endpoint: pulls off its loop
        self._queued: dict[int, int] = {}  # prefill backend -> prompt tokens sent, not done
        self.num_sent = 0
        self.num_split = 0

    def rates(self, pid: int) -> KVRates | None:
        return self._rates.get(pid)

    def queued_tokens(self, pid: int) -> int:
        return self._queued.get(pid, 0)

    def prefill_started(self, pid: int, num_tokens: int) -> None:
        self._queued[pid] = self._queued.get(pid, 0) + num_tokens
        self.num_split += 1

    def prefill_done(self, pid: int, num_tokens: int) -> None:
        self._queued[pid] = max(0, self._queued.get(pid, 0) - num_tokens)

    def on_info(self, pid: int, info: pb.BackendInfo) -> None:
        if not info.kv_layout or not info.block_size:
            self._rates.pop(pid, None)
            self.planner.set_rates(pid, KVRates())  # unknown: never pulls, never a peer
            return
        self.planner.block_size = info.block_size
        if info.kv_endpoint:
            self._kv_endpoint[pid] = info.kv_endpoint
        else:
            self._kv_endpoint.pop(pid, None)
        rates = replace(self.config.default_rates, layout=info.kv_layout,
                        off_loop=bool(info.kv_endpoint),
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

    def endpoint(self, pid: int, address: str) -> str:
        """Where a pull from backend `pid` (reached at `address`) goes: its KV socket when it
        has one (a wildcard tcp host there means `address`'s host), else its main socket."""
        kv = self._kv_endpoint.get(pid)
        if not kv:
            return address
        if kv.startswith("tcp://") and address.startswith("tcp://"):
            host, port = kv[len("tcp://"):].rsplit(":", 1)
            if host in ("*", "0.0.0.0", "[::]", "::", ""):
                return f"tcp://{address[len('tcp://'):].rsplit(':', 1)[0]}:{port}"
        return kv

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
            d.kv_source = pb.KvSource(endpoint=self.endpoint(plan.peer, address_of(plan.peer)),
                                      num_tokens=plan.peer_tokens,
                                      timeout_s=self.config.timeout_s)
            self.num_sent += 1


# ---- disaggregated Slow prefill ----------------------------------------------------------------
class PrefillSink:
    """The gateway's own prefill-only request on a prefill backend: its one token is dropped;
    its end (any way) frees its place in that backend's queue estimate. Its blocks stay pinned
    there until the decode backend has pulled them (or the pin expires)."""

    unstarted = False  # not a client request: the TTFT predictor does not count it

    def __init__(self, pulls: GatewayPulls, pid: int, num_tokens: int, pin_ttl_s: float) -> None:
        self.pulls, self.pid, self.num_tokens = pulls, pid, num_tokens
        self.options = _PinOptions(pin_ttl_s)
        self.done = False

    def on_dispatched(self, now: float, backend: str = "") -> None:
        pass

    def on_tokens(self, token_ids, finish_reason, logprobs, now, text=None) -> None:
        if finish_reason is not None:
            self._end()

    def on_error(self, error) -> None:
        self._end()  # the decode backend's pull then fails or times out: it recomputes

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.pulls.prefill_done(self.pid, self.num_tokens)


class _PinOptions:
    """What `BackendPool.send_batch` reads of a sink's options: a pin of the whole prompt."""

    def __init__(self, pin_ttl_s: float) -> None:
        self.pin_ttl_s, self.pin_tokens, self.session_key = pin_ttl_s, 0, None


def split_prefills(pulls: GatewayPulls, items, prefill_backends, dispatch_cls) -> list:
    """Disaggregated Slow prefill (issue 34): for each placed Slow request with a long prompt,
    when the cost model says moving its KV costs little next to its prefill, a prefill-only copy
    (max_tokens 1, its prompt pinned) goes to the least-queued prefill backend and the request
    itself to its decode backend with that prefill backend as its kv_source, told to wait for
    the prefill (`KvSource.prefill_wait_s`). Returns [(prefill backend, prefill dispatch)]."""
    cfg = pulls.config
    if not prefill_backends or cfg.split_margin <= 0:
        return []
    out = []
    for it in items:
        d = it.payload
        n = len(d.prompt_ids)
        if it.backend < 0 or d.queue_class != pb.SLOW or n < cfg.split_min_tokens:
            continue
        p = min(prefill_backends, key=lambda b: pulls.queued_tokens(b.pid))
        rates = pulls.rates(p.pid)
        decode = pulls.planner.model(it.backend)
        if rates is None or rates.layout != decode.rates.layout:
            continue
        # A prefill-only backend measures its prefill rate only once it has prefilled, and it
        # prefills only what is split to it: until then the decode backend's measured rate (an
        # equal layout: the same model and pages) stands in, or nothing would ever be split
        # (the H200 split with no warm-up pull, 2026-12-04 night: 0 of 12)
        rate = rates.prefill_tokens_per_s or decode.rates.prefill_tokens_per_s
        if rate <= 0:
            continue
        wait = pulls.queued_tokens(p.pid) / rate
        if not decode.should_split(n, wait):
            continue
        prefill_s = n / rate
        ready_s = wait + prefill_s + cfg.timeout_s   # when its blocks should be there, at worst
        d.kv_source = pb.KvSource(endpoint=pulls.endpoint(p.pid, p.address), num_tokens=n - 1,
                                  prefill_wait_s=ready_s,
                                  timeout_s=ready_s + decode.transfer_s(n) + cfg.timeout_s)
        sink = PrefillSink(pulls, p.pid, n, pin_ttl_s=ready_s + cfg.timeout_s)
        out.append((p, dispatch_cls(d.request_id + "#prefill", d.prompt_ids,
                                    pb.SamplingParams(max_tokens=1, ignore_eos=True), pb.SLOW,
                                    d.priority, d.arrival_time, sink)))
        pulls.prefill_started(p.pid, n)
    return out
