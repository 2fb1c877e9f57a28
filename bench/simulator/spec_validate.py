"""Simulator vs live for speculative decoding (issue 28's goal: TPOT p50 and throughput within
5% of live for the oracle edit workload at 3 loads, and the same policy decisions).

    python -m bench.simulator.spec_validate --live edit_c1.json edit_c8.json edit_c32.json \\
        --sim sim_c1.json sim_c8.json sim_c32.json [--json spec_validate.json]

`--live`: `tidegate bench serve --workload edit --oracle --json` outputs; `--sim`:
`python -m sims.speculation --trace <that run's --trace-dir>/<run>.jsonl --json` outputs, one
per live file, same order. For every run the two share (off, keep=...): TPOT p50, output
throughput, and the policy's decisions as the counters show them (draft tokens per verify,
acceptance), with the sim/live ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TOLERANCE = 0.05


def _live(run: dict) -> dict:
    spec = run.get("spec_decode") or {}
    drafts = spec.get("vllm:spec_decode_num_drafts_total") or 0.0
    tokens = spec.get("vllm:spec_decode_num_draft_tokens_total") or 0.0
    return {"tpot_p50_ms": run["tpot_ms"]["p50"], "throughput": run["output_throughput"],
            "drafts_per_request": drafts / max(1, run["completed"]),
            "draft_tokens_per_verify": tokens / drafts if drafts else 0.0,
            "acceptance": spec.get("acceptance_rate")}


def _sim(s: dict) -> dict:
    verifies = s.get("verifies") or 0
    return {"tpot_p50_ms": (s["tpot_p50_s"] or 0.0) * 1e3,
            "throughput": s["output_throughput_tok_s"],
            "drafts_per_request": verifies / max(1, s["num_requests"]),
            "draft_tokens_per_verify": s["draft_tokens"] / verifies if verifies else 0.0,
            "acceptance": s.get("acceptance_rate")}


def compare(live: dict, sim: dict) -> list[dict]:
    rows = []
    for name, run in live["runs"].items():
        if name == "off":
            sim_run = next(iter(sim["runs"].values()), {}).get("off")
        else:
            sim_run = (sim["runs"].get(name) or {}).get("on")
        if sim_run is None:
            continue
        a, b = _live(run), _sim(sim_run)
        row = {"concurrency": live["concurrency"], "run": name, "live": a, "sim": b}
        for key in ("tpot_p50_ms", "throughput"):
            row[f"{key}_ratio"] = b[key] / a[key] if a[key] else None
        row["within_5pct"] = all(r is not None and abs(r - 1.0) <= TOLERANCE
                                 for r in (row["tpot_p50_ms_ratio"], row["throughput_ratio"]))
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    out = [(f"{'c':>3} {'run':<10}{'TPOT live':>10}{'sim':>8}{'ratio':>7}{'tok/s live':>11}"
           f"{'sim':>8}{'ratio':>7}{'k/verify live':>14}{'sim':>6}{'accept live':>12}{'sim':>7}")]
    for r in rows:
        a, b = r["live"], r["sim"]

        def acc(x):
            return "" if x is None else f"{x:.3f}"
        out.append(f"{r['concurrency']:>3} {r['run']:<10}{a['tpot_p50_ms']:>10.2f}"
                   f"{b['tpot_p50_ms']:>8.2f}{r['tpot_p50_ms_ratio'] or 0:>7.3f}"
                   f"{a['throughput']:>11.1f}{b['throughput']:>8.1f}{r['throughput_ratio'] or 0:>7.3f}"
                   f"{a['draft_tokens_per_verify']:>14.2f}{b['draft_tokens_per_verify']:>6.2f}"
                   f"{acc(a['acceptance']):>12}{acc(b['acceptance']):>7}"
                   f"{'' if r['within_5pct'] else '  > 5%'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.simulator.spec_validate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--live", nargs="+", required=True)
    p.add_argument("--sim", nargs="+", required=True)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if len(args.live) != len(args.sim):
        p.error("give one --sim file per --live file")
    rows = []
    for lf, sf in zip(args.live, args.sim):
        rows += compare(json.loads(Path(lf).read_text()), json.loads(Path(sf).read_text()))
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "tolerance": TOLERANCE},
                                              indent=2) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
