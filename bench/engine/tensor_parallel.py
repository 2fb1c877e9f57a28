"""Tensor-parallel decode benchmark: step time per batch at one TP size, against its floor and
the simulator's plan (issue 19's goals).

    python -m bench.engine.tensor_parallel --model deepseek-coder-33b --device cuda --tp 2 \\
        --batches 1,8,32 --context 512 --out tp2.json

One TP size per run (`scripts/gpu_tp_run.sh` runs 1, 2, 4 and compares). What it measures, on
rank 0 with the other ranks following as in serving (`LeaderRunner`):

- `ceilings`: copy bandwidth and bf16 matmul rate of rank 0's device (`engine_bench`);
- `all_reduce`: seconds per all-reduce of [tokens, hidden] activations, eager and inside a CUDA
  graph, for each batch (every rank takes part: `LeaderRunner.time_all_reduce`);
- `decode`: ms per decode step at each batch (random weights, `--context` tokens of KV each,
  CUDA graphs unless `--enforce-eager`), with

      floor_ms = (weight bytes per rank + KV bytes per rank) / copy bandwidth
                 + (2 x layers + 1) all-reduces at that batch (graph figure) + the logits gather
                 (not measured apart: counted as one more all-reduce)

  (the simulator's plan for the same layout is put beside it by `scripts/gpu_tp_run.sh`: the
  backend does not import sims).

On the CPU (gloo, a small model) it runs the same code: a smoke test of the path, not a speed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from backend.engine.assemble import BackendConfig
from engine_flags import int_list


@dataclasses.dataclass
class _Chunk:
    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    is_prefill: bool = False
    sample: bool = True


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.engine.tensor_parallel",
                                description="decode step time at one tensor-parallel size")
    p.add_argument("--model", default="deepseek-coder-33b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--batches", type=int_list, default=[1, 8, 32])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--cpu-threads", type=int, default=None)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p


def _build(a: argparse.Namespace):
    from backend.engine.assemble import ServingOptions

    max_batch = max(a.batches)
    per_seq = -(-(a.context + a.warmup + a.steps + 2) // a.block_size)
    cfg = BackendConfig(model=a.model, load_format="dummy", device=a.device, dtype=a.dtype,
                        max_model_len=a.context + a.warmup + a.steps + 2,
                        block_size=a.block_size, num_blocks=max_batch * per_seq + 1,
                        max_num_seqs=max_batch, max_num_batched_tokens=max(max_batch, 16),
                        cpu_threads=a.cpu_threads)
    buckets = ",".join(str(b) for b in a.batches)
    serving = ServingOptions(enforce_eager=a.enforce_eager, cuda_graph_buckets=buckets,
                             cuda_graph_token_buckets="none", capture=True)
    if a.tp == 1:
        from backend.engine.assemble import create_engine

        engine, loaded = create_engine(cfg, serving)
        return engine.runner, loaded, None
    from backend.server.ranks import start_tp_engine

    engine, loaded, _, ranks = start_tp_engine(cfg, serving, a.tp)
    return engine.runner, loaded, ranks


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_ms(runner, batch: int, a: argparse.Namespace) -> tuple[list[float], list[float]]:
    """ms per step, and ms of each step's plan broadcast (rank 0's host time; TP > 1)."""
    bs, vocab = runner.block_size, runner.model.config.vocab_size
    per_seq = -(-(a.context + a.warmup + a.steps + 2) // bs)
    chunks = [_Chunk(f"d{i}", [(7 * i + 3) % vocab], a.context - 1,
                     list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]
    times, sends = [], []
    for i in range(a.warmup + a.steps):
        _sync(runner.device)
        t0 = time.perf_counter()
        out = runner.execute(chunks)
        _sync(runner.device)
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            sends.append(getattr(runner, "last_send_s", 0.0) * 1e3)
        chunks = [dataclasses.replace(c, token_ids=[out.token_ids[c.request_id]],
                                      start_pos=c.start_pos + 1) for c in chunks]
    return times, sends


def run(a: argparse.Namespace) -> dict:
    from backend.model.quantization import weight_bytes
    from bench.engine.steps import measure_ceilings

    runner, loaded, ranks = _build(a)
    device = runner.device
    cfg = runner.model.config  # this rank's shard
    res: dict = {"tp": a.tp, "model": a.model, "device": str(device),
                 "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "dtype": str(loaded.dtype).removeprefix("torch."), "context": a.context,
                 "cuda_graphs": runner.graphs is not None, "decode": [], "all_reduce": []}
    try:
        res["ceilings"] = measure_ceilings(device)
        bw = res["ceilings"]["copy_bytes_per_s"]
        wbytes = weight_bytes(runner.model)
        dname = res["dtype"]
        for batch in a.batches:
            ar = {"tokens": batch, "eager_s": 0.0, "graph_s": 0.0}
            if a.tp > 1:
                ar["eager_s"] = runner.time_all_reduce(batch, 50, graph=False)
                ar["graph_s"] = runner.time_all_reduce(batch, 50, graph=device.type == "cuda")
            res["all_reduce"].append(ar)
            times, sends = _decode_ms(runner, batch, a)
            ms = statistics.median(times)
            mean_ctx = a.context + a.warmup + (a.steps - 1) / 2
            kv = batch * mean_ctx * cfg.kv_bytes_per_token(dname)
            collectives = 2 * cfg.num_hidden_layers + 2 if a.tp > 1 else 0
            floor_ms = ((wbytes + kv) / bw + collectives * ar["graph_s"]) * 1e3
            row = {"batch": batch, "ms_per_step": ms, "tokens_per_s": batch / ms * 1e3,
                   "step_ms_min": min(times), "plan_send_ms": statistics.median(sends),
                   "floor_ms": floor_ms,
                   "fraction_of_floor": floor_ms / ms, "weight_bytes_per_rank": wbytes,
                   "kv_bytes_per_rank": kv, "collectives_per_step": collectives}
            res["decode"].append(row)
            print(f"tp={a.tp} batch={batch:4d}: {ms:8.3f} ms/step {row['tokens_per_s']:9.1f} tok/s "
                  f"floor {floor_ms:7.3f} ms ({row['fraction_of_floor']:.1%}); plan sent in "
                  f"{row['plan_send_ms']:.3f} ms; all-reduce "
                  f"{ar['eager_s'] * 1e6:.1f} us eager / {ar['graph_s'] * 1e6:.1f} us graph",
                  file=sys.stderr, flush=True)
    finally:
        if ranks is not None:
            ranks.stop()
    return res


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    res = run(a)
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
