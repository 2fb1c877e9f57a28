"""How well can any Retry-After predict a refused request's wait? Fork the future and see
(issue 31, the Retry-After goal: within +-25% of the wait the refused request would have had).

    tidegate sim retry-bound --step-ms 20 --backends 4 --max-num-seqs 8 --placement ttft \\
        --waiting-by-class --slot-model --rate 47.8 --num-requests 600 --seed 2 \\
        --input-len 32 --output-len uniform:1:80 --slo-ttft-ms fast=150,normal=400,slow=1000 \\
        --forks 20 --classes slow --json bound.json --plot bound/

(the simulated twin of `scripts/gpu_slo_run.sh` with `MODEL=echo`: the planner's 4-backend row).

One simulation with admission on (the base run) gives the requests admission refused and the
Retry-After each got. For each refused request i of the chosen classes, `--forks` K worlds:
the arrivals up to and including i kept exactly as in the base run (so the state of every
queue, slot and predictor at i's arrival is the same: checked, `prefix_identical`), the arrivals
after it drawn again from the workload's own law with another seed (a Poisson process
continues from i's arrival memorylessly; the same request count in all, so the run ends as the
benchmark's does), and request i sent anyway (its own TTFT target so large it is admitted: what
`bench.serving.slo_control --probe-every` does live). Its TTFT in world k is W_k, the wait it
would have had there. Also world 0: the base run's own future with i sent anyway (what a probe
in that run measures).

Per refused request, with the benchmark's criterion |R / W - 1| <= 0.25 ("hit"):

- ``current``: the share of the K worlds in which the Retry-After it got hits;
- ``median``: the same for the conditional median of W_1..K (in sample);
- ``best_loo``: the best any predictor that knows the state at i's arrival can do: for each
  world k, the R that hits the most of the other K-1 worlds, scored on world k (leave one out:
  the in-sample best, ``best_in``, over-fits K draws and bounds the ceiling from above);
- ``bias``: the Retry-After over the conditional median.

The ceiling is the mean of ``best_loo`` over the refused requests: the share of probes any
Retry-After could put within +-25% when what decides the wait is the future's arrivals. Also
scored per refusal: alternative predictors computed at the refusal from the same state
(`ALTERNATIVES`: `point`, the default rule (the wait with the arrivals at their mean);
`quantile_Q`, `AdmissionConfig.retry_after_quantile` = Q (a quantile of the wait over the
admission check's futures); `median_of_futures`, the same at 0.5 with the gateway's queue term
kept; `*_shared_rate`, each backend's higher-class rate replaced by the backends' mean;
`cluster_median`, every backend's slots in one simulation (`cluster_wait`); the slot model with
another arrival horizon, or without the calibration). A Retry-After changes nothing that happens, so `--rescore` scores a
study's worlds again with today's alternatives (`--admission-config retry_after_quantile=none`:
the base run of a study made before that default).

The simulator only: its waits are the model's (a constant step, outputs of exactly max_tokens);
live steps jitter too, which can only lower the ceiling.
"""
from __future__ import annotations

import argparse
import functools
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler.admission import WaitPredictor, sampled_arrivals
from scheduler.classes import CLASS_NAMES
from scheduler.slo import NUM_CLASSES
from sims.event_loop import EventLoop
from sims.runner import RunSpec
from sims.workload import Workload, WorkloadConfig, _lengths_and_prefixes, generate, inter_arrivals

PROBE_TTFT_MS = 1e9  # a request's own target so large that admission admits it (the live probe's)
TOLERANCE = 0.25


def hit(r: float, w: np.ndarray | Sequence[float], tol: float = TOLERANCE) -> np.ndarray:
    """Whether a Retry-After `r` is within +-tol of each wait: |r / w - 1| <= tol."""
    w = np.asarray(w, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(r / w - 1.0) <= tol + 1e-12


def best_r(waits: Sequence[float], tol: float = TOLERANCE) -> tuple[float, int]:
    """(the R that hits the most of `waits`, how many). R hits w when w is in
    [R / (1 + tol), R / (1 - tol)]; the best R sits at some w (1 + tol): scan those."""
    w = np.sort(np.asarray(waits, dtype=np.float64))
    w = w[w > 0]
    if not len(w):
        return 0.0, 0
    best, best_n = float(w[0]) * (1 + tol), 0
    for lo in w:
        r = float(lo) * (1 + tol)
        n = int(np.count_nonzero(hit(r, w, tol)))
        if n > best_n:
            best, best_n = r, n
    return best, best_n


def score(r_current: float, waits: Sequence[float], tol: float = TOLERANCE) -> dict:
    """The per-refusal scores of the module doc over the worlds' waits."""
    w = np.asarray(waits, dtype=np.float64)
    k = len(w)
    med = float(np.median(w))
    loo = []
    for j in range(k):
        rest = np.delete(w, j)
        r, _ = best_r(rest, tol)
        loo.append(bool(hit(r, w[j:j + 1], tol)[0]))
    _, n_in = best_r(w, tol)
    return {"current": float(np.mean(hit(r_current, w, tol))),
            "median": float(np.mean(hit(med, w, tol))),
            "best_loo": float(np.mean(loo)) if k > 1 else 1.0,
            "best_in": n_in / k,
            "bias": r_current / med if med > 0 else math.inf,
            "wait_median_s": med,
            "wait_p10_s": float(np.percentile(w, 10)),
            "wait_p90_s": float(np.percentile(w, 90))}


# ---- the worlds -------------------------------------------------------------------------------
def fork_workload(base: Workload, config: WorkloadConfig, i: int, seed: int | None) -> Workload:
    """Arrivals 0..i as in `base`, those after i drawn again with `seed` (None: kept, the base
    run's own future), request i with a TTFT target of its own so large it is admitted."""
    n = len(base)
    if seed is None:
        arrival, prompt, output = base.arrival_time, base.prompt_len, base.output_len
        group, plen = base.prefix_group, base.prefix_len
    else:
        if config.arrival not in ("poisson", "gamma"):
            raise ValueError("forks redraw generated arrivals: poisson or gamma, not a trace")
        m = n - i - 1
        rng = np.random.default_rng([seed, i])
        gaps = inter_arrivals(rng, m, config.rate, config.arrival, config.cv)
        p, o, g, pl = _lengths_and_prefixes(rng, m, config)
        t_i = float(base.arrival_time[i])
        arrival = np.concatenate([base.arrival_time[: i + 1], t_i + np.cumsum(gaps)])
        prompt = np.concatenate([base.prompt_len[: i + 1], p])
        output = np.concatenate([base.output_len[: i + 1], o])
        group = np.concatenate([base.prefix_group[: i + 1], g.astype(base.prefix_group.dtype)])
        plen = np.concatenate([base.prefix_len[: i + 1], pl])
    own: list[float | None] = [None] * n
    own[i] = PROBE_TTFT_MS
    return Workload(arrival.astype(np.float64), prompt, output, group, plen,
                    base.queue_class[:n].copy(), base.priority[:n].copy(), ttft_override_ms=own)


@dataclass
class BaseRun:
    workload: Workload
    retry_after_s: dict[int, float]            # refused request -> its Retry-After
    predictions: dict[int, tuple[float, float]]  # request -> (predicted TTFT, margin) at its check
    classes: list[int]
    alternatives: dict[int, dict[str, float]]  # refused request -> {predictor: R}
    result: object = None                      # the base run's SimResult


def _loop(spec: RunSpec, workload: Workload, admission: dict | None = None) -> EventLoop:
    """The event loop of `spec` on `workload`, its admission's settings changed by `admission`
    (`AdmissionConfig` fields: variants of the predictor, compared in the same worlds)."""
    loop = EventLoop(workload, spec.cost.build(), spec.scheduler, spec.engine)
    if admission:
        adm = loop.gateway.admission
        adm.config = adm.predictor.config = replace(adm.config, **admission)
    return loop


def parse_admission(text: str | None) -> dict:
    """'arrival_window_s=20,retry_after_calibrated=false' -> AdmissionConfig field values."""
    from scheduler.admission import AdmissionConfig
    out: dict = {}
    if not text:
        return out
    fields = AdmissionConfig.__dataclass_fields__
    for part in text.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in fields:
            raise ValueError(f"--admission-config: {key!r} is no AdmissionConfig field")
        default = getattr(AdmissionConfig(), key)
        v = val.strip().lower()
        if key == "retry_after_calibrated":
            out[key] = None if v == "none" else v in ("1", "true", "on", "yes")
        elif isinstance(default, str):
            out[key] = val.strip()
        elif isinstance(default, bool):
            out[key] = v in ("1", "true", "on", "yes")
        elif isinstance(default, int):
            out[key] = int(val)
        else:
            out[key] = None if val.strip().lower() == "none" else float(val)
    AdmissionConfig(**out)  # validated
    return out


# Alternative Retry-Afters computed at a refusal from the same predictor state: name -> a
# function of (the predictor, the check's arguments, its deadline) -> seconds. The slot model's
# arrival horizon (how far ahead the higher classes' recent rate is projected) and its
# calibration (+ the median error of the prediction's pool: always, or only where the
# prediction itself met the deadline, so that the margin refused it: the calibration's errors
# are those of admitted requests, whose predictions met it).
def _with_config(calibrated: bool | str = True, **changes) -> Callable:
    def predict(pred, cls, depths, window_s, live, deadline):
        saved = pred.config
        pred.config = replace(saved, **changes)
        try:
            ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
        finally:
            pred.config = saved
        on = calibrated if calibrated != "below_deadline" else ttft <= deadline
        return max(0.0, ttft + pred.error_mid[pred.pool_at(cls, b)]) if on else ttft
    return predict


# ---- alternative Retry-Afters (scored in the same worlds) ----------------------------------------
def _point(pred, cls, depths, window_s, live, deadline):
    """The default rule: the wait with the higher classes' arrivals at their mean, the
    gateway's queue at the paced-gap rate (+ the gap model's calibration)."""
    ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
    return max(0.0, ttft + pred.retry_after_error(pred.pool_at(cls, b)))


def _slot_quantile(q: float) -> Callable:
    def predict(pred, cls, depths, window_s, live, deadline):
        """`AdmissionConfig.retry_after_quantile` = q, whatever the base run's setting."""
        ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
        ra = pred.slot_retry_after(b, cls, window_s, q) if b >= 0 else None
        return max(0.0, (ttft if ra is None else ra)
                   + pred.retry_after_error(pred.pool_at(cls, b)))
    return predict


def _shared_rate(f: Callable) -> Callable:
    """`f` with each backend's higher-class arrival rate replaced by the backends' mean."""
    def predict(pred, cls, depths, window_s, live, deadline):
        orig = pred.higher_rate

        def mean_rate(be, c, now):
            rs = [orig(other, c, now) for other in pred.backends.values()]
            n = len(rs) or 1
            r = sum(x for x, _ in rs) / n
            m = sum(x * y for x, y in rs) / (r * n) if r else 0.0
            return r, m
        pred.higher_rate = mean_rate
        try:
            return f(pred, cls, depths, window_s, live, deadline)
        finally:
            del pred.higher_rate
    return predict


def _median_of_futures(pred, cls, depths, window_s, live, deadline):
    """The median over the admission check's futures, without the gateway's queue."""
    ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
    if b < 0:
        return ttft
    return max(0.0, ttft - pred.backend_ttft(b, cls)
               + pred.backend_ttft(b, cls, quantile=0.5, send_in=window_s))


# the cluster-wide model (`cluster_wait`), tried in the fourteenth session and not adopted
CLUSTER_ARRIVALS = 256  # arrivals per future
RECENT_SENT = 256       # requests sent whose max_tokens the futures' arrivals draw from


@functools.lru_cache(maxsize=4)
def sampled_uniforms(n: int, length: int) -> tuple[tuple[float, ...], ...]:
    """`n` fixed sequences of `length` uniforms in [0, 1): which recent request's max_tokens
    each future arrival of `cluster_wait` holds."""
    rng = random.Random(32)
    return tuple(tuple(rng.random() for _ in range(length)) for _ in range(n))


def cluster_wait(self: WaitPredictor, b: int, cls: int, now: float, live, gateway_higher: int,
                 quantile: float, lengths: Sequence[int], tolerance: float = 0.1) -> float | None:
    """An alternative Retry-After's wait (not adopted): the `quantile` of a class-`cls`
    request's slot wait on `b` (sent now) with every backend's slots in one simulation, the
    higher classes' arrivals at the cluster's recent rate, each placed where its predicted
    TTFT is best (near-ties within `tolerance` avoid `b`), holding their slots for `lengths`
    drawn from the recent requests' (their mean if none), over the admission check's fixed
    Poisson futures (None: the slot model is off on `b`). `WaitPredictor._slot_wait`
    projects only `b`'s share of those arrivals, as if spread evenly whatever the backends'
    state; placement sends the next Fast or Normal request to the backend whose slot frees
    first, the slot a waiting Slow request there waits for. In the forked worlds it
    over-states the wait (Retry-After over the worlds' median 1.1-1.6, 4 x 8 slots at 1.5x,
    seeds 0-2): placement spreads the arrivals more than this rule does.
    `gateway_higher`: the higher classes' requests queued in the gateway now."""
    cfg = self.config
    target = self.backends.get(b)
    if not cfg.slot_model or target is None or not target.step:
        return None
    heaps: list[list[float]] = []
    frees: list[float] = []
    steps: list[float] = []
    own_ahead: list[int] = []  # b's same-class requests waiting before it (max_tokens)
    rate_h = mt_w = 0.0
    grant = now
    ib = -1
    for k in (self.backends if live is None else live):
        be = self.backends.get(k)
        if be is None or not be.step:
            continue
        slots = be.slots if cfg.reported_slots else be.seen_slots
        if not slots:
            continue
        step = be.step
        finishes = self._live_finishes(be, now)
        queued = list(be.queued.values())
        free = max(0, slots - len(finishes))
        heap = list(finishes)
        # what was sent there first takes the free slots now, whatever the class
        heap.extend(now + q[1] * step for q in queued[:free])
        heap.extend([now] * max(0, free - len(queued)))  # slots free now
        heapq.heapify(heap)
        # the waiting higher classes' requests take the next slots to free (Fast first)
        for q in sorted((q for q in queued[free:] if q[0] < cls), key=lambda q: q[0]):
            t = heapq.heappop(heap)
            heapq.heappush(heap, max(t, now) + q[1] * step)
        r, m = self.higher_rate(be, cls, now)
        rate_h += r
        mt_w += r * m
        if k == b:
            ib = len(heaps)
            own_ahead = [q[1] for q in queued[free:] if q[0] == cls]
            if cfg.compete_phase and be.tick > -math.inf:
                # a slot free now is taken at the backend's next step start
                grant = now + step - math.fmod(max(0.0, now - be.tick), step)
        heaps.append(heap)
        fs = be.free_service
        frees.append(fs[NUM_CLASSES - 1] or fs[NUM_CLASSES] or 1.5 * step)
        steps.append(step)
    if ib < 0:
        return None
    mt_h = mt_w / rate_h if rate_h else 0.0
    pick = sampled_uniforms(cfg.arrival_samples, CLUSTER_ARRIVALS)
    step = target.step
    horizon = now + cfg.arrival_horizon_s
    if rate_h:
        futures = sampled_arrivals(cfg.arrival_samples, CLUSTER_ARRIVALS)
    else:
        futures = ((),)
    waits = []
    for f, u in enumerate(futures):
        v = pick[f % len(pick)]
        hs = [list(h) for h in heaps]
        hb = hs[ib]
        n_own = 0
        pending = [now] * gateway_higher  # sent in the gateway's next flush
        a_idx = 0
        for _ in range(4 * CLUSTER_ARRIVALS + len(own_ahead) + gateway_higher):
            t_free = max(hb[0], grant)  # when b's next slot could be its (or its class's)
            if pending:
                a = pending.pop()
            elif a_idx < len(u) and rate_h:
                a = now + u[a_idx] / rate_h
                if a >= min(t_free, horizon):
                    a = math.inf
                else:
                    a_idx += 1
            else:
                a = math.inf
            if a < t_free:
                # a higher-class request arriving before b's slot is given: placed on the
                # backend whose slot frees first (one free now elsewhere before b's)
                j = _cluster_pick(hs, ib, a, frees, steps, tolerance)
                h = hs[j]
                if lengths and a_idx:
                    mt = lengths[int(v[a_idx - 1] * len(lengths))]
                else:
                    mt = mt_h
                heapq.heapreplace(h, max(h[0], a) + mt * step)
                continue
            if n_own < len(own_ahead):  # its own class's earlier requests first
                heapq.heapreplace(hb, t_free + own_ahead[n_own] * step)
                n_own += 1
                continue
            break
        waits.append(min(cfg.max_wait_s, max(0.0, max(hb[0], grant) - now)
                         if hb[0] > now else 0.0))
    waits.sort()
    return waits[min(len(waits) - 1, int(quantile * len(waits)))]


def _cluster_pick(hs: list[list[float]], ib: int, a: float, frees: list[float],
                  steps: list[float], tolerance: float) -> int:
    """Where a higher-class request arriving at `a` goes in `cluster_wait`: the backends
    whose predicted TTFT for it is within `tolerance` of the best are near-ties, and
    among them it avoids `ib` (which holds one more request: the waiting one)."""
    ttfts = []
    for x, h in enumerate(hs):
        w = h[0] - a
        ttfts.append(frees[x] if w <= 0.0 else w + steps[x] + max(0.0, frees[x] - 1.5 * steps[x]))
    limit = min(ttfts) * (1.0 + tolerance)
    return min((x for x in range(len(hs)) if ttfts[x] <= limit),
               key=lambda x: (x == ib, hs[x][0], x))


def _cluster(q: float) -> Callable:
    def predict(pred, cls, depths, window_s, live, deadline):
        ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
        if b < 0:
            return ttft
        lengths = [mt for c, mt in getattr(pred, "study_sent", ()) if c < cls]
        w = cluster_wait(pred, b, cls, pred.clock(), live, sum(depths[:cls]), q, lengths)
        return ttft if w is None else window_s + pred.slot_ttft(b, cls, w)
    return predict


ALTERNATIVES: dict[str, Callable] = {
    "point": _point,
    "quantile_0.5": _slot_quantile(0.5),
    "quantile_0.5_shared_rate": _shared_rate(_slot_quantile(0.5)),
    "point_shared_rate": _shared_rate(_point),
    "quantile_0.4": _slot_quantile(0.4),
    "quantile_0.6": _slot_quantile(0.6),
    "median_of_futures": _median_of_futures,
    "cluster_median": _cluster(0.5),
    "uncalibrated": _with_config(False),
    "calibrated": _with_config(True),
    "calibrated_below_deadline": _with_config("below_deadline"),
    **{f"horizon_{h:g}s": _with_config(arrival_horizon_s=h) for h in (0.0, 1.0, 2.0, 3.0, 10.0)},
    **{f"uncalibrated_horizon_{h:g}s": _with_config(False, arrival_horizon_s=h)
       for h in (1.0, 2.0, 3.0, 10.0)},
}


def base_run(spec: RunSpec, admission: dict | None = None) -> BaseRun:
    """The run with admission; at each refusal, the alternatives' Retry-Afters too."""
    w = generate(spec.workload)
    loop = _loop(spec, w, admission)
    gw = loop.gateway
    adm = gw.admission
    alts: dict[int, dict[str, float]] = {}
    check = adm.check
    arrivals = [0]

    def recording_check(cls, depths, window_s, ttft_override_ms=None, live=None, now=None):
        refusal = check(cls, depths, window_s, ttft_override_ms, live, now)
        if refusal is not None:
            # the request being checked: the loop pushes arrivals in index order, each
            # checked once
            deadline = refusal.deadline_s
            alts[arrivals[0]] = {name: f(adm.predictor, cls, list(depths), window_s, live,
                                         deadline)
                                 for name, f in ALTERNATIVES.items()}
        arrivals[0] += 1
        return refusal

    adm.check = recording_check
    sent: deque = deque(maxlen=RECENT_SENT)  # (class, max_tokens) of the requests sent
    adm.predictor.study_sent = sent
    dispatched = adm.predictor.dispatched

    def recording_dispatched(b, cls, key=None, max_tokens=0):
        sent.append((cls, max(1, max_tokens)))
        return dispatched(b, cls, key, max_tokens)

    adm.predictor.dispatched = recording_dispatched
    result = loop.run()
    if arrivals[0] != len(w):
        raise RuntimeError(f"{arrivals[0]} admission checks for {len(w)} arrivals")
    return BaseRun(w, dict(result.extra["retry_after_s"]),
                   dict(result.extra["admission_predictions"]),
                   [int(c) for c in result.queue_class], alts, result)


def admission_outcome(spec: RunSpec, base: BaseRun) -> dict:
    """What the base run's admission did, per class: sent, refused, met their TTFT target (of
    all sent: refused = missed), the admitted that missed it by > 10%, admitted TTFT p90."""
    res = base.result
    out = {}
    for c, name in enumerate(CLASS_NAMES):
        idx = [j for j in range(len(base.classes)) if base.classes[j] == c]
        target = spec.scheduler.slo.ttft_s(c, None)
        ttft = [float(res.first_token_time[j] - base.workload.arrival_time[j])
                for j in idx if j not in base.retry_after_s]
        out[name] = {"sent": len(idx), "refused": len(idx) - len(ttft),
                     "met": sum(t <= target for t in ttft) if target is not None else len(ttft),
                     "missed_by_10pct": (sum(t > 1.1 * target for t in ttft)
                                         if target is not None else 0),
                     "ttft_p90_ms": float(np.percentile(ttft, 90)) * 1e3 if ttft else None}
    return out


def outcomes_over_seeds(spec: RunSpec, seeds: Sequence[int], admission: dict | None = None) -> dict:
    """`admission_outcome` of the base run (no worlds) for each workload seed, and the totals."""
    per, total = {}, {}
    for seed in seeds:
        sp = replace(spec, workload=replace(spec.workload, seed=seed))
        o = per[seed] = admission_outcome(sp, base_run(sp, admission))
        for c, d in o.items():
            t = total.setdefault(c, {"sent": 0, "refused": 0, "met": 0, "missed_by_10pct": 0})
            for k in t:
                t[k] += d[k]
    return {"admission": dict(admission or {}), "seeds": list(seeds), "per_seed": per,
            "total": total}


def fork_wait(spec: RunSpec, base: BaseRun, i: int, seed: int | None,
              admission: dict | None = None) -> tuple[float, bool]:
    """(request i's TTFT in the world of `seed`, whether every admission prediction before i
    was the base run's: the same state at i's arrival)."""
    w = fork_workload(base.workload, spec.workload, i, seed)
    result = _loop(spec, w, admission).run()
    preds = result.extra["admission_predictions"]
    same = all(preds.get(j) == p for j, p in base.predictions.items() if j < i)
    return float(result.first_token_time[i] - w.arrival_time[i]), same


def study(spec: RunSpec, forks: int, classes: Sequence[int], max_refusals: int | None = None,
          seed0: int = 1000, progress: Callable[[str], None] | None = None,
          admission: dict | None = None) -> dict:
    """The module doc's study: per refused request of `classes`, its worlds and scores
    (`admission`: AdmissionConfig fields changed, in the base run and every world)."""
    if not (spec.scheduler.admission and spec.scheduler.slo.any_ttft):
        raise ValueError("the study needs admission on with TTFT targets (--admission --slo-ttft-ms)")
    t0 = time.perf_counter()
    base = base_run(spec, admission)
    refused = sorted(i for i in base.retry_after_s if base.classes[i] in classes)
    if max_refusals is not None and len(refused) > max_refusals:  # evenly over the run
        pick = np.linspace(0, len(refused) - 1, max_refusals).round().astype(int)
        refused = [refused[k] for k in sorted(set(pick.tolist()))]
    rows = []
    for n, i in enumerate(refused):
        r = base.retry_after_s[i]
        w0, same0 = fork_wait(spec, base, i, None, admission)
        waits, same = [], same0
        for k in range(forks):
            wk, s = fork_wait(spec, base, i, seed0 + k, admission)
            waits.append(wk)
            same = same and s
        row = {"request": i, "class": CLASS_NAMES[base.classes[i]],
               "arrival_s": float(base.workload.arrival_time[i]),
               "retry_after_s": r, "predicted_s": base.predictions[i][0],
               "own_future_wait_s": w0, "own_future_hit": bool(hit(r, [w0])[0]),
               "waits_s": waits, "prefix_identical": same, **score(r, waits)}
        row["alternatives"] = _alternative_scores(base.alternatives.get(i, {}), waits, w0)
        rows.append(row)
        if progress:
            progress(f"[{n + 1}/{len(refused)}] request {i} ({row['class']}, t={row['arrival_s']:.2f} s): "
                     f"Retry-After {r:.2f} s, waits p10/p50/p90 {row['wait_p10_s']:.2f}/"
                     f"{row['wait_median_s']:.2f}/{row['wait_p90_s']:.2f} s; hits current "
                     f"{row['current']:.2f} ceiling {row['best_loo']:.2f} "
                     f"({time.perf_counter() - t0:.0f} s)")
    met = admission_outcome(spec, base)
    return {"forks": forks, "tolerance": TOLERANCE, "admission": dict(admission or {}),
            "base_met_ttft": met, "classes": [CLASS_NAMES[c] for c in classes],
            "num_refused": {CLASS_NAMES[c]: sum(1 for j in base.retry_after_s if base.classes[j] == c)
                            for c in range(len(CLASS_NAMES))},
            "summary": summarize_rows(rows), "rows": rows,
            "wall_s": time.perf_counter() - t0}


def _alternative_scores(alts: dict[str, float], waits, w0) -> dict:
    return {name: {"retry_after_s": ra, "hit": float(np.mean(hit(ra, waits))),
                   "own_future_hit": bool(hit(ra, [w0])[0])} for name, ra in alts.items()}


def rescore(spec: RunSpec, res: dict, admission: dict | None = None) -> dict:
    """A study's worlds scored again with today's `ALTERNATIVES`: the base run again (the same
    refusals and Retry-Afters, checked), the worlds' waits from `res` (a Retry-After changes
    nothing that happens: no world needs simulating again). `admission`: settings over the
    study's own (`--admission-config`: e.g. `retry_after_quantile=none` to score a study made
    before that setting's default)."""
    base = base_run(spec, {**(res.get("admission") or {}), **(admission or {})} or None)
    for row in res["rows"]:
        i = row["request"]
        if base.retry_after_s.get(i) != row["retry_after_s"]:
            raise ValueError(f"request {i}: not the study's base run (other settings?): "
                             f"{base.retry_after_s.get(i)} vs {row['retry_after_s']}")
        row["alternatives"] = _alternative_scores(base.alternatives.get(i, {}), row["waits_s"],
                                                  row["own_future_wait_s"])
    res["summary"] = summarize_rows(res["rows"])
    return res


def summarize_rows(rows: list[dict]) -> dict:
    """Means over the refusals (the expected share of probes within +-25%), per class and all."""
    out = {}
    for name in [*CLASS_NAMES, "all"]:
        rs = [r for r in rows if name == "all" or r["class"] == name]
        if not rs:
            continue
        alt_names = sorted({a for r in rs for a in r["alternatives"]})
        out[name] = {
            "n": len(rs),
            **{k: float(np.mean([r[k] for r in rs]))
               for k in ("current", "median", "best_loo", "best_in")},
            "own_future_hit": float(np.mean([r["own_future_hit"] for r in rs])),
            "bias_p50": float(np.median([r["bias"] for r in rs])),
            "own_future_ratio_p50": float(np.median([r["retry_after_s"] / r["own_future_wait_s"]
                                                     for r in rs])),
            "spread_p90_over_p10_p50": float(np.median([r["wait_p90_s"] / r["wait_p10_s"]
                                                        for r in rs if r["wait_p10_s"] > 0] or [0])),
            "prefix_identical": all(r["prefix_identical"] for r in rs),
            "alternatives": {a: {"hit": float(np.mean([r["alternatives"][a]["hit"] for r in rs
                                                       if a in r["alternatives"]])),
                                 "own_future_hit": float(np.mean([
                                     r["alternatives"][a]["own_future_hit"] for r in rs
                                     if a in r["alternatives"]])),
                                 "bias_p50": float(np.median([
                                     r["alternatives"][a]["retry_after_s"] / r["wait_median_s"]
                                     for r in rs if a in r["alternatives"]]))}
                             for a in alt_names},
        }
    return out


def plot(res: dict, out_dir: str) -> list[str]:
    """Each refusal's worlds (p10-p90 of the waits, the median) and its Retry-After, by arrival."""
    import os

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = [r["arrival_s"] for r in rows]
    ax.vlines(t, [r["wait_p10_s"] for r in rows], [r["wait_p90_s"] for r in rows], color="0.6",
              label="wait, p10-p90 over the worlds")
    ax.scatter(t, [r["wait_median_s"] for r in rows], s=12, color="k", label="wait, median")
    ax.scatter(t, [r["own_future_wait_s"] for r in rows], s=12, marker="x", color="tab:green",
               label="wait in the run's own future")
    ax.scatter(t, [r["retry_after_s"] for r in rows], s=12, color="tab:red", label="Retry-After")
    ax.set_yscale("log")
    ax.set_xlabel("arrival of the refused request, s")
    ax.set_ylabel("s")
    s = res["summary"].get("all", {})
    ax.set_title(f"refused {'/'.join(res['classes'])}: Retry-After within ±25% in "
                 f"{100 * s.get('current', 0):.0f}% of worlds; ceiling {100 * s.get('best_loo', 0):.0f}%",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files = []
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"retry_after_bound.{ext}")
        fig.savefig(path, dpi=110)
        files.append(path)
    plt.close(fig)
    return files


def main(argv: list[str]) -> int:
    from sims.options import add_run_args, parse_with_config, spec_from_args
    p = argparse.ArgumentParser(prog="tidegate sim retry-bound",
                                description="the ceiling on Retry-After within +-25%: forked "
                                "futures per refused request (module doc)")
    add_run_args(p, num_requests=600)
    p.add_argument("--forks", type=int, default=20, help="worlds per refused request")
    p.add_argument("--classes", default="slow", help="refused classes studied (fast,normal,slow)")
    p.add_argument("--max-refusals", type=int, default=None,
                   help="study at most this many refusals, spread evenly over the run")
    p.add_argument("--fork-seed", type=int, default=1000, help="the first world's seed")
    p.add_argument("--outcome-seeds", type=int, default=0, metavar="N",
                   help="no worlds: admission's outcome per class over workload seeds 0..N-1")
    p.add_argument("--rescore", metavar="JSON", help="a study's output: score its worlds again "
                   "with the alternatives of today (the same flags as the study's)")
    p.add_argument("--admission-config", default=None, metavar="FIELD=V,...",
                   help="admission settings changed in the base run and every world "
                   "(scheduler.admission.AdmissionConfig fields: arrival_window_s=20,"
                   "retry_after_calibrated=false)")
    a = parse_with_config(p, argv)
    if a.forks < 2:
        p.error("--forks must be >= 2")
    spec = spec_from_args(a)
    spec = replace(spec, scheduler=replace(spec.scheduler, admission=True))
    classes = [CLASS_NAMES.index(c.strip()) for c in a.classes.split(",")]
    if a.outcome_seeds:
        res = outcomes_over_seeds(spec, range(a.outcome_seeds),
                                  parse_admission(a.admission_config))
        for c, t in res["total"].items():
            adm = t["sent"] - t["refused"]
            print(f"{c:<8} sent {t['sent']:>5}  refused {t['refused']:>4}  met {t['met']:>5} "
                  f"({100 * t['met'] / max(1, t['sent']):.1f}%)  admitted missing by > 10% "
                  f"{t['missed_by_10pct']}/{adm}")
        if a.json_out:
            with open(a.json_out, "w") as fh:
                json.dump(res, fh, indent=1)
                fh.write("\n")
        return 0
    if a.rescore:
        with open(a.rescore) as fh:
            res = rescore(spec, json.load(fh), parse_admission(a.admission_config))
    else:
        res = study(spec, a.forks, classes, a.max_refusals, a.fork_seed,
                    progress=lambda s: print(s, file=sys.stderr, flush=True),
                    admission=parse_admission(a.admission_config))
    res["config"] = spec.describe()
    print(f"{'class':<8}{'n':>4}{'current':>9}{'median':>8}{'ceiling':>9}{'in-sample':>10}"
          f"{'own fut.':>9}{'bias p50':>9}{'p90/p10':>8}")
    for name, s in res["summary"].items():
        print(f"{name:<8}{s['n']:>4}{100 * s['current']:>8.1f}%{100 * s['median']:>7.1f}%"
              f"{100 * s['best_loo']:>8.1f}%{100 * s['best_in']:>9.1f}%{100 * s['own_future_hit']:>8.1f}%"
              f"{s['bias_p50']:>9.2f}{s['spread_p90_over_p10_p50']:>8.2f}")
    print("base run, met TTFT / refused / admitted missing by > 10% / sent: " + ", ".join(
        f"{k} {v['met']}/{v['refused']}/{v['missed_by_10pct']}/{v['sent']}"
        for k, v in res["base_met_ttft"].items()))
    alls = res["summary"].get("all")
    if alls:
        for name, s in alls["alternatives"].items():
            print(f"  alternative {name:<16} hit {100 * s['hit']:5.1f}% (own future "
                  f"{100 * s['own_future_hit']:5.1f}%), bias p50 {s['bias_p50']:.2f}")
        if not alls["prefix_identical"]:
            print("WARNING: a world's history before its refusal differed from the base run's")
    if a.json_out:
        with open(a.json_out, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")
    if a.plot:
        plot(res, a.plot)
    return 0
