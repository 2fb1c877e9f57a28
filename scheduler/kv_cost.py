"""What moving KV between backends costs, against recomputing it (issue 34): the rule the gateway's
placement and the simulator both use to decide a prefix pull, and whether to split a Slow
request's prefill onto a prefill-only backend. Pure policy: rates come in as numbers.

    pull_s(n)      = fixed_s + peer_wait_s                     a round trip, and the peer's step
                   + n * bytes_per_token * (1/link + 2/copy)   wire, plus device<->host on both
                                                               ends (copy = 0: no device, CPU)
    recompute_s(n) = n / prefill_tokens_per_s

A pull is planned when n >= min_tokens and pull_s(n) <= margin * recompute_s(n). The backends'
loops enter as `peer_wait_s`, by how each one serves (`KVRates.off_loop`):

    a peer that answers between two of its steps      waits about one of its step times
    a peer that answers off its loop (a KV thread)    0
    a receiver that reads the reply between steps     one of its own step times
    a receiver that holds its next step for a pull    0 when fixed_s + transfer_s(n) <= land_wait_s
    expected within land_wait_s (off_loop)            (the request joins that step), else its step

(the gateway reads step times from LoadReports, the simulator from the backends' steps). Live on
4 contended CPU backends, pulls served between steps took 0.3-2 s for 2 MB when the loops ran long
prefill steps, as long as recomputing: hence the KV thread and the land wait.

The gateway knows which backend holds which prefix only at the sampled depths of
`scheduler.prefix_index` (1, 2, 4 ... 32 blocks); `PullPlanner.plan` uses the deepest depth a
peer holds beyond what the chosen backend holds, so its token count is a lower bound (the
receiver pulls every block the peer has). Usage::

    planner = PullPlanner(PullConfig(), block_size=16)
    planner.set_rates(b, KVRates(bytes_per_token=..., prefill_tokens_per_s=...))
    plan = planner.plan(policy.index, item.prefix, item.backend, prompt_len, peer_wait_s)
    if plan is not None:  # send the request to item.backend with kv_source = plan.peer
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler.prefix_index import DEPTHS, PrefixIndex


@dataclass(frozen=True)
class KVRates:
    """One backend's measured rates (BackendInfo.kv_block_bytes / block_size,
    prefill_tokens_per_s, kv_copy_bytes_per_s; LoadReport.kv_pull_bytes_per_s)."""
    bytes_per_token: float = 0.0         # KV bytes of one token, every layer, as stored
    prefill_tokens_per_s: float = 0.0    # 0: unknown (no pull is planned)
    link_bytes_per_s: float = 1e9        # the transport between backends (ZMQ: measured by pulls)
    copy_bytes_per_s: float = 0.0        # device <-> host block copies; 0: none (CPU pools)
    layout: str = ""                     # BackendInfo.kv_layout: pulls only between equal ones
    off_loop: bool = False               # serves pulls off its step loop (BackendInfo.kv_endpoint)
                                         # and lands its own before its next step


@dataclass(frozen=True)
class PullConfig:
    enabled: bool = True
    margin: float = 0.8          # pull only when it takes at most this share of the recompute
    min_tokens: int = 64         # fewer than this: never worth a round trip
    fixed_s: float = 0.002       # round trip and message handling, both ends
    timeout_s: float = 2.0       # the pull's hard deadline (GenerateRequest.kv_source.timeout_s)
    land_wait_s: float = 0.05    # an off-loop receiver holds its next step this long at most
    # disaggregated Slow prefill: split a prompt of at least this many tokens onto a prefill
    # backend when moving its KV takes at most `split_margin` of its prefill (0: never split)
    split_min_tokens: int = 4096
    split_margin: float = 0.5
    default_rates: KVRates = KVRates()


@dataclass(frozen=True)
class PullPlan:
    peer: int
    num_tokens: int     # lower bound of what the peer holds beyond the receiver (sampled depths)
    peer_tokens: int    # lower bound of the prefix the peer holds (KvSource.num_tokens)
    pull_s: float
    recompute_s: float


class KVCostModel:
    """pull_s vs recompute_s for one receiving backend (module docstring)."""

    def __init__(self, rates: KVRates, config: PullConfig = PullConfig()) -> None:
        self.rates, self.config = rates, config

    def transfer_s(self, num_tokens: int) -> float:
        r = self.rates
        nbytes = num_tokens * r.bytes_per_token
        copy = 2 * nbytes / r.copy_bytes_per_s if r.copy_bytes_per_s > 0 else 0.0
        return nbytes / r.link_bytes_per_s + copy

    def pull_s(self, num_tokens: int, peer_wait_s: float = 0.0) -> float:
        return self.config.fixed_s + max(0.0, peer_wait_s) + self.transfer_s(num_tokens)

    def recompute_s(self, num_tokens: int) -> float:
        rate = self.rates.prefill_tokens_per_s
        return num_tokens / rate if rate > 0 else float("inf")

    def own_wait_s(self, num_tokens: int, step_s: float) -> float:
        """What the receiver's loop adds to a pull of `num_tokens` while it runs `step_s` steps
        (module docstring)."""
        if self.rates.off_loop and \
                self.config.fixed_s + self.transfer_s(num_tokens) <= self.config.land_wait_s:
            return 0.0
        return max(0.0, step_s)

    def known(self) -> bool:
        r = self.rates
        return r.prefill_tokens_per_s > 0 and r.bytes_per_token > 0 and r.link_bytes_per_s > 0

    def should_pull(self, num_tokens: int, peer_wait_s: float = 0.0) -> bool:
        cfg = self.config
        return (cfg.enabled and self.known() and num_tokens >= cfg.min_tokens
                and self.pull_s(num_tokens, peer_wait_s) <= cfg.margin * self.recompute_s(num_tokens))

    def should_split(self, prompt_len: int, prefill_wait_s: float = 0.0) -> bool:
        """Disaggregated Slow prefill: split when what the request pays for it (waiting
        `prefill_wait_s` for the prefill backend, then moving its KV) is at most `split_margin`
        of the prefill it takes off the decode backend, whose decoding streams would each stall
        for that prefill's length."""
        cfg = self.config
        if cfg.split_margin <= 0 or prompt_len < cfg.split_min_tokens or not self.known():
            return False
        return (self.pull_s(prompt_len) + max(0.0, prefill_wait_s)
                <= cfg.split_margin * self.recompute_s(prompt_len))


class PullPlanner:
    """Per placed request: is there a peer holding more of its prefix, and is pulling it worth it."""

    def __init__(self, config: PullConfig = PullConfig(), block_size: int = 16,
                 max_peers_scanned: int = 8) -> None:
        self.config, self.block_size = config, block_size
        self.max_peers_scanned = max_peers_scanned
        self._models: dict[int, KVCostModel] = {}
        self.num_planned = 0
        self.num_declined = 0     # a peer held more, the cost model said recompute
        self.num_planned_tokens = 0

    def set_rates(self, b: int, rates: KVRates) -> None:
        self._models[b] = KVCostModel(rates, self.config)

    def model(self, b: int) -> KVCostModel:
        m = self._models.get(b)
        if m is None:
            m = self._models[b] = KVCostModel(self.config.default_rates, self.config)
        return m

    def plan(self, index: PrefixIndex, prefix: Sequence[int], b: int, prompt_len: int,
             now: float, peer_wait_s: Callable[[int], float] | None = None,
             accepting: Sequence[bool] | None = None) -> PullPlan | None:
        """A pull for a request placed on `b` at `now` (after placement; prefix: its
        sampled-depth hashes, shallowest first), or None: no peer held more before `now`, or
        recomputing is cheaper. Peers are those with b's KV layout (`KVRates.layout`)."""
        if not self.config.enabled or not prefix or b < 0:
            return None
        local = next((d + 1 for d in range(len(prefix) - 1, -1, -1)
                      if index.held_before(b, prefix[d], now)), 0)
        if local == len(prefix):
            return None
        bs = self.block_size
        have = DEPTHS[local - 1] * bs if local else 0
        model = self.model(b)
        own_step = peer_wait_s(b) if peer_wait_s is not None else 0.0
        for d in range(len(prefix) - 1, local - 1, -1):
            holders = index.holders.get(prefix[d])
            if not holders:
                continue
            n = min(DEPTHS[d] * bs, prompt_len - 1) - have
            own_wait = model.own_wait_s(n, own_step)
            best, best_wait = -1, 0.0
            layout = model.rates.layout
            for scanned, p in enumerate(sorted(holders), 1):
                if p == b or (accepting is not None and not accepting[p]) or \
                        self.model(p).rates.layout != layout or \
                        not index.held_before(p, prefix[d], now):
                    continue
                peer = self.model(p).rates
                wait = own_wait + (peer_wait_s(p) if peer_wait_s is not None and
                                   not peer.off_loop else 0.0)
                if best < 0 or wait < best_wait:
                    best, best_wait = p, wait
                if scanned >= self.max_peers_scanned:
                    break
            if best < 0:
                continue
            if not model.should_pull(n, best_wait):
                self.num_declined += 1
                return None
            self.num_planned += 1
            self.num_planned_tokens += n
            return PullPlan(best, n, n + have, model.pull_s(n, best_wait), model.recompute_s(n))
        return None
