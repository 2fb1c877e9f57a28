"""Is a cached profile this card's? A short re-measurement of a few of its points (issue 35, session 38).

A profile is a property of one card, not of a kind of card. On four H100 80GB HBM3 calls the same 6.7B
grid read two levels: two cards alike (decode points 1.000, prefill 1.005 of each other) and two whose
decode points ran 3.0-3.8 % slower at every decode batch (median 3.3 %) and whose prefill points ran
1.1-2.4 % slower: a card with ~3 % less memory bandwidth and ~1 % less compute. Replayed on a profile
of the faster card, the slower card's live runs read TPOT P50 -4 to -6 % and TTFT P50 -4 to -12 %
(bench/results/pairs_s38). `sim validate` measures a profile only when none is cached, and the grid's
device calls reuse a profile from an earlier call (`PROFILE_FROM`) to spend the device time on seeds:
without a check, such a call scores the card difference as the simulator's error.

`check_grid` picks the check's shapes from the cached grid itself: decode batches 1 / 16 / 32 / 48 / 64 / 128
(as far as the grid has them: 32 and 48 end two decode graphs) at its first context, each beside every one-prompt chunk size of the grid. A
decode-bound and a compute-bound reading, ~30 points (26 of them compared on the validate grid), an eighth of a profile's; every chunk size so that
each decode-only point follows the step it follows in the whole grid (the largest chunk that fits beside
the previous batch): a decode point's time depends on the step before it (session 32's conditioning). `backend profile`
measures them as the cached profile measured its own (its pause, repetitions, device timing, KV fill),
without the extra runs (pause check, spread and tile points, block-order check). `compare` reads each
against the cached point of the same shape: the median ratio of the decode-only points and of the
points with prefill. Outside the tolerance the profile is another card's, and `sim validate
--profile-check reprofile` measures a whole profile instead (warn: record and go on).

A single point beyond three times the tolerance also fails the check (POINT_TOLERANCE_FACTOR): a change
confined to one or two decode graphs moves no median. A profile also belongs to one engine setting: `compare`
sets the settings both profiles record (ENGINE_KEYS: weights, the FP8 GEMV switch, the decode graphs) side by
side, and a cached profile measured at other settings is not this service's either (session 39).

The check does not rescale the cached profile: one ratio per kind of step would carry a card's level
but not its shape (the pause check's power terms, the tiles), and a profile measured on the card is
what the simulator is validated on."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECK_DECODE_BATCHES = (1, 16, 32, 48, 64, 128)
# The two H100 levels differ by ~3.3 % (decode) and ~1.4 % (prefill); two whole profiles of one card,
# or of two alike, agree to ~0.5 % (bench/results/pairs_s38/README.md): 1.5 % sits between.
DEFAULT_TOLERANCE_PCT = 1.5
# A single point may also give the profile away: a change confined to one or two graphs (a kernel path of the
# 24- and 32-row decode graphs moves d 32 by ~9 % and no median) is not the card's level. Alike cards' whole grids
# read every point within 2.6 % of each other (the H100 6.7B, sessions 35 / 37), one card minutes apart within
# 2.5 % (session 39): a point beyond 3x the tolerance (4.5 %) is something else.
POINT_TOLERANCE_FACTOR = 3.0


def _plain(pt: dict) -> bool:
    """A grid point: one prompt from position 0 (or none) beside equal contexts, not a verify."""
    return ("decode_spread" not in pt and "num_draft_tokens" not in pt
            and pt.get("num_prefill_seqs", 0) <= 1 and not pt.get("prefill_context_len", 0))


def _key(pt: dict) -> tuple[int, int, int]:
    return int(pt["num_decode_seqs"]), int(pt["num_prefill_tokens"]), int(pt["context_len"])


def check_grid(doc: dict) -> dict[str, str]:
    """The check's `backend profile` grid, from the cached profile's own grid points: the decode
    batches of CHECK_DECODE_BATCHES it has (with fewer than two, its smallest, middle and largest),
    its one-prompt chunk sizes, and its first decode context."""
    pts = [p for p in doc["points"] if _plain(p)]
    ds = sorted({int(p["num_decode_seqs"]) for p in pts if p["num_decode_seqs"] and not p["num_prefill_tokens"]})
    ps = sorted({int(p["num_prefill_tokens"]) for p in pts if p["num_prefill_tokens"]})
    cs = sorted({int(p["context_len"]) for p in pts if p["num_decode_seqs"] and not p["num_prefill_tokens"]})
    if not ds or not cs:
        raise ValueError("the profile has no decode-only grid points to check")
    use_d = [d for d in CHECK_DECODE_BATCHES if d in ds]
    if len(use_d) < 2:  # a small grid (the CPU's): its ends and middle
        use_d = sorted({ds[0], ds[len(ds) // 2], ds[-1]})
    return {"decode_batch_sizes": ",".join(map(str, use_d)),
            "prefill_tokens": ",".join(map(str, [0, *ps])), "context_lens": str(cs[0])}


def check_points(doc: dict, cached: dict) -> dict:
    """`doc` with only its grid points at the shapes the check measures against `cached`: what a
    whole profile of another card reads at the check (offline: committed profiles against each other)."""
    from bench.engine.profile import step_shapes  # torch: only when asked

    g = check_grid(cached)
    ints = [[int(x) for x in g[k].split(",") if x] for k in ("decode_batch_sizes", "prefill_tokens", "context_lens")]
    shapes = {(d, p, c) for d, p, c, _k, _s in step_shapes(
        *ints, [], [], None, max_num_seqs=int(cached.get("max_num_seqs") or 256),
        max_num_batched_tokens=int(cached.get("max_num_batched_tokens") or 2048),
        max_model_len=int(cached.get("max_model_len") or 16384), budget_packed=False)}
    return {**doc, "points": [p for p in doc["points"] if _plain(p) and _key(p) in shapes]}


def _time_of(pt: dict, device: bool) -> float | None:
    return pt.get("device_ms_median") if device else pt.get("step_ms_median", pt.get("step_ms"))


# What a profile records of the engine that ran its steps, beyond the card: a cached profile measured
# at other settings is not this service's, whatever its points read (the check's six decode points can
# miss a change confined to a few decode graphs, as --fp8-gemv-max-m 16 is: d 17-32 only).
ENGINE_KEYS = ("quantization", "fp8_gemv_max_m", "cuda_graph_decode_buckets")
# The FP8 GEMV / _scaled_mm switch of every profile measured before it was recorded (session 39)
FP8_GEMV_MAX_M_BEFORE_RECORDED = 32


def engine_settings(doc: dict) -> dict:
    """The profile's engine settings (ENGINE_KEYS that it records; fp8 profiles from before the switch
    was recorded ran it at 32)."""
    out = {k: doc[k] for k in ENGINE_KEYS if k in doc}
    if out.get("quantization") == "fp8":
        out.setdefault("fp8_gemv_max_m", FP8_GEMV_MAX_M_BEFORE_RECORDED)
    return out


def engine_differences(cached: dict, check: dict) -> list[str]:
    """'key cached -> check' for each engine setting both profiles record and that differs."""
    a, b = engine_settings(cached), engine_settings(check)
    return [f"{k} {a[k]} -> {b[k]}" for k in ENGINE_KEYS if k in a and k in b and a[k] != b[k]]


def compare(cached: dict, check: dict, tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> dict:
    """The check's points against the cached points of the same shape (d, p, c): ratio check /
    cached of the device-timed medians where both profiles have them (else the step medians), the
    median ratio per kind of step (decode-only, with prefill), and whether both lie within
    `tolerance_pct` of 1."""
    old = {}
    for p in cached["points"]:
        if _plain(p):
            old.setdefault(_key(p), p)
    new = [p for p in check["points"] if _plain(p) and _key(p) in old]
    device = all(p.get("device_ms_median") for p in new) and all(old[_key(p)].get("device_ms_median") for p in new)
    rows = []
    for p in new:
        a, b = _time_of(old[_key(p)], device), _time_of(p, device)
        if a and b:
            d, n, c = _key(p)
            rows.append({"d": d, "p": n, "c": c, "cached_ms": a, "check_ms": b, "ratio": b / a})
    kinds = {}
    for kind, pick in (("decode", lambda r: r["p"] == 0), ("prefill", lambda r: r["p"] > 0)):
        rs = [r["ratio"] for r in rows if pick(r)]
        if rs:
            kinds[kind] = {"median_ratio": statistics.median(rs), "n": len(rs), "min": min(rs), "max": max(rs)}
    if not kinds:
        raise ValueError("the check measured no point the cached profile has")
    tol = tolerance_pct / 100.0
    engine = engine_differences(cached, check)
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1.0))
    point_off = abs(worst["ratio"] - 1.0) > POINT_TOLERANCE_FACTOR * tol
    return {"timing": "device" if device else "step", "tolerance_pct": tolerance_pct, "kinds": kinds,
            "engine_differences": engine, "worst_point": worst, "worst_point_beyond": point_off,
            "within": (not engine and not point_off
                       and all(abs(k["median_ratio"] - 1.0) <= tol for k in kinds.values())),
            "points": rows,
            "cached_device_name": cached.get("device_name"), "check_device_name": check.get("device_name")}


def describe(result: dict) -> str:
    """One line for the log."""
    kinds = ", ".join(f"{k} {100 * (v['median_ratio'] - 1):+.1f} % ({v['n']} points)"
                      for k, v in result["kinds"].items())
    if result.get("engine_differences"):
        verdict = f"not this engine's ({'; '.join(result['engine_differences'])})"
    elif result["within"]:
        verdict = "this card's"
    elif result.get("worst_point_beyond") and all(
            abs(v["median_ratio"] - 1.0) * 100 <= result["tolerance_pct"] for v in result["kinds"].values()):
        w = result["worst_point"]
        verdict = (f"not this profile's engine or card at one point (d {w['d']} p {w['p']}: "
                   f"{100 * (w['ratio'] - 1):+.1f} %, beyond ±{POINT_TOLERANCE_FACTOR * result['tolerance_pct']:g} %)")
    else:
        verdict = f"not this card's (beyond ±{result['tolerance_pct']:g} %)"
    return f"profile check: {kinds} against the cached points ({result['timing']} times): {verdict}"


def _kv_fill(cached: dict) -> str:
    """The `--kv-fill` the cached points were measured over: absent before session 29 (a zeroed pool), and
    a quantized pool's note after the word in some profiles of session 29-30 ("zeros (quantized pool)")."""
    fill = str(cached.get("kv_fill") or "zeros")
    return "random" if fill.startswith("random") else "zeros"


def profile_command(cached: dict, out: Path, model: str, device: str, repeats: int, warmup: int,
                    engine_args: list[str]) -> list[str]:
    """`backend profile` on the check's grid, measured as the cached profile measured its points (its
    pause, device timing and KV fill), without the runs beside the grid."""
    g = check_grid(cached)
    device_time = "on" if any(p.get("device_ms_median") for p in cached["points"]) else "off"
    return [sys.executable, "-m", "gateway.tidegate_cli", "backend", "profile", "--model", model,
            "--device", device, "--out", str(out), "--repeats", str(repeats), "--warmup", str(warmup),
            "--pause-ms", str(float(cached.get("pause_ms") or 0.0)), "--device-time", device_time,
            "--kv-fill", _kv_fill(cached),
            "--decode-batch-sizes", g["decode_batch_sizes"], "--prefill-tokens", g["prefill_tokens"],
            "--context-lens", g["context_lens"], "--packed-prefill-seqs", "", "--prefill-context-lens", "",
            "--budget-packed-points", "off", "--decode-bucket-points", "off", "--decode-spread-points", "off",
            "--mixed-spread-points", "off", "--tile-edge-pairs", "off", "--block-order-check", "off",
            "--pause-check", "off", *engine_args]


def run_check(cached_path: Path, model: str, device: str, repeats: int, warmup: int, engine_args: list[str],
              tolerance_pct: float = DEFAULT_TOLERANCE_PCT, cwd: Path | None = None) -> dict:
    """Measure the check's points on this device and compare them with the cached profile's."""
    cached = json.loads(Path(cached_path).read_text())
    with tempfile.TemporaryDirectory(prefix="tidegate-profile-check-") as tmp:
        out = Path(tmp) / "check.json"
        cmd = profile_command(cached, out, model, device, repeats, warmup, engine_args)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"profile check failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        check = json.loads(out.read_text())
    result = compare(cached, check, tolerance_pct)
    result["seconds"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.simulator.profile_check PROFILE --model M --device cuda`: is PROFILE this card's?
    Prints the check's line (and its points with --verbose); exit status 0 when within the tolerance, 1
    when not, 2 on a bad profile or a failed measurement."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.simulator.profile_check",
                                description="re-measure a few of a cached profile's points on this device")
    p.add_argument("profile", help="a profile JSON (`tidegate backend profile --out`)")
    p.add_argument("--model", help="preset or HF directory (default: the profile's model)")
    p.add_argument("--device", help="cpu or cuda[:N] (default: the profile's device)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE_PCT, metavar="PCT")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="engine flag the profile was measured with (repeat; e.g. --engine-arg=--quantization=fp8)")
    p.add_argument("--json", dest="json_out", metavar="OUT")
    p.add_argument("--verbose", action="store_true", help="every point's ratio")
    a = p.parse_args(argv)
    try:
        doc = json.loads(Path(a.profile).read_text())
        result = run_check(Path(a.profile), a.model or doc["model"], a.device or doc["device"], a.repeats,
                           a.warmup, a.engine_arg, a.tolerance, cwd=Path(__file__).resolve().parents[2])
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        print(f"profile check: {e}", file=sys.stderr)
        return 2
    print(f"{describe(result)} ({result['seconds']:.0f} s)")
    if a.verbose:
        for r in result["points"]:
            print(f"  d {r['d']:4d} p {r['p']:5d} c {r['c']:5d}: {r['cached_ms']:9.3f} -> {r['check_ms']:9.3f} ms "
                  f"(x{r['ratio']:.4f})")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result, indent=1))
    return 0 if result["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
