"""Decode CUDA graphs and the kernel path (backend.runner.cuda_graphs, serving_setup, kernel_dispatch).

CPU: the graph runner with its CPU stand-in (re-runs the captured function on the same static
buffers) and the kernel path through the kernels' torch references must give the engine's
exact outputs. GPU (`gpu` marker): real capture/replay and the Triton kernels against eager and
against the torch path; no device allocation per graph step.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from backend.engine.assemble import BackendConfig, create_engine
from backend.kernels.dispatch import KernelAttention, install_kernels
from backend.runner.cuda_graphs import (
    DEFAULT_BUCKETS,
    DEFAULT_TOKEN_BUCKETS,
    StepGraphs,
    parse_buckets,
)
from backend.runner.sampler import SamplingParams
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
    assert parse_buckets(None) == DEFAULT_BUCKETS
    # every step the default scheduler can plan fits a graph: decodes up to max_num_seqs,
    # mixed steps up to max_num_batched_tokens
    from scheduler.capacity import DEFAULT_CAPACITY
    assert DEFAULT_BUCKETS[-1] == DEFAULT_CAPACITY.max_num_seqs
    assert DEFAULT_TOKEN_BUCKETS[-1] == DEFAULT_CAPACITY.max_num_batched_tokens
    from engine_flags import DEFAULT_CUDA_GRAPH_BUCKETS, DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS

    assert parse_buckets(DEFAULT_CUDA_GRAPH_BUCKETS) == DEFAULT_BUCKETS  # the flags' help text
    assert parse_buckets(DEFAULT_CUDA_GRAPH_TOKEN_BUCKETS) == DEFAULT_TOKEN_BUCKETS
    assert parse_buckets("8, 1,4,4") == (1, 4, 8)
    assert parse_buckets("none") == parse_buckets("") == ()
    with pytest.raises(ValueError):
        parse_buckets("0,2")
    engine, _ = _engine(max_num_seqs=6, max_num_batched_tokens=40)
    g = StepGraphs(engine.runner, (1, 4, 8, 16), use_cuda_graphs=False,
                   token_buckets=(8, 16, 32, 64))
    assert g.buckets == (1, 4) and g.max_bucket == 4  # buckets above max_num_seqs are dropped
    assert g.token_buckets == (8, 16, 32)  # and token buckets above max_num_batched_tokens
    assert [int(g._bucket_of[n]) for n in range(1, 5)] == [1, 4, 4, 4]
    assert not g.can_replay([]) and not g.can_replay([Chunk("a", [1], 3, [0], False)] * 5)
    assert not g.can_replay([Chunk("a", [1, 2], 0, [0], True)])
    # mixed steps: the smallest token bucket that holds the step; too many tokens -> eager
    assert g.token_bucket([Chunk("a", [1, 2], 0, [0], True)]) == 8
    assert g.token_bucket([Chunk("a", [1] * 9, 0, [0, 1, 2], True)]) == 16
    assert g.token_bucket([Chunk("a", [1], 3, [0], False)] * 5) == 8  # decodes past max_bucket
    assert g.token_bucket([Chunk("a", [1] * 33, 0, [0] * 9, True)]) == 0
    assert g.seq_rows(8) == 7 and g.seq_rows(32) == 7  # min(T, max_num_seqs) + 1 padding row


def test_mixed_step_padding_rows():
    """A padded mixed step: real tokens first, padding tokens in one context-0 sequence with
    slot -1 at position 0, empty sequences after it, logits rows at each sequence's last token."""
    engine, _ = _engine(block_size=4, max_num_seqs=8)
    runner = engine.runner
    chunks = [Chunk("d", [5], 6, [3, 1], False), Chunk("p", [7, 8, 9], 0, [4], True)]
    t, _, last = runner.prepare(chunks, pad_to=(8, 5))
    b = runner.buffers
    assert t == 4 and last == [0, 3]
    assert b.input_ids[:8].tolist() == [5, 7, 8, 9, 0, 0, 0, 0]
    assert b.positions[:8].tolist() == [6, 0, 1, 2, 0, 0, 0, 0]
    assert b.slot_mapping[:8].tolist() == [1 * 4 + 2, 16, 17, 18, -1, -1, -1, -1]
    assert b.query_start_loc[:6].tolist() == [0, 1, 4, 8, 8, 8]
    assert b.context_lens[:5].tolist() == [7, 3, 0, 0, 0]
    assert b.last_token[:5].tolist() == [0, 3, 0, 0, 0]
    with pytest.raises(ValueError):
        runner.prepare(chunks, pad_to=(3, 5))


def test_static_rows_padding_and_incremental_tables():
    engine, _ = _engine(block_size=4, max_num_seqs=8)
    g = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False)
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


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int4-fp8"])
def test_emulated_graphs_and_kernel_path_match_torch_engine(kv_cache_dtype):
    """Same tokens and logprobs as the plain CPU engine, with preemption (tiny pool), seeded
    sampling, logprobs, batch sizes padded to decode buckets and mixed prefill+decode steps
    padded to token buckets (every step but those over 32 tokens replays a stand-in graph),
    for every KV format. Torch attention throughout (the C kernel's float sums differ)."""
    from backend.kernels.reference.attention import TorchAttention

    def engine_():
        engine, _ = _engine(kv_cache_dtype=kv_cache_dtype)
        engine.runner.model.attn = TorchAttention(engine.runner.model.config.head_dim ** -0.5)
        return engine

    ref, ref_engine = _serve(engine_())
    assert ref_engine.scheduler.num_preemptions >= 1
    for kernels, graphs in ((True, False), (False, True), (True, True)):
        engine = engine_()
        if kernels:
            install_kernels(engine.runner.model)
            assert isinstance(engine.runner.model.attn, KernelAttention)
        if graphs:
            engine.runner.graphs = StepGraphs(engine.runner, (1, 2, 4, 8), use_cuda_graphs=False,
                                              token_buckets=(8, 16, 32))
        out, _ = _serve(engine)
        # tokens identical (greedy and seeded sampling); logprobs to rounding: the stand-in
        # graphs and the kernel path read decodes through the prefill reference's op order
        assert {r: t for r, (t, _) in out.items()} == {r: t for r, (t, _) in ref.items()}, \
            (kernels, graphs)
        for rid, (_, lps) in out.items():
            assert lps == pytest.approx(ref[rid][1], abs=2e-4), (kernels, graphs, rid)
        if graphs:
            g = engine.runner.graphs
            assert g.graphs and set(g.graphs) <= {1, 2, 4, 8}
            assert g.mixed_graphs and set(g.mixed_graphs) <= {8, 16, 32}


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
    from backend.model.quantization import QuantizationError
    from backend.runner.serving import configure_serving

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
    runner.graphs = StepGraphs(runner, buckets)
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
    from backend.kernels.reference.attention import TorchAttention
    from backend.kernels.reference.ops import TORCH_OPS

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


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int4-fp8"])
def test_step_graphs_greedy_equal_eager_every_kv_format(gqa7_ckpt, kv_cache_dtype):
    """Whole engine runs (continuous batching: prompts arrive while others decode, so most
    steps are mixed): graphs for every step vs every step eager, same greedy tokens, for each
    KV format; the mixed and decode graphs were both used."""
    results, graphs = [], None
    for use_graphs in (True, False):
        engine, _ = _engine(device="cuda", dtype="float32", num_blocks=256, block_size=16,
                            max_num_seqs=8, model=str(gqa7_ckpt), max_num_batched_tokens=128,
                            kv_cache_dtype=kv_cache_dtype)
        runner = engine.runner
        assert isinstance(runner.model.attn, KernelAttention)
        if use_graphs:
            graphs = runner.graphs = StepGraphs(runner, (1, 2, 4, 8),
                                                token_buckets=(16, 32, 64, 128))
        else:
            runner.graphs = None
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(0, 250, (n,), generator=g).tolist()
                   for n in (5, 47, 18, 33, 100, 9, 70)]
        toks: dict[str, list[int]] = {}
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        pending = list(enumerate(prompts))
        while pending or engine.has_unfinished():
            if pending:  # one new prompt per step: mixed steps
                i, p = pending.pop(0)
                engine.add_request(f"r{i}", p, params)
            for o in engine.step():
                toks.setdefault(o.request_id, []).extend(o.new_token_ids)
        results.append(toks)
    assert results[0] == results[1]
    assert graphs.mixed_graphs and graphs.graphs


@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int4-fp8"])
def test_mixed_step_graph_logits_match_eager_bf16(gqa7_ckpt, kv_cache_dtype):
    """One bf16 mixed step (2 decodes, a chunk on a cached prefix, a fresh prompt) replayed
    from its graph (51 tokens padded to 64) against the same step eager, same KV contents."""
    engine, _ = _engine(device="cuda", dtype="bfloat16", num_blocks=128, block_size=16,
                        max_num_seqs=8, model=str(gqa7_ckpt), max_num_batched_tokens=256,
                        kv_cache_dtype=kv_cache_dtype)
    runner = engine.runner
    graphs = StepGraphs(runner, (1, 2, 4, 8), token_buckets=(64, 128))
    alloc = BlockAllocator(runner.block_size)
    g = torch.Generator().manual_seed(2)
    p = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (40, 23, 70, 29)]
    runner.graphs = None
    runner.execute([Chunk("a", p[0], 0, alloc.table("a", 40), True),
                    Chunk("b", p[1], 0, alloc.table("b", 23), True),
                    Chunk("c", p[2][:50], 0, alloc.table("c", 50), True, False)])
    step = [Chunk("a", [3], 40, alloc.table("a", 41), False),
            Chunk("b", [4], 23, alloc.table("b", 24), False),
            Chunk("c", p[2][50:], 50, alloc.table("c", 70), True),
            Chunk("d", p[3], 0, alloc.table("d", 29), True)]
    # the same step twice: int4 keys' fill slots must see it as the same continuation both
    # times (a repeated step is no continuation to them: backend.kv.fill_slots)
    fill_state = copy.deepcopy(runner.fill_slots)
    eager = runner.execute(step, keep_logits=True)
    runner.graphs = graphs
    runner.fill_slots = fill_state
    graph = runner.execute(step, keep_logits=True)  # rewrites the same K/V, then attends
    assert set(graphs.mixed_graphs) == {64}  # 51 tokens (expected 128 before: a wrong count)
    rel = ((graph.logits - eager.logits).norm() / eager.logits.norm()).item()
    assert torch.isfinite(graph.logits).all() and rel < 2e-2, rel
