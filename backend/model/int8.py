"""Int8 weight-only checkpoints: one int8 matrix and one float32 scale per output row.

A storage format, so that the repository's 30 MB holds twice the parameters of a bf16 file
(issue 36): the loader dequantizes each tensor once, at load time, on the target device and in
the run's dtype, so the model, kernels, KV formats, `--quantization fp8` and tensor parallelism
all see ordinary float weights.

    w [N, K] (float)  ->  q [N, K] int8, scale [N, 1] float32,   w ~= q * scale
    scale[n] = max_k |w[n, k]| / 127    (an all-zero row: scale 1, q 0)
    q[n, k]  = round(w[n, k] / scale[n]), within [-127, 127]   (symmetric; -128 unused)

Checkpoint layout (one `model.safetensors`, beside the model's other files):

    <name>.weight        I8   [N, K]   every 2-D weight: projections, embedding, an untied head
    <name>.weight_scale  F32  [N, 1]   its per-row scale (for the embedding: one per token)
    <norm>.weight        as written by the trainer (1-D weights stay float)
    config.json          "quantization_config": {"quant_method": "tidegate-int8", ...}

Transformers and vLLM do not read this `quant_method`; `dequantize_checkpoint` writes the float
checkpoint they read (the same numbers the loader computes).

    python -m backend.model.int8 quantize SRC_DIR DST_DIR     # a float HF directory -> int8
    python -m backend.model.int8 dequantize SRC_DIR DST_DIR   # int8 -> bf16 (transformers)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

QUANT_METHOD = "tidegate-int8"
SCALE_SUFFIX = "_scale"  # "<name>.weight" -> "<name>.weight_scale"
QMAX = 127
QUANTIZATION_CONFIG = {
    "quant_method": QUANT_METHOD, "bits": 8, "symmetric": True,
    "granularity": "per output channel (one float32 scale per row, <name>.weight_scale [N, 1])",
    "targets": "every 2-D weight (projections, embedding, untied LM head); 1-D weights stay float",
}


class Int8FormatError(ValueError):
    """A checkpoint that claims or looks int8 but is not readable as this format."""


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (q [N, K] int8, scale [N, 1] float32), module docstring's rule."""
    if w.dim() != 2:
        raise Int8FormatError(f"int8 per-channel quantization needs a 2-D weight, got {tuple(w.shape)}")
    w32 = w.detach().to(torch.float32)
    amax = w32.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(w32 / scale).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
               device: torch.device | str | None = None) -> torch.Tensor:
    """q [N, K] int8 and scale [N, 1] (or [N]) -> q * scale in `dtype`, computed in float32 on
    `device` (the int8 tensor moves, not a float copy of it)."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise Int8FormatError(f"expected a 2-D int8 tensor, got {q.dtype} {list(q.shape)}")
    scale = scale.reshape(-1, 1)
    if scale.shape[0] != q.shape[0]:
        raise Int8FormatError(f"scale has {scale.shape[0]} rows for a weight of {q.shape[0]}")
    if device is not None:
        q, scale = q.to(device), scale.to(device)
    return (q.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def read_int8_tensor(handle, name: str, piece=None, device=None) -> torch.Tensor:
    """The float32 weight of int8 tensor `name` in an open safetensors `handle` (its scale
    `name + '_scale'` from the same file), or its `piece` (dim, start, stop) for a tensor-parallel
    rank: rows of both, or columns of the int8 matrix with every row's scale."""
    scale_name = name + SCALE_SUFFIX
    if scale_name not in handle.keys():  # noqa: SIM118 -- safe_open is not iterable
        raise Int8FormatError(f"int8 tensor {name!r} has no {scale_name!r} in the same file")
    if piece is None:
        q, scale = handle.get_tensor(name), handle.get_tensor(scale_name)
    else:
        dim, start, stop = piece
        q = handle.get_slice(name)[start:stop] if dim == 0 else handle.get_slice(name)[:, start:stop]
        scale = handle.get_slice(scale_name)[start:stop] if dim == 0 else handle.get_tensor(scale_name)
    return dequantize(q, scale, torch.float32, device)


def checkpoint_method(config: dict) -> str | None:
    """'int8' for this format, None for a float checkpoint; Int8FormatError for another
    `quantization_config` (GPTQ, AWQ, compressed-tensors, ...: not read here)."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method == QUANT_METHOD:
        return "int8"
    raise Int8FormatError(f"unsupported quantization_config quant_method {method!r}: tidegate "
                          f"reads float checkpoints and its own {QUANT_METHOD!r} "
                          "(python -m backend.model.int8)")


def _rewrite_dir(src: Path, dst: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dst.resolve():
        for f in src.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and \
                    f.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy2(f, dst / f.name)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _read(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = json.loads((src / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not tensors:
        raise Int8FormatError(f"no *.safetensors in {src}")
    return config, tensors


def quantize_checkpoint(src: str | Path, dst: str | Path) -> dict:
    """Write `dst` = the float HF directory `src` with every 2-D weight int8 (module docstring;
    `dst` may be `src`). Returns {'tensors', 'int8_tensors', 'bytes'}."""
    src, dst = Path(src), Path(dst)
    config, tensors = _read(src)
    if checkpoint_method(config) is not None:
        raise Int8FormatError(f"{src} is already quantized")
    out: dict[str, torch.Tensor] = {}
    n_int8 = 0
    for name, t in tensors.items():
        if t.dim() == 2 and t.is_floating_point():
            q, scale = quantize_per_channel(t)
            out[name], out[name + SCALE_SUFFIX] = q, scale
            n_int8 += 1
        else:
            out[name] = t.contiguous()
    config = {**config, "quantization_config": dict(QUANTIZATION_CONFIG)}
    _rewrite_dir(src, dst, out, config)
    return {"tensors": len(tensors), "int8_tensors": n_int8,
            "bytes": (dst / "model.safetensors").stat().st_size}


def dequantize_checkpoint(src: str | Path, dst: str | Path, dtype: str = "bfloat16") -> dict:
    """Write `dst` = the int8 directory `src` as a float checkpoint (`dtype`) that transformers
    and vLLM read: the weights the loader computes, rounded to `dtype`."""
    src, dst = Path(src), Path(dst)
    config, tensors = _read(src)
    if checkpoint_method(config) != "int8":
        raise Int8FormatError(f"{src} is not a {QUANT_METHOD} checkpoint")
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32,
                   "float16": torch.float16}[dtype]
    out = {}
    for name, t in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if t.dtype == torch.int8:
            scale = tensors.get(name + SCALE_SUFFIX)
            if scale is None:
                raise Int8FormatError(f"{src}: int8 tensor {name!r} has no {name + SCALE_SUFFIX!r}")
            out[name] = dequantize(t, scale, torch_dtype).contiguous()
        else:
            out[name] = t.to(torch_dtype).contiguous()
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    config["torch_dtype"] = dtype
    _rewrite_dir(src, dst, out, config)
    return {"tensors": len(out), "bytes": (dst / "model.safetensors").stat().st_size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quantize", help="float HF directory -> int8 directory")
    q.add_argument("src", type=Path)
    q.add_argument("dst", type=Path)
    d = sub.add_parser("dequantize", help="int8 directory -> float directory (transformers)")
    d.add_argument("src", type=Path)
    d.add_argument("dst", type=Path)
    d.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    a = p.parse_args(argv)
    try:
        r = quantize_checkpoint(a.src, a.dst) if a.cmd == "quantize" else \
            dequantize_checkpoint(a.src, a.dst, a.dtype)
    except (Int8FormatError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"cmd": a.cmd, "dst": str(a.dst), **r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
