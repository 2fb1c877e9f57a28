"""`python bench/engine/spec_admission.py`: the serving loop's host time in drafting when a
batch of long new prompts starts decoding (issue 28: the H200's c=32 edit run held a step's
planning ~150 ms after 12 requests with ~3,100-token prompts joined; prompt lookup indexed each
prompt in Python at its first draft, all in that one step).

The real engine in-process (tiny preset, dummy weights, the CPU, speculation on: the server's
default), a closed loop of `--concurrency` requests of `--prompt-tokens` tokens of real code
(bytes of standard-library files: the tiny preset's ids are bytes) with a prediction, refilled
as requests finish, so that they start in waves as in the live run. Per step: the time of the
engine's drafting (`Engine._drafts`: the proposers' `load` and the policy) and of the whole
step. Prints one JSON line: those times' summary and the run's wall time. Imports whatever tree
is first on sys.path (run it with PYTHONPATH=<tree> to compare two trees).

    PYTHONPATH=. python bench/engine/spec_admission.py --concurrency 32 --requests 64 \\
        --prompt-tokens 1800 --max-tokens 48
"""
from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path


def code_ids(num: int, tokens: int, seed: int) -> list[list[int]]:
    """`num` prompts of `tokens` byte ids each, from the standard library's files."""
    import random
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng = random.Random(seed)
    out = []
    while len(out) < num:
        data = rng.choice(files).read_bytes()
        if len(data) >= tokens + 64:
            start = rng.randrange(0, len(data) - tokens)
            out.append(list(data[start:start + tokens]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1800)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--prediction-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import numpy as np
    import torch

    import scheduler.speculation as spec_mod
    from backend.engine.assemble import BackendConfig, create_engine
    from backend.runner.sampler import SamplingParams
    from scheduler.speculation import SpeculationConfig

    torch.set_num_threads(args.threads)
    max_len = args.prompt_tokens + args.max_tokens + 16
    engine, _ = create_engine(BackendConfig(
        model="tiny", load_format="dummy", device="cpu", dtype="float32",
        max_model_len=max(2048, max_len), num_blocks=args.concurrency * (max_len // 16 + 2) + 64,
        max_num_seqs=args.concurrency, cpu_threads=args.threads,
        speculation_config=SpeculationConfig()))
    prompts = code_ids(args.requests, args.prompt_tokens, args.seed)
    rng = np.random.default_rng(args.seed)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)

    drafts_s: list[float] = []
    inner = engine._drafts

    def timed_drafts():
        t = time.perf_counter()
        try:
            return inner()
        finally:
            drafts_s.append(time.perf_counter() - t)

    engine._drafts = timed_drafts
    steps = []  # (step seconds, drafting seconds in it, decodes)
    sent = 0
    t0 = time.perf_counter()
    while sent < len(prompts) or engine.has_unfinished():
        while sent < len(prompts) and len(engine.request_ids) < args.concurrency:
            ids = prompts[sent]
            # a prediction: a stretch of the prompt (the file an edit rewrites)
            at = int(rng.integers(0, len(ids) - args.prediction_tokens))
            engine.add_request(f"r{sent}", ids, params,
                               prediction=ids[at:at + args.prediction_tokens])
            sent += 1
        n = len(drafts_s)
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        plan = engine.last_step.plan if engine.last_step is not None else None
        decodes = sum(1 for c in plan.chunks if not c.is_prefill) if plan is not None else 0
        steps.append((dt, sum(drafts_s[n:]), decodes))
    wall = time.perf_counter() - t0
    d = sorted(s[1] * 1000 for s in steps)
    busy = [s for s in steps if s[2] > 0]
    print(json.dumps({
        "tree": str(Path(spec_mod.__file__).parents[1]), "concurrency": args.concurrency,
        "requests": args.requests, "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens, "steps": len(steps), "wall_s": round(wall, 3),
        "drafting_ms": {"max": round(d[-1], 2), "p99": round(d[int(0.99 * (len(d) - 1))], 2),
                        "total": round(sum(d), 1),
                        "steps_over_5ms": sum(x > 5 for x in d),
                        "steps_over_20ms": sum(x > 20 for x in d)},
        "decode_step_ms_max": round(max(s[0] for s in busy) * 1000, 2) if busy else None,
        "spec": engine.speculator.stats() if engine.speculator is not None else None}))


if __name__ == "__main__":
    main()
