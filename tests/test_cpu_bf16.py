"""bf16 on the CPU (issue 32): the dtype `auto` picks by the CPU's flags, and a bf16 model run
through the CPU path (C kernels, fused attention for fresh prefills, oneDNN-packed projections)
gives transformers' logits to bf16 precision on mixed steps."""
import pytest
import torch

from backend.config import ModelConfig
from backend.engine.assemble import use_cpu_kernels
from backend.kernels import cpu as cpu_kernels
from backend.kernels.cpu.linear import PackedLinear, packing_supported
from backend.kv.pools import KVCache
from backend.model.loader import load, resolve_dtype
from backend.runner.step import ModelRunner
from tests.backend_helpers import BlockAllocator, Chunk, hf_model, make_checkpoint

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma {}\n"


def test_bf16_arithmetic_reads_the_cpu_flags():
    assert cpu_kernels.bf16_arithmetic(FLAGS.format("avx512f avx512_bf16"))
    assert cpu_kernels.bf16_arithmetic(FLAGS.format("amx_tile amx_bf16"))
    assert not cpu_kernels.bf16_arithmetic(FLAGS.format("avx512f"))
    assert not cpu_kernels.bf16_arithmetic("")


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_dtype_on_the_cpu_follows_the_flags_for_bf16_checkpoints(monkeypatch, has_bf16):
    monkeypatch.setattr(cpu_kernels, "bf16_arithmetic", lambda: has_bf16)
    cpu = torch.device("cpu")
    bf16_ckpt, fp32_ckpt = ModelConfig.from_preset("deepseek-coder-1.3b"), ModelConfig.from_preset("tiny")
    assert bf16_ckpt.torch_dtype == "bfloat16" and fp32_ckpt.torch_dtype == "float32"
    assert resolve_dtype("auto", bf16_ckpt, cpu) == (torch.bfloat16 if has_bf16 else torch.float32)
    assert resolve_dtype("auto", fp32_ckpt, cpu) == torch.float32  # fp32 stays fp32
    assert resolve_dtype("float32", bf16_ckpt, cpu) == torch.float32  # asked for: kept
    assert load("tiny", "dummy").dtype == torch.float32


@pytest.mark.skipif(not packing_supported(), reason="oneDNN without bf16")
def test_packed_linear_is_the_plain_bf16_linear():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 40, generator=g).bfloat16()
    lin = PackedLinear(w)
    for m in (1, 5, 130):
        x = torch.randn(m, 40, generator=g).bfloat16()
        assert torch.equal(lin(x), torch.nn.functional.linear(x, w))


@pytest.fixture(scope="module", params=["gqa4_tied_rope4", "gqa1_untied_oddvocab"])
def bf16_runner(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("ckpt"), request.param)
    loaded = load(str(path), dtype="bfloat16")
    kv = KVCache.allocate(loaded.config, 64, 4, torch.bfloat16, "cpu")
    runner = ModelRunner(loaded.model, kv, max_num_batched_tokens=256, max_num_seqs=8,
                         max_model_len=256)
    use_cpu_kernels(runner)
    return loaded, runner, hf_model(path)


def test_bf16_cpu_path_matches_transformers_on_mixed_steps(bf16_runner):
    loaded, runner, hf = bf16_runner
    if cpu_kernels.load_library() is not None:
        assert runner.model.attn.uses_kernel
    if packing_supported():  # every projection and the head
        packed = [m for m in runner.model.modules() if isinstance(m, PackedLinear)]
        assert len(packed) == 4 * loaded.config.num_hidden_layers + 1
    vocab = loaded.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = {k: torch.randint(0, vocab, (n,), generator=g).tolist()
               for k, n in (("a", 30), ("b", 12), ("c", 12), ("d", 9))}
    with torch.no_grad():
        ref = {k: hf(torch.tensor([v])).logits[0] for k, v in prompts.items()}
    alloc = BlockAllocator(4)
    steps = [  # b and c: a run of equal fresh prefills; a: fresh, then after a cached prefix
        [Chunk("a", prompts["a"][:13], 0, alloc.table("a", 13)),
         Chunk("b", prompts["b"][:11], 0, alloc.table("b", 11)),
         Chunk("c", prompts["c"][:11], 0, alloc.table("c", 11)),
         Chunk("d", prompts["d"], 0, alloc.table("d", 9))],
        [Chunk("b", prompts["b"][11:12], 11, alloc.table("b", 12), is_prefill=False),
         Chunk("c", prompts["c"][11:12], 11, alloc.table("c", 12), is_prefill=False),
         Chunk("a", prompts["a"][13:30], 13, alloc.table("a", 30))],
    ]
    expect = [{"a": ref["a"][12], "b": ref["b"][10], "c": ref["c"][10], "d": ref["d"][8]},
              {"b": ref["b"][11], "c": ref["c"][11], "a": ref["a"][29]}]
    for chunks, exp in zip(steps, expect):
        out = runner.execute(chunks, keep_logits=True)
        for row, c in enumerate(chunks):
            want = exp[c.request_id]
            err = ((out.logits[row] - want).abs().max() / want.abs().max()).item()
            assert err < 0.05, (c.request_id, err)  # bf16 weights and activations
