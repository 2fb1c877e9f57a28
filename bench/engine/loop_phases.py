"""`python -m bench.engine.loop_phases --out FILE -- BACKEND ARGS`: run `tidegate backend` with
the serving loop's phases and the cyclic GC timed, to attribute a stall of the loop (issue 28:
the H200 step logs' idle gaps between steps).

Times every call of the worker's phases (`_poll`, `_drain` with `_add` per admitted request,
`_step`, `_deliver`, `_flush_pending`, `_maybe_report`, `_flush_outboxes`) and the engine's (`_launch`,
`_drafts`, `_finish`, `_outputs`), and every collection of the cyclic GC (gc.callbacks), as
(perf_counter at its start, ms). Written as JSON to FILE when the backend exits (SIGTERM). The
step log (`--step-log`) is on the same clock (`mono`: CLOCK_MONOTONIC, as perf_counter on
Linux), so `--report STEPLOG` prints each phase's figures over the steps' span and, for the
longest gaps between two steps that decode, what ran in them (and which phase held each long GC
collection).

    python -m bench.engine.loop_phases --out phases.json -- --listen ipc:///tmp/b.sock \\
        --model tiny --load-format dummy --device cpu --step-log steps.jsonl &
    tidegate serve --backend ipc:///tmp/b.sock ...; tidegate bench serve ...; kill %1
    python -m bench.engine.loop_phases --report steps.jsonl --out phases.json
"""
from __future__ import annotations

import argparse
import atexit
import gc
import itertools
import json
import sys
import time
from collections import defaultdict

# `_poll`: the loop's wait for messages, up to the next launch's deadline (async scheduling:
# Engine.launch_deadline); a long one in a gap is the deadline's estimate, not host work
WORKER_PHASES = ("_poll", "_drain", "_add", "_step", "_deliver", "_flush_pending",
                 "_maybe_report", "_flush_outboxes")
ENGINE_PHASES = ("_launch", "_drafts", "_finish", "_outputs")


def instrument(out: str) -> dict[str, list]:
    from backend.engine import continuous
    from backend.server import worker
    rec: dict[str, list] = defaultdict(list)

    def wrap(cls, name: str, label: str) -> None:
        f = getattr(cls, name)

        def timed(self, *a, **k):
            t = time.perf_counter()
            try:
                return f(self, *a, **k)
            finally:
                rec[label].append((t, (time.perf_counter() - t) * 1000))
        setattr(cls, name, timed)

    for name in WORKER_PHASES:
        wrap(worker.Worker, name, name)
    for name in ENGINE_PHASES:
        wrap(continuous.Engine, name, "engine." + name)
    start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            rec[f"gc{info['generation']}"].append((start[0],
                                                   (time.perf_counter() - start[0]) * 1000))
    gc.callbacks.append(on_gc)

    def dump() -> None:
        with open(out, "w") as fh:
            json.dump(rec, fh)
    atexit.register(dump)
    return rec


def report(step_log: str, phases: str, top: int = 10) -> None:
    with open(phases) as fh:
        rec = json.load(fh)
    with open(step_log) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    first, last = rows[0]["mono"], rows[-1]["mono"] + rows[-1]["ms"] / 1000
    print(f"{'phase':<22} {'calls':>7} {'total ms':>9} {'max':>7} {'p99':>7}")
    for k, v in sorted(rec.items()):
        ms = sorted(x[1] for x in v if first <= x[0] <= last)
        if ms:
            print(f"{k:<22} {len(ms):>7} {sum(ms):>9.0f} {ms[-1]:>7.1f} "
                  f"{ms[int(0.99 * (len(ms) - 1))]:>7.2f}")
    events = sorted((t, ms, k) for k, v in rec.items() for t, ms in v
                    if k not in ("_step", "engine._launch", "engine._finish"))
    gaps = []
    for a, b in itertools.pairwise(rows):
        end = a["mono"] + a["ms"] / 1000
        if a["decodes"] > 1 and b["decodes"] > 1:
            inside = [(k, round(ms, 1)) for t, ms, k in events
                      if end - 0.0005 <= t <= b["mono"] and ms > 2]
            gaps.append(((b["mono"] - end) * 1000, a["decodes"], inside))
    print("longest gaps between decoding steps (ms, decodes, phases over 2 ms in them):")
    for g, d, inside in sorted(gaps, key=lambda x: -x[0])[:top]:
        print(f"  {g:7.1f} {d:4d} {inside}")
    spans = [(t, t + ms / 1000, k) for k, v in rec.items() if not k.startswith("gc")
             for t, ms in v]
    print("GC collections over 5 ms, and the phases they ran in:")
    for k in ("gc0", "gc1", "gc2"):
        for t, ms in rec.get(k, []):
            if first <= t <= last and ms > 5:
                print(f"  {k} {ms:6.1f} ms in {[s[2] for s in spans if s[0] <= t <= s[1]]}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.engine.loop_phases",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="phases JSON (written at exit / read)")
    p.add_argument("--report", metavar="STEPLOG", help="print the report of a finished run")
    p.add_argument("backend_args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.report:
        report(args.report, args.out)
        return
    instrument(args.out)
    from backend.server.cli import main as backend_main
    rest = args.backend_args[1:] if args.backend_args[:1] == ["--"] else args.backend_args
    sys.exit(backend_main(rest))


if __name__ == "__main__":
    main()
