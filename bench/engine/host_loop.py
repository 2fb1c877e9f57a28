"""Host time per step of the real engine loop, synchronous vs async scheduling (issue 11's
"host time per step at batch 64 <= 0.2 ms").

    python -m bench.engine.host_loop --model deepseek-coder-33b --device cuda \\
        --batches 1,64 --context 512 --steps 60 --json OUT.json

Per batch B: B greedy requests of `--context` prompt tokens are prefilled, then, with every
sequence decoding, three loops of `--steps` steps each on the same engine:

- `sync`:  `Engine.step()` — plan, launch, wait, read back, update, one after the other (the
  device idles while the host plans and updates);
- `async`: `Engine.advance()` — step k+1 planned and launched before step k is read back;
- `device`: the decode graph of the batch's bucket replayed back to back with no host work
  between replays: the step's device time alone.

Reported per loop (medians over steps): the step period (time between two read-backs); the
host's busy time per step (the period minus the time spent waiting for the device in the
read-back); and the **device idle time between steps** (`gap_ms`), from CUDA events recorded on
the stream right before each step's input copy and right after its graph replay: the time from
the end of one step's replay to the start of the next one's = how long the device waited for
the host. The goal is read on that gap (what the host costs the GPU per step); the busy time
says how much host work a step holds, hidden or not. The period minus the back-to-back replay
period is shown too, but the batch's context grows a token a step (attention at batch 64 grows
with it), so that difference is biased by the order the loops run in; the events are not.
Dummy weights (the timing does not depend on them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

GOAL_HOST_MS = 0.2


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.host_loop",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-coder-33b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--batches", default="1,64", help="decode batch sizes, comma-separated")
    p.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    p.add_argument("--steps", type=int, default=60, help="timed steps per loop")
    p.add_argument("--json", default=None, help="write the results here")
    return p.parse_args(argv)


class _WaitClock:
    """Time spent blocked in the runner's read-back (the device wait), summed."""

    def __init__(self, buffers) -> None:
        self.seconds = 0.0
        self._read = buffers.read_sampled
        buffers.read_sampled = self.read

    def read(self, slot: int, num_rows: int) -> list[int]:
        t0 = time.perf_counter()
        ids = self._read(slot, num_rows)
        self.seconds += time.perf_counter() - t0
        return ids


class _StepEvents:
    """CUDA events around each decode-graph launch (input copy + replay), on the stream."""

    def __init__(self, graphs) -> None:
        self.pairs: list[tuple] = []
        self._launch = graphs.launch
        graphs.launch = self.launch

    def launch(self, chunks, gpu_src=None):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launched = self._launch(chunks, gpu_src)
        end.record()
        self.pairs.append((start, end))
        return launched

    def summary(self) -> dict:
        torch.cuda.synchronize()
        p = self.pairs
        gaps = [p[i][1].elapsed_time(p[i + 1][0]) for i in range(len(p) - 1)]
        busy = [s.elapsed_time(e) for s, e in p]
        return {"gap_ms": statistics.median(gaps), "gap_p90_ms": sorted(gaps)[int(0.9 * (len(gaps) - 1))],
                "device_step_ms": statistics.median(busy)}


def _loop(engine, turn, steps: int, wait: _WaitClock) -> dict:
    periods, busy = [], []
    turn()  # settle into the loop's rhythm
    turn()
    events = _StepEvents(engine.runner.graphs) if engine.runner.device.type == "cuda" else None
    last = time.perf_counter()
    for _ in range(steps):
        wait.seconds = 0.0
        turn()
        now = time.perf_counter()
        periods.append((now - last) * 1e3)
        busy.append((now - last - wait.seconds) * 1e3)
        last = now
    out = {"period_ms": statistics.median(periods), "host_busy_ms": statistics.median(busy),
           "period_p90_ms": sorted(periods)[int(0.9 * (len(periods) - 1))]}
    if events is not None:
        engine.runner.graphs.launch = events._launch
        out.update(events.summary())
    return out


def _device_period(runner, batch: int, steps: int) -> float:
    """Back-to-back replays of the batch's decode graph: the step's device time alone."""
    g = runner.graphs
    captured = g.graphs[int(g._bucket_of[batch])]
    for _ in range(3):
        captured.graph.replay()
    _sync(runner.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        captured.graph.replay()
    _sync(runner.device)
    return (time.perf_counter() - t0) * 1e3 / steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args: argparse.Namespace, batches: list[int]):
    from backend.engine.assemble import BackendConfig, ServingOptions, create_engine

    engine, loaded = create_engine(BackendConfig(
        model=args.model, load_format=args.load_format, device=args.device,
        max_num_seqs=max(max(batches), 8), max_model_len=args.context + 4 * args.steps + 64),
        ServingOptions(cuda_graph_buckets=",".join(map(str, batches)),
                       cuda_graph_token_buckets="2048", capture=True))
    info = engine.serving_info
    if engine.runner.graphs is None:  # CPU (a check of this script): the graphs' stand-in
        from backend.runner.cuda_graphs import StepGraphs

        engine.runner.graphs = StepGraphs(engine.runner, batches, use_cuda_graphs=False,
                                          token_buckets=(2048,))
    return engine, loaded, info


def run_batch(args: argparse.Namespace, engine, batch: int) -> dict:
    from backend.runner.sampler import SamplingParams

    vocab = engine.runner.model.config.vocab_size
    params = SamplingParams(max_tokens=4 * args.steps + 32, ignore_eos=True)
    for i in range(batch):
        prompt = [(31 * i + 7 * j + batch) % vocab for j in range(args.context)]
        assert engine.add_request(f"b{batch}-{i}", prompt, params) is None
    sched = engine.scheduler
    engine.async_scheduling = False
    while sched.waiting or sched.prefilling:  # prefill, synchronously
        engine.step()
    engine.step()
    wait = _WaitClock(engine.runner.buffers)
    out = {"batch": batch, "context": args.context, "steps": args.steps}
    out["sync"] = _loop(engine, engine.step, args.steps, wait)
    engine.async_scheduling = True
    out["async"] = _loop(engine, engine.advance, args.steps, wait)
    engine.settle()
    engine.async_scheduling = False
    assert len(sched.running) == batch and not sched.prefilling, "a sequence left the batch"
    out["device_ms"] = _device_period(engine.runner, batch, args.steps)
    for mode in ("sync", "async"):
        m = out[mode]
        m["period_minus_replay_ms"] = m["period_ms"] - out["device_ms"]
    engine.runner.buffers.read_sampled = wait._read
    for rid in engine.request_ids:
        engine.abort(rid)
    engine.check_integrity()
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("host_loop_bench: no CUDA device", file=sys.stderr)
        return 2
    # on the CPU the figures mean nothing (no device to overlap): a check that the script runs
    results = {"model": args.model, "goal_ms": GOAL_HOST_MS, "batches": [],
               "device": torch.cuda.get_device_name() if cuda else "cpu"}
    batches = [int(x) for x in args.batches.split(",")]
    engine, _, info = build(args, batches)
    results["capture_s"] = info.get("capture_s")
    for b in batches:
        r = run_batch(args, engine, b)
        results["batches"].append(r)
        line = [f"batch {b}: back-to-back replay {r['device_ms']:.3f} ms"]
        for mode in ("sync", "async"):
            m = r[mode]
            line.append(f"{mode}: period {m['period_ms']:.3f}, host busy {m['host_busy_ms']:.3f}"
                        + (f", device idle between steps {m['gap_ms']:.3f} (p90 "
                           f"{m['gap_p90_ms']:.3f}), step on device {m['device_step_ms']:.3f}"
                           if "gap_ms" in m else ""))
        print(" | ".join(line) + " (ms)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
