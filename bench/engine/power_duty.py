"""The power limiter's answer to bursts of mixed steps, at the live steps' shapes (issue 35, session 41).

    python -m bench.engine.power_duty --model deepseek-coder-6.7b --load-format dummy --device cuda \\
        --out duty.json [--patterns 1:3,1:1,2:2,4:4,8:8,4:2,8:4,1:0] [--mixed 48,256,576] [--decode 48,576]

Why. On the H100 the live steps with prefill run over the paused profile by a level that rises with load where the
board reaches its power limit (6.7B bf16: 1.003 / 1.009 / 1.011 at 0.5 / 0.8 / 0.95x) and stays flat where it does
not (6.7B FP8: 1.004-1.005), and no form of the simulator's cap has that slope (bench/results/pairs_s41, section 6).
The profile's patterns do not show it either: one mixed step then one decode step, on a card kept busy, read
1.002 at 667 W (session 40's hot pattern). But the live mixed steps do not come alone: each 512-token prompt is two
256-token chunks, and at 0.95x the live steps with prefill come in runs of 5-7 back to back (2.7 at 0.5x), 56-66 %
of the time (26-31 % at 0.5x). This measures what the limiter does with such runs on its own card: patterns of k
mixed steps then n decode-only steps, launched as the serving loop launches (two in flight), each for SPAN_S after
PRELUDE_S of decode-only steps (the live engine between bursts: busy, never idle), with NVML sampled every 20 ms.
For each pattern: the mixed steps' device time over the paused step's, overall and by place in their burst
(first, last, and every place), the decode steps' likewise, the mixed steps' share of the time, and the board's power and SM clock.
If the live level is the limiter answering bursts, k = 4-8 at n = k / 2 .. k reads the live 0.8-0.95x level on the
6.7B bf16, and 1:1 the hot pattern's ~1.002.

A device measurement: CUDA only (the step's device time is the live step log's CUDA events); on the CPU it says so
and writes nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from bench.engine import profile as prof

PATTERNS = "1:3,1:1,2:2,4:4,8:8,4:2,8:4,1:0"
SPAN_S = 3.0
PRELUDE_S = 1.0
PAUSED_REPEATS = 10
PAUSE_S = 0.06  # the grid's pause (`backend profile --pause-ms 60`): the paused reference is the profile's


def parse_patterns(text: str) -> list[tuple[int, int]]:
    """"k:n,..." -> [(k mixed steps, n decode-only steps)]: k >= 1, n >= 0."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        try:
            k, n = (int(v) for v in item.split(":"))
        except ValueError:
            raise ValueError(f"pattern {item!r} is not k:n (k mixed steps, then n decode steps)") from None
        if k < 1 or n < 0:
            raise ValueError(f"pattern {item!r}: k >= 1 mixed steps and n >= 0 decode steps")
        out.append((k, n))
    if not out:
        raise ValueError("no pattern given")
    return out


def int_triple(text: str, n: int, what: str) -> tuple[int, ...]:
    vals = tuple(int(v) for v in text.split(","))
    if len(vals) != n or any(v < 0 for v in vals):
        raise ValueError(f"--{what} takes {n} non-negative integers, got {text!r}")
    return vals


def pattern_order(k: int, n: int) -> list[tuple[str, int]]:
    """One period of the pattern as (kind, place in its burst): ("m", 0..k-1) then ("d", 0..n-1)."""
    return [("m", i) for i in range(k)] + [("d", i) for i in range(n)]


def summarize(k: int, n: int, steps: list[tuple[str, int, float]], mixed_paused_ms: float,
              decode_paused_ms: float, nvml_rows: list[tuple] | None) -> dict:
    """A pattern's record from its steps [(kind, place in burst, device ms)] (their second half: the
    limiter settled) and its NVML rows [(t, SM MHz, W, sw cap 0/1, hw slowdown 0/1)]."""
    late = steps[len(steps) // 2:] or steps
    m = [ms for kind, _, ms in late if kind == "m"]
    d = [ms for kind, _, ms in late if kind == "d"]
    first = [ms for kind, i, ms in late if kind == "m" and i == 0]
    last = [ms for kind, i, ms in late if kind == "m" and i == k - 1]
    out = {"k": k, "n": n, "steps": len(steps),
           "mixed_time_share": sum(m) / (sum(m) + sum(d)) if m else None,
           "mixed_ratio": statistics.median(m) / mixed_paused_ms if m else None,
           "mixed_first_ratio": statistics.median(first) / mixed_paused_ms if first else None,
           "mixed_last_ratio": statistics.median(last) / mixed_paused_ms if last else None,
           "decode_ratio": statistics.median(d) / decode_paused_ms if d else None,
           # each place in the burst (0 .. k-1): where, from a decode-busy card, the limiter's level sets in (the
           # live runs' places 5-8 rise before the idle card's sustained trace does: bench/results/pairs_s41 section 8)
           "mixed_by_place": [round(statistics.median(v) / mixed_paused_ms, 5) if v else None
                              for v in ([ms for kind, i, ms in late if kind == "m" and i == j] for j in range(k))]}
    rows = (nvml_rows or [])[len(nvml_rows or []) // 3:]
    if rows:
        watts = sorted(r[2] for r in rows)
        out["nvml"] = {"samples": len(rows), "power_median_w": statistics.median(watts),
                       "power_p90_w": watts[min(len(watts) - 1, int(0.9 * len(watts)))],
                       "sm_clock_median": statistics.median(r[1] for r in rows),
                       "sw_power_cap_share": round(sum(r[3] for r in rows) / len(rows), 3)}
    return out


def run_pattern(runner, mixed, decode, k: int, n: int, span_s: float, prelude_s: float) -> tuple[list, list]:
    """PRELUDE_S of decode-only steps, then the pattern for `span_s`, two in flight throughout:
    ([(kind, place, device ms)], NVML rows)."""
    period = pattern_order(k, n)
    prof.launch_pipelined(runner, [("d", decode)], prelude_s)
    with prof.NvmlSampler(runner.device) as smi:
        rows = prof.launch_pipelined(runner, [(f"{kind}{i}", mixed if kind == "m" else decode)
                                              for kind, i in period], span_s)[1:]
    steps = [(label[0], int(label[1:]), dev) for label, dev, _ in rows if dev is not None]
    return steps, list(smi.rows)


def parser() -> argparse.ArgumentParser:
    p = prof.parser()
    p.prog = "python -m bench.engine.power_duty"
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--patterns", default=PATTERNS, help="k:n,... (k mixed steps then n decode-only steps)")
    p.add_argument("--mixed", default="48,256,576", help="the mixed step: decodes, chunk tokens, decode context")
    p.add_argument("--decode", default="48,576", help="the decode-only step: decodes, context")
    p.add_argument("--span-s", type=float, default=SPAN_S, help="seconds of each pattern")
    p.add_argument("--prelude-s", type=float, default=PRELUDE_S, help="seconds of decode-only steps before each")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        patterns = parse_patterns(args.patterns)
        dm, pm, cm = int_triple(args.mixed, 3, "mixed")
        dd, cd = int_triple(args.decode, 2, "decode")
    except ValueError as exc:
        print(f"power_duty: error: {exc}", file=sys.stderr)
        return 2
    from backend.engine.args import backend_config
    from backend.engine.assemble import ServingOptions, create_engine

    engine, loaded = create_engine(backend_config(args),
                                   ServingOptions(quantization=args.quantization, fp8_gemv_max_m=args.fp8_gemv_max_m))
    runner, cfg = engine.runner, engine.config
    if runner.device.type != "cuda":
        print("power_duty: error: a device measurement (CUDA step events); nothing to measure on "
              f"{runner.device.type}", file=sys.stderr)
        return 1
    kv_fill = prof.fill_kv_pool(runner, getattr(args, "kv_fill", "random"))
    vocab = loaded.config.vocab_size
    mixed = prof.make_step(dm, pm, cm, cfg.block_size, cfg.num_blocks, vocab)
    decode = prof.make_step(dd, 0, cd, cfg.block_size, cfg.num_blocks, vocab)
    for chunks in (mixed, decode):  # warm the graphs
        prof.measure(runner, chunks, 2, 2)
    paused_m = prof.measure_device(runner, mixed, PAUSED_REPEATS, PAUSE_S)
    paused_d = prof.measure_device(runner, decode, PAUSED_REPEATS, PAUSE_S)
    if not paused_m or not paused_d:
        print("power_duty: error: the steps carry no device time", file=sys.stderr)
        return 1
    mp, dp = statistics.median(paused_m), statistics.median(paused_d)
    print(f"paused device ms: mixed {mp:.3f}, decode {dp:.3f} ({kv_fill} pool)", flush=True)
    done = []
    t0 = time.perf_counter()
    for k, n in patterns + [patterns[0]]:  # the first again last: the card's drift over the run
        steps, rows = run_pattern(runner, mixed, decode, k, n, args.span_s, args.prelude_s)
        rec = summarize(k, n, steps, mp, dp, rows)
        rec["t_s"] = round(time.perf_counter() - t0, 2)
        done.append(rec)
        nv = rec.get("nvml") or {}
        print(f"{k}:{n}  mixed share {rec['mixed_time_share'] or 0:.2f}  mixed {rec['mixed_ratio'] or 0:.4f} "
              f"(first {rec['mixed_first_ratio'] or 0:.4f}, last {rec['mixed_last_ratio'] or 0:.4f})  decode "
              f"{rec['decode_ratio'] or 0:.4f}  {nv.get('power_median_w', '-')} W p90 {nv.get('power_p90_w', '-')}  "
              f"SM {nv.get('sm_clock_median', '-')}  cap {nv.get('sw_power_cap_share', '-')}", flush=True)
    doc = {"model": args.model, "device_name": torch.cuda.get_device_name(runner.device),
           "quantization": args.quantization, "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
           "mixed": [dm, pm, cm], "decode": [dd, cd], "span_s": args.span_s, "prelude_s": args.prelude_s,
           "paused_pause_ms": PAUSE_S * 1000, "mixed_paused_device_ms": mp, "decode_paused_device_ms": dp,
           "kv_fill": kv_fill, "patterns": done}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(done)} patterns to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
