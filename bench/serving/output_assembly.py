"""The gateway's output assembly (detokenize + stop strings, `gateway.output.OutputAssembler`)
per output token, by tokens per step: one (decoding) against k (a verify that accepted k - 1
drafts), with and without a stop string that never matches (so every step is assembled whole).

    python -m bench.serving.output_assembly [--tokenizer models/tiny-coder/tokenizer.json]
        [--text scheduler/speculation.py] [--k 9] [--repeats 5]

Prints microseconds per token (median of the repeats, the cases interleaved in each repeat).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gateway.output import OutputAssembler


def per_token_us(ids: list[int], decode, tokens_per_step: int, stops: list[str]) -> float:
    asm = OutputAssembler(decode, [], stops, False, 0, ())
    t = time.perf_counter()
    for i in range(0, len(ids), tokens_per_step):
        asm.add(ids[i:i + tokens_per_step], 0.0, None, None)
    return (time.perf_counter() - t) / len(ids) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.output_assembly",
                                description=__doc__.split("\n")[0])
    p.add_argument("--tokenizer", default="models/tiny-coder/tokenizer.json")
    p.add_argument("--text", default="scheduler/speculation.py", help="the output to assemble")
    p.add_argument("--chars", type=int, default=20000)
    p.add_argument("--k", type=int, default=9, help="tokens per step of the speculating case")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    ids = tok.encode(Path(args.text).read_text()[:args.chars]).ids

    def decode(x):
        return tok.decode(list(x))

    cases = [(k, stops) for stops in ((), ("\nclass Nope",)) for k in (1, args.k)]
    times: dict = {c: [] for c in cases}
    for _ in range(args.repeats):
        for k, stops in cases:
            times[(k, stops)].append(per_token_us(ids, decode, k, list(stops)))
    print(f"{len(ids)} tokens of {args.text}; us per token, median of {args.repeats}")
    for (k, stops), ts in times.items():
        print(f"  {k:>2} tokens/step, stop strings {stops!r:<16} {statistics.median(ts):7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
