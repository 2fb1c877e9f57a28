"""`python -m bench.engine.spec_phases`: where a speculating engine's host time goes, per step.

A drafting step is not pipelined (its drafts follow the tokens read back before it), so the
host's work between that read-back and its launch is on the device's critical path (issue 28).
This serves N requests of L-token prompts twice on one engine (tiny model, dummy weights, CPU,
the CUDA loop's async turns unless --sync): first with speculation off, whose outputs become
the second pass's predictions (every draft accepted: the planning at its busiest), then with
speculation on, and prints each engine phase's median and mean milliseconds per step
(`_drafts`, `_launch`, `_finish`, ..., `Speculator.index_ahead`, the scheduler's `schedule` /
`update`, the runner's `launch` / `finish`), and with --profile the cProfile of `_drafts`.

    python -m bench.engine.spec_phases --requests 32 --prompt-tokens 1700 --max-tokens 256

On the CPU the forward pass runs inside `runner.launch`; the other phases are host work the
H200's serving loop does too (its host is faster: compare them, not the forward).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections import defaultdict

from backend.engine.assemble import BackendConfig, ServingOptions, create_engine
from backend.runner.sampler import SamplingParams
from scheduler.speculation import SpeculationConfig, Speculator
from scheduler.step_scheduler import StepScheduler

ENGINE_PHASES = ("_drafts", "_launch", "_finish", "_verify", "_stop_checks", "_outputs", "_spec",
                 "_start_masks", "_read_back")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine.spec_phases",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=1700)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-draft-tokens", type=int, default=8)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--sync", action="store_true", help="the CPU engine's turns (no async)")
    ap.add_argument("--profile", action="store_true", help="cProfile of _drafts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    engine, _ = create_engine(
        BackendConfig(model=args.model, device="cpu", load_format="dummy",
                      speculation_config=SpeculationConfig(max_draft_tokens=args.max_draft_tokens)),
        ServingOptions(async_scheduling=not args.sync))
    rec: dict[str, list[float]] = defaultdict(list)

    def wrap(cls, name: str, label: str) -> None:
        f = getattr(cls, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                rec[label].append((time.perf_counter() - t) * 1000)
        setattr(cls, name, timed)

    engine_cls = type(engine)
    for name in ENGINE_PHASES:
        if hasattr(engine_cls, name):
            wrap(engine_cls, name, name)
    wrap(StepScheduler, "schedule", "schedule")
    wrap(StepScheduler, "update", "update")
    wrap(Speculator, "index_ahead", "index_ahead")
    wrap(type(engine.runner), "launch", "runner.launch")
    wrap(type(engine.runner), "finish", "runner.finish")
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        drafts = engine_cls._drafts

        def profiled(self):
            profiler.enable()
            try:
                return drafts(self)
            finally:
                profiler.disable()
        engine_cls._drafts = profiled

    rng = random.Random(args.seed)
    vocab = min(200, engine.runner.model.config.vocab_size)
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
               for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    outputs: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        assert engine.add_request(f"ref{i}", prompt, params, speculation_off=True) is None
    while engine.has_unfinished():
        for o in engine.advance():
            outputs[o.request_id].extend(o.new_token_ids)
    engine.settle()
    rec.clear()
    if profiler is not None:
        profiler = cProfile.Profile()
    for i, prompt in enumerate(prompts):
        assert engine.add_request(f"r{i}", prompt, params, prediction=outputs[f"ref{i}"]) is None
    steps = 0
    while engine.has_unfinished():
        engine.advance()
        steps += 1
    engine.settle()
    print(f"{args.requests} requests of {args.prompt_tokens} prompt tokens, {args.max_tokens} "
          f"output tokens, {'sync' if args.sync else 'async'} turns: {steps} steps")
    print(f"{'phase':<16}{'calls':>7}{'median ms':>11}{'ms / step':>11}")
    for name, ms in sorted(rec.items()):
        print(f"{name:<16}{len(ms):>7}{statistics.median(ms):>11.3f}{sum(ms) / steps:>11.3f}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
