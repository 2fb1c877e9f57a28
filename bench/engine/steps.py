"""`python -m bench.engine.steps` (also `tidegate bench engine`): the engine on one GPU, against its
measured ceilings and against transformers' eager `generate` of the same config.

    python -m bench.engine.steps --out engine_bench.json --profile-out profile_h200.json
    python -m bench.engine.steps --device cpu --preset tiny ...        # the code path, end to end

Sections, in this order (JSON rewritten after every row, so a cut-off run keeps what it had):

    ceilings   device-to-device copy bandwidth (bytes read + written), bf16 matmul TFLOP/s
    bf16       decode batch 1 with graphs / eager, prefill 2048, decode batches, prefill others,
               host time per decode step at batch 64 through the real StepScheduler,
               extra profile points -> the simulator's profile JSON (docs/contracts.md)
    fp8        the same model after `quantize_model(model, "fp8")`
    peer       our engine freed, then transformers' LlamaForCausalLM of the same config (random
               bf16 weights made on the GPU) with eager `generate`, in the same process

Decode rows feed back their own sampled tokens for `--steps` timed steps after `--warmup`;
each sequence starts with `--context` tokens of random KV. floor_ms = (bytes of the weights a
step streams + KV bytes the step reads) / copy bandwidth; fraction_of_floor = floor_ms / ms.
Prefill rows: one prompt from position 0; fraction_of_ceiling = model FLOPs / time / matmul
rate. Weights are random (N(0, 0.02), never zeros) and generated on the device.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from backend.config import ModelConfig
from backend.engine.args import int_list
from scheduler.step_plan import ScheduledChunk

GOAL_HOST_MS = 0.2


def _chunk(request_id, token_ids, start_pos, block_table, is_prefill) -> ScheduledChunk:
    """A step chunk for a synthetic step; every chunk samples (the runner reads all of them)."""
    return ScheduledChunk(request_id, token_ids, start_pos, block_table, is_prefill, True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.engine.steps", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (code-path check only)")
    p.add_argument("--preset", default="deepseek-coder-33b", help="model preset (dummy weights)")
    p.add_argument("--layers", type=int, default=None,
                   help="reduced depth: build only N decoder layers (stated in the output)")
    p.add_argument("--dtype", default=None, help="bfloat16 (default on cuda) / float32 (cpu)")
    p.add_argument("--context", type=int, default=512, help="KV tokens per sequence at decode")
    p.add_argument("--decode-batches", default="1,8,32,64,128")
    p.add_argument("--prefill-tokens", default="512,2048,8192")
    p.add_argument("--steps", type=int, default=12, help="timed decode steps per row")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps per row")
    p.add_argument("--buckets", default=None, help="CUDA-graph batch buckets (default 1..128)")
    p.add_argument("--host-batch", type=int, default=64, help="batch of the host-time check")
    p.add_argument("--host-steps", type=int, default=40, help="timed steps of the host-time check")
    p.add_argument("--profile-contexts", default="2048", help="extra decode contexts for the profile")
    p.add_argument("--no-fp8", action="store_true")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--peer-batches", default="1,8,32,64")
    p.add_argument("--peer-new-tokens", type=int, default=12)
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="stop starting sections after this many seconds (0: none)")
    p.add_argument("--kernel-profile", action="store_true",
                   help="per-kernel GPU times (torch profiler) of the batch-1 decode graph "
                        "replay and the 2048-token prefill, bf16 and fp8")
    p.add_argument("--ab", action="store_true",
                   help="batch-1 decode graphs recaptured with programmatic dependent launch "
                        "off/on and (bf16) our GEMV off/on, every combination twice, "
                        "interleaved; bf16 and fp8")
    p.add_argument("--ab-fused-norm", action="store_true",
                   help="with --ab: instead of the PDL / GEMV combinations, the decoder norms "
                        "as their own kernels vs folded into the qkv / gate_up GEMVs "
                        "(TIDEGATE_FUSED_NORM_GEMV), on the current defaults")
    p.add_argument("--gemv-configs", default=None,
                   help="JSON of swept one-row GEMV configs (bench/kernels/fp8_gemv_sweep.py "
                        "--tuned-out; several comma-separated, later ones win) applied before "
                        "the run; --ab then compares them with the committed tables, each with "
                        "the silu-fused down projection off and on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON results path")
    p.add_argument("--profile-out", default=None, help="the simulator's profile JSON path")
    return p


# ---- timing ----------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_op(fn, device: torch.device, iters: int, warmup: int = 2) -> float:
    """Median seconds of fn()."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: torch.device) -> dict:
    cuda = device.type == "cuda"
    n = (1 << 30) if cuda else (64 << 20)
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t = _time_op(lambda: dst.copy_(src), device, 20)
    copy_bw = 2 * n / t
    src = dst = None  # free before the matmul
    m = 8192 if cuda else 512
    a = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=device)
    t = _time_op(lambda: a @ b, device, 10)
    flops = 2 * m ** 3 / t
    return {"copy_bytes_per_s": copy_bw, "copy_tb_per_s": copy_bw / 1e12,
            "copy_bytes": 2 * n, "matmul_flops_per_s": flops, "matmul_tflops": flops / 1e12,
            "matmul_shape": [m, m, m], "matmul_inputs": "random bf16"}


# ---- the engine under test -------------------------------------------------------------------

class BlockPool:
    """Consecutive block ids, wrapping around the pool (wrapped tables share blocks: the
    timing is unchanged, the contents are irrelevant here)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.next = 0

    def take(self, n: int) -> list[int]:
        out = [(self.next + i) % self.num_blocks for i in range(n)]
        self.next = (self.next + n) % self.num_blocks
        return out


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype or ("bfloat16" if self.device.type == "cuda"
                                                    else "float32"))
        self.t0 = time.perf_counter()
        full = ModelConfig.from_preset(args.preset)
        self.full_config = full
        self.config = dataclasses.replace(full, num_hidden_layers=args.layers) if args.layers \
            else full
        self.results: dict = {
            "meta": {
                "preset": args.preset, "num_layers": self.config.num_hidden_layers,
                "full_num_layers": full.num_hidden_layers,
                "reduced_depth": bool(args.layers and args.layers != full.num_hidden_layers),
                "device": str(self.device), "device_name": self._device_name(),
                "dtype": str(self.dtype).removeprefix("torch."), "torch": torch.__version__,
                "python": platform.python_version(), "weights": "dummy N(0, 0.02), on device",
                "context_len": args.context, "decode_steps": args.steps,
                "decode_warmup": args.warmup,
                "graphs_emulated": self.device.type != "cuda",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            "ceilings": {}, "cuda_graphs": {}, "prefill": [], "decode": [], "host_time": {},
            "checks": {}, "peer": {}, "goals": [], "skipped": [], "errors": [],
            "kernel_profile": {}, "ab": {},
        }
        self.profile_points: list[dict] = []
        self.runner = None
        self.committed_tables = self.swept_tables = None
        if args.gemv_configs:
            from backend.kernels import fp8_gemv

            self.committed_tables = fp8_gemv.config_tables()
            swept: dict = {}
            for path in args.gemv_configs.split(","):
                with open(path) as f:
                    for name, table in fp8_gemv.tables_from_json(json.load(f)).items():
                        swept.setdefault(name, {}).update(table)
            self.swept_tables = swept
            fp8_gemv.set_config_tables(swept)
            self.results["meta"]["gemv_configs"] = {
                name: {f"{n}x{k}": dataclasses.asdict(c) for (n, k), c in table.items()}
                for name, table in swept.items()}

    def _device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return platform.processor() or "cpu"

    # ---- bookkeeping -------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def time_left(self) -> float:
        return math.inf if not self.args.deadline_s else self.args.deadline_s - self.elapsed()

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)

    def save(self) -> None:
        if not self.args.out:
            return
        self.results["meta"]["elapsed_s"] = round(self.elapsed(), 2)
        tmp = f"{self.args.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1, default=float)
            f.write("\n")
        os.replace(tmp, self.args.out)

    def section(self, name: str, need_s: float, fn, *a) -> bool:
        """Run fn unless the deadline is too close; errors are recorded, not raised."""
        if self.time_left() < need_s:
            self.results["skipped"].append({"section": name, "reason": "deadline",
                                            "time_left_s": round(self.time_left(), 1)})
            self.log(f"SKIP {name}: {self.time_left():.0f} s left, needs ~{need_s:.0f} s")
            self.save()
            return False
        try:
            fn(*a)
            return True
        except Exception as exc:  # noqa: BLE001 - a benchmark reports and carries on
            self.results["errors"].append({"section": name, "error": repr(exc),
                                           "traceback": traceback.format_exc(limit=8)})
            self.log(f"ERROR in {name}: {exc!r}\n{traceback.format_exc(limit=8)}")
            return False
        finally:
            self.save()

    # ---- building ----------------------------------------------------------------------------
    def build(self) -> None:
        from backend.kernels.dispatch import install_kernels
        from backend.kv.pools import KVCache
        from backend.model.llama import LlamaModel
        from backend.model.loader import init_dummy_weights
        from backend.runner.cuda_graphs import StepGraphs, parse_buckets
        from backend.runner.step import ModelRunner

        a, c = self.args, self.config
        self.batches = int_list(a.decode_batches)
        self.prefills = [p for p in int_list(a.prefill_tokens) if p <= c.max_position_embeddings]
        contexts = [a.context] + int_list(a.profile_contexts)
        self.max_model_len = min(c.max_position_embeddings, max(
            self.prefills + [x + a.warmup + a.steps + 8 for x in contexts]
            + [a.context + a.host_steps + 16]))
        t0 = time.perf_counter()
        with torch.device("meta"):
            model = LlamaModel(c, max_model_len=self.max_model_len)
        model = model.to(self.dtype).to_empty(device=self.device)
        init_dummy_weights(model, a.seed)
        model.init_rope()
        model.eval()
        _sync(self.device)
        self.results["meta"]["load_s"] = round(time.perf_counter() - t0, 2)
        bs = 16
        need = max(max(self.batches) * -(-(a.context + a.warmup + a.steps + 8) // bs),
                   a.host_batch * -(-(a.context + 64) // bs))
        for ctx_len in int_list(a.profile_contexts):
            need = max(need, 64 * -(-(ctx_len + a.warmup + a.steps + 8) // bs))
        need += -(-max(self.prefills + [1]) // bs) + 16
        block_bytes = bs * c.kv_bytes_per_token(str(self.dtype).removeprefix("torch."))
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
            budget = max(block_bytes * 64, free - (14 << 30))
            num_blocks = max(64, min(need, budget // block_bytes))
        else:
            num_blocks = need
        kv = KVCache.allocate(c, num_blocks, bs, self.dtype, self.device)
        gen = torch.Generator(device=self.device).manual_seed(a.seed + 1)
        for t in kv.k_caches + kv.v_caches:  # random KV contents, never zeros
            t.normal_(0.0, 1.0, generator=gen)
        self.pool = BlockPool(num_blocks)
        max_tokens = max(self.prefills + [max(self.batches), a.host_batch, 64]) + 64
        self.runner = ModelRunner(model, kv, max_num_batched_tokens=max_tokens,
                                  max_num_seqs=max(self.batches + [a.host_batch, 128]),
                                  max_model_len=self.max_model_len,
                                  cuda_graph_buckets=parse_buckets(a.buckets))
        if self.device.type != "cuda":  # CPU: kernel references + emulated graphs (code path)
            install_kernels(model)
            self.runner.graphs = StepGraphs(self.runner, parse_buckets(a.buckets),
                                            use_cuda_graphs=False)
        self.results["meta"].update({
            "num_kv_blocks": num_blocks, "block_size": bs, "max_model_len": self.max_model_len,
            "kernels": type(model.attn).__name__, "weight_bytes_bf16": self.weight_bytes()})
        self.log(f"built {c.name} x{c.num_hidden_layers} layers in "
                 f"{self.results['meta']['load_s']} s; {num_blocks} KV blocks; attn "
                 f"{type(model.attn).__name__}")

    def weight_bytes(self) -> int:
        from backend.model.quantization import weight_bytes

        return weight_bytes(self.runner.model)

    def capture(self, weights: str, buckets=None) -> None:
        g = self.runner.graphs
        if g is None:
            self.results["cuda_graphs"][weights] = {"enabled": False}
            return
        total = g.capture_all(buckets)
        self.results["cuda_graphs"][weights] = {
            "enabled": True, "emulated": not g.use_cuda_graphs, "capture_s": round(total, 3),
            "buckets": sorted(g.graphs), "per_bucket_s": {str(b): round(s, 3) for b, s in
                                                          sorted(g.capture_s.items())},
            "token_buckets": sorted(g.mixed_graphs),
            "per_token_bucket_s": {str(b): round(s, 3) for b, s in
                                   sorted(g.mixed_capture_s.items())},
            "capture_mem": dict(g.capture_mem)}
        self.log(f"captured {len(g.graphs)} decode + {len(g.mixed_graphs)} mixed {weights} "
                 f"graphs in {total:.1f} s; memory {g.capture_mem}")

    # ---- rows --------------------------------------------------------------------------------
    def decode_chunks(self, batch: int, context: int) -> list[ScheduledChunk]:
        bs = self.runner.block_size
        nb = -(-(context + self.args.warmup + self.args.steps + 2) // bs)
        vocab = self.config.vocab_size
        return [_chunk(f"d{i}", [(7 * i + 3) % vocab], context - 1, self.pool.take(nb), False)
                for i in range(batch)]

    def run_decode(self, weights: str, batch: int, graphs: bool, context: int | None = None,
                   record: bool = True, profile_point: bool = True) -> dict:
        a, r = self.args, self.runner
        context = context or a.context
        saved = r.graphs
        if not graphs:
            r.graphs = None
        elif saved is None:
            raise RuntimeError("CUDA graphs are not available on this runner")
        chunks = self.decode_chunks(batch, context)
        times = []
        try:
            for i in range(a.warmup + a.steps):
                _sync(self.device)
                t0 = time.perf_counter()
                out = r.execute(chunks)
                _sync(self.device)
                if i >= a.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
                chunks = [dataclasses.replace(c, token_ids=[out.token_ids[c.request_id]],
                                              start_pos=c.start_pos + 1) for c in chunks]
        finally:
            r.graphs = saved
        ms = statistics.median(times)
        mean_ctx = context + a.warmup + (a.steps - 1) / 2
        kv_bytes = batch * mean_ctx * self.config.kv_bytes_per_token(
            str(self.dtype).removeprefix("torch."))
        floor_ms = (self.weight_bytes() + kv_bytes) / self.results["ceilings"]["copy_bytes_per_s"] \
            * 1e3
        row = {"weights": weights, "batch": batch, "graphs": graphs, "context_len": context,
               "ms_per_token": ms, "tokens_per_s": batch / ms * 1e3, "floor_ms": floor_ms,
               "fraction_of_floor": floor_ms / ms, "step_ms_mean": statistics.fmean(times),
               "step_ms_min": min(times), "weight_bytes": self.weight_bytes(),
               "kv_bytes_read": kv_bytes, "repeats": len(times)}
        if record:
            self.results["decode"].append(row)
            self.log(f"decode {weights} b={batch:3d} graphs={graphs!s:5} ctx={context}: "
                     f"{ms:8.3f} ms/token  {row['tokens_per_s']:9.1f} tok/s  "
                     f"floor {floor_ms:7.3f} ms ({row['fraction_of_floor']:.1%})")
        if weights == "bf16" and graphs and profile_point:
            self.profile_points.append(self._point(batch, 0, context + a.warmup + a.steps // 2,
                                                   times))
        return row

    def prefill_flops(self, tokens: int) -> float:
        c = self.config
        h, i = c.hidden_size, c.intermediate_size
        per_layer = h * (c.q_size + 2 * c.kv_size) + c.q_size * h + 3 * h * i
        attn = 2 * tokens * tokens * c.num_attention_heads * c.head_dim  # QK^T + PV, causal half
        return 2 * tokens * per_layer * c.num_hidden_layers + attn * c.num_hidden_layers \
            + 2 * c.vocab_size * h

    def run_prefill(self, weights: str, tokens: int, graphs: bool = True) -> dict:
        """One prompt of `tokens` from position 0, the engine's own path (a mixed-step graph
        where a token bucket holds it), or with `graphs=False` eager (whole prompts over
        model-dtype pages then take flash SDPA instead of the paged kernel)."""
        r, bs = self.runner, self.runner.block_size
        gen = torch.Generator().manual_seed(tokens)
        ids = torch.randint(0, self.config.vocab_size, (tokens,), generator=gen).tolist()
        table = self.pool.take(-(-tokens // bs))
        chunk = _chunk("p", ids, 0, table, True)
        reps = 2 if tokens >= 8192 else 3
        times = []
        saved = r.graphs
        via_graph = saved is not None and bool(saved.token_bucket([chunk]))
        if not graphs:
            r.graphs = None
        try:
            for i in range(1 + reps):
                _sync(self.device)
                t0 = time.perf_counter()
                r.execute([chunk])
                _sync(self.device)
                if i:
                    times.append((time.perf_counter() - t0) * 1e3)
        finally:
            r.graphs = saved
        ms = statistics.median(times)
        flops = self.prefill_flops(tokens)
        rate = self.results["ceilings"]["matmul_flops_per_s"]
        row = {"weights": weights, "tokens": tokens, "batch": 1, "ms": ms,
               "path": "graph" if graphs and via_graph else "eager",
               "fraction_of_ceiling": flops / (ms / 1e3) / rate, "flops": flops,
               "tflops": flops / (ms / 1e3) / 1e12, "floor_ms": flops / rate * 1e3,
               "step_ms_min": min(times), "repeats": len(times)}
        self.results["prefill"].append(row)
        self.log(f"prefill {weights} {tokens:5d} tokens ({row['path']}): {ms:9.2f} ms  "
                 f"{row['tflops']:7.1f} TFLOP/s ({row['fraction_of_ceiling']:.1%} of the matmul "
                 f"ceiling)")
        if weights == "bf16" and row["path"] == ("graph" if via_graph else "eager"):
            self.profile_points.append(self._point(0, tokens, 0, times))
        return row

    def _point(self, d: int, p: int, c: int, times: list[float]) -> dict:
        return {"num_decode_seqs": d, "num_prefill_tokens": p, "context_len": c if d else 0,
                "num_context_tokens": d * c + p, "step_ms": statistics.fmean(times),
                "step_ms_min": min(times), "step_ms_median": statistics.median(times),
                "repeats": len(times)}

    def run_mixed_point(self, d: int, p: int, c: int) -> None:
        """One step of d decodes (context c) + a p-token prefill from position 0 (eager)."""
        bs = self.runner.block_size
        chunks = self.decode_chunks(d, c)
        chunks.append(_chunk("p", [(5 * j + 1) % self.config.vocab_size for j in range(p)], 0,
                             self.pool.take(-(-p // bs)), True))
        times = []
        for i in range(3):
            _sync(self.device)
            t0 = time.perf_counter()
            self.runner.execute(chunks)
            _sync(self.device)
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        self.profile_points.append(self._point(d, p, c, times))
        self.log(f"profile point d={d} p={p} c={c}: {statistics.fmean(times):.2f} ms")

    # ---- per-kernel profile --------------------------------------------------------------------
    def profile_kernels(self, weights: str, batch: int, prefill_tokens: int = 0,
                        steps: int = 3) -> None:
        """GPU time per kernel of `steps` steps (decode `batch` through the graphs, or one
        prefill of `prefill_tokens`) from the torch profiler; steps are separated by a 20 ms
        host sleep so that the kernels split into steps by that gap."""
        from torch.profiler import ProfilerActivity, profile

        if self.device.type != "cuda":
            self.log("kernel profile: CUDA only (skipped)")
            return
        r, bs = self.runner, self.runner.block_size
        if prefill_tokens:
            ids = [(11 * j + 5) % self.config.vocab_size for j in range(prefill_tokens)]
            chunks = [_chunk("pp", ids, 0, self.pool.take(-(-prefill_tokens // bs)), True)]
        else:
            chunks = self.decode_chunks(batch, self.args.context)
        r.execute(chunks)  # warm (first use of any new shape)
        _sync(self.device)
        walls = []
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                time.sleep(0.02)
                t0 = time.perf_counter()
                out = r.execute(chunks)
                _sync(self.device)
                walls.append((time.perf_counter() - t0) * 1e3)
                if not prefill_tokens:
                    chunks = [dataclasses.replace(c, token_ids=[out.token_ids[c.request_id]],
                                                  start_pos=c.start_pos + 1) for c in chunks]
        kernels = [(e.name, e.time_range.start, e.time_range.end - e.time_range.start)
                   for e in prof.events() if str(e.device_type).endswith("CUDA")]
        key = f"{weights} " + (f"prefill {prefill_tokens}" if prefill_tokens else
                               f"decode b={batch}")
        bd = kernel_breakdown(kernels, walls)
        bd["weight_bytes"] = self.weight_bytes()
        mm = bd["categories"].get("matmul (cuBLAS)", {}).get("us", 0.0) \
            + bd["categories"].get("fp8 gemv", {}).get("us", 0.0) \
            + bd["categories"].get("split-k reduce", {}).get("us", 0.0)
        if mm and not prefill_tokens:  # decode: the matmuls stream (almost) all weight bytes
            bd["matmul_tb_per_s"] = self.weight_bytes() / (mm * 1e-6) / 1e12
        self.results["kernel_profile"][key] = bd
        self.log(f"kernel profile {key}: wall {bd['wall_ms']:.3f} ms, kernels busy "
                 f"{bd['busy_us'] / 1e3:.3f} ms, span {bd['span_us'] / 1e3:.3f} ms, gaps "
                 f"{bd['gap_us'] / 1e3:.3f} ms, {bd['kernels_per_step']} kernels/step")
        for name, c in sorted(bd["categories"].items(), key=lambda kv: -kv[1]["us"]):
            self.log(f"    {name:26s} {c['us'] / 1e3:8.3f} ms  {c['count']:5d} launches  "
                     f"{c['share']:6.1%}  chain {c['chain_us'] / 1e3:8.3f} ms")
        for t in bd["top_kernels"][:6]:
            if t["early_mean_us"] and t["late_mean_us"]:
                self.log(f"    {t['name'][:40]:40s} mean {t['mean_us']:8.2f} us, first quarter "
                         f"{t['early_mean_us']:8.2f}, last quarter {t['late_mean_us']:8.2f}")

    def ab_variants(self, weights: str) -> None:
        """Batch-1 decode with the bucket-1 graph recaptured under each combination of PDL
        off/on and (bf16 weights) our GEMV off/on (--ab-fused-norm: the norms separate vs
        folded into the qkv / gate_up GEMVs); two interleaved rounds (paired in time).
        The graph is left captured with the defaults."""
        from backend.kernels import dispatch as kernel_dispatch
        from backend.kernels import triton_utils

        g = self.runner.graphs
        if g is None or not g.use_cuda_graphs:
            self.log("a/b: needs CUDA graphs (skipped)")
            return
        from backend.kernels import fp8_gemv

        pdl0, gemv0 = triton_utils._PDL["enabled"], kernel_dispatch.BF16_GEMV["enabled"]
        fused0 = kernel_dispatch.FUSED_SILU_DOWN["enabled"]
        norm0 = kernel_dispatch.FUSED_NORM_GEMV["enabled"]
        tables0 = fp8_gemv.config_tables()
        norm_ab = getattr(self.args, "ab_fused_norm", False)
        if norm_ab:
            combos = [(pdl0, gemv0, None, None, fused0, norm) for norm in (False, True)]
        elif self.swept_tables is not None:
            # PDL and our GEMV on (measured last session); committed vs swept tables x the
            # silu-fused down projection off / on
            # each table exactly as named (replace): a shape only the sweep has (a small
            # preset's) runs on cuBLAS under "committed"
            swept_all = {name: {**self.committed_tables.get(name, {}), **table}
                         for name, table in self.swept_tables.items()}
            swept_all = {**self.committed_tables, **swept_all}
            combos = [(True, gemv0, name, tables, fused, norm0)
                      for name, tables in (("committed", self.committed_tables),
                                           ("swept", swept_all))
                      for fused in (False, True)]
        else:
            combos = [(p, gm, None, None, fused0, norm0)
                      for gm in ((False, True) if weights == "bf16" else (gemv0,))
                      for p in (False, True)]
        ms: dict[str, list[float]] = {}
        try:
            for _ in range(2):
                for pdl, gemv, name, tables, fused, norm in combos:
                    triton_utils.set_pdl(pdl)
                    kernel_dispatch.BF16_GEMV["enabled"] = gemv
                    kernel_dispatch.FUSED_SILU_DOWN["enabled"] = fused
                    kernel_dispatch.FUSED_NORM_GEMV["enabled"] = norm
                    if tables is not None:
                        fp8_gemv.set_config_tables(tables, replace=True)
                    g.capture(1)
                    row = self.run_decode(weights, 1, True, record=False, profile_point=False)
                    if norm_ab:
                        key = f"norm={'fused-into-gemv' if norm else 'separate'}"
                    elif name is not None:
                        key = f"configs={name} down={'silu-fused' if fused else 'separate'}"
                    else:
                        key = f"pdl={'on' if pdl else 'off'}" + (
                            f" gemv={'ours' if gemv else 'cublas'}" if weights == "bf16"
                            else "")
                    ms.setdefault(key, []).append(row["ms_per_token"])
        finally:
            triton_utils.set_pdl(pdl0)
            kernel_dispatch.BF16_GEMV["enabled"] = gemv0
            kernel_dispatch.FUSED_SILU_DOWN["enabled"] = fused0
            kernel_dispatch.FUSED_NORM_GEMV["enabled"] = norm0
            fp8_gemv.set_config_tables(tables0, replace=True)
            g.capture(1)
        floor = row["floor_ms"]
        out = {k: {"ms": v, "median_ms": statistics.median(v),
                   "fraction_of_floor": floor / statistics.median(v)} for k, v in ms.items()}
        self.results["ab"][weights] = {"batch": 1, "floor_ms": floor, "variants": out}
        for k, v in out.items():
            self.log(f"a/b {weights} b=1 {k:24s}: {v['ms']} ms -> {v['median_ms']:.3f} ms "
                     f"({v['fraction_of_floor']:.1%} of floor)")

    # ---- host time ---------------------------------------------------------------------------
    def host_time(self) -> None:
        """Per decode step at batch B: StepScheduler.schedule + input prep + H2D copy + graph
        launch + token read-back + StepScheduler.update, host clocks only (the GPU wait, a
        synchronize between launch and read-back, is excluded)."""
        from scheduler.step_scheduler import SchedulerConfig, StepResult, StepScheduler

        a, r = self.args, self.runner
        g = r.graphs
        if g is None:
            raise RuntimeError("no CUDA graphs: host time is measured on the graph path")
        batch = min(a.host_batch, g.max_bucket)
        cfg = SchedulerConfig(max_model_len=r.max_model_len, num_blocks=r.kv.num_blocks,
                              max_num_seqs=batch, max_num_batched_tokens=batch * (a.context + 1),
                              block_size=r.block_size, enable_prefix_caching=False)
        sched = StepScheduler(cfg)
        vocab = self.config.vocab_size
        steps, warm = a.host_steps, 3
        for i in range(batch):
            prompt = [(31 * i + 7 * j) % vocab for j in range(a.context)]
            assert sched.add_request(f"h{i}", prompt, steps + warm + 8, 0.0) is None
        plan = sched.schedule()  # the scheduler alone (no model): prompts "prefilled" at once
        while any(c.is_prefill for c in plan.chunks) or len(plan.chunks) < batch:
            sched.update(plan, StepResult(sampled={c.request_id: 1 for c in plan.chunks
                                                   if c.sample}, stopped=set()))
            plan = sched.schedule()
        parts = {"schedule": [], "launch": [], "read_back": [], "update": [], "step": []}
        for i in range(warm + steps):
            t0 = time.perf_counter()
            if i:
                plan = sched.schedule()
            t1 = time.perf_counter()
            launched = g.launch(plan.chunks)
            t2 = time.perf_counter()
            _sync(self.device)
            t3 = time.perf_counter()
            out = g.finish(launched, plan.chunks)
            t4 = time.perf_counter()
            sched.update(plan, StepResult(sampled=out.token_ids, stopped=set()))
            t5 = time.perf_counter()
            if i >= warm:
                for k, v in (("schedule", t1 - t0), ("launch", t2 - t1), ("read_back", t4 - t3),
                             ("update", t5 - t4), ("step", t5 - t0)):
                    parts[k].append(v * 1e3)
        med = {k: statistics.median(v) for k, v in parts.items()}
        host = med["schedule"] + med["launch"] + med["read_back"] + med["update"]
        self.results["host_time"] = {
            "batch": batch, "context_len": a.context, "steps": steps,
            "schedule_ms": med["schedule"], "input_prep_copy_replay_launch_ms": med["launch"],
            "read_back_ms": med["read_back"], "update_ms": med["update"], "host_ms": host,
            "step_ms": med["step"], "goal_ms": GOAL_HOST_MS,
            "method": "median over steps of host clocks around StepScheduler.schedule, "
                      "StepGraphs.launch (fill static rows, one H2D copy, replay), token "
                      "read-back after a synchronize, and StepScheduler.update"}
        self.log(f"host time per decode step at batch {batch}: {host:.3f} ms (schedule "
                 f"{med['schedule']:.3f}, prep+copy+launch {med['launch']:.3f}, read-back "
                 f"{med['read_back']:.3f}, update {med['update']:.3f}); step {med['step']:.2f} ms")

    # ---- checks ------------------------------------------------------------------------------
    @torch.inference_mode()
    def check_paths(self) -> None:
        """One batch-8 decode step three ways on the same inputs: graph replay vs eager kernels
        vs the torch reference path; relative logit differences."""
        from backend.kernels.reference.attention import TorchAttention
        from backend.kernels.reference.ops import TORCH_OPS

        r, model = self.runner, self.runner.model
        chunks = self.decode_chunks(8, self.args.context)
        outs = {}
        saved = r.graphs
        if saved is not None:
            outs["graph"] = r.execute(chunks, keep_logits=True).logits.clone()
        r.graphs = None
        try:
            outs["eager"] = r.execute(chunks, keep_logits=True).logits.clone()
            ops, attn = model.ops, model.attn
            model.ops, model.attn = TORCH_OPS, TorchAttention(self.config.head_dim ** -0.5)
            try:
                outs["torch"] = r.execute(chunks, keep_logits=True).logits.clone()
            finally:
                model.ops, model.attn = ops, attn
        finally:
            r.graphs = saved
        ref = outs["torch"]
        for k, v in outs.items():
            if k != "torch":
                err = ((v - ref).norm() / ref.norm()).item()
                agree = (v.argmax(-1) == ref.argmax(-1)).float().mean().item()
                self.results["checks"][f"{k}_vs_torch_rel_err"] = err
                self.results["checks"][f"{k}_vs_torch_argmax_agree"] = agree
                self.log(f"check {k} vs torch path: rel err {err:.2e}, argmax agree {agree:.2f}")

    # ---- sections ----------------------------------------------------------------------------
    def run_bf16(self) -> None:
        a = self.args
        self.section("capture_bf16", 30, self.capture, "bf16")
        self.section("check_paths", 20, self.check_paths)
        for graphs in (True, False):
            self.section(f"decode bf16 b=1 graphs={graphs}", 10, self.run_decode, "bf16", 1, graphs)
        if a.kernel_profile:
            self.section("kernel profile bf16 decode b=1", 15, self.profile_kernels, "bf16", 1)
        if a.ab:
            self.section("a/b bf16 b=1", 20, self.ab_variants, "bf16")
        if 2048 in self.prefills:
            self.section("prefill bf16 2048", 10, self.run_prefill, "bf16", 2048)
            if self.runner.graphs is not None and self.runner.graphs.token_bucket(
                    [_chunk("p", [0] * 2048, 0, [], True)]):
                # the engine replays a mixed graph (paged attention kernel); eager takes SDPA
                self.section("prefill bf16 2048 eager", 10, self.run_prefill, "bf16", 2048,
                             False)
            if a.kernel_profile:
                self.section("kernel profile bf16 prefill 2048", 15, self.profile_kernels,
                             "bf16", 0, 2048)
        for b in self.batches:
            for graphs in (True, False):
                if b != 1:
                    self.section(f"decode bf16 b={b} graphs={graphs}", 10, self.run_decode,
                                 "bf16", b, graphs)
        for p in self.prefills:
            if p != 2048:
                self.section(f"prefill bf16 {p}", 10, self.run_prefill, "bf16", p)
        self.section("host_time", 10, self.host_time)
        for ctx_len in int_list(a.profile_contexts):
            for b in self.batches:
                if b <= 64 and ctx_len + a.steps + a.warmup + 8 <= self.max_model_len:
                    self.section(f"profile decode b={b} c={ctx_len}", 15, self.run_decode,
                                 "bf16", b, True, ctx_len, False)
        for d, p in ((8, 512), (32, 1024)):
            if d + p <= self.runner.max_num_batched_tokens and d <= max(self.batches):
                self.section(f"profile mixed d={d} p={p}", 15, self.run_mixed_point, d, p,
                             a.context)
        self.write_profile()

    def write_profile(self) -> None:
        doc = {
            "format": "tidegate-profile/1", "model": self.config.name,
            "device": str(self.device), "device_name": self._device_name(),
            "dtype": str(self.dtype).removeprefix("torch."), "block_size": self.runner.block_size,
            "num_kv_blocks": self.runner.kv.num_blocks, "max_num_seqs": self.runner.max_num_seqs,
            "max_num_batched_tokens": self.runner.max_num_batched_tokens,
            "max_model_len": self.max_model_len, "torch_version": torch.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "source": "python -m bench.engine.steps (bf16 weights, CUDA graphs for pure decode)",
            "num_layers": self.config.num_hidden_layers,
            "reduced_depth": self.results["meta"]["reduced_depth"],
            "points": self.profile_points,
        }
        if self.args.profile_out and len(self.profile_points) >= 2:
            with open(self.args.profile_out, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            self.log(f"wrote {len(self.profile_points)} profile points to {self.args.profile_out}")

    def quantize(self) -> None:
        from backend.model.quantization import quantize_model
        from backend.runner.cuda_graphs import StepGraphs

        r = self.runner
        emulated = r.graphs is not None and not r.graphs.use_cuda_graphs
        if r.graphs is not None:
            r.graphs.release()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        n = quantize_model(r.model, "fp8", check_device=self.device.type == "cuda")
        _sync(self.device)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.results["meta"]["fp8_quantize_s"] = round(time.perf_counter() - t0, 2)
        self.results["meta"]["weight_bytes_fp8"] = self.weight_bytes()
        if r.graphs is not None:
            r.graphs = StepGraphs(r, r.graphs.buckets, use_cuda_graphs=not emulated,
                                  token_buckets=r.graphs.token_buckets)
        self.log(f"fp8: {n} linear layers quantized in {self.results['meta']['fp8_quantize_s']} s; "
                 f"{self.weight_bytes() / 1e9:.2f} GB of weights per step")

    def run_fp8(self) -> None:
        if not self.section("quantize_fp8", 30, self.quantize):
            return
        g = self.runner.graphs
        buckets = sorted({g._bucket_of[b] for b in self.batches if b <= g.max_bucket}) if g else None
        self.section("capture_fp8", 20, self.capture, "fp8", buckets)
        for graphs in (True, False):
            self.section(f"decode fp8 b=1 graphs={graphs}", 10, self.run_decode, "fp8", 1, graphs)
        if self.args.kernel_profile:
            self.section("kernel profile fp8 decode b=1", 15, self.profile_kernels, "fp8", 1)
        if self.args.ab:
            self.section("a/b fp8 b=1", 15, self.ab_variants, "fp8")
        if 2048 in self.prefills:
            self.section("prefill fp8 2048", 10, self.run_prefill, "fp8", 2048)
        for b in self.batches:
            if b != 1:
                self.section(f"decode fp8 b={b} graphs=True", 10, self.run_decode, "fp8", b, True)
        for p in self.prefills:
            if p != 2048:
                self.section(f"prefill fp8 {p}", 10, self.run_prefill, "fp8", p)
        for b in self.batches:
            if b != 1:
                self.section(f"decode fp8 b={b} graphs=False", 10, self.run_decode, "fp8", b,
                             False)

    def free_engine(self) -> None:
        if self.runner is not None and self.runner.graphs is not None:
            self.runner.graphs.release()
        self.runner = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            self.log(f"engine freed: {torch.cuda.memory_allocated(self.device) / 2**30:.1f} GiB "
                     f"still allocated")

    # ---- peer --------------------------------------------------------------------------------
    def run_peer(self) -> None:
        a = self.args
        t0 = time.perf_counter()
        model = build_peer(self.config, self.dtype, self.device, a.seed)
        peer = self.results["peer"]
        peer.update({
            "library": "transformers", "version": __import__("transformers").__version__,
            "model": "LlamaForCausalLM, same config, random bf16 weights made on the device",
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "method": "eager generate (greedy, min_new_tokens = max_new_tokens), run in the same "
                      "process after our engine was freed; per-step times from a logits "
                      "processor that synchronizes; ms/token = median step interval after the "
                      "first generated token",
            "build_s": round(time.perf_counter() - t0, 2), "decode": [], "prefill": []})
        self.log(f"peer built in {peer['build_s']} s ({peer['attn_implementation']})")
        self.save()
        if self.prefills:
            tokens = 2048 if 2048 in self.prefills else max(self.prefills)
            self.section(f"peer prefill {tokens}", 10, self._peer_prefill, model, tokens)
        for b in int_list(a.peer_batches):
            need = 15 + b * a.context / 2000
            self.section(f"peer decode b={b}", need, self._peer_decode, model, b)

    def _peer_prefill(self, model, tokens: int) -> None:
        ms = peer_prefill(model, tokens, self.config.vocab_size, self.device)
        self.results["peer"]["prefill"].append({"tokens": tokens, "batch": 1, "ms": ms})
        self.log(f"peer prefill {tokens} tokens: {ms:.2f} ms")

    def _peer_decode(self, model, batch: int) -> None:
        a = self.args
        row = peer_decode(model, batch, a.context, a.peer_new_tokens, self.config.vocab_size,
                          self.device)
        self.results["peer"]["decode"].append(row)
        self.log(f"peer decode b={batch:3d}: {row['ms_per_token']:8.3f} ms/token  "
                 f"{row['tokens_per_s']:9.1f} tok/s (prompt {a.context})")

    # ---- summary -----------------------------------------------------------------------------
    def summarize(self) -> None:
        self.results["goals"] = goals(self.results)
        self.save()
        print(format_table(self.results), flush=True)

    def run(self) -> dict:
        self.log(f"bench.engine.steps on {self._device_name()}: {self.config.name} "
                 f"({self.config.num_hidden_layers} layers), {self.dtype}")
        if self.results["meta"]["reduced_depth"]:
            self.log(f"REDUCED DEPTH: {self.config.num_hidden_layers} of "
                     f"{self.full_config.num_hidden_layers} layers")
        self.section("ceilings", 5, self._ceilings)
        if not self.section("build", 20, self.build):
            self.summarize()
            return self.results
        self.run_bf16()
        if not self.args.no_fp8:
            self.run_fp8()
        self.free_engine()
        if not self.args.no_peer:
            self.section("peer", 40, self.run_peer)
        self.summarize()
        return self.results

    def _ceilings(self) -> None:
        self.results["ceilings"] = measure_ceilings(self.device)
        c = self.results["ceilings"]
        self.log(f"ceilings: copy {c['copy_tb_per_s']:.3f} TB/s, bf16 matmul "
                 f"{c['matmul_tflops']:.1f} TFLOP/s")


# ---- per-kernel breakdown ---------------------------------------------------------------------

# Kernel name (lower case) -> category; the first matching entry wins.
KERNEL_CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fp8 gemv", ("_fp8_gemv", "_gemv_row")),   # our GEMVs, fp8 and bf16 weights
    ("split-k reduce", ("_splitk_reduce", "splitkreduce", "splitk_reduce")),
    ("fp8 activation quant", ("_quant_per_token",)),
    ("rms norm", ("_rms_norm",)),
    ("silu*mul", ("silu",)),
    ("rotary + KV write", ("rotary",)),
    ("paged attention", ("_paged_attention",)),
    ("attention split merge", ("_merge_splits",)),
    ("sdpa (flash / cudnn)", ("flash", "fmha", "cudnn", "attention")),
    ("matmul (cuBLAS)", ("gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "matmul")),
    ("memcpy / memset", ("memcpy", "memset")),
    ("sampling / logits", ("argmax", "softmax", "sort", "topk", "reduce", "max", "exponential")),
    ("elementwise / copy", ("elementwise", "copy", "fill", "index", "cat", "embedding")),
)
STEP_GAP_US = 5000.0   # kernels further apart than this belong to different steps


def kernel_category(name: str) -> str:
    low = name.lower()
    for cat, keys in KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def kernel_breakdown(kernels: list[tuple[str, float, float]], walls_ms: list[float],
                     timeline: int = 40) -> dict:
    """Per-step GPU time by kernel category from (name, start us, duration us) records of
    several steps (split where the device idled > STEP_GAP_US). `gap_us` is the step's span
    minus the time some kernel ran (launch gaps and ramp-up on one stream); `timeline` lists
    the first kernels of one step with the idle time before each (one layer and a bit).

    Under programmatic dependent launch a kernel starts before its predecessor ends and its
    recorded duration includes that wait, so durations overlap. Each category therefore also
    gets `chain_us`: the time from each of its kernels' start to the next kernel's start (the
    step's span split without overlap: what a kernel adds to the chain). Top kernels carry
    `early_mean_us` / `late_mean_us`, their mean duration in the first and last quarter of a
    step (a drift between them is the clock, not the kernel)."""
    kernels = sorted(kernels, key=lambda k: k[1])
    steps: list[list[tuple[str, float, float]]] = []
    last_end = -math.inf
    for k in kernels:
        if k[1] - last_end > STEP_GAP_US:
            steps.append([])
        steps[-1].append(k)
        last_end = max(last_end, k[1] + k[2])
    n = max(1, len(steps))
    cats: dict[str, dict] = {}
    names: dict[str, list[float]] = {}
    busy = span = 0.0
    quarters: dict[str, tuple[list[float], list[float]]] = {}
    for st in steps:
        end = st[0][1]
        for i, (name, start, dur) in enumerate(st):
            c = cats.setdefault(kernel_category(name),
                                {"us": 0.0, "count": 0, "chain_us": 0.0})
            c["us"] += dur
            c["count"] += 1
            c["chain_us"] += (st[i + 1][1] if i + 1 < len(st) else start + dur) - start
            names.setdefault(name, []).append(dur)
            q = quarters.setdefault(name, ([], []))
            if 4 * i < len(st):
                q[0].append(dur)
            elif 4 * i >= 3 * len(st):
                q[1].append(dur)
            busy += max(0.0, start + dur - max(start, end))  # union of busy intervals
            end = max(end, start + dur)
        span += end - st[0][1]
    total = sum(c["us"] for c in cats.values()) or 1.0
    for c in cats.values():
        c["share"] = c["us"] / total
        c["us"] /= n
        c["chain_us"] /= n
        c["count"] //= n
    top = sorted(names.items(), key=lambda kv: -sum(kv[1]))[:25]
    one = steps[len(steps) // 2] if steps else []
    line, prev_end = [], one[0][1] if one else 0.0
    for name, start, dur in one[:timeline]:
        line.append({"name": name[:100], "category": kernel_category(name),
                     "us": round(dur, 2), "idle_before_us": round(max(0.0, start - prev_end), 2),
                     "start_us": round(start - one[0][1], 2)})
        prev_end = max(prev_end, start + dur)
    return {"steps": len(steps), "wall_ms": statistics.median(walls_ms) if walls_ms else None,
            "busy_us": busy / n, "span_us": span / n, "gap_us": (span - busy) / n,
            "kernels_per_step": len(kernels) // n, "categories": cats,
            "top_kernels": [{"name": k[:120], "category": kernel_category(k),
                             "count_per_step": len(v) // n, "mean_us": statistics.fmean(v),
                             "us_per_step": sum(v) / n,
                             "early_mean_us": statistics.fmean(quarters[k][0])
                             if quarters[k][0] else None,
                             "late_mean_us": statistics.fmean(quarters[k][1])
                             if quarters[k][1] else None} for k, v in top],
            "timeline": line}


# ---- the peer: transformers' eager generate ---------------------------------------------------

def build_peer(config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int):
    """LlamaForCausalLM of `config`, parameters created on `device` in `dtype` and initialized
    there by transformers (N(0, 0.02) matrices)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = None if config.rope_scaling_factor == 1.0 else \
        {"rope_type": "linear", "type": "linear", "factor": config.rope_scaling_factor}
    hf_cfg = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta, rope_scaling=rope,
        tie_word_embeddings=config.tie_word_embeddings, initializer_range=0.02,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_ids[0] if config.eos_token_ids else None)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(hf_cfg)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    w = model.model.layers[0].mlp.down_proj.weight
    if w.dtype != dtype or not w.float().std().item() > 0:
        raise RuntimeError(f"peer weights are {w.dtype} with std {w.float().std().item()}")
    return model


def peer_prefill(model, tokens: int, vocab: int, device: torch.device) -> float:
    """Median ms of one forward over a `tokens`-token prompt (no cache, last logits only)."""
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(1)).to(device)

    def fwd():
        with torch.inference_mode():
            try:
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
            except TypeError:
                model(input_ids=ids, use_cache=False)

    times = []
    for i in range(3):
        _sync(device)
        t0 = time.perf_counter()
        fwd()
        _sync(device)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peer_decode(model, batch: int, prompt_len: int, new_tokens: int, vocab: int,
                device: torch.device) -> dict:
    """Greedy `generate` of `new_tokens` tokens for `batch` random prompts; per-step times."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            _sync(device)
            self.times.append(time.perf_counter())
            return scores

    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(device)
    clock = StepClock()
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       logits_processor=LogitsProcessorList([clock]), pad_token_id=0)
    _sync(device)
    total = time.perf_counter() - t0
    steps = [(b - a) * 1e3 for a, b in zip(clock.times, clock.times[1:])]
    ms = statistics.median(steps)
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "ms_per_token": ms, "tokens_per_s": batch / ms * 1e3,
            "prefill_ms": (clock.times[0] - t0) * 1e3, "total_s": total, "repeats": len(steps)}


# ---- goals and the table ---------------------------------------------------------------------

def _find(rows: list[dict], **kw) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), None)


def goals(res: dict) -> list[dict]:
    """Issue 7's goals against this run's numbers; `met` is None where a number is missing."""
    dec, pre = res["decode"], res["prefill"]
    peer = res.get("peer", {}).get("decode", [])
    out: list[dict] = []

    def add(name: str, value, met, **extra) -> None:
        out.append({"goal": name, "value": value, "met": met, **extra})

    b1 = _find(dec, weights="bf16", batch=1, graphs=True)
    b1e = _find(dec, weights="bf16", batch=1, graphs=False)
    f1 = _find(dec, weights="fp8", batch=1, graphs=True)
    add("batch-1 decode bf16 >= 90% of the floor (<= 17.2 ms/token on the 33B)",
        b1 and {"ms_per_token": b1["ms_per_token"], "fraction_of_floor": b1["fraction_of_floor"],
                "floor_ms": b1["floor_ms"]},
        None if b1 is None else b1["fraction_of_floor"] >= 0.90)
    add("batch-1 decode fp8 >= 85% of its floor (<= 9.1 ms/token on the 33B)",
        f1 and {"ms_per_token": f1["ms_per_token"], "fraction_of_floor": f1["fraction_of_floor"],
                "floor_ms": f1["floor_ms"]},
        None if f1 is None else f1["fraction_of_floor"] >= 0.85)
    add("batch-1 fp8 >= 1.85x bf16 tokens/s",
        b1 and f1 and b1["ms_per_token"] / f1["ms_per_token"],
        None if not (b1 and f1) else b1["ms_per_token"] / f1["ms_per_token"] >= 1.85)
    for b in (8, 32, 64):
        r = _find(dec, weights="bf16", batch=b, graphs=True)
        add(f"batch-{b} decode bf16 >= 85% of the floor",
            r and {"ms_per_token": r["ms_per_token"], "fraction_of_floor": r["fraction_of_floor"]},
            None if r is None else r["fraction_of_floor"] >= 0.85)
    ratios = {}
    for p in peer:
        r = _find(dec, weights="bf16", batch=p["batch"], graphs=True)
        if r:
            ratios[str(p["batch"])] = r["tokens_per_s"] / p["tokens_per_s"]
    add(">= 2x transformers' eager tokens/s at every batch size (bf16)", ratios or None,
        None if not ratios else all(v >= 2.0 for v in ratios.values()))
    add("CUDA graphs vs eager at batch 1 (bf16): latency reduction (spec claims 41.7% with fusion)",
        b1 and b1e and 1 - b1["ms_per_token"] / b1e["ms_per_token"], None)
    cap = res.get("cuda_graphs", {}).get("bf16", {})
    add("capturing all buckets <= 60 s", cap.get("capture_s"),
        None if cap.get("capture_s") is None else cap["capture_s"] <= 60)
    p2 = _find(pre, weights="bf16", tokens=2048)
    add("prefill 2048 bf16 <= 225 ms and >= 90% of the matmul ceiling",
        p2 and {"ms": p2["ms"], "fraction_of_ceiling": p2["fraction_of_ceiling"]},
        None if p2 is None else p2["ms"] <= 225 and p2["fraction_of_ceiling"] >= 0.9)
    p2f = _find(pre, weights="fp8", tokens=2048)
    add("prefill 2048 fp8 <= 130 ms", p2f and p2f["ms"], None if p2f is None else p2f["ms"] <= 130)
    ht = res.get("host_time", {})
    add(f"host time per decode step at batch 64 <= {GOAL_HOST_MS} ms", ht.get("host_ms"),
        None if ht.get("host_ms") is None else ht["host_ms"] <= GOAL_HOST_MS)
    if res["meta"].get("reduced_depth"):
        for g in out:
            g["note"] = "reduced depth: absolute ms targets are for 62 layers; fractions hold"
    return out


def format_table(res: dict) -> str:
    m, c = res["meta"], res.get("ceilings", {})
    lines = [f"== bench.engine.steps: {m['preset']} x{m['num_layers']} layers"
             + (" (REDUCED DEPTH)" if m.get("reduced_depth") else "")
             + f" on {m['device_name']}, context {m['context_len']}"]
    if c:
        lines.append(f"ceilings: copy {c['copy_tb_per_s']:.3f} TB/s, bf16 matmul "
                     f"{c['matmul_tflops']:.1f} TFLOP/s")
    for k, v in res.get("cuda_graphs", {}).items():
        if v.get("enabled"):
            lines.append(f"graphs {k}: {len(v['buckets'])} buckets captured in {v['capture_s']} s"
                         + (" (emulated)" if v.get("emulated") else ""))
    peer = {p["batch"]: p for p in res.get("peer", {}).get("decode", [])}
    lines.append(f"{'decode':8} {'batch':>5} {'graphs':>6} {'ms/token':>9} {'tok/s':>9} "
                 f"{'floor ms':>9} {'%floor':>7} {'x peer':>7}")
    for r in res["decode"]:
        p = peer.get(r["batch"])
        vs = f"{r['tokens_per_s'] / p['tokens_per_s']:7.2f}" if p else f"{'':7}"
        lines.append(f"{r['weights']:8} {r['batch']:5d} {r['graphs']!s:>6} "
                     f"{r['ms_per_token']:9.3f} {r['tokens_per_s']:9.1f} {r['floor_ms']:9.3f} "
                     f"{r['fraction_of_floor']:7.1%} {vs}")
    for b, p in sorted(peer.items()):
        lines.append(f"{'peer':8} {b:5d} {'-':>6} {p['ms_per_token']:9.3f} "
                     f"{p['tokens_per_s']:9.1f}")
    lines.append(f"{'prefill':8} {'tokens':>6} {'ms':>9} {'TFLOP/s':>8} {'%ceiling':>8}  path")
    for r in res["prefill"]:
        lines.append(f"{r['weights']:8} {r['tokens']:6d} {r['ms']:9.2f} {r['tflops']:8.1f} "
                     f"{r['fraction_of_ceiling']:8.1%}  {r.get('path', '')}")
    for r in res.get("peer", {}).get("prefill", []):
        lines.append(f"{'peer':8} {r['tokens']:6d} {r['ms']:9.2f}")
    ht = res.get("host_time")
    if ht:
        lines.append(f"host time / decode step at batch {ht['batch']}: {ht['host_ms']:.3f} ms "
                     f"(goal {ht['goal_ms']} ms)")
    for g in res.get("goals", []):
        mark = {True: "MET", False: "NOT MET", None: "-"}[g["met"]]
        val = g["value"]
        if isinstance(val, float):
            val = f"{val:.4g}"
        elif isinstance(val, dict):
            val = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in val.items())
        lines.append(f"[{mark:7}] {g['goal']}: {val}")
    for s in res.get("skipped", []):
        lines.append(f"skipped: {s['section']} ({s['reason']})")
    for e in res.get("errors", []):
        lines.append(f"error: {e['section']}: {e['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench.engine.steps: error: CUDA is not available here (use --device cpu for a "
              "code-path check)", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    res = Bench(args).run()
    return 1 if not res["decode"] and not res["prefill"] else 0


if __name__ == "__main__":
    sys.exit(main())
