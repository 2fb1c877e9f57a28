"""Step CUDA graphs on the 33B preset (dummy bf16 weights), one GPU, per KV format:
capture time and memory of every default bucket, and step times graphed vs eager for mixed
steps (prefill chunks + decodes) and large decode batches, with the greedy tokens of both.

    PYTHONUNBUFFERED=1 python3 -m bench.engine.graphs_check --out $OUT [--formats auto,int4-fp8]

Writes OUT/step_graphs.json after every section. Step time: median wall time of
`runner.execute` (synchronized) over --repeats runs of the same step after warm-ups; the step
rewrites its own K/V at the same slots, so every repeat has the same inputs.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.engine.assemble import BackendConfig, create_engine
from scheduler.step_plan import ScheduledChunk

# (name, decodes, their context, prefill chunks [(tokens, cached prefix)])
STEPS = [
    ("mixed 16-token prompt + 32 decodes (ctx 1024)", 32, 1024, [(16, 0)]),
    ("mixed 256-token chunk + 64 decodes (ctx 1024)", 64, 1024, [(256, 0)]),
    ("mixed 512-token prompt + 100 decodes (ctx 1024)", 100, 1024, [(512, 0)]),
    ("mixed 512-token chunk on a 2048 prefix + 16 decodes", 16, 2048, [(512, 2048)]),
    ("decode 200 seqs (ctx 1024)", 200, 1024, []),
    ("decode 64 seqs (ctx 1024)", 64, 1024, []),
    ("decode 1 seq (ctx 2048)", 1, 2048, []),
]


def log(msg: str) -> None:
    print(msg, flush=True)


class Blocks:
    def __init__(self, block_size: int) -> None:
        self.bs, self.next = block_size, 1   # block 0 stays free (padding rows read it)

    def take(self, tokens: int) -> list[int]:
        n = -(-tokens // self.bs)
        self.next += n
        return list(range(self.next - n, self.next))


def build_step(vocab: int, blocks: Blocks, decodes: int, ctx: int, chunks) -> list:
    out = []
    for i in range(decodes):
        out.append(ScheduledChunk(f"d{i}", [(7 * i + 3) % vocab], ctx - 1, blocks.take(ctx + 8),
                                  False, True))
    for j, (tokens, prefix) in enumerate(chunks):
        ids = [(5 * k + j) % vocab for k in range(tokens)]
        out.append(ScheduledChunk(f"p{j}", ids, prefix, blocks.take(prefix + tokens + 8), True,
                                  True))
    return out


def fill_random(kv) -> None:
    """Random page contents (never zeros) for every layer and format."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    for pool in kv.k_caches + kv.v_caches:
        if isinstance(pool, torch.Tensor):
            pool.normal_(generator=gen)
        else:
            pool.data.view(torch.uint8).random_(0, 120, generator=gen)  # finite E4M3 / nibbles
            pool.scale.uniform_(0.001, 0.02, generator=gen)


def time_step(runner, chunks, graphs, repeats: int) -> tuple[float, dict]:
    saved = runner.graphs
    if not graphs:
        runner.graphs = None
    try:
        times, out = [], None
        for i in range(2 + repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = runner.execute(chunks)
            torch.cuda.synchronize()
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        runner.graphs = saved
    return statistics.median(times), out.token_ids


def run_format(fmt: str, args, results: dict, out_path: Path) -> None:
    t0 = time.perf_counter()
    engine, loaded = create_engine(BackendConfig(
        model=args.preset, load_format="dummy", device="cuda", dtype="bfloat16",
        max_model_len=args.max_model_len, kv_cache_dtype=fmt,
        max_num_seqs=256, max_num_batched_tokens=2048))
    runner = engine.runner
    res = {"build_s": round(time.perf_counter() - t0, 1), "num_blocks": engine.config.num_blocks,
           "attention": type(runner.model.attn).__name__}
    results["formats"][fmt] = res
    fill_random(runner.kv)
    g = runner.graphs
    torch.cuda.synchronize()
    res["capture_s"] = round(g.capture_all(), 2)
    res["capture_mem"] = g.capture_mem
    res["decode_buckets"] = list(g.buckets)
    res["token_buckets"] = list(g.token_buckets)
    res["decode_capture_s"] = {str(k): round(v, 3) for k, v in sorted(g.capture_s.items())}
    res["mixed_capture_s"] = {str(k): round(v, 3) for k, v in sorted(g.mixed_capture_s.items())}
    log(f"[{fmt}] built in {res['build_s']} s ({res['num_blocks']} blocks, "
        f"{res['attention']}); captured {len(g.graphs)} decode + {len(g.mixed_graphs)} mixed "
        f"graphs in {res['capture_s']} s; memory {g.capture_mem}")
    out_path.write_text(json.dumps(results, indent=1))
    vocab = loaded.config.vocab_size
    res["steps"] = []
    for name, decodes, ctx, chunks in STEPS:
        if time.perf_counter() - START > args.budget_s:
            log(f"[{fmt}] budget spent, skipping {name}")
            continue
        step = build_step(vocab, Blocks(runner.block_size), decodes, ctx, chunks)
        tokens = sum(len(c.token_ids) for c in step)
        graph_ms, graph_ids = time_step(runner, step, True, args.repeats)
        eager_ms, eager_ids = time_step(runner, step, False, args.repeats)
        same = sum(graph_ids[k] == eager_ids[k] for k in eager_ids)
        row = {"step": name, "tokens": tokens, "seqs": len(step), "graph_ms": round(graph_ms, 2),
               "eager_ms": round(eager_ms, 2), "greedy_equal": same, "sampled": len(eager_ids)}
        res["steps"].append(row)
        log(f"[{fmt}] {name}: {tokens} tokens, graph {graph_ms:.2f} ms vs eager {eager_ms:.2f} ms;"
            f" greedy tokens equal {same}/{len(eager_ids)}")
        out_path.write_text(json.dumps(results, indent=1))
    g.release()
    del engine, loaded, runner, g
    gc.collect()
    torch.cuda.empty_cache()


START = time.perf_counter()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--preset", default="deepseek-coder-33b")
    ap.add_argument("--formats", default="auto,int4-fp8")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=200.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "step_graphs.json"
    results = {"meta": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                        "preset": args.preset}, "formats": {}}
    for fmt in args.formats.split(","):
        if time.perf_counter() - START > args.budget_s:
            log(f"budget spent, skipping format {fmt}")
            continue
        try:
            run_format(fmt, args, results, path)
        except Exception as exc:  # noqa: BLE001 - report and carry on with the next format
            import traceback
            traceback.print_exc()
            results.setdefault("errors", []).append(f"{fmt}: {exc!r}"[:500])
            path.write_text(json.dumps(results, indent=1))
    log(json.dumps(results["formats"], indent=1)[:6000])
    return 0 if "errors" not in results else 1


if __name__ == "__main__":
    sys.exit(main())
