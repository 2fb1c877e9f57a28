"""CPU time per engine step of the checkout it runs from (tiny preset, float32, one thread, 8
sequences decoding): for paired comparisons of two trees, run it from each in turn.

    git worktree add /tmp/old <rev>
    for r in 1 2 3 4; do (cd /tmp/old && python -m bench.engine.cpu_step_time);
                         python -m bench.engine.cpu_step_time; done

Trees from before the `backend/` move (issue 26) are handled (their assembler was
`backend.build`)."""
from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine.cpu_step_time")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        from backend.engine.assemble import BackendConfig, create_engine
        from backend.runner.sampler import SamplingParams
    except ImportError:  # a tree from before the move
        from backend.build import BackendConfig, create_engine  # type: ignore[no-redef]
        from backend.sampler import SamplingParams  # type: ignore[no-redef]
    engine, _ = create_engine(BackendConfig(model="tiny", load_format="dummy", device="cpu",
                                            dtype="float32", num_blocks=256, max_model_len=512,
                                            cpu_threads=1))
    for i in range(8):
        engine.add_request(f"r{i}", list(range(10 + i, 40 + i)),
                           SamplingParams(max_tokens=400, ignore_eos=True))
    for _ in range(5):  # the prefill and first decodes
        engine.step()
    t0 = time.thread_time()
    for _ in range(args.steps):
        engine.step()
    per_step = (time.thread_time() - t0) / args.steps
    print(f"{create_engine.__module__}: {per_step * 1e6:.1f} us of CPU per step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
