"""Capacity as the rate where TTFT starts to grow (issue 31, fifteenth session): the SLO control's
"1.5x capacity" is read off a short rate sweep through the control gateway, not off a rate-inf
burst (a burst measures the throughput of a backend with a full queue; the rate a backend keeps
up with, queueing nothing, is lower, and is what a load factor should multiply).

Rule: the sweep's rates in increasing order; a rate passes while its TTFT p90 is at most
`factor` x the lowest rate's (+ `slack_ms`, so a fast backend's few-ms p90 does not fail on
noise); the capacity is the last rate that passes before the first that does not (later ones
are not read: a sweep may stop at the first failure). Not the delivered throughput: over a
short run it counts the drain after the last arrival (120 requests at 12/s: ~0.8 of the rate).

    python -m bench.serving.rate_knee sweep_*.json            # bench serve --json outputs
    python -m bench.serving.rate_knee --next sweep_*.json     # exit 0: sweep on; 1: stop
"""
from __future__ import annotations

import argparse
import json
import sys

FACTOR = 2.0
SLACK_MS = 50.0


def knee(rows: list[tuple[float, float]], factor: float = FACTOR,
         slack_ms: float = SLACK_MS) -> tuple[float | None, bool]:
    """rows: (offered rate, TTFT p90 ms). (capacity: the last passing rate, None if the lowest
    fails; whether every row passed, i.e. the sweep may go on)."""
    rows = sorted(rows)
    if not rows:
        return None, True
    base = rows[0][1]
    cap = None
    for rate, p90 in rows:
        if p90 > factor * base + slack_ms:
            return cap, False
        cap = rate
    return cap, True


def read(path: str) -> tuple[float, float]:
    """(rate, TTFT p90 ms) of a `tidegate bench serve --json` file."""
    with open(path) as fh:
        d = json.load(fh)
    return float(d["config"]["rate"]), float(d["ttft_ms"]["p90"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.rate_knee", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--next", action="store_true",
                   help="exit 0 when every rate so far passes (sweep on), 1 when one failed")
    p.add_argument("--factor", type=float, default=FACTOR)
    p.add_argument("--slack-ms", type=float, default=SLACK_MS)
    a = p.parse_args(argv)
    cap, go_on = knee([read(f) for f in a.files], a.factor, a.slack_ms)
    if a.next:
        return 0 if go_on else 1
    print(cap if cap is not None else 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
