"""Issue 35, session 27, call 6: does a busy stream of mixed steps slow down over seconds (the power cap
past the pause check's 2.5 s runs)? Nine grid-like mixed shapes (8 / 16 / 32 decodes at context 705
beside 64 / 128 / 256 tokens) timed paused (device time, as the profile's points), then run in turn,
two in flight, for SPAN_S seconds; each step's device time over its shape's paused one, in 1 s bins.

    python bench/results/fidelity_onset_s27/sustain_drift.py --model deepseek-coder-6.7b --device cuda \\
        --out drift.json [--span-s 12]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from backend.engine.args import add_engine_args, backend_config
from backend.engine.assemble import ServingOptions, create_engine
from bench.engine.profile import _step_device_ms, make_step, measure_device, sm_clock_mhz


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--span-s", type=float, default=12.0)
    a = p.parse_args()
    engine, loaded = create_engine(backend_config(a), ServingOptions())
    runner, cfg = engine.runner, engine.config
    vocab = loaded.config.vocab_size
    shapes = [(d, n) for d in (8, 16, 32) for n in (64, 128, 256)]
    steps = [make_step(d, n, 705, cfg.block_size, cfg.num_blocks, vocab) for d, n in shapes]
    for chunks in steps:  # warm-up
        runner.finish(runner.launch(chunks))
    cuda = runner.device.type == "cuda"
    paused = [statistics.median(measure_device(runner, c, 5, 0.06) or [float("nan")]) for c in steps]
    time.sleep(0.5)
    order = [0, 8, 1, 7, 2, 6, 3, 5, 4]
    t0 = time.perf_counter()
    rows = []  # (t since start, shape index, device ms)
    i = 0
    prev_k, prev, prev_t = order[0], runner.launch(steps[order[0]]), 0.0
    while time.perf_counter() - t0 < a.span_s:
        i += 1
        k = order[i % len(order)]
        t = time.perf_counter() - t0
        cur = runner.launch(steps[k])
        runner.finish(prev)
        rows.append((prev_t, prev_k, _step_device_ms(runner, prev)))
        prev_k, prev, prev_t = k, cur, t
    runner.finish(prev)
    rows.append((prev_t, prev_k, _step_device_ms(runner, prev)))
    clock_end = sm_clock_mhz(runner.device)
    bins = {}
    for t, k, ms in rows[1:]:
        if ms is not None:
            bins.setdefault(int(t), []).append(ms / paused[k])
    out = {"device": runner.device.type, "device_name": __import__("torch").cuda.get_device_name() if cuda else "cpu",
           "shapes": shapes, "paused_device_ms": paused, "span_s": a.span_s, "steps": len(rows),
           "sm_clock_mhz_end": clock_end,
           "ratio_by_second": {s: round(statistics.median(v), 4) for s, v in sorted(bins.items())},
           "rows": rows}
    Path(a.out).write_text(json.dumps(out) + "\n")
    print("pipelined / paused device time by second:", out["ratio_by_second"], "clock at the end", clock_end)


if __name__ == "__main__":
    main()
