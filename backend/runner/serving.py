"""Serving-time transforms of a built runner: install the Triton kernels in the model, quantize
the weights, set up and capture the step CUDA graphs (`backend.runner.cuda_graphs`: decode and mixed
prefill+decode steps, every KV format). Used when a runner is built on CUDA
(`setup_cuda_runner`, for runners built directly, as tests do) and once by the assembler
(`backend.engine.assemble.build_runner`, for every serving engine: `configure_serving`)."""
from __future__ import annotations

import time
from collections.abc import Sequence

from backend.runner.cuda_graphs import StepGraphs


def setup_cuda_runner(runner, enforce_eager: bool = False,
                      buckets: Sequence[int] | None = None,
                      token_buckets: Sequence[int] | None = None) -> StepGraphs | None:
    """The CUDA defaults for a new runner: Triton kernels in the model and (unless
    `enforce_eager`) decode and mixed-step graphs, captured lazily per bucket or by
    `capture_all()`. Returns the graphs object, or None when the step stays eager."""
    from backend.kernels.dispatch import install_kernels, kernels_available

    if not kernels_available(runner.device):
        return None  # torch reference path: host-synchronizing, so never captured
    install_kernels(runner.model)
    if enforce_eager:
        return None
    return StepGraphs(runner, buckets, token_buckets=token_buckets)


def quantize_weights(model, quantization: str | None, device) -> dict:
    """Quantize the weights of `model` in place (`backend.model.quantization`) and, on CUDA, hand
    the freed bf16 weights back to the device. Returns {"quantize_s": seconds} ({} for "none").

    The assembler calls this before it sizes the KV pool: the pool is a share of the memory the
    device reports free, and fp8 weights free about half of what the bf16 ones held (the 33B:
    ~31 GiB, ~6,900 more KV blocks of 16 at the default share)."""
    if not quantization or quantization == "none":
        return {}
    # imported only when asked for: it loads Triton (~0.9 s), which a CPU backend never needs
    from backend.model.quantization import quantize_model

    cuda = device.type == "cuda"
    if cuda:
        import torch

        free_before = torch.cuda.mem_get_info(device)[0]
    t0 = time.perf_counter()
    quantize_model(model, quantization)
    info = {"quantize_s": time.perf_counter() - t0}
    if cuda:
        # The bf16 weights just freed stay in torch's cache (reserved to this process) unless
        # handed back: the device would not report them free to the KV sizing, and two 33B fp8
        # backends sharing one H200 each peak at ~73 GB while quantizing, so the second cannot
        # start while the first still holds its peak (H200, issue 34's pair: out of memory at
        # 139.8 GiB). Afterwards this process holds its fp8 weights and KV only.
        torch.cuda.empty_cache()
        # What the device got back, and what stays reserved to this process but unused: freed
        # weights the cache cannot return (a segment with an fp8 weight still in it). The 33B fp8
        # on an H100 started with 10,081 KV blocks where the weights' arithmetic gave ~10,380
        # (session 38): the ready line shows where the ~1.4 GB went.
        info["quantize_freed_bytes"] = int(torch.cuda.mem_get_info(device)[0] - free_before)
        info["quantize_cache_held_bytes"] = int(torch.cuda.memory_reserved(device)
                                                - torch.cuda.memory_allocated(device))
    return info


def configure_serving(runner, quantization: str | None = None, enforce_eager: bool = False,
                      buckets: Sequence[int] | None = None, capture: bool = True,
                      token_buckets: Sequence[int] | None = None) -> dict:
    """Serving-time transforms of a built runner, in order: quantize the weights (unless the
    assembler did, before it sized the KV pool), then set up and capture the step graphs (CUDA).
    Returns timings (and graph memory) for the start-up log."""
    info: dict = {"quantization": quantization or "none", "cuda_graphs": False}
    if runner.graphs is not None:  # a runner built with its default graphs (tests): set up anew
        runner.graphs.release()
        runner.graphs = None
    info.update(quantize_weights(runner.model, quantization, runner.device))
    if runner.device.type != "cuda":
        return info
    from backend.kernels.dispatch import kernels_available

    if not enforce_eager and kernels_available(runner.device):  # else the step stays eager
        runner.graphs = StepGraphs(runner, buckets, token_buckets=token_buckets)
    if runner.graphs is not None:
        info["cuda_graphs"] = True
        info["buckets"] = list(runner.graphs.buckets)
        info["token_buckets"] = list(runner.graphs.token_buckets)
        if capture:
            info["capture_s"] = runner.graphs.capture_all()
            info["capture_mem"] = dict(runner.graphs.capture_mem)
    return info
