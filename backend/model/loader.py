"""Weight loading: an HF LLaMA directory (safetensors, single or sharded) or random weights.

Every failure a user can cause is a `ModelLoadError` with a one-line message: unsupported
architecture, missing file, a tensor of the wrong shape or dtype, a checkpoint that does not fit
the device (checked before any weight is read), a tokenizer that does not match the model.

HF tensor names map onto our fused modules:

    model.layers.N.self_attn.{q,k,v}_proj.weight -> layers.N.self_attn.qkv_proj.weight rows [q | k | v]
    model.layers.N.mlp.{gate,up}_proj.weight     -> layers.N.mlp.gate_up_proj.weight rows [gate | up]
    everything else: the same name without the leading `model.`

Tensor parallelism (`load(..., tp=group)`): the rank builds the model of its shard
(`backend.distributed.sharding`) and reads only its piece of each tensor (safetensors
slices); random weights are the full tensors' pieces, so TP=N with a seed is TP=1 with it, split.
`LoadedModel.config` is then the rank's config (its heads, KV heads, MLP columns).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from backend.config import PRESETS, ConfigError, ModelConfig
from backend.distributed.sharding import Shard
from backend.errors import ModelLoadError
from backend.model import int8
from backend.model.llama import LlamaModel
from backend.model.tokenizer import check_vocab, load_tokenizer_bundle
from tokenizer.bundle import TokenizerBundle

LOAD_FORMATS = ("auto", "dummy", "dummy-cycle", "safetensors")
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_MEMORY_FRACTION = 0.9  # weights may take at most this share of the free memory
DUMMY_STD = 0.02
# dummy-cycle: the residual branches' output projections are scaled by this, so that the residual
# stream stays the input token's embedding (init_dummy_weights)
CYCLE_BRANCH_SCALE = 1e-4


@dataclass
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: TokenizerBundle
    dtype: torch.dtype
    device: torch.device


def resolve_dtype(dtype: str, config: ModelConfig, device: torch.device) -> torch.dtype:
    """`auto`: the checkpoint's dtype, except on a CPU: float32 there, or bfloat16 for a bf16
    checkpoint on a CPU with bf16 arithmetic (AVX-512 BF16 / AMX; `bf16_arithmetic`)."""
    if dtype == "auto":
        if device.type != "cpu":
            return TORCH_DTYPES[config.torch_dtype]
        from backend.kernels.cpu import bf16_arithmetic

        bf16 = config.torch_dtype == "bfloat16" and bf16_arithmetic()
        return torch.bfloat16 if bf16 else torch.float32
    if dtype not in TORCH_DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r} (choose from auto, {', '.join(TORCH_DTYPES)})")
    return TORCH_DTYPES[dtype]


def resolve_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda requested but CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unsupported device {device!r} (cpu or cuda)")
    return dev


def available_memory(device: torch.device) -> int:
    """Free bytes on `device`: CUDA free memory, or the OS's MemAvailable for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(config: ModelConfig, dtype: torch.dtype, device: torch.device,
               available: int | None = None) -> int:
    """Raise unless the weights fit in the device's free memory; returns the weight bytes."""
    dtype_name = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    need = config.weight_bytes(dtype_name)
    have = available_memory(device) if available is None else available
    if need > WEIGHT_MEMORY_FRACTION * have:
        raise ModelLoadError(
            f"model {config.name!r} needs {need / 2**30:.1f} GiB for its weights in {dtype_name} "
            f"but {device} has {have / 2**30:.1f} GiB free: it does not fit")
    return need


def read_config(model: str) -> tuple[ModelConfig, Path | None]:
    """Config of a preset name or an HF directory (the directory, or None for a preset)."""
    path = Path(model)
    try:
        if path.is_dir():
            return ModelConfig.from_json_file(path / "config.json", name=path.name), path
        if model in PRESETS:
            return ModelConfig.from_preset(model), None
    except ConfigError as exc:
        raise ModelLoadError(str(exc)) from None
    raise ModelLoadError(f"model {model!r} is neither a directory nor a preset ({', '.join(PRESETS)})")


@contextlib.contextmanager
def _no_default_init():
    """Skip the modules' default init while the model is built on the meta device: the weights
    are loaded or dummy-initialized right after. On meta, nn.Embedding's `normal_` runs torch's
    Python reference, whose first use imports torch._dynamo: 2-9 s of CPU at every start-up."""
    saved = nn.Embedding.reset_parameters, nn.Linear.reset_parameters
    nn.Embedding.reset_parameters = nn.Linear.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Embedding.reset_parameters, nn.Linear.reset_parameters = saved


def load(model: str, load_format: str = "auto", dtype: str = "auto", device: str = "cpu",
         seed: int = 0, max_model_len: int | None = None, tp=None) -> LoadedModel:
    """Config, tokenizer (checked against the vocabulary) and weights, in that order. `tp`: this
    rank's `backend.server.ranks.TPGroup` (load its shard only)."""
    config, path = read_config(model)
    tokenizer = load_tokenizer_bundle(model)
    check_vocab(tokenizer, config.vocab_size)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, dev)
    if max_model_len is not None and max_model_len <= 0:
        raise ModelLoadError(f"--max-model-len must be positive, got {max_model_len}")
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r} ({', '.join(LOAD_FORMATS)})")
    if load_format == "auto":
        load_format = "dummy" if path is None else "safetensors"
    if load_format == "safetensors" and path is None:
        raise ModelLoadError(f"preset {model!r} has no weights on disk: use --load-format dummy")
    files = _safetensors_files(path) if load_format == "safetensors" else []
    if files:
        _check_quantization(path)
    shard = None
    if tp is not None:
        try:
            shard = Shard(config, tp.rank, tp.size)
        except ConfigError as exc:
            raise ModelLoadError(str(exc)) from None
        tp.attach(shard)
        config = shard.local_config()
    check_fits(config, torch_dtype, dev)

    with torch.device("meta"), _no_default_init():
        net = LlamaModel(config, max_model_len=max_model_len)
        if shard is not None:  # vocabulary-parallel: Vp rows each (backend.server.ranks)
            net.embed_tokens = nn.Embedding(shard.vocab_rows, config.hidden_size)
            if net.lm_head is not None:
                net.lm_head = nn.Linear(config.hidden_size, shard.vocab_rows, bias=False)
    _materialize(net.to(torch_dtype), dev)
    net.tp = tp
    if load_format == "dummy-cycle" and config.tie_word_embeddings:
        raise ModelLoadError(f"--load-format dummy-cycle needs an LM head of its own; {model!r} ties "
                             "it to the embeddings (use --load-format dummy)")
    if load_format in ("dummy", "dummy-cycle"):
        init_dummy_weights(net, seed, shard, cycle=load_format == "dummy-cycle")
    else:
        load_safetensors(net, files, shard)
    net.init_rope()
    net.eval()
    return LoadedModel(config, net, tokenizer, torch_dtype, dev)


def _materialize(net: torch.nn.Module, device: torch.device) -> None:
    """Give every meta parameter and buffer real (uninitialised) storage on `device`.

    What `Module.to_empty` does, but through `torch.empty` rather than `torch.empty_like`: on meta
    tensors the latter runs torch's Python reference path, whose first call imports sympy and the
    symbolic-shapes machinery — ~1.3 s of a CPU backend's ~4 s start-up, for nothing."""
    for module in net.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(
                torch.empty(param.shape, dtype=param.dtype, device=device),
                requires_grad=param.requires_grad))
        for name, buf in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buf.shape, dtype=buf.dtype, device=device))


def load_model(model: str, load_format: str = "auto", dtype: str = "auto", device: str = "cpu",
               seed: int = 0) -> tuple[ModelConfig, LlamaModel]:
    loaded = load(model, load_format, dtype, device, seed)
    return loaded.config, loaded.model


@torch.no_grad()
def init_dummy_weights(net: LlamaModel, seed: int, shard: Shard | None = None,
                       cycle: bool = False) -> None:
    """Random weights, deterministic by seed (per device), never zeros: N(0, 0.02) matrices,
    norm weights 1 + N(0, 0.02). With a `shard`, the rank's piece of the full tensors.

    `cycle` (`--load-format dummy-cycle`): the same random weights, except that the attention and
    MLP output projections are scaled by CYCLE_BRANCH_SCALE and the LM head's row `next(v)` is
    token v's embedding, where `next` is one cycle through the whole vocabulary (`cycle_order`).
    The residual stream then stays the input token's embedding, and greedy decoding walks the
    cycle: token t is followed by next(t), with a logit margin of ~0.02^2 * hidden_size / rms
    (~140 on a 7168-wide model, 32K ids) against ~7 for the runner-up. Random weights give near-ties that
    flip when the same logits are summed in another order (a verify step against a decode step in
    bf16); these never do, so an oracle prediction built from one greedy run stays exact in the
    next (`tidegate bench serve --workload edit --oracle`). Shapes, dtypes and so every kernel's
    time are those of `dummy`: only the values differ."""
    params = sorted(net.named_parameters())

    def full_noise(i: int, name: str, p: torch.Tensor) -> torch.Tensor:
        shape = tuple(p.shape) if shard is None else shard.full_shape(name, tuple(p.shape))
        gen = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + i)
        noise = torch.empty(shape, dtype=torch.float32, device=p.device) if p.device.type == "cpu" \
            else torch.empty(shape, dtype=p.dtype, device=p.device)
        noise.normal_(0.0, DUMMY_STD, generator=gen)
        return noise

    embed = None
    if cycle:
        i_embed = next(i for i, (name, _) in enumerate(params) if name == "embed_tokens.weight")
        embed = full_noise(i_embed, "embed_tokens.weight", params[i_embed][1])
    for i, (name, p) in enumerate(params):
        if cycle and name == "lm_head.weight":
            order = torch.as_tensor(cycle_order(embed.shape[0], seed), device=embed.device)
            noise = torch.empty_like(embed)
            noise[order.roll(-1)] = embed[order]  # row next(v) = embedding of v
        elif cycle and name == "embed_tokens.weight":
            noise = embed
        else:
            noise = full_noise(i, name, p)
            if p.dim() == 1:  # norm weights
                noise += 1.0
            elif cycle and name.endswith(("o_proj.weight", "down_proj.weight")):
                noise *= CYCLE_BRANCH_SCALE
        p.copy_(noise if shard is None else shard.take(name, noise))


def cycle_order(vocab_size: int, seed: int) -> list[int]:
    """dummy-cycle's order of the vocabulary: token order[j] is followed by order[j + 1] (and the
    last by the first): one cycle through every id, so no output repeats before vocab_size tokens."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 7)
    return torch.randperm(vocab_size, generator=gen).tolist()


# ---- safetensors ---------------------------------------------------------------------------

def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index ({exc})") from None
        files = [path / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"missing file {path / 'model.safetensors'} (no *.safetensors in {path})")
    for f in files:
        if not f.exists():
            raise ModelLoadError(f"missing file {f} (listed in {index.name})")
    return files


def _check_quantization(path: Path) -> None:
    """Refuse a quantized checkpoint we do not read (GPTQ, AWQ, ...): int8 per channel
    (`backend.model.int8`) is read, and dequantized at load."""
    try:
        int8.checkpoint_method(json.loads((path / "config.json").read_text()))
    except int8.Int8FormatError as exc:
        raise ModelLoadError(f"{path / 'config.json'}: {exc}") from None


_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


def _target(net: LlamaModel, hf_name: str) -> tuple[str, int, int] | None:
    """(our parameter name, first row, number of rows) for an HF tensor name; None = ignore."""
    c = net.config
    name = hf_name.removeprefix("model.")
    m = _LAYER.match(name)
    if m:
        i, rest = m.group(1), m.group(2)
        fused = {
            "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0, c.q_size),
            "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", c.q_size, c.kv_size),
            "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", c.q_size + c.kv_size, c.kv_size),
            "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0, c.intermediate_size),
            "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", c.intermediate_size, c.intermediate_size),
        }
        if rest.endswith("rotary_emb.inv_freq"):
            return None
        if rest in fused:
            target, row, rows = fused[rest]
            return f"layers.{i}.{target}", row, rows
        return f"layers.{i}.{rest}", 0, -1
    if name == "lm_head.weight" and c.tie_word_embeddings:
        return None
    return name, 0, -1


@torch.no_grad()
def load_safetensors(net: LlamaModel, files: list[Path], shard: Shard | None = None) -> None:
    from safetensors import SafetensorError, safe_open

    params = dict(net.named_parameters())
    filled: dict[str, int] = {name: 0 for name in params}  # rows written per parameter
    for f in files:
        try:
            handle = safe_open(str(f), framework="pt", device="cpu")
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"cannot read {f}: {exc}") from None
        with handle:
            for hf_name in handle.keys():  # noqa: SIM118 -- safe_open is not iterable
                if hf_name.endswith(int8.SCALE_SUFFIX):  # an int8 weight's scale: read with it
                    continue
                target = _target(net, hf_name)
                if target is None:
                    continue
                name, row, rows = target
                if name not in params:
                    raise ModelLoadError(f"{f.name}: unexpected tensor {hf_name!r} (not a LLaMA weight)")
                p = params[name]
                expected = tuple(p.shape) if rows < 0 else (rows, *p.shape[1:])
                piece = None
                if shard is not None:  # the checkpoint holds the full tensor; we read our piece
                    expected = shard.hf_full_shape(hf_name, expected)
                    piece = shard.hf_piece(hf_name)
                sl = handle.get_slice(hf_name)
                shape = tuple(sl.get_shape())
                if shape != expected:
                    raise ModelLoadError(f"{f.name}: tensor {hf_name!r} has shape {list(shape)}, "
                                         f"expected {list(expected)} from config.json")
                dtype = sl.get_dtype()
                if dtype not in ("F32", "BF16", "F16", "I8"):
                    raise ModelLoadError(f"{f.name}: tensor {hf_name!r} has dtype {dtype}, "
                                         "expected F32, BF16, F16 or I8 (backend.model.int8)")
                if dtype == "I8":  # dequantized once, on the model's device
                    try:
                        t = int8.read_int8_tensor(handle, hf_name, piece, p.device)
                    except int8.Int8FormatError as exc:
                        raise ModelLoadError(f"{f.name}: {exc}") from None
                elif piece is None:
                    t = handle.get_tensor(hf_name)
                else:
                    dim, start, stop = piece
                    t = sl[start:stop] if dim == 0 else sl[:, start:stop]
                if rows < 0:
                    p[:t.shape[0]].copy_(t)
                    p[t.shape[0]:].zero_()  # the vocabulary padding of the last rank
                    filled[name] = p.shape[0]
                else:
                    p[row:row + rows].copy_(t)
                    filled[name] += rows
    missing = [n for n, rows in filled.items() if rows != params[n].shape[0]]
    if missing:
        hf = "model." + missing[0] if not missing[0].startswith("lm_head") else missing[0]
        raise ModelLoadError(f"checkpoint lacks tensor(s) for {hf!r}"
                             + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
