"""Loader: HF directories, dummy presets, and one-line errors for everything a user can get wrong."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.config import ModelConfig
from backend.errors import ModelLoadError
from backend.model.loader import check_fits, load
from tests.backend_helpers import make_checkpoint


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    make_checkpoint(root, "gqa1_untied_oddvocab")
    make_checkpoint(root, "gqa7_sharded")
    return root


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_sharded_checkpoint_loads_with_fused_weights(ckpt_root):
    path = ckpt_root / "gqa7_sharded"
    assert (path / "model.safetensors.index.json").exists()
    assert len(list(path.glob("*.safetensors"))) > 1
    loaded = load(str(path))
    c = loaded.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.rope_scaling_factor) == (7, 1, 4.0)
    from tests.backend_helpers import hf_model

    hf = hf_model(path)
    layer = hf.model.layers[1]
    qkv = loaded.model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(qkv[c.q_size + c.kv_size:], layer.self_attn.v_proj.weight)
    gate_up = loaded.model.layers[1].mlp.gate_up_proj.weight
    assert torch.equal(gate_up[c.intermediate_size:], layer.mlp.up_proj.weight)
    assert loaded.tokenizer.bos_token_id == 256


def test_dummy_presets_deterministic_never_zero():
    a = load("tiny", load_format="dummy", seed=3).model
    b = load("tiny", seed=3).model  # auto = dummy for a preset
    c = load("tiny", load_format="dummy", seed=4).model
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name
        assert (pa != 0).all(), name
        assert pa.float().std() < 0.1 or pa.dim() == 1


def _expect(msg, *args, **kw):
    with pytest.raises(ModelLoadError, match=msg) as info:
        load(*args, **kw)
    assert "\n" not in str(info.value)


def test_unsupported_architecture(ckpt_root, tmp_path):
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    _expect("unsupported architecture 'GPT2LMHeadModel'", str(d))


def test_missing_files(ckpt_root, tmp_path):
    _expect("neither a directory nor a preset", str(tmp_path / "absent"))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "m")
    (d / "model.safetensors").unlink()
    _expect("missing file .*model.safetensors", str(d))
    d = _copy(ckpt_root / "gqa7_sharded", tmp_path / "s")
    next(d.glob("model-00002-*.safetensors")).unlink()
    _expect("missing file .*model-00002", str(d))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "c")
    (d / "config.json").unlink()
    _expect("missing file .*config.json", str(d))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "t")
    (d / "tokenizer.json").unlink()
    _expect("missing file .*tokenizer.json", str(d))
    _expect("has no weights on disk", "tiny", load_format="safetensors")


def _rewrite_weights(d, fn):
    tensors = load_file(str(d / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_wrong_shape_dtype_and_missing_tensor(ckpt_root, tmp_path):
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "shape")
    _rewrite_weights(d, lambda t: t.update({"model.layers.1.self_attn.k_proj.weight": torch.zeros(8, 64)}))
    _expect(r"tensor 'model.layers.1.self_attn.k_proj.weight' has shape \[8, 64\], expected \[64, 64\]", str(d))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "dtype")
    _rewrite_weights(d, lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)}))
    _expect("tensor 'model.norm.weight' has dtype I32", str(d))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "missing")
    _rewrite_weights(d, lambda t: t.pop("lm_head.weight"))
    _expect("checkpoint lacks tensor.*lm_head.weight", str(d))
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "corrupt")
    (d / "model.safetensors").write_bytes(b"garbage" * 10)
    _expect("cannot read", str(d))


def test_tokenizer_vocab_mismatch(ckpt_root, tmp_path):
    d = _copy(ckpt_root / "gqa1_untied_oddvocab", tmp_path / "v")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 200  # tokenizer has 259 ids
    (d / "config.json").write_text(json.dumps(cfg))
    _expect("has 259 tokens but the model's vocab_size is 200", str(d))


def test_does_not_fit():
    cfg = ModelConfig.from_preset("deepseek-coder-33b")
    with pytest.raises(ModelLoadError, match=r"needs 62.1 GiB .* bfloat16 but cpu has 16.0 GiB free"):
        check_fits(cfg, torch.bfloat16, torch.device("cpu"), available=16 * 2**30)
    check_fits(cfg, torch.bfloat16, torch.device("cpu"), available=80 * 2**30)


def test_does_not_fit_real_memory_before_allocating():
    # 33B in float32 is 124 GiB: more than this machine (and CI) has
    _expect("does not fit", "deepseek-coder-33b", load_format="dummy", dtype="float32")


def test_bad_dtype_and_device():
    _expect("unsupported dtype 'int8'", "tiny", dtype="int8")
    if not torch.cuda.is_available():
        _expect("CUDA is not available", "tiny", device="cuda")


def test_cli_style_error_is_one_line():
    code = ("from backend.model.loader import load\nfrom backend.errors import ModelLoadError\n"
            "try:\n    load('nope')\nexcept ModelLoadError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.count("\n") == 1 and "neither a directory nor a preset" in out.stdout


def test_cpu_backend_start_up_imports_neither_sympy_nor_triton():
    """Start-up time (issue 16: ready in <= 5 s): a CPU engine built and configured the way
    `tidegate backend` does it must not pull in torch's symbolic-shapes machinery (sympy, ~1.3 s:
    `Module.to_empty` on meta tensors did) or Triton (~0.9 s: the FP8 kernels, only needed with
    --quantization fp8 on CUDA)."""
    code = (
        "import sys\n"
        "from backend.engine.assemble import BackendConfig, create_engine\n"
        "from backend.runner.serving import configure_serving\n"
        "engine, loaded = create_engine(BackendConfig(model='tiny', num_blocks=64))\n"
        "configure_serving(engine.runner)\n"
        "print(sorted(m for m in ('sympy', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
