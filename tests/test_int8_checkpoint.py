"""Int8 weight-only checkpoints (backend.model.int8, issue 36): written from a float checkpoint,
read by the loader (dequantized at load, on the CPU and on CUDA, whole or as a tensor-parallel
rank's piece), against the float path: the loaded weights are exactly the dequantized ones, and
the model's logits (transformers, float32) stay close to the float checkpoint's."""
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from backend.distributed.group import TPGroup
from backend.errors import ModelLoadError
from backend.model import int8
from backend.model.loader import load
from tests.backend_helpers import hf_model, make_checkpoint


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """{name: (float dir, int8 dir, its float32 dequantized copy)} for a tied and an untied model."""
    root = tmp_path_factory.mktemp("int8")
    out = {}
    for name in ("gqa4_tied_rope4", "gqa1_untied_oddvocab"):
        src = make_checkpoint(root, name)
        q = root / f"{name}-int8"
        int8.quantize_checkpoint(src, q)
        d = root / f"{name}-deq"
        int8.dequantize_checkpoint(q, d, "float32")
        out[name] = (src, q, d)
    return out


def test_per_channel_round_trip_bounds():
    torch.manual_seed(0)
    w = torch.randn(37, 53) * torch.logspace(-3, 1, 37)[:, None]  # rows of very different size
    w[5] = 0.0
    q, scale = int8.quantize_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (37, 1) and scale.dtype == torch.float32
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    back = int8.dequantize(q, scale, torch.float32)
    err = (back - w).abs()
    assert torch.all(err <= scale / 2 * (1 + 1e-6))  # round to nearest, one scale per row
    assert torch.equal(back[5], torch.zeros(53)) and scale[5].item() == 1.0
    # every row uses its full range: per channel, not per tensor
    assert torch.all(q.abs().amax(dim=1)[torch.arange(37) != 5] == 127)


def test_checkpoint_layout_and_size(ckpts):
    src, q, _ = ckpts["gqa1_untied_oddvocab"]
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == int8.QUANT_METHOD
    assert (q / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    with safe_open(str(q / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for n in names:
            t = f.get_slice(n)
            if n.endswith(".weight_scale"):
                assert t.get_dtype() == "F32"
                assert n.removesuffix("_scale") in names
            elif len(t.get_shape()) == 2:
                assert t.get_dtype() == "I8", n
                assert n + "_scale" in names
            else:  # norms stay float
                assert t.get_dtype() in ("F32", "BF16")
    assert "lm_head.weight_scale" in names and "model.embed_tokens.weight_scale" in names
    # float32 source: int8 is ~1/4 of its bytes (1/2 of bf16), scales and norms aside
    ratio = (q / "model.safetensors").stat().st_size / (src / "model.safetensors").stat().st_size
    assert 0.25 < ratio < 0.32


@pytest.mark.parametrize("name", ["gqa4_tied_rope4", "gqa1_untied_oddvocab"])
def test_loader_reads_int8_as_the_dequantized_float_checkpoint(ckpts, name):
    src, q, deq = ckpts[name]
    a = dict(load(str(q), dtype="float32").model.named_parameters())
    b = dict(load(str(deq), dtype="float32").model.named_parameters())
    f = dict(load(str(src), dtype="float32").model.named_parameters())
    assert a.keys() == b.keys() == f.keys()
    for k, w in a.items():
        assert torch.equal(w, b[k]), k  # the int8 path is the float path on q * scale
        if w.dim() == 2:
            # within half a step of the float weights, each row on its own scale
            step = f[k].abs().amax(dim=1, keepdim=True) / 127
            assert torch.all((w - f[k]).abs() <= step / 2 + 1e-7), k
        else:
            assert torch.equal(w, f[k]), k


def test_logits_close_to_the_float_checkpoint(ckpts):
    """transformers (float32) on the dequantized checkpoint against the float original: the
    quantization error a user sees, on random weights of std 0.08 (a real model's error is
    smaller: tests/test_tiny_coder_quality.py)."""
    src, _, deq = ckpts["gqa1_untied_oddvocab"]
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf_model(src)(ids).logits
        got = hf_model(deq)(ids).logits
    rel = (got - ref).norm() / ref.norm()
    # ~0.5% RMS error per matrix (a step of amax/127 on Gaussian rows), 7 matrices deep: 2.1%
    assert rel < 0.04, float(rel)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_tensor_parallel_pieces_equal_the_float_path(ckpts):
    """Each rank reads its rows (or columns, with every row's scale) of the int8 tensors."""
    _, q, deq = ckpts["gqa1_untied_oddvocab"]
    for rank in range(2):
        a = load(str(q), dtype="float32", tp=TPGroup(rank, 2, torch.device("cpu"))).model
        b = load(str(deq), dtype="float32", tp=TPGroup(rank, 2, torch.device("cpu"))).model
        for (ka, pa), (kb, pb) in zip(a.named_parameters(), b.named_parameters()):
            assert ka == kb and torch.equal(pa, pb), (rank, ka)


def test_bad_int8_checkpoints_are_one_line_errors(ckpts, tmp_path):
    _, q, _ = ckpts["gqa4_tied_rope4"]
    other = shutil.copytree(q, tmp_path / "gptq")
    cfg = json.loads((other / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported quantization_config quant_method 'gptq'"):
        load(str(other))
    lost = shutil.copytree(q, tmp_path / "noscale")
    t = load_file(str(lost / "model.safetensors"))
    del t["model.layers.0.mlp.down_proj.weight_scale"]
    save_file(t, str(lost / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="down_proj.weight_scale"):
        load(str(lost))
    with pytest.raises(int8.Int8FormatError, match="already quantized"):
        int8.quantize_checkpoint(q, tmp_path / "twice")


def test_cli_round_trip(ckpts, tmp_path):
    import subprocess
    import sys

    src, _, _ = ckpts["gqa4_tied_rope4"]
    r = subprocess.run([sys.executable, "-m", "backend.model.int8", "quantize", str(src),
                        str(tmp_path / "q")], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["int8_tensors"] == 1 + 2 * 7  # embedding (tied) + 7 per layer
    r = subprocess.run([sys.executable, "-m", "backend.model.int8", "quantize", str(tmp_path / "q"),
                        str(tmp_path / "q2")], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "already" in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_load_equals_the_cpu_load(ckpts):
    """The GPU path dequantizes on the device: the same numbers as the CPU path, in bf16 too."""
    _, q, deq = ckpts["gqa1_untied_oddvocab"]
    for dtype in ("float32", "bfloat16"):
        a = dict(load(str(q), dtype=dtype, device="cuda").model.named_parameters())
        b = dict(load(str(deq), dtype=dtype, device="cpu").model.named_parameters())
        for k, w in a.items():
            assert w.device.type == "cuda"
            assert torch.equal(w.cpu(), b[k]), (dtype, k)


def test_the_trainers_int8_rounding_is_the_checkpoints():
    """training/train.py measures held-out bits/byte with `round_int8_per_row` (it imports
    nothing of ours): the same numbers as writing and dequantizing the checkpoint."""
    from training.train import round_int8_per_row

    torch.manual_seed(3)
    lin = torch.nn.Linear(40, 24, bias=False).to(torch.bfloat16).float()  # bf16 values, as saved
    with torch.no_grad():
        lin.weight[7] = 0.0
    want = int8.dequantize(*int8.quantize_per_channel(lin.weight), torch.float32)
    assert round_int8_per_row(lin) == 1
    assert torch.equal(lin.weight, want)
