"""Decode CUDA graphs and the kernel path (backend.cuda_graphs, serving_setup, kernel_dispatch).

CPU: the graph runner with its CPU stand-in (re-runs the captured function on the same static
buffers) and the kernel path through the kernels' torch references must give the engine's
exact outputs. GPU (`gpu` marker): real capture/replay and the Triton kernels against eager and
against the torch path; no device allocation per graph step.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.build import BackendConfig, create_engine
from backend.cuda_graphs import DEFAULT_BUCKETS, DecodeGraphs, parse_buckets
from backend.kernel_dispatch import KernelAttention, install_kernels
from backend.sampler import SamplingParams
from tests.backend_helpers import BlockAllocator, Chunk

CUDA = torch.cuda.is_available()


def _engine(device="cpu", dtype="auto", num_blocks=48, block_size=4, max_num_seqs=8, model="tiny",
            max_num_batched_tokens=40, **kw):
    return create_engine(BackendConfig(model=model, device=device, dtype=dtype,
                                       num_blocks=num_blocks, block_size=block_size,
                                       max_num_seqs=max_num_seqs,
                                       max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=256, **kw))


def _serve(engine, seed=0, lens=(5, 17, 3, 30, 9, 12, 7)):
    """Mixed greedy / seeded-sampled / logprob requests; id -> (tokens, logprobs)."""
    g = torch.Generator().manual_seed(seed)
    vocab = engine.runner.model.config.vocab_size
    reqs = {f"r{i}": torch.randint(0, vocab, (n,), generator=g).tolist() for i, n in enumerate(lens)}
    for i, (rid, prompt) in enumerate(reqs.items()):
        params = SamplingParams(max_tokens=20 + i, ignore_eos=True,
                                temperature=0.0 if i % 2 else 0.8, seed=i,
                                logprobs=2 if i == 3 else 0)
        assert engine.add_request(rid, prompt, params) is None
    out = {rid: ([], []) for rid in reqs}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id][0].extend(o.new_token_ids)
            out[o.request_id][1].extend(round(lp.logprob, 4) for lp in o.logprobs)
        engine.check_integrity()
    return out, engine


# ---- CPU -------------------------------------------------------------------------------------

def test_buckets_parse_and_lookup():
    assert parse_buckets(None) == DEFAULT_BUCKETS == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    assert parse_buckets("8, 1,4,4") == (1, 4, 8)
    with pytest.raises(ValueError):
        parse_buckets("0,2")
    engine, _ = _engine(max_num_seqs=6)
    g = DecodeGraphs(engine.runner, (1, 4, 8, 16), use_cuda_graphs=False)
    assert g.buckets == (1, 4) and g.max_bucket == 4  # buckets above max_num_seqs are dropped
    assert [int(g._bucket_of[n]) for n in range(1, 5)] == [1, 4, 4, 4]
    assert not g.can_replay([]) and not g.can_replay([Chunk("a", [1], 3, [0], False)] * 5)
    assert not g.can_replay([Chunk("a", [1, 2], 0, [0], True)])


def test_static_rows_padding_and_incremental_tables():
    engine, _ = _engine(block_size=4, max_num_seqs=8)
    g = DecodeGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False)
    rows = g.rows
    a = Chunk("a", [11], 5, [7, 3, 9], False)     # position 5 -> block index 1 (3), offset 1
    b = Chunk("b", [12], 8, [2, 4, 6, 8], False)  # position 8 -> block index 2 (6), offset 0
    g._fill([a, b], 4)
    assert rows[0, :4].tolist() == [11, 5, 3 * 4 + 1, 6] and rows[0, 4:6].tolist() == [7, 3]
    assert rows[1, :4].tolist() == [12, 8, 6 * 4 + 0, 9] and rows[1, 4:7].tolist() == [2, 4, 6]
    assert rows[2:4, :4].tolist() == [[0, 0, -1, 0]] * 2  # padding: no write, empty context
    # same request, one step on: the new block appears; a copy-on-write swap of the last
    # block is picked up; a different request in the row rewrites the whole table
    a2 = Chunk("a", [13], 8, [7, 3, 9], False)
    c = Chunk("c", [14], 2, [5], False)
    g._fill([a2, c], 2)
    assert rows[0, 4:7].tolist() == [7, 3, 9] and rows[0, 2] == 9 * 4
    a3 = Chunk("a", [15], 9, [7, 3, 10], False)
    g._fill([a3], 1)
    assert rows[0, 4:7].tolist() == [7, 3, 10] and rows[0, 2] == 10 * 4 + 1
    assert rows[1, :4].tolist() == [14, 2, 5 * 4 + 2, 3]
    g.forget_rows()
    rows[0, 4:7] = -5
    g._fill([a3], 1)
    assert rows[0, 4:7].tolist() == [7, 3, 10]


def test_emulated_graphs_and_kernel_path_match_torch_engine():
    """Same tokens and logprobs as the plain CPU engine, with preemption (tiny pool), seeded
    sampling, logprobs and batch sizes padded to buckets."""
    ref, ref_engine = _serve(_engine()[0])
    assert ref_engine.scheduler.num_preemptions >= 1
    for kernels, graphs in ((True, False), (False, True), (True, True)):
        engine, _ = _engine()
        if kernels:
            install_kernels(engine.runner.model)
            assert isinstance(engine.runner.model.attn, KernelAttention)
        if graphs:
            engine.runner.graphs = DecodeGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False)
        out, _ = _serve(engine)
        assert out == ref, (kernels, graphs)
        if graphs:
            assert set(engine.runner.graphs.graphs) <= {1, 2, 4, 8} and engine.runner.graphs.graphs


def test_kernel_path_prefill_with_cached_prefix_matches_reference():
    """Chunked prefill (a cached prefix read back through the block table, bottom-right causal
    mask) and a decode in one step: the SDPA/kernels path equals the torch path."""
    outs = []
    for kernels in (False, True):
        engine, _ = _engine(dtype="float32")
        runner = engine.runner
        if kernels:
            install_kernels(runner.model)
        alloc = BlockAllocator(runner.block_size)
        g = torch.Generator().manual_seed(3)
        p1 = torch.randint(0, 250, (21,), generator=g).tolist()
        p2 = torch.randint(0, 250, (9,), generator=g).tolist()
        runner.execute([Chunk("x", p1[:13], 0, alloc.table("x", 13), True, False),
                        Chunk("y", p2, 0, alloc.table("y", 9), True)])
        out = runner.execute([Chunk("y", [5], 9, alloc.table("y", 10), False),
                              Chunk("x", p1[13:], 13, alloc.table("x", 21), True)],
                             keep_logits=True)
        outs.append(out.logits)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_configure_serving_on_cpu_quantizes_and_keeps_eager():
    from backend.quantization import QuantizationError
    from backend.serving_setup import configure_serving

    engine, _ = _engine()
    assert engine.runner.graphs is None  # the CPU path is unchanged
    info = configure_serving(engine.runner)
    assert info == {"quantization": "none", "cuda_graphs": False}
    with pytest.raises(QuantizationError, match="CUDA"):
        configure_serving(engine.runner, quantization="fp8")


# ---- GPU -------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


def _gpu_runner(dtype, model="tiny", buckets=(1, 2, 4, 8, 16, 24, 32)):
    engine, _ = _engine(device="cuda", dtype=dtype, num_blocks=256, block_size=16,
                        max_num_seqs=32, model=model)
    runner = engine.runner
    assert isinstance(runner.model.attn, KernelAttention)  # the CUDA default
    assert runner.graphs is not None and runner.graphs.use_cuda_graphs
    runner.graphs = DecodeGraphs(runner, buckets)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in runner.kv.k_caches + runner.kv.v_caches:  # random context, never zeros
        t.normal_(generator=gen)
    return engine, runner


def _decode_steps(runner, batch, steps, graphs, start=37):
    """`steps` decode steps of `batch` sequences on fixed tokens; logits per step."""
    saved = runner.graphs
    if not graphs:
        runner.graphs = None
    alloc = BlockAllocator(runner.block_size)
    chunks = [Chunk(f"s{i}", [i + 1], start + 3 * i, alloc.table(f"s{i}", start + 3 * i + steps + 1),
                    False) for i in range(batch)]
    logits = []
    try:
        for step in range(steps):
            out = runner.execute(chunks, keep_logits=True)
            logits.append(out.logits.float().cpu())
            chunks = [dataclasses.replace(c, token_ids=[(7 * step + i) % 250],
                                          start_pos=c.start_pos + 1) for i, c in enumerate(chunks)]
    finally:
        runner.graphs = saved
    return logits


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_replay_matches_eager(dtype):
    _, runner = _gpu_runner(dtype)
    kv_state = [t.clone() for t in runner.kv.k_caches + runner.kv.v_caches]
    for batch in (1, 3, 5, 17):  # padded to buckets 1, 4, 8, 24
        eager = _decode_steps(runner, batch, 4, graphs=False)
        for t, s in zip(runner.kv.k_caches + runner.kv.v_caches, kv_state):
            t.copy_(s)
        graph = _decode_steps(runner, batch, 4, graphs=True)
        tol = 1e-4 if dtype == "float32" else 2e-2
        for e, gr in zip(eager, graph):
            assert torch.isfinite(gr).all()
            rel = ((gr - e).norm() / e.norm()).item()
            assert rel < tol, (batch, rel)
    assert {1, 4, 8, 24} <= set(runner.graphs.graphs)


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_graph_step_allocates_no_device_memory():
    _, runner = _gpu_runner("bfloat16")
    alloc = BlockAllocator(runner.block_size)
    chunks = [Chunk(f"s{i}", [i + 1], 20 + i, alloc.table(f"s{i}", 40), False) for i in range(6)]
    runner.execute(chunks)  # captures bucket 8
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        chunks = [dataclasses.replace(c, start_pos=c.start_pos + 1) for c in chunks]
        runner.execute(chunks)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


@pytest.fixture(scope="module")
def gqa7_ckpt(tmp_path_factory):
    from tests.backend_helpers import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("gqa7"), "gqa7_sharded")


def _torch_path(runner):
    from backend.attention import TorchAttention
    from backend.ops import TORCH_OPS

    runner.graphs = None
    runner.model.ops = TORCH_OPS
    runner.model.attn = TorchAttention(runner.model.config.head_dim ** -0.5)


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_default_path_matches_torch_path_greedy_fp32(gqa7_ckpt):
    """Whole engine runs (GQA 7, rope x4, chunked prefill, continuous batching): the CUDA
    default (Triton kernels + graphs) and the torch path on the same GPU give the same tokens."""
    results = []
    for default_path in (True, False):
        engine, _ = _engine(device="cuda", dtype="float32", num_blocks=128, block_size=16,
                            max_num_seqs=8, model=str(gqa7_ckpt))
        if not default_path:
            _torch_path(engine.runner)
        g = torch.Generator().manual_seed(1)
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        for i, n in enumerate((5, 47, 18, 33, 64)):
            engine.add_request(f"r{i}", torch.randint(0, 250, (n,), generator=g).tolist(), params)
        toks = {}
        while engine.has_unfinished():
            for o in engine.step():
                toks.setdefault(o.request_id, []).extend(o.new_token_ids)
        results.append(toks)
    assert results[0] == results[1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])])
def test_default_path_matches_torch_path_bf16_mixed_step(gqa7_ckpt, device):
    """One mixed step (2 decodes + a chunk with a cached prefix + a fresh prompt) in bf16: the
    device's default path (CUDA: Triton kernels; CPU: the same code over the kernels' torch
    references) against the torch path."""
    outs = []
    for default_path in (True, False):
        engine, _ = _engine(device=device, dtype="bfloat16", num_blocks=128, block_size=16,
                            max_num_seqs=8, model=str(gqa7_ckpt), max_num_batched_tokens=256)
        runner = engine.runner
        if default_path and device == "cpu":
            install_kernels(runner.model)
        if not default_path:
            _torch_path(runner)
        alloc = BlockAllocator(runner.block_size)
        g = torch.Generator().manual_seed(2)
        p = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (40, 23, 70, 29)]
        runner.execute([Chunk("a", p[0], 0, alloc.table("a", 40), True),
                        Chunk("b", p[1], 0, alloc.table("b", 23), True),
                        Chunk("c", p[2][:50], 0, alloc.table("c", 50), True, False)])
        out = runner.execute([Chunk("a", [3], 40, alloc.table("a", 41), False),
                              Chunk("b", [4], 23, alloc.table("b", 24), False),
                              Chunk("c", p[2][50:], 50, alloc.table("c", 70), True),
                              Chunk("d", p[3], 0, alloc.table("d", 29), True)], keep_logits=True)
        outs.append(out.logits.float())
    rel = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert rel < 2e-2, rel
