"""The BENCHMARKS fidelity table (issue 35): one row per grid cell (model, weights, KV format,
lengths, load), every figure as its relative error mean ± 95% interval over the seeds, bold where
the interval lies inside the bound (P50 5%, P99 10%, throughput 2%), beside the mean window size
(live / simulated: with one-request windows "the same windows" cannot fail), the prefill steps
with the same chunks, and the runs behind the cell.

Inputs: `tidegate sim validate --json` files (one per grid part; the cell's model, weights, KV and
lengths are read from its config), or `bench.simulator.fidelity_resim --json` files (a
re-simulation of a committed session with other model terms: no windows or steps; give its
validate JSON with --validate for the cell's names).

    python -m bench.simulator.fidelity_table V1.json [V2.json ...] [--which replay_path|replay|run]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

METRICS = (("ttft_p50", "TTFT P50", 0.05), ("ttft_p99", "TTFT P99", 0.10), ("tpot_p50", "TPOT P50", 0.05),
           ("tpot_p99", "TPOT P99", 0.10), ("throughput", "throughput", 0.02))
# which comparison of a validate JSON: the replay of the recorded arrivals with the measured
# delivery path (the model's error alone), the replay without the path, or the independent run
WHICH = {"replay_path": "summary_replay_path", "replay": "summary_replay", "run": "summary"}


def _arg(cfg: dict, flag: str, default: str) -> str:
    """An engine flag's value from sim validate's --engine-arg/--serve-arg lists."""
    args = list(cfg.get("engine_arg") or []) + list(cfg.get("serve_arg") or [])
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return default


def cell_names(validate: dict) -> dict:
    cfg = validate["config"]
    model = str(cfg.get("model", "?")).removeprefix("deepseek-coder-")
    weights = _arg(cfg, "--quantization", "none")
    weights = {"none": validate.get("profile", {}).get("dtype", "bf16")}.get(weights, weights)
    weights = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(weights, weights)
    return {"model": model, "weights": weights, "kv": _arg(cfg, "--kv-cache-dtype", "auto"),
            "lengths": f"{cfg.get('input_len')}/{cfg.get('output_len')}",
            "runs": f"{len(str(cfg.get('seeds', '')).split(','))} x {cfg.get('num_requests')}"}


def _window_sizes(load: dict) -> tuple[float, float] | None:
    runs = [r.get("decisions") for r in load.get("runs", [])]
    if not runs or any(not r or "num_batches" not in r for r in runs):
        return None
    req = [sum(r["num_requests"][i] for r in runs) for i in (0, 1)]
    bat = [sum(r["num_batches"][i] for r in runs) for i in (0, 1)]
    return tuple(req[i] / bat[i] if bat[i] else math.nan for i in (0, 1))


def model_label(terms: dict | None) -> str:
    """The simulator's model terms in a few words (sim validate's profile.model_terms, or a
    fidelity_resim's model_terms)."""
    if not terms:
        return "as recorded"
    on = [name for key, name in (("hide_launch", "launch hidden"), ("power_cap", "power cap"))
          if terms.get(key)]
    if terms.get("power_cap") == "alike":  # fidelity_resim: prefill steps slowed alike (before)
        on[-1] = "power cap (prefill steps alike)"
    elif terms.get("power_cap") and "prefill_cap" in terms:  # fidelity_resim since the share
        on[-1] = "power cap by compute share"
    if terms.get("prefill_cap"):
        on.append(f"prefill cap {terms['prefill_cap']['max_tokens']}")
    if terms.get("async_plan_lead_ms") is not None:
        on.insert(0, "async loop")
    if terms.get("network_delay_ms"):
        on.append(f"dispatch {terms['network_delay_ms']:.2f} ms")
    if terms.get("live_step_times"):
        on.append("LIVE step times (diagnostic)")
    return ", ".join(on) or "sync loop"


def cells(doc: dict, which: str = "replay_path", names: dict | None = None) -> list[dict]:
    """One cell per load of a validate, fidelity_resim or fidelity_steps JSON (the latter: its
    re-simulation, with each run's same-prefill-chunks share)."""
    from bench.simulator.fidelity_stats import mean_ci

    names = names or cell_names(doc)
    shares, windows = {}, {}
    if "resim" in doc:  # bench.simulator.fidelity_steps
        for ld in doc.get("schedule", []):
            shares[ld["load_label"]] = mean_ci([r["same_prefill_step_share"] for r in ld["runs"]])
            if all(r.get("num_windows") for r in ld["runs"]):
                n = sum(r["num_requests"] for r in ld["runs"])
                windows[ld["load_label"]] = tuple(n / sum(r["num_windows"][i] for r in ld["runs"])
                                                  for i in (0, 1))
        doc = doc["resim"]
    terms = doc.get("model_terms") or doc.get("profile", {}).get("model_terms")
    if "model_terms" not in doc and "profile" in doc:  # sim validate: the async loop's lead too
        terms = {**(terms or {}), "async_plan_lead_ms": doc["profile"].get("async_plan_lead_ms")}
    out = []
    for ld in doc["loads"]:
        summ = ld.get(WHICH[which]) or ld.get("summary")
        figs = {}
        for key, _, bound in METRICS:
            s = summ[key]["rel_err"]
            mean, ci = float(s["mean"]), float(s.get("ci", math.nan))
            figs[key] = {"mean": mean, "ci": ci, "bound": bound,
                         "inside": bool(math.isfinite(ci) and abs(mean) + ci <= bound),
                         "mean_inside": bool(abs(mean) <= bound)}
        # the prefill steps of the replay this comparison reads (with the paths: steps_path)
        st = ld.get("steps_path") if which == "replay_path" and ld.get("steps_path") else ld.get("steps", {})
        steps = st.get("same_prefill_step_share") or shares.get(ld["load_label"])
        out.append({**names, "sim_model": model_label(terms), "load": ld["load_label"],
                    "rate": ld.get("rate"), "figures": figs,
                    "windows": _window_sizes(ld) or windows.get(ld["load_label"]),
                    "same_chunks": None if not steps else (steps["mean"], steps.get("ci", math.nan)),
                    "comparison": (which if ld.get(WHICH[which]) else
                                   "resim" if doc.get("source") == "bench.simulator.fidelity_resim" else "run")})
    return out


def _fmt(f: dict) -> str:
    ci = "" if not math.isfinite(f["ci"]) else f" ± {100 * f['ci']:.1f}"
    text = f"{100 * f['mean']:+.1f}{ci}"
    return f"**{text}**" if f["inside"] else text


def markdown(rows: list[dict]) -> str:
    head = ("| model | weights | KV | lengths | simulator | load | " + " | ".join(n for _, n, _ in METRICS)
            + " | mean window live / sim | same prefill chunks | seeds x requests |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        w = "–" if r["windows"] is None else f"{r['windows'][0]:.2f} / {r['windows'][1]:.2f}"
        sc = "–" if r["same_chunks"] is None else (
            f"{100 * r['same_chunks'][0]:.1f}%" + ("" if not math.isfinite(r["same_chunks"][1])
                                                 else f" ± {100 * r['same_chunks'][1]:.1f}"))
        figs = " | ".join(_fmt(r["figures"][k]) for k, _, _ in METRICS)
        lines.append(f"| {r['model']} | {r['weights']} | {r['kv']} | {r['lengths']} | {r['sim_model']} "
                     f"| {r['load']} | {figs} "
                     f"| {w} | {sc} | {r['runs']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.simulator.fidelity_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="sim validate (or fidelity_resim) JSON files")
    p.add_argument("--which", choices=tuple(WHICH), default="replay_path")
    p.add_argument("--validate", help="for fidelity_resim JSONs: the validate JSON they re-simulate")
    p.add_argument("--json", dest="json_out")
    a = p.parse_args(argv)
    names = cell_names(json.loads(Path(a.validate).read_text())) if a.validate else None
    rows = []
    for f in a.files:
        doc = json.loads(Path(f).read_text())
        rows += cells(doc, a.which, names if "config" not in doc else None)
    print(markdown(rows))
    print(f"\nrelative error (sim - live) / live, mean ± 95% interval over the seeds, in %; bold: the "
          f"interval inside the bound (P50 5%, P99 10%, throughput 2%); comparison: "
          f"{', '.join(sorted({r['comparison'] for r in rows}))}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
