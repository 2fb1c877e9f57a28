"""Per-step cost of the step scheduler (a command, not a timed test).

    python -m bench.scheduler.step_scheduler [--num-seqs 256] [--prompt-len 512] [--steps 1000] [--repeat 3]

Fills the running set with `num_seqs` decoding sequences, then times (a) schedule() + update()
per step, listed (the engine) and unlisted (the simulator), (b) max_pure_decode_steps() +
advance_decode_steps(k) per simulated step.

Shared 2-core VM under load (another job running), CPython 3.11, 256 seqs x 512-token prompts:
  before lazy decode accounting: listed min 391 us/step (1.53 us/seq), advance 133 us/sim-step
  after: see the commit message / BENCHMARKS.md; the unlisted step is O(block boundaries +
  completions), about 1/16 of the sequences start a block each step.
"""
from __future__ import annotations

import argparse
import time

from scheduler.capacity import DEFAULT_CAPACITY
from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler


def _filled(num_seqs: int, prompt_len: int, max_tokens: int) -> StepScheduler:
    blocks_per_seq = -(-(prompt_len + max_tokens) // DEFAULT_CAPACITY.block_size)
    cfg = SchedulerConfig(max_model_len=prompt_len + max_tokens, num_blocks=num_seqs * blocks_per_seq,
                          max_num_seqs=num_seqs, max_num_batched_tokens=max(DEFAULT_CAPACITY.max_num_batched_tokens,
                                                                 num_seqs))
    s = StepScheduler(cfg)
    for i in range(num_seqs):
        s.add_request(f"req-{i}", [(i * 7 + j) % 32000 for j in range(prompt_len)],
                      max_tokens - (i % 50), float(i))
    while s.num_waiting or any(q.is_prefilling for q in s.running):
        plan = s.schedule()
        s.update(plan, StepResult({c.request_id: 1 for c in plan.chunks if c.sample}))
    return s


def _time_single_steps(s: StepScheduler, num_steps: int, block: int = 50,
                       list_decodes: bool = True) -> list[float]:
    """Seconds per step over blocks of `block` steps (the machine may be shared: report min)."""
    result = StepResult({q.request_id: 1 for q in s.running} if list_decodes else {})
    times = []
    for _ in range(max(1, num_steps // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            s.update(s.schedule(list_decodes), result)
        times.append((time.perf_counter() - t0) / block)
    return times


def _time_advance(s: StepScheduler, num_steps: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    steps = calls = 0
    while steps < num_steps:
        k = min(s.max_pure_decode_steps(), num_steps - steps)
        if k == 0:
            s.update(s.schedule(), StepResult({q.request_id: 1 for q in s.running}))
            k = 1
        else:
            s.advance_decode_steps(k)
        steps += k
        calls += 1
    return (time.perf_counter() - t0) / steps, calls, steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    max_tokens = args.steps + 100
    times = []
    for _ in range(args.repeat):
        times += _time_single_steps(_filled(args.num_seqs, args.prompt_len, max_tokens), args.steps)
    times.sort()
    print(f"schedule+update, {args.num_seqs} decodes: min {times[0] * 1e6:.0f} us/step, "
          f"median {times[len(times) // 2] * 1e6:.0f} us/step "
          f"(min {times[0] * 1e6 / args.num_seqs:.2f} us/sequence)")
    times = []
    for _ in range(args.repeat):
        times += _time_single_steps(_filled(args.num_seqs, args.prompt_len, max_tokens), args.steps,
                                    list_decodes=False)
    times.sort()
    print(f"schedule(list_decodes=False)+update, {args.num_seqs} decodes: min "
          f"{times[0] * 1e6:.1f} us/step, median {times[len(times) // 2] * 1e6:.1f} us/step")
    runs = [_time_advance(_filled(args.num_seqs, args.prompt_len, max_tokens), args.steps)
            for _ in range(args.repeat)]
    per_step, calls, steps = min(runs)
    print(f"max_pure_decode_steps+advance_decode_steps: min {per_step * 1e6:.1f} us per simulated "
          f"step ({per_step * 1e9 / args.num_seqs:.0f} ns/sequence-step; {calls} calls for {steps} steps)")


if __name__ == "__main__":
    main()
