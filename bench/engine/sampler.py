"""Sampler cost per step with and without the logit processors, same run, same logits.

    python -m bench.engine.sampler [--batch 64] [--vocab 32256] [--history 512] [--device cpu]

Prints one line per configuration: ms per step (median of --repeats) and the ratio to plain
temperature sampling. The processors are batched tensor ops, so their cost should grow with
B x V (and the history length for penalties), not with a Python loop per row."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from backend.runner.sampler import Sampler, SampleSpec, SamplingParams


def configs() -> dict[str, SamplingParams]:
    base = {"temperature": 0.8, "top_p": 0.95, "seed": 1}
    return {
        "greedy": SamplingParams(),
        "temperature+top_p": SamplingParams(**base),
        "+min_p": SamplingParams(**base, min_p=0.05),
        "+penalties": SamplingParams(**base, repetition_penalty=1.1, presence_penalty=0.5,
                                     frequency_penalty=0.5),
        "+logit_bias(8)": SamplingParams(**base, logit_bias=tuple((i, 1.0) for i in range(8))),
        "all": SamplingParams(**base, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
                              frequency_penalty=0.5, logit_bias=tuple((i, 1.0) for i in range(8)),
                              min_tokens=4),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32256)  # DeepSeek-Coder's
    p.add_argument("--history", type=int, default=512, help="prompt + output tokens per row")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    logits = torch.randn(args.batch, args.vocab, device=dev)
    hist = torch.randint(0, args.vocab, (args.batch, args.history)).tolist()
    sampler = Sampler(args.vocab, dev)
    plain = None
    print(f"# device={dev} batch={args.batch} vocab={args.vocab} history={args.history}")
    for name, params in configs().items():
        specs = [SampleSpec(params, i, 10, h[:args.history // 2], h[args.history // 2:],
                            (2,) if params.min_tokens else ()) for i, h in enumerate(hist)]
        times = []
        for _ in range(args.repeats + 2):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            sampler.sample_specs(logits, specs)  # .tolist() inside: synchronizes
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times[2:]) * 1000
        plain = ms if name == "temperature+top_p" else plain
        ratio = f"{ms / plain:.2f}x" if plain else "-"
        print(f"{name:20s} {ms:8.2f} ms/step  {ratio} of temperature+top_p")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
