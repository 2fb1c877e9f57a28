"""Issue 35, session 18 (H35C): the cost model's error on the live steps WITH prefill, per kind, per call.

For each committed H200 part the model is built as `validate_replay` builds it (the part's own
profile, measured before the live runs in the same GPU call, and the validate's recorded terms:
hide_launch + power_cap) and charged at every live step's composition
(`bench.simulator.fidelity_steps.model_step_ms`: the power-cap factor from the busy shares before
the step, as the simulator applies it). Per step e = log(model / live). Steps after an idle spell
are left out of the kinds (they pay a launch the model adds apart; their own row).

The question is not the size of the error but its *structure*: a bin whose mean differs from the
call's other steps with prefill with the SAME sign in every call is a shape the model gets wrong
(fixable from the profile, if the profile measures it); a shift shared by every bin of a call and
of changing sign between calls is the call's level (the power / clock state the profile, measured
paused, does not carry). Each candidate is printed as rows bin x load, columns the parts, cells
"mean% sd n"; then the contrast of each bin against the call's steps with prefill at that load
(bin mean - all mean), which is what a structural term would remove.

    python chunk_bins.py [--json out.json] [PART_DIR ...]   (default: the 33B bf16 and 6.7B bf16 parts)
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from bisect import bisect_left
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from bench.simulator.fidelity_steps import live_steps, model_step_ms, read_steps
from bench.simulator.session_records import run_arrivals
from scheduler.decisions import read_log
from sims.profile_cost import ProfileCost

R = HERE.parent
PARTS = {  # name -> part folder (the call's raw files)
    "33b-s11": R / "fidelity_grid_h200_s11" / "33b",
    "33b-s13": R / "fidelity_grid_h200_s13" / "33b-seeds",
    "6.7b-s13": R / "fidelity_grid_h200_s13" / "6.7b",
    "6.7b-s14": R / "fidelity_grid_h200_s14" / "6.7b",
    "6.7b-s16": R / "fidelity_grid_h200_s16" / "6.7b",
}
LOADS = ("0.5x", "0.8x", "0.95x", "1.2x")


def smi_clock(part: Path, tag: str):
    """t (epoch s) -> the SM clock (MHz) of the nvidia-smi sample at or before it (100 ms samples),
    or None without the file."""
    f = part / f"smi_{tag}.csv.gz"
    if not f.exists():
        return None
    ts, mhz = [], []
    with gzip.open(f, "rt") as fh:
        for line in fh:
            if line.startswith("#") or not line.strip():
                continue
            c = [x.strip() for x in line.split(",")]
            try:
                t = datetime.strptime(c[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
                ts.append(t)
                mhz.append(float(c[1]))
            except ValueError:
                continue

    def at(t):
        i = bisect_left(ts, t)
        return mhz[max(0, min(i, len(ts) - 1))] if ts else None
    return at


def part_steps(part: Path) -> tuple[list[dict], ProfileCost, dict]:
    """Every live step of the part with: lr = log(model / live) (None for empty steps), load,
    seed index, the busy share f, and the candidate features (module doc)."""
    tag = part.name
    val = json.loads((part / f"validate_{tag}.json").read_text())
    terms = dict(val["profile"]["model_terms"])
    cost = ProfileCost.from_json(str(part / f"profile_{tag}.json"), **terms)
    arr, batches = read_log(part / f"decisions_{tag}.jsonl.gz")
    rows = read_steps(part / f"steps_{tag}.jsonl.gz")
    steps, bad = live_steps(rows, {a.request_id: a.max_tokens for a in arr})
    assert bad == 0, f"{part}: {bad} steps' rebuilt decode count differs from the log"
    label = {}
    for (si, li), (ars, _bs) in run_arrivals(val, arr, batches).items():
        for a in ars:
            label[a.request_id] = (val["loads"][li]["load_label"], si)
    clock = smi_clock(part, tag)
    cur = ("warm-up", -1)
    since = None  # decode-only steps since the last step with prefill
    last_pf_end = None
    for row, s in zip(rows, steps, strict=True):
        if row["prefill"]:
            cur = label.get(str(row["prefill"][0][0]), ("warm-up", -1))
        s["load"], s["seed"] = cur
        s["clock"] = clock(float(row["t"])) if clock else None
        s["since_prefill"] = since
        s["gap_ms"] = None if last_pf_end is None else 1e3 * (s["start"] - last_pf_end)
        if s["p"]:
            since, last_pf_end = 0, s["end"]
        elif since is not None:
            since += 1
    for s in steps:
        s["lr"] = None
    for k, t, f in model_step_ms(cost, steps):
        steps[k]["lr"] = float(np.log(t / steps[k]["ms"]))
        steps[k]["model_ms"] = t
        steps[k]["f"] = f
    return steps, cost, val


def bucket_of(n, buckets):
    if buckets is None:
        return None
    i = int(np.searchsorted(buckets, n))
    return int(buckets[i]) if i < len(buckets) else None


def candidates(cost: ProfileCost) -> dict:
    """name -> step -> bin label (None: not in this table). Steps with prefill only, after a
    step (not an idle spell)."""
    tb = cost.token_buckets
    measured_p = sorted({int(p) for p in cost.points[:, 1] if p > 0})

    def pos(s):
        st = [x for _, x in s["chunks"]]
        return "first chunk (start 0)" if all(x == 0 for x in st) else \
            "later chunk (start > 0)" if all(x > 0 for x in st) else "both kinds"

    def kbin(s):
        k = len(s["chunks"])
        return f"k {k}" if k < 3 else "k 3+"

    def dbin(s):
        d = s["d"]
        for lo, hi in ((0, 0), (1, 8), (9, 16), (17, 32), (33, 48), (49, 64), (65, 96), (97, 10 ** 6)):
            if lo <= d <= hi:
                return f"d {lo:3d}-{hi if hi < 10 ** 6 else '':>3}"

    def cbin(s):
        if not s["d"]:
            return None
        c = s["ctx"] / s["d"]
        lo = min(int(c // 128) * 128, 1024)
        return f"ctx/d {lo:4d}{'+' if lo == 1024 else '-' + str(lo + 127)}"

    def padbin(s):
        n = s["d"] + s["p"]
        b = bucket_of(n, tb)
        if b is None:
            return "eager (> largest bucket)"
        pad = b - n
        return f"bucket {b:4d}, pad {'0' if pad == 0 else '1-16' if pad <= 16 else '17-48' if pad <= 48 else '49+'}"

    def prev(s):
        n = s["since_prefill"]
        if n is None:
            return None
        return ("after a prefill step" if n == 0 else "after 1 decode-only" if n == 1 else
                "after 2-4 decode-only" if n <= 4 else "after 5-16 decode-only" if n <= 16 else
                "after 17+ decode-only")

    def fbin(s):
        f = s.get("f", 0.0)
        return "busy share < 0.25" if f < 0.25 else "busy share 0.25-0.5" if f < 0.5 else \
            "busy share 0.5-0.75" if f < 0.75 else "busy share >= 0.75"

    def interp(s):
        p = s["p"]
        if p in measured_p:
            return f"p {p} (a measured p)"
        if p < measured_p[0]:
            return f"p < {measured_p[0]} (below the smallest measured p)"
        return "p between measured p"

    def clk(s):
        c = s.get("clock")
        if c is None:
            return None
        lo = int(c // 100) * 100
        return f"SM {lo}-{lo + 99} MHz"

    return {"(1) chunk position (prefix)": pos, "(2) prefill sequences in the step": kbin,
            "(3a) decodes beside the chunks": dbin, "(3b) decode context per sequence": cbin,
            "(4) mixed graph token bucket / pad": padbin, "(5) the step before": prev,
            "(5b) the model's prefill-busy share before": fbin, "(6) p against the profile's p": interp,
            "(clock) nvidia-smi SM clock at the step": clk}


def cell(x):
    return f"{100 * np.mean(x):+6.2f} {100 * np.std(x):4.1f} {len(x):5d}" if len(x) else f"{'':>17s}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", help="name=PART_DIR (default: the module's PARTS)")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    parts = dict(PARTS) if not a.parts else {p.split("=")[0]: Path(p.split("=")[1]) for p in a.parts}
    data, costs = {}, {}
    for name, path in parts.items():
        steps, cost, _ = part_steps(path)
        data[name], costs[name] = steps, cost
        print(f"# {name}: {path.relative_to(R) if path.is_relative_to(R) else path}, {len(steps)} steps, "
              f"profile points {len(cost.points)}, terms {cost.describe()['power_cap'] is not None and 'power_cap' or ''}"
              f" hide_launch {cost.hides_launch}")
    names = list(parts)
    out = {"parts": {n: str(p) for n, p in parts.items()}, "tables": {}}
    hdr = f"{'bin':44s} {'load':6s}" + "".join(f" | {n:>17s}" for n in names)
    sub = f"{'':44s} {'':6s}" + "".join(f" | {'mean%   sd     n':>17s}" for _ in names)

    def sel(steps, load):
        return [s for s in steps if s["lr"] is not None and s["load"] == load]

    # the kinds first: what the earlier analysis summed up
    print("\n## step kinds, log(model/live): mean % / sd % / n (after-idle steps apart)")
    print(hdr)
    print(sub)
    for kind, f in (("decode-only", lambda s: not s["p"] and s["since_prefill"] is not None),
                    ("with prefill", lambda s: s["p"] and s["since_prefill"] is not None),
                    ("with prefill, after idle", lambda s: s["p"] and s["since_prefill"] is None)):
        for load in LOADS + ("all",):
            row = []
            for n in names:
                x = [s["lr"] for s in data[n] if s["lr"] is not None and (load == "all" or s["load"] == load)
                     and f(s) and s["load"] != "warm-up"]
                row.append(cell(x))
                out["tables"].setdefault("kinds", {}).setdefault(kind, {}).setdefault(load, {})[n] = \
                    [float(np.mean(x)) if x else None, float(np.std(x)) if x else None, len(x)]
            print(f"{kind:44s} {load:6s}" + "".join(f" | {c}" for c in row))

    # the candidates, on the steps with prefill after a step (not idle)
    for cname in candidates(costs[names[0]]):
        print(f"\n## {cname}: steps with prefill, log(model/live) mean % / sd % / n; "
              "then contrast = bin mean - the call's mean at that load (pp)")
        bins: dict = {}
        for n in names:
            key = candidates(costs[n])[cname]
            for s in data[n]:
                if s["lr"] is None or not s["p"] or s["since_prefill"] is None or s["load"] not in LOADS:
                    continue
                b = key(s)
                if b is None:
                    continue
                bins.setdefault(b, {}).setdefault(s["load"], {}).setdefault(n, []).append(s["lr"])
        print(hdr)
        print(sub)
        tab = out["tables"].setdefault(cname, {})
        for b in sorted(bins):
            for load in LOADS:
                row = [cell(bins[b].get(load, {}).get(n, [])) for n in names]
                if all(not c.strip() for c in row):
                    continue
                print(f"{b:44s} {load:6s}" + "".join(f" | {c}" for c in row))
        print(f"{'contrast (pp), n >= 20':44s} {'':6s}" + "".join(f" | {n:>17s}" for n in names))
        for b in sorted(bins):
            for load in LOADS:
                row, signs = [], []
                for n in names:
                    x = bins[b].get(load, {}).get(n, [])
                    allx = [s["lr"] for s in sel(data[n], load) if s["p"] and s["since_prefill"] is not None]
                    if len(x) >= 20 and allx:
                        c = 100 * (np.mean(x) - np.mean(allx))
                        se = 100 * np.std(x) / np.sqrt(len(x))
                        row.append(f"{c:+6.2f} ±{se:4.2f}     ")
                        signs.append(np.sign(c) if abs(c) > 2 * se else 0)
                        tab.setdefault(b, {}).setdefault(load, {})[n] = {
                            "mean": float(np.mean(x)), "sd": float(np.std(x)), "n": len(x),
                            "contrast": float(c / 100), "se": float(se / 100)}
                    else:
                        row.append(f"{'':17s}")
                if not signs:
                    continue
                verdict = ("same sign in every call" if len(signs) == len(names) and abs(sum(signs)) == len(names)
                           else "")
                print(f"{b:44s} {load:6s}" + "".join(f" | {c}" for c in row) + f"  {verdict}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
