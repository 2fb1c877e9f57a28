"""Cost of one placement decision per policy (scheduler.placement, scheduler.ttft_placement).

    python -m bench.scheduler.placement [--backends 4 64 512] [--num-requests 200000]

Each request: a random prompt head (one of 200 tenants, so prefixes repeat), placed alone
(`place_one`, the idle-flush window of one), the predictor told of its dispatch, and released
with its first token after 32 more requests (a steady in-flight load). The ttft policy's
predictor is measured first on every backend (as after warm-up). Prints microseconds per request
(placement + the bookkeeping the gateway does around it), best of `--repeat`.
"""
from __future__ import annotations

import argparse
import random
import time

from scheduler.admission import AdmissionConfig, WaitPredictor
from scheduler.placement import PlacementConfig
from scheduler.placements import create_placement
from scheduler.prefix_index import prefix_hashes


def run(policy: str, num_backends: int, num_requests: int, seed: int = 0) -> float:
    rng = random.Random(seed)
    p = create_placement(PlacementConfig(policy=policy))
    pred = WaitPredictor(AdmissionConfig(min_samples=2))
    for b in range(num_backends):
        p.add_backend(b)
        pred.add_backend(b)
        for k in range(4):  # measured: paced starts
            a = pred.dispatched(b, 1)
            pred.started(b, 1, 1.0 + 0.01 * k, 0.02 + 0.01 * k, a, 64, 2)
    if hasattr(p, "predictor"):
        p.predictor = pred
    heads = [prefix_hashes([t] * 64 + list(range(64)), 16) for t in range(200)]
    reqs = [(heads[rng.randrange(200)], rng.randrange(3)) for _ in range(num_requests)]
    inflight: list[tuple[int, int, int, int]] = []
    t0 = time.perf_counter()
    now = 2.0
    for prefix, cls in reqs:
        now += 1e-4
        if hasattr(p, "predictor"):
            b, charged = p.place_one(200, prefix, now, None, cls, 128)
        else:
            b, charged = p.place_one(200, prefix, now)
        inflight.append((b, cls, pred.dispatched(b, cls), charged))
        if len(inflight) > 32:
            ob, ocls, ahead, ocharged = inflight.pop(0)
            pred.started(ob, ocls, now, 0.05, ahead, 64, 2, 0.05)
            p.release(ob, ocharged)
    return (time.perf_counter() - t0) / num_requests * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", type=int, nargs="+", default=[4, 64, 512])
    ap.add_argument("--num-requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    print(f"{'backends':>8} " + " ".join(f"{pol:>13}" for pol in ("prefix", "ttft")) + "   us/request")
    for n in a.backends:
        row = [min(run(pol, n, a.num_requests) for _ in range(a.repeat)) for pol in ("prefix", "ttft")]
        print(f"{n:>8} " + " ".join(f"{v:>13.2f}" for v in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
