"""What the KV-event hook costs the block manager (issue 33): the same request stream through
BlockManager with the hook absent (the block manager of a given git revision), present but off
(the default), and recording (what `--kv-events-endpoint` turns on), plus the publisher's
encoding of the recorded entries (done on its own thread, not the engine's).

    python -m bench.scheduler.kv_events [--requests 20000] [--repeats 5] [--before REV]

Stream: prompts of 1-4 shared 16-token-block prefixes out of 64 plus a private tail, 4 blocks
of output, through a 2,048-block pool (evictions all along): allocate, cache_blocks over prompt
and output, free — the block-manager work of a serving step, without the model. Variants run
in turn (each first, second, third as often), `--repeats` times; the medians of process CPU time are reported, in µs per request
(CPU time: a shared machine's other load counts less than in wall time).
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scheduler.block_manager import BlockManager

REPO = Path(__file__).resolve().parents[2]


def stream(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(32000) for _ in range(64)] for _ in range(64)]
    out = []
    for _ in range(n):
        head = rng.choice(heads)[:16 * rng.randint(1, 4)]
        out.append(head + [rng.randrange(32000) for _ in range(rng.randint(1, 48) + 64)])
    return out


def run(bm_class, reqs: list[list[int]], record: bool, take_every: int = 8) -> tuple[float, list]:
    bm = bm_class(2048, 16)
    taken: list = []
    if record:
        bm.record_kv_events()
    gc.disable()
    t0 = time.process_time()
    for i, toks in enumerate(reqs):
        bm.allocate(i, toks)
        bm.cache_blocks(i, toks, len(toks))
        bm.free(i)
        if record and i % take_every == 0:
            taken.append(bm.take_kv_events())
    dt = time.process_time() - t0
    gc.enable()
    return dt / len(reqs) * 1e6, taken


def load_before(rev: str):
    """scheduler/block_manager.py as of `rev`, imported under another name."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:scheduler/block_manager.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "block_manager_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("block_manager_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.BlockManager


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--before", default="2601691~1", help="revision without the hook")
    args = p.parse_args(argv)
    from backend.server.kv_events import encode_batch

    reqs = stream(args.requests)
    before = load_before(args.before)
    times: dict[str, list[float]] = {"before": [], "off": [], "recording": [], "encode": []}
    nbytes = 0

    def one(variant: str) -> None:
        nonlocal nbytes
        if variant == "recording":
            us, taken = run(BlockManager, reqs, True)
            times["recording"].append(us)
            t0 = time.process_time()
            nbytes = sum(len(encode_batch(entries, 16)) for entries in taken if entries)
            times["encode"].append((time.process_time() - t0) / len(reqs) * 1e6)
        else:
            times[variant].append(run(before if variant == "before" else BlockManager, reqs,
                                      False)[0])

    order = ["before", "off", "recording"]
    for r in range(args.repeats):  # each variant first, second and third in turn
        for variant in order[r % 3:] + order[:r % 3]:
            one(variant)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}, "
          f"{args.requests} requests x {args.repeats} (medians, us/request)")
    print(f"  hook absent ({args.before})  {med['before']:.2f}")
    print(f"  hook off (default)         {med['off']:.2f}  ({med['off'] / med['before'] - 1:+.1%})")
    print(f"  recording                  {med['recording']:.2f}  "
          f"({med['recording'] / med['before'] - 1:+.1%})")
    print(f"  encoding (publisher thread) {med['encode']:.2f}  "
          f"({nbytes / args.requests:.0f} bytes/request of msgpack)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
