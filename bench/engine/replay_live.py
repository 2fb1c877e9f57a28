"""Replay live steps' compositions on the device (issue 35, session 27).

A served step holds what the profile's synthetic points do not: its decodes' own contexts, its
chunks' own starts, its neighbours. The cost model is fitted on the synthetic points; on the grid's
live runs the steps with prefill ran ~2.5-3% over it at every history, while decode-only steps
matched (bench/results/fidelity_onset_s27). This runs a list of live compositions (each step's
decode contexts and prefill chunks as (tokens, start), rebuilt from a step log on the CPU) through
the model runner two ways, each step's device time from the CUDA events the live step log reads:

- pipelined, in the list's order, as the serving loop launches (each step queued while the one
  before runs, then that one finished: two in flight), `--passes` times;
- paused, each step after `--pause-ms` idle and queued behind a spin (as the profile times its
  points: `bench.engine.profile.measure_device`).

    python -m bench.engine.replay_live --model deepseek-coder-6.7b --device cuda \\
        --steps compositions.json --out replay.json

`--steps`: {"steps": [{"i", "ctxs": [decode contexts], "chunks": [[tokens, start], ...]}, ...]}
(bench/results/fidelity_onset_s27/live_replay_prep.py writes it). On the CPU (no timing events) the
steps' wall times are recorded instead, which makes the tool testable, not the CPU a reference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.engine.profile import (
    BLOCK_ORDERS,
    DEVICE_QUEUE_S,
    _chunk,
    _step_device_ms,
    decode_tables,
    fill_kv_pool,
    launch_pipelined,
    sm_clock_mhz,
)


def parser() -> argparse.ArgumentParser:
    from backend.engine.args import add_engine_args

    p = argparse.ArgumentParser(prog="python -m bench.engine.replay_live", description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--quantization", default="none", choices=["none", "fp8"])
    p.add_argument("--steps", required=True, help="the compositions (JSON, see the module doc)")
    p.add_argument("--out", required=True, help="path of the result JSON")
    p.add_argument("--passes", type=int, default=3, help="pipelined passes over the list")
    p.add_argument("--pause-ms", type=float, default=60.0, help="idle before each paused repetition")
    p.add_argument("--paused-repeats", type=int, default=1, help="paused repetitions a step (0: none)")
    p.add_argument("--block-order", default="contiguous", choices=BLOCK_ORDERS,
                   help="how the decodes' block tables lie in the pool (`bench.engine.profile.decode_tables`): "
                        "the live engine's allocator hands out blocks interleaved, a long-running one scattered")
    p.add_argument("--fill-kv", action="store_true",
                   help="fill the whole KV pool with random values (scale 1) before the replay: the decodes read "
                        "non-zero K/V, as live ones do, instead of the zeroed pool the profile's points read")
    return p


def build_step(ctxs: list[int], chunks: list[tuple[int, int]], block_size: int, num_blocks: int,
               vocab: int, seed: int = 0, block_order: str = "contiguous") -> list:
    """A step of decodes at contexts `ctxs` (each counting its new token) and prefill chunks of
    (tokens, start), the decodes' block tables laid out as `block_order` (contiguous: as the
    profile's points), the chunks' after them, wrapping around the pool."""
    tables, nxt = decode_tables([-(-c // block_size) for c in ctxs], num_blocks, block_order, seed)
    out = [_chunk(f"d{i}", [(7 * i + 1 + seed) % vocab], c - 1, tables[i], False) for i, c in enumerate(ctxs)]
    for j, (n, start) in enumerate(chunks):
        blocks = -(-(start + n) // block_size)
        table = [(nxt + b) % num_blocks for b in range(blocks)]
        nxt += blocks
        out.append(_chunk(f"p{j}", [(13 * t + 5 + j + seed) % vocab for t in range(n)], start, table, True))
    return out


def _timed(runner, step, t0: float) -> float:
    """The step's device ms, or (the CPU) its wall ms since `t0`."""
    dev = _step_device_ms(runner, step)
    return dev if dev is not None else round((time.perf_counter() - t0) * 1000, 4)


def pipelined(runner, steps: list[list]) -> list[float]:
    """One pass in order, two steps in flight (`bench.engine.profile.launch_pipelined`): each step's
    device ms (wall on the CPU)."""
    rows = launch_pipelined(runner, list(enumerate(steps)))
    return [dev if dev is not None else round(wall, 4) for _, dev, wall in rows]


def paused(runner, chunks: list, pause_s: float, repeats: int) -> float:
    """The median device ms of `repeats` runs, each after `pause_s` idle and queued behind a spin
    (wall ms on the CPU)."""
    cuda = runner.device.type == "cuda"
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        time.sleep(pause_s)
        t0 = time.perf_counter()
        if cuda and hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(DEVICE_QUEUE_S * (sm_clock_mhz(runner.device) or 2000) * 1e6))
        step = runner.launch(chunks)
        runner.finish(step)
        if cuda:
            torch.cuda.synchronize()
        times.append(_timed(runner, step, t0))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from backend.engine.args import backend_config
    from backend.engine.assemble import ServingOptions, create_engine

    a = parser().parse_args(argv)
    doc = json.loads(Path(a.steps).read_text())
    comps = doc["steps"]
    if not comps:
        print("replay_live: no steps", file=sys.stderr)
        return 1
    engine, loaded = create_engine(backend_config(a), ServingOptions(quantization=a.quantization))
    runner, cfg = engine.runner, engine.config
    vocab = loaded.config.vocab_size
    steps = []
    for k, c in enumerate(comps):
        ctxs = [int(x) for x in c.get("ctxs", [])]
        chunks = [(int(n), int(s)) for n, s in c.get("chunks", [])]
        if len(ctxs) + len(chunks) > cfg.max_num_seqs or max(ctxs + [s + n for n, s in chunks] or [1]) > cfg.max_model_len:
            raise SystemExit(f"replay_live: step {c.get('i', k)} does not fit this engine's limits")
        steps.append(build_step(ctxs, chunks, cfg.block_size, cfg.num_blocks, vocab, seed=k,
                                block_order=a.block_order))
    if a.fill_kv and fill_kv_pool(runner, "random") != "random":
        raise SystemExit("replay_live --fill-kv: this pool is of a kind fill_kv_pool does not fill")
    for chunks in steps[:3]:  # warm-up: graphs, allocator
        runner.finish(runner.launch(chunks))
    t0 = time.perf_counter()
    passes = [pipelined(runner, steps) for _ in range(max(1, a.passes))]
    t_pipe = time.perf_counter() - t0
    paused_ms = ([paused(runner, chunks, a.pause_ms / 1000, a.paused_repeats) for chunks in steps]
                 if a.paused_repeats > 0 else None)
    rows = []
    for k, c in enumerate(comps):
        row = {"i": c.get("i", k), "pipelined_ms": statistics.median(p[k] for p in passes)}
        if paused_ms is not None:
            row["paused_ms"] = paused_ms[k]
        rows.append(row)
    out = {"device": runner.device.type, "device_name": torch.cuda.get_device_name(runner.device)
           if runner.device.type == "cuda" else "cpu", "timed_on_device": runner.device.type == "cuda",
           "model": a.model, "passes": len(passes), "pause_ms": a.pause_ms,
           "block_order": a.block_order, "fill_kv": a.fill_kv, "pipelined_s": round(t_pipe, 3),
           "source": doc.get("source"), "steps": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"replay_live: {len(rows)} steps, {len(passes)} pipelined passes in {t_pipe:.1f} s, "
          f"{'paused too, ' if paused_ms else ''}{'device' if out['timed_on_device'] else 'wall (CPU)'} ms "
          f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
