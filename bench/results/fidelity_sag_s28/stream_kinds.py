"""Issue 35, session 28: which live step kinds run slower in a busy stream than paused, and is it the power cap?

Session 27's H100 replay of live 6.7B mixed steps (h100_call3) read pipelined / paused 1.012 over one-chunk steps, but
by the chunk's start: 1.002 from 0, 1.008 at 1-512, 1.011 at 513-1,024, 1.054-1.076 past 1,024; session 28's
12 s stream of start-0 mixed shapes read a flat 1.003-1.005 at 1,980 MHz (h100_drift.json). Here each kind of
step in its own stream: paused device times (as the profile's points), then after IDLE_S idle SPAN_S of the kind's
shapes in turn, two in flight, in 1 s bins, each bin's ratio (device time over the shapes' paused) with the SM clock
and the board power after it. A kind throttled by the power cap reads a clock under 1,980 MHz and the power at its
limit; a kind slower at full clock is not the cap.

    python bench/results/fidelity_sag_s28/stream_kinds.py --model deepseek-coder-6.7b --device cuda --out kinds.json
    python bench/results/fidelity_sag_s28/stream_kinds.py --model tiny --device cpu --out /tmp/k.json --span-s 0.3  # dry run
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
    NvmlSampler,
    launch_pipelined,
    make_step,
    measure,
    measure_device,
    power_w,
    sm_clock_mhz,
)

# (d, p, c, k, s): d decodes of context c beside k chunks of p / k tokens, each from position s
KINDS = {
    "start0": [(8, 256, 705, 1, 0), (16, 256, 705, 1, 0), (32, 256, 705, 1, 0)],
    "prefix512": [(8, 256, 705, 1, 512), (16, 256, 705, 1, 512), (32, 256, 705, 1, 512)],
    "prefix1024": [(8, 256, 705, 1, 1024), (16, 256, 705, 1, 1024), (32, 256, 705, 1, 1024)],
    "prefix2048": [(8, 256, 705, 1, 2048), (16, 256, 705, 1, 2048), (32, 256, 705, 1, 2048)],
    "two_chunks": [(8, 256, 705, 2, 256), (16, 256, 705, 2, 256), (32, 256, 705, 2, 256)],
    "long_decodes": [(8, 256, 2048, 1, 0), (16, 256, 2048, 1, 0), (32, 256, 2048, 1, 0)],
    "packed_2048": [(0, 2048, 0, 4, 0)],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--span-s", type=float, default=3.0)
    p.add_argument("--idle-s", type=float, default=1.0)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--profile-stream", action="store_true",
                   help="also the profile's own long stream_mixed run (bench.engine.profile, session 28's form) on a "
                        "grid-like set of mixed shapes: a check of that code on the device before a grid part runs it")
    a = p.parse_args()
    engine, loaded = create_engine(backend_config(a), ServingOptions())
    runner, cfg = engine.runner, engine.config
    vocab = loaded.config.vocab_size
    cuda = runner.device.type == "cuda"
    if a.profile_stream:
        from bench.engine import profile as prof
        grid = [(d, pp, c, 1, 0) for c in (705, 1741) for d in (1, 8, 32) for pp in (64, 256)]
        t0 = time.perf_counter()
        run = prof.stream_mixed(runner, grid, cfg, vocab, 0.06, 5, prof.STREAM_S, prof.STREAM_IDLE_S,
                                prof.STREAM_BIN_S, prof.STREAM_PREFIX_STARTS)
        print(f"profile stream ({time.perf_counter() - t0:.1f} s):",
              None if run is None else {k: v for k, v in run.items() if k != "bins"}, flush=True)
        if run is not None:
            print("  bins", [(b["ratio"], b["sm_clock_mhz"], b["power_w"]) for b in run["bins"]], flush=True)
        Path(a.out).with_suffix(".stream.json").write_text(json.dumps(run) + "\n")
    out = {"device_name": torch.cuda.get_device_name() if cuda else "cpu", "model": a.model,
           "span_s": a.span_s, "idle_s": a.idle_s, "kinds": {}}
    for name in a.kinds.split(","):
        top = runner.max_model_len
        shapes = [x for x in KINDS[name] if x[0] < cfg.max_num_seqs and x[0] + x[1] <= cfg.max_num_batched_tokens
                  and x[4] + x[1] // x[3] <= top and x[2] <= top]
        if not shapes:
            continue
        steps = [make_step(d, pp, c, cfg.block_size, cfg.num_blocks, vocab, k, s) for d, pp, c, k, s in shapes]
        for chunks in steps:  # warm-up
            runner.finish(runner.launch(chunks))
        paused = []
        for chunks in steps:
            dev = measure_device(runner, chunks, 5, 0.06) if cuda else None
            paused.append(statistics.median(dev if dev else measure(runner, chunks, 3, 1, 0.0)))
        if cuda:
            torch.cuda.synchronize()
        time.sleep(a.idle_s)
        bins, t0 = [], time.perf_counter()
        sampler = NvmlSampler(runner.device) if cuda else None
        if sampler is not None:
            sampler.__enter__()
        while time.perf_counter() - t0 < a.span_s:
            rows = launch_pipelined(runner, list(enumerate(steps)), 1.0 if cuda else a.span_s / 3)[1:]
            ms = [(i, dev if dev is not None else wall) for i, dev, wall in rows]
            if not ms:  # one step longer than the bin (the CPU's dry run)
                continue
            bins.append({"t_s": round(time.perf_counter() - t0, 2),
                         "ratio": round(sum(m for _, m in ms) / sum(paused[i] for i, _ in ms), 4),
                         "steps": len(ms), "sm_clock_mhz": sm_clock_mhz(runner.device),
                         "power_w": power_w(runner.device)})
        smi = {}
        if sampler is not None:
            sampler.__exit__()
            smi = sampler.summary()
        out["kinds"][name] = {"shapes": [list(x) for x in shapes], "paused_ms": paused, "bins": bins,
                              "nvml": smi, "nvml_rows": sampler.rows if sampler is not None else []}
        print(f"{name:13s} paused {' '.join(f'{x:7.3f}' for x in paused)} ms; stream by second "
              + " ".join(f"{b['ratio']:.4f}" for b in bins) + f"; during it {smi}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
