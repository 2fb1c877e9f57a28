"""The CPU elementwise kernels against the torch reference ops (fp32, bf16), and the fallbacks."""
from __future__ import annotations

import pytest
import torch

from backend.kernels.cpu import load_library
from backend.kernels.cpu.ops import CpuOps
from backend.kernels.reference.ops import TorchOps, rope_cos_sin

pytestmark = pytest.mark.skipif(load_library() is None, reason="no C compiler for the CPU kernels")
OPS = CpuOps()


def test_rms_norm_and_fused_add():
    g = torch.Generator().manual_seed(0)
    x, res = torch.randn(37, 96, generator=g) * 3, torch.randn(37, 96, generator=g)
    w = torch.randn(96, generator=g)
    torch.testing.assert_close(OPS.rms_norm(x, w, 1e-5), TorchOps.rms_norm(x, w, 1e-5))
    got, got_res = OPS.add_rms_norm(x, res, w, 1e-6)
    want, want_res = TorchOps.add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_res, want_res)


def test_rotary_on_slices_of_a_fused_qkv_output_in_place():
    g = torch.Generator().manual_seed(1)
    tokens, hq, hkv, d = 11, 6, 2, 32
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=g)
    q, k, _ = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.reshape(tokens, hq, d), k.reshape(tokens, hkv, d)  # strided views
    positions = torch.tensor([0, 1, 2, 100, 7, 5, 3, 2047, 9, 1000, 4])
    cos_sin = rope_cos_sin(d, 2048, 10000.0, 4.0)
    want_q, want_k = TorchOps.rotary(q.clone(), k.clone(), positions, cos_sin)
    got_q, got_k = OPS.rotary(q, k, positions, cos_sin)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert got_q.data_ptr() == q.data_ptr()  # rotated where it lies


def test_silu_and_mul():
    x = torch.randn(13, 2 * 40, generator=torch.Generator().manual_seed(2)) * 4
    torch.testing.assert_close(OPS.silu_and_mul(x), TorchOps.silu_and_mul(x))


def test_bf16_kernels_match_the_fp32_reference_to_bf16_rounding():
    g = torch.Generator().manual_seed(3)
    bf = torch.bfloat16
    x, res = torch.randn(9, 80, generator=g).to(bf), torch.randn(9, 80, generator=g).to(bf)
    w = torch.randn(80, generator=g).to(bf)
    tol = {"rtol": 1.6e-2, "atol": 1e-2}  # one bf16 rounding of the result (+ of the weight product)
    got = OPS.rms_norm(x, w, 1e-5)
    assert got.dtype == bf
    torch.testing.assert_close(got.float(), TorchOps.rms_norm(x.float(), w.float(), 1e-5), **tol)
    got, got_res = OPS.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(got_res, x + res)  # the bf16 residual, rounded as torch rounds it
    torch.testing.assert_close(got.float(), TorchOps.rms_norm(got_res.float(), w.float(), 1e-6),
                               **tol)
    gu = (torch.randn(9, 2 * 40, generator=g) * 4).to(bf)
    torch.testing.assert_close(OPS.silu_and_mul(gu).float(), TorchOps.silu_and_mul(gu.float()),
                               **tol)
    qkv = torch.randn(5, 4 * 32, generator=g).to(bf)
    q, k, _ = qkv.split([2 * 32, 32, 32], dim=-1)
    q, k = q.reshape(5, 2, 32), k.reshape(5, 1, 32)
    positions = torch.tensor([0, 3, 900, 17, 5])
    cos_sin = rope_cos_sin(32, 1024, 10000.0, 1.0)
    want_q, want_k = TorchOps.rotary(q.float(), k.float(), positions, cos_sin)
    got_q, got_k = OPS.rotary(q, k, positions, cos_sin)
    assert got_q.data_ptr() == q.data_ptr()
    torch.testing.assert_close(got_q.float(), want_q, **tol)
    torch.testing.assert_close(got_k.float(), want_k, **tol)


def test_other_dtypes_use_the_reference():
    x = torch.randn(4, 16).half()
    w = torch.randn(16).half()
    assert torch.equal(OPS.rms_norm(x, w, 1e-5), TorchOps.rms_norm(x, w, 1e-5))
    assert torch.equal(OPS.silu_and_mul(x), TorchOps.silu_and_mul(x))


def test_an_unwritable_cache_falls_back_to_the_temp_dir(tmp_path, monkeypatch):
    import tempfile

    from backend.kernels import cpu as cpu_kernels

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TIDEGATE_CACHE", str(blocker / "cache"))  # mkdir under a file fails
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = cpu_kernels.build_library()
    assert path is not None and path.is_relative_to(tmp_path / "tmp") and path.stat().st_size > 0
