"""The model's norm + projection seam (`ops.add_rms_norm_linear`, the hook for the GEMV with the
RMSNorm folded in) changes nothing on the CPU: the forward equals the older loop (norm, then the
attention block / MLP calling their own projections) bit for bit, and with the kernel ops object
installed `TIDEGATE_FUSED_NORM_GEMV` on or off gives the same numbers (the fused GEMV serves only
one-row steps on the Triton path; tests/test_gemv_interpret.py checks it there)."""
import pytest
import torch

from backend.kv.pools import KVCache
from backend.model.loader import load
from backend.runner.step import ModelRunner
from tests.backend_helpers import BlockAllocator, Chunk, make_checkpoint

BLOCK = 4


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load(str(make_checkpoint(tmp_path_factory.mktemp("ckpt"), "gqa4_tied_rope4")))


def _older_forward(model, input_ids, positions, ctx, kv):
    """LlamaModel.forward as it was before the seam: separate norm and projection calls."""
    ops, eps = model.ops, model.config.rms_norm_eps
    h = model.embed_tokens(input_ids)
    residual = None
    for i, layer in enumerate(model.layers):
        if residual is None:
            residual = h
            h = ops.rms_norm(h, layer.input_layernorm.weight, eps)
        else:
            h, residual = ops.add_rms_norm(h, residual, layer.input_layernorm.weight, eps)
        h = layer.self_attn(h, positions, model.cos_sin, kv.k_caches[i], kv.v_caches[i], ctx,
                            ops, model.attn)
        h, residual = ops.add_rms_norm(h, residual, layer.post_attention_layernorm.weight, eps)
        h = layer.mlp(h, ops)
    h, _ = ops.add_rms_norm(h, residual, model.norm.weight, eps)
    return h


def _steps(vocab):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocab, (10,), generator=g).tolist()
    alloc = BlockAllocator(BLOCK)
    return [[Chunk("a", ids[:9], 0, alloc.table("a", 9))],                       # prefill
            [Chunk("a", ids[9:], 9, alloc.table("a", 10), is_prefill=False)]]    # one-row decode


def _run(model, config, forward):
    kv = KVCache.allocate(config, 16, BLOCK, torch.float32, "cpu")
    runner = ModelRunner(model, kv, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64)
    outs = []
    for chunks in _steps(config.vocab_size):
        n, ctx, _ = runner.prepare(chunks)
        with torch.inference_mode():
            outs.append(forward(model, runner.buffers.input_ids[:n], runner.buffers.positions[:n],
                                ctx, kv).clone())
    return outs


def test_forward_equals_the_unfused_loop(loaded):
    model, config = loaded.model, loaded.config
    new = _run(model, config, lambda m, *a: m(*a))
    old = _run(model, config, _older_forward)
    assert [o.shape[0] for o in new] == [9, 1]
    for a, b in zip(new, old):
        assert torch.equal(a, b)


def test_kernel_ops_fused_norm_switch_is_inert_on_cpu(loaded, monkeypatch):
    from backend.kernels import dispatch as kd

    model, config = loaded.model, loaded.config
    ops0, attn0 = model.ops, model.attn
    try:
        kd.install_kernels(model)
        calls = []
        real = kd.KernelOps.add_rms_norm_linear
        monkeypatch.setattr(kd.KernelOps, "add_rms_norm_linear",
                            lambda self, *a: calls.append(a[1] is None) or real(self, *a))
        outs = {}
        for on in (False, True):
            monkeypatch.setitem(kd.FUSED_NORM_GEMV, "enabled", on)
            outs[on] = _run(model, config, lambda m, *a: m(*a))
        # two seams per layer per step; the first layer's input norm has no residual
        layers = config.num_hidden_layers
        assert len(calls) == 2 * 2 * 2 * layers and sum(calls) == 2 * 2
        for a, b in zip(outs[False], outs[True]):
            assert torch.equal(a, b)
        ref = _run(model, config, _older_forward)
        for a, b in zip(outs[True], ref):
            assert torch.equal(a, b)
    finally:
        model.ops, model.attn = ops0, attn0
        for module in model.modules():   # install_kernels' GemvLinear swap back
            if type(module) is kd.GemvLinear:
                module.__class__ = torch.nn.Linear
