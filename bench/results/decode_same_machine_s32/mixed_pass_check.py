"""Issue 35, session 32: do the profile's mixed points read the mixed steps as the live ones run?

On one H100 (6.7B FP8, `README.md` section 4) the live mixed steps (16-40 decodes + one 256-token chunk) ran 1.5-3.6 %
over the raw model, and their paused replay on the same card read the same: so the excess is in the steps, not the
live process. The decode points' excess was the profile's procedure (section 2); this times mixed shapes each way in
one process, over a pool filled as the profile fills it, to split the mixed steps' excess into procedure and
composition:
  profile_paused  the profile's own procedure for a point with prefill (`measure` with its repeats and warm-up, each
                  after the pause; then `measure_device` likewise): the median device ms
  replay_paused   replay_live's paused single runs (`paused`, 30 ms idle) of `build_step`, seeds 1-3: the harness the
                  live steps agree with (the reference of the ratios)
  after_decode    the mixed step right after 5 decode steps of its decodes, launched as the serving loop launches
                  (`launch_pipelined`): 3 times, the median of the mixed step's device ms
  rotated_tables  3 single runs, each over blocks no earlier run read (tables shifted through the pool), no pause
Shapes: d decodes of context 576 beside one 256-token chunk at start 0 (a prompt's first chunk) or 256 (its second,
after a 256-token prefix), d in 16 / 24 / 32. Also printed: the profile procedure's d 24 over the mean of its d 16 and
32 (the model interpolates d 24 between those points), per start.

    python bench/results/decode_same_machine_s32/mixed_pass_check.py --model deepseek-coder-6.7b --device cuda \\
        --quantization fp8 --out mixed_pass_check.json
    python bench/results/decode_same_machine_s32/mixed_pass_check.py --model tiny --device cpu --out /tmp/m.json \\
        --ds 1,2,3 --context 24 --chunk 16            # dry run (wall ms: no timing events)
"""
import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch

from backend.engine.args import add_engine_args, backend_config, int_list
from backend.engine.assemble import ServingOptions, create_engine
from bench.engine.profile import (
    fill_kv_pool,
    launch_pipelined,
    make_step,
    measure,
    measure_device,
)
from bench.engine.replay_live import build_step, paused
from bench.simulator.validate import CUDA_PROFILE_PAUSE_MS

PASSES = ("profile_paused", "replay_paused", "after_decode", "rotated_tables")
RUNS = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    p.add_argument("--ds", default="16,24,32", help="decode batches: the first and last are grid points, the "
                                                   "middle one is read against their mean")
    p.add_argument("--context", type=int, default=576)
    p.add_argument("--chunk", type=int, default=256, help="the prefill chunk's tokens; starts 0 and this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--pause-ms", type=float, default=CUDA_PROFILE_PAUSE_MS)
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    engine, loaded = create_engine(backend_config(a), ServingOptions(quantization=a.quantization))
    runner, cfg = engine.runner, engine.config
    vocab, bs, nb = loaded.config.vocab_size, cfg.block_size, cfg.num_blocks
    cuda = runner.device.type == "cuda"
    kv_fill = fill_kv_pool(runner, "random")
    c, n = a.context, a.chunk
    ds = [d for d in int_list(a.ds) if d + 1 <= cfg.max_num_seqs and d + n <= cfg.max_num_batched_tokens]
    starts = [0, n] if 2 * n <= cfg.max_model_len else [0]
    shapes = [(d, s) for s in starts for d in ds]

    def mixed(d: int, s: int) -> list:
        return make_step(d, n, c, bs, nb, vocab, 1, s)

    span = {(d, s): d * -(-c // bs) + -(-(s + n) // bs) for d, s in shapes}

    def shifted(chunks, by: int) -> list:
        return [dataclasses.replace(ch, block_table=[(b + by) % nb for b in ch.block_table]) for ch in chunks]

    steps = {x: mixed(*x) for x in shapes}
    dec = {d: make_step(d, 0, c, bs, nb, vocab) for d in ds}
    rot = {x: [shifted(steps[x], k * span[x]) for k in range(1, RUNS + 1)] for x in shapes}
    rep = {(d, s): [build_step([c] * d, [(n, s)], bs, nb, vocab, seed=k) for k in range(1, RUNS + 1)]
           for d, s in shapes}
    for chunks in [*steps.values(), *dec.values(), *(y for v in rot.values() for y in v),
                   *(y for v in rep.values() for y in v)]:  # warm-up: graphs, allocator
        runner.finish(runner.launch(chunks))
    pause_s = a.pause_ms / 1000

    def timed(chunks, reps: int, pause: float) -> float:
        dev = measure_device(runner, chunks, reps, pause)
        return statistics.median(dev if dev else measure(runner, chunks, reps, 0, pause))

    out = {"device_name": torch.cuda.get_device_name(runner.device) if cuda else "cpu", "timed_on_device": cuda,
           "model": a.model, "quantization": a.quantization, "kv_fill": kv_fill, "ds": ds, "starts": starts,
           "context": c, "chunk": n, "repeats": a.repeats, "warmup": a.warmup, "pause_ms": a.pause_ms,
           "passes": {}}
    print(f"device {out['device_name']}  kv_fill {kv_fill}  ds {ds}  context {c}  chunk {n} at {starts}", flush=True)
    for name in PASSES:
        rec = {}
        for d, s in shapes:
            if name == "profile_paused":
                ms = measure(runner, steps[d, s], a.repeats, a.warmup, pause_s)
                dev = measure_device(runner, steps[d, s], a.repeats, pause_s)
                v = statistics.median(dev if dev else ms)
            elif name == "replay_paused":
                v = statistics.median(paused(runner, ch, 0.03, 1) for ch in rep[d, s])
            elif name == "after_decode":
                runs = []
                for _ in range(RUNS):
                    rows = launch_pipelined(runner, [("d", dec[d])] * 5 + [("m", steps[d, s])])
                    dv, wall = rows[-1][1], rows[-1][2]
                    runs.append(dv if dv is not None else wall)
                v = statistics.median(runs)
            else:
                v = statistics.median(timed(ch, 1, 0.0) for ch in rot[d, s])
            rec[f"{d}@{s}"] = v
        out["passes"][name] = rec
        print(f"{name:15s} " + "  ".join(f"d{k} {v:.3f}" for k, v in rec.items()), flush=True)
    ref = out["passes"]["replay_paused"]
    out["over_replay_paused"] = {nm: {k: round(v / ref[k], 4) for k, v in out["passes"][nm].items()}
                                 for nm in PASSES if nm != "replay_paused"}
    print("over replay_paused:", flush=True)
    for nm, r in out["over_replay_paused"].items():
        print(f"{nm:15s} " + "  ".join(f"d{k} {v:.4f}" for k, v in r.items()), flush=True)
    if len(ds) >= 3:
        lo, mid, hi = ds[0], ds[len(ds) // 2], ds[-1]
        f = (mid - lo) / (hi - lo)
        out["interpolation"] = {}
        for nm in ("profile_paused", "replay_paused"):
            r = out["passes"][nm]
            for s in starts:
                x = r[f"{mid}@{s}"] / ((1 - f) * r[f"{lo}@{s}"] + f * r[f"{hi}@{s}"])
                out["interpolation"][f"{nm}@{s}"] = round(x, 4)
        print("d", mid, "over the line between d", lo, "and", hi, ":", out["interpolation"], flush=True)
    out["total_s"] = round(time.perf_counter() - t_start, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({out['total_s']} s)", flush=True)
    return 0 if all(math.isfinite(v) and v > 0 for r in out["over_replay_paused"].values() for v in r.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
