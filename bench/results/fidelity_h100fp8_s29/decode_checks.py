"""Issue 35, session 29: why do live decode-only steps run 1.5-3 % over the profile at some batch sizes only?

`decode_exact.py` on session 21's H100 6.7B parts (bf16 and FP8) and session 16's H200 6.7B: live decode-only steps
of near-equal contexts read ~1.00 of the profile's device time at d = 1-4, 8, 16, 32 and 1.015-1.03 at every other
d, the d the profile measured itself included (17, 18, 24-26, 33, 34, 48-50). The split is not the batch sizes: it
is which pass measured the point. d 1, 2, 4, ..., 128 are the grid's decode points, each measured right after the
mixed points of the d before it (paused steps with 64-1,024 prefill tokens); the others are the decode-bucket
points, measured at the end of the grid, one decode shape after another. In the live steps the history does not
matter (after a decode step 1.022, after a prefill step 1.025, at the same d as the step before or not alike). So
one of the two passes reads its points off by ~2 %, and the live steps agree with the grid's pass.

This measures the grid's decode shapes at context 576 (the grid's mean) both ways, in one process, and in a busy
stream, over a zeroed pool and then over K/V the model prefilled:
  consecutive    each d after the one before (the bucket points' pass), 5 device-timed repetitions
  after_mixed    each d right after 3 paused repetitions of the mixed step (d, 1,024 prefill tokens, context 512),
                 as the grid's pass orders them
  stream         the d alone back to back, two in flight, 1.5 s after 0.3 s idle (`launch_pipelined`), its
                 device time over the consecutive pass's
with the SM clock and the board power after each. Predictions: PREDICTIONS.md #6.

    python bench/results/fidelity_h100fp8_s29/decode_checks.py --model deepseek-coder-6.7b --device cuda --out d.json
    python bench/results/fidelity_h100fp8_s29/decode_checks.py --model tiny --device cpu --out /tmp/d.json  # dry run
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch

from backend.engine.args import add_engine_args, backend_config
from backend.engine.assemble import ServingOptions, create_engine
from bench.engine.profile import (
    fill_decode_kv,
    launch_pipelined,
    make_step,
    measure,
    measure_device,
    power_w,
    sm_clock_mhz,
)

DS = (8, 16, 17, 24, 32, 33, 48)
C = 576
MIXED = (1024, 512)  # the grid pass's last mixed point before each decode point: p tokens, decodes' context


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--stream-s", type=float, default=1.5)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    a = p.parse_args()
    engine, loaded = create_engine(backend_config(a), ServingOptions(quantization=a.quantization))
    runner, cfg = engine.runner, engine.config
    vocab = loaded.config.vocab_size
    cuda = runner.device.type == "cuda"
    ds = [d for d in DS if d <= cfg.max_num_seqs and d * (-(-C // cfg.block_size)) < cfg.num_blocks]
    dec = {d: make_step(d, 0, C, cfg.block_size, cfg.num_blocks, vocab) for d in ds}
    mp = min(MIXED[0], cfg.max_num_batched_tokens - max(ds))
    mix = {d: make_step(d, mp, MIXED[1], cfg.block_size, cfg.num_blocks, vocab, 1, 0) for d in ds}
    for d in ds:  # warm-up (graphs captured)
        runner.finish(runner.launch(dec[d]))
        runner.finish(runner.launch(mix[d]))

    def timed(chunks, reps: int, pause_s: float = 0.0) -> float:
        dev = measure_device(runner, chunks, reps, pause_s) if cuda else None
        return statistics.median(dev if dev else measure(runner, chunks, reps, 0, pause_s))

    def state() -> dict:
        return {"sm_clock_mhz": sm_clock_mhz(runner.device), "power_w": power_w(runner.device)}

    out = {"device_name": torch.cuda.get_device_name() if cuda else "cpu", "model": a.model,
           "quantization": a.quantization, "context": C, "mixed": [mp, MIXED[1]], "passes": {}}

    def run_pass(name: str) -> None:
        rec = {}
        if name.startswith("consecutive"):
            for d in ds:
                rec[d] = {"ms": timed(dec[d], 5), **state()}
        elif name.startswith("after_mixed"):
            for d in ds:
                timed(mix[d], 3, 0.06)
                rec[d] = {"ms": timed(dec[d], 3), **state()}
        else:  # stream
            base = out["passes"][name.replace("stream", "consecutive")]
            for d in ds:
                if cuda:
                    torch.cuda.synchronize()
                time.sleep(0.3)
                rows = launch_pipelined(runner, [(0, dec[d])], a.stream_s if cuda else 0.2)[1:]
                ms = [dv if dv is not None else wall for _, dv, wall in rows]
                rec[d] = {"ms": statistics.median(ms) if ms else None, "steps": len(ms), **state()}
                if ms:
                    rec[d]["ratio"] = round(rec[d]["ms"] / base[d]["ms"], 4)
        out["passes"][name] = rec
        print(f"{name:26s} " + "  ".join(f"d{d} {r['ms']:.3f}" + (f" ({r['ratio']:.4f})" if "ratio" in r else "")
                                        for d, r in rec.items() if r["ms"] is not None), flush=True)

    for name in ("consecutive_zeros", "after_mixed_zeros", "consecutive_zeros_2", "stream_zeros"):
        run_pass(name)
    out["fill_launches"] = fill_decode_kv(runner, max(ds), C, cfg, vocab)
    for name in ("consecutive_prefilled", "after_mixed_prefilled", "stream_prefilled"):
        run_pass(name)
    for kv in ("zeros", "prefilled"):
        c, m = out["passes"][f"consecutive_{kv}"], out["passes"][f"after_mixed_{kv}"]
        out[f"after_mixed_over_consecutive_{kv}"] = {d: round(m[d]["ms"] / c[d]["ms"], 4) for d in ds}
        print(f"after_mixed / consecutive, {kv}: {out[f'after_mixed_over_consecutive_{kv}']}", flush=True)
    c0, c1 = out["passes"]["consecutive_zeros"], out["passes"]["consecutive_prefilled"]
    out["prefilled_over_zeros"] = {d: round(c1[d]["ms"] / c0[d]["ms"], 4) for d in ds}
    print(f"prefilled / zeros, consecutive: {out['prefilled_over_zeros']}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
