"""Issue 31, fourteenth session: both Retry-After rules scored on the same live probes.

    python paired.py RUN_DIR ...     # scripts/gpu_slo_run.sh outputs (decisions_a.jsonl[.gz],
                                     # records_a.jsonl[.gz]), RATE=47.8 echo 4 x 8 x 20 ms

Each run's decision log is replayed in the simulator with admission forced to the live
decisions (the gateway_slo_run.sh step 5 replay: 4 backends, 20 ms steps, 8 slots, placement by
predicted TTFT, Fast first, the slot model; probes are arrivals with their own target), and at
every request refused live both rules compute a Retry-After from the replay's state: `point`
(the rule before: the wait with the higher classes' arrivals at their mean, the gateway's queue
at the paced-gap rate) and `median` (`AdmissionConfig.retry_after_quantile` = 0.5, as committed in 0bcdd5b). Each is
scored against the wait the live probe of that refusal measured (|RA / wait - 1|), the same
probes for both: the runs' own noise (their states, the box's load) is common to the two.
Also the live gateway's own Retry-After (whichever rule that run's code had) for reference.
"""
from __future__ import annotations

import gzip
import json
import os
import sys

import numpy as np

from scheduler.admission import AdmissionControl
from scheduler.batcher import BatcherConfig
from scheduler.decisions import read_log
from scheduler.placement import PlacementConfig
from scheduler.slo import SLOTargets
from sims.adapters import SimSchedulerConfig
from sims.cost import ConstantCost
from sims.decision_replay import replay_run
from sims.event_loop import EngineConfig

SLO = "fast=150,normal=400,slow=1000"


def _open(path: str):
    return gzip.open(path + ".gz", "rt") if not os.path.exists(path) else open(path)


def replay_ras(run: str) -> dict[str, tuple[float, float]]:
    """live request id -> (point, median) Retry-After computed in the forced replay."""
    log = os.path.join(run, "decisions_a.jsonl")
    if not os.path.exists(log):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp, \
                gzip.open(log + ".gz", "rt") as fh:
            tmp.write(fh.read())
        log = tmp.name
    arrivals, _ = read_log(log)
    ordered = sorted(arrivals, key=lambda a: a.t)
    refused = {k for k, a in enumerate(ordered) if a.refused}
    out: dict[str, tuple[float, float]] = {}
    calls = [0]
    check = AdmissionControl.check

    def hooked(self, cls, depths, window_s, ttft_override_ms=None, live=None, now=None):
        k = calls[0]
        calls[0] += 1
        r = check(self, cls, depths, window_s, ttft_override_ms, live, now)
        if k in refused:
            pred = self.predictor
            ttft, b = pred.predict(cls, sum(depths[: cls + 1]), window_s, live)
            err = pred.retry_after_error(pred.pool_at(cls, b))
            point = max(0.0, ttft + err)
            ra = pred.slot_retry_after(b, cls, window_s, 0.5) if b >= 0 else None
            median = max(0.0, (ttft if ra is None else ra) + err)
            out[ordered[k].request_id] = (point, median)
        return r

    AdmissionControl.check = hooked
    try:
        slo = SLOTargets.parse(SLO, None)
        sched = SimSchedulerConfig(batcher=BatcherConfig(), slo=slo, admission=True,
                                   waiting_by_class=True, slot_model=True, max_num_seqs=8)
        replay_run(arrivals, sched, ConstantCost(0.020, num_blocks=1 << 14),
                   EngineConfig(num_samples=1, num_backends=4,
                                placement=PlacementConfig(policy="ttft")), forced=True)
    finally:
        AdmissionControl.check = check
    assert calls[0] == len(ordered), (calls[0], len(ordered))
    return out


def probes(run: str) -> list[tuple[str, str, float, float]]:
    """(live request id, class, the live Retry-After, the probe's wait) per probed refusal: the
    refused arrivals in the gateway's order joined with the records' refusals in send order."""
    with _open(os.path.join(run, "decisions_a.jsonl")) as fh:
        dec = [json.loads(line) for line in fh]
    ref = sorted((d for d in dec if d["kind"] == "arrival" and d.get("refused")),
                 key=lambda d: d["received"])
    with _open(os.path.join(run, "records_a.jsonl")) as fh:
        recs = sorted((r for r in map(json.loads, fh) if r["error"] == "http_429"),
                      key=lambda r: r["send_s"])
    assert len(ref) == len(recs), (run, len(ref), len(recs))
    return [(d["id"], r["class"], r["retry_after_s"], r["probe_ttft_s"])
            for d, r in zip(ref, recs) if r["probe_ttft_s"]]


def stats(err) -> str:
    e = np.abs(np.asarray(err, dtype=float))
    return (f"|err| p50 {np.median(e):5.2f} p90 {np.percentile(e, 90):5.2f} "
            f"within +-25% {100 * np.mean(e <= 0.25):5.1f}%")


def main(runs: list[str]) -> None:
    rows = []
    for run in runs:
        ras = replay_ras(run)
        for rid, cls, live_ra, wait in probes(run):
            point, median = ras[rid]
            rows.append((os.path.basename(run.rstrip("/")), cls, live_ra, point, median, wait))
    for cls in ("fast", "normal", "slow", "all"):
        v = [r for r in rows if cls == "all" or r[1] == cls]
        if not v:
            continue
        w = np.array([r[5] for r in v])
        print(f"{cls:<6} probes {len(v):4d}")
        for name, col in (("live gateway's", 2), ("replay point", 3), ("replay median", 4)):
            print(f"   {name:<15} {stats(np.array([r[col] for r in v]) / w - 1.0)}")
    if os.environ.get("ROWS"):
        with open(os.environ["ROWS"], "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
