#!/usr/bin/env python3
r"""Train ``tiny-coder``: a ~12.6M-parameter LLaMA-architecture code model on the Python stdlib.

Everything happens in one process, with no downloads:

1. **Corpus.** Every ``.py`` file under ``sysconfig.get_paths()['stdlib']`` of the interpreter
   running this script (``site-packages``/``dist-packages``/``__pycache__`` skipped, files that
   are not valid UTF-8 or are empty skipped). Each file is assigned to a split by the SHA-1 of its
   path *relative to the stdlib root* (POSIX separators)::

       bucket = int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16) % 20
       bucket == 0  -> held-out test (5%): never trained on, never used for any decision;
                       listed in ``heldout_files.txt`` and scored once at the end
       bucket == 1  -> validation (5%): periodic loss, best-checkpoint selection
       otherwise    -> training (90%): also the only text the tokenizer is trained on

2. **Tokenizer.** Byte-level BPE (``tokenizers``), vocabulary 4096 including the special tokens
   ``<|pad|>`` (0), ``<|bos|>`` (1), ``<|eos|>`` (2), ``<|system|>``, ``<|user|>``,
   ``<|assistant|>``. Encoding adds ``<|bos|>`` in front (like LLaMA tokenizers).

3. **Model.** LLaMA (GQA, RoPE, RMSNorm, SwiGLU), written here in plain PyTorch with the
   parameter names of ``transformers``' ``LlamaForCausalLM`` so that the saved weights load there
   unchanged (checked at the end: the logits of the two implementations are compared).

4. **Training.** Documents are ``<|bos|> text <|eos|>``, shuffled and packed into one stream,
   cut into sequences of ``--seq-len`` tokens (a new random offset each epoch). AdamW, bf16
   autocast, gradient clipping, residual dropout. Learning rate: linear warm-up, held at the peak
   while the validation loss improves, then -- once it stalls (the corpus is small: a 12M model
   starts to memorise it after a few epochs) or at 75% of the budget at the latest -- rewound to
   the best validation point and decayed along a half cosine. The checkpoint with the best
   validation loss is shipped. The hard budget ``--time-budget-s`` covers the whole training loop
   (periodic evaluations included), timed on the device with synchronisation; training usually
   ends earlier, when the decay is done.

5. **Held-out perplexity.** Token-level, over all held-out files, with the *saved* bf16 weights
   computed in float32: each file is ``<|bos|> text <|eos|>``; it is cut into windows of
   ``--seq-len`` predicted tokens (window ``i`` reads tokens ``[i*L, i*L+L)`` and predicts tokens
   ``[i*L+1, i*L+L]``, the context restarting at every window); every token after ``<|bos|>``
   (``<|eos|>`` included) is predicted exactly once. ppl = exp(sum NLL / number of predicted tokens).

Output: a Hugging Face directory (config.json, model.safetensors in bf16, tokenizer files,
generation_config.json) plus train_log.jsonl, loss.png, heldout_files.txt, metrics.json and a
README.md model card.

Quick CPU smoke test (a subset of files, so that the final held-out pass stays short)::

    python scripts/train_tiny_coder.py --out /tmp/tc --device cpu --time-budget-s 30 --max-steps 20 \
        --max-files 100 --batch-size 4 --eval-windows 16

Full run (one H200; at most 7 min of training, ~2 min in practice)::

    python scripts/train_tiny_coder.py --out models/tiny-coder

The shipped ``models/tiny-coder`` was trained on an H200 machine whose own python3 (Ubuntu's
3.12) has no test suite in its stdlib (10.7 MB instead of ~31 MB), so the development
interpreter's stdlib (CPython 3.11.7) was copied there and read with ``--stdlib-root``::

    (cd "$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" &&
     find . \( -name site-packages -o -name __pycache__ \) -prune -o -name '*.py' -print0 |
     xargs -0 cp --parents -t "$REPO/out/tiny-coder-stdlib")
    python3 scripts/train_tiny_coder.py --out /tmp/tiny-coder --stdlib-root out/tiny-coder-stdlib \
        --corpus-label "CPython 3.11.7 (...)" --corpus-note "..."
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPLIT_MODULUS = 20
HELDOUT_BUCKET = 0
VAL_BUCKET = 1
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}

# A plain chat template: <|bos|><|role|>\ncontent<|eos|>\n ... ending with <|assistant|>\n.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------
# corpus


def split_of(relpath: str) -> str:
    """Return 'heldout', 'val' or 'train' for a path relative to the stdlib root."""
    bucket = int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16) % SPLIT_MODULUS
    if bucket == HELDOUT_BUCKET:
        return "heldout"
    if bucket == VAL_BUCKET:
        return "val"
    return "train"


def load_stdlib_corpus(root: Path, max_files: int | None = None) -> dict:
    """Read the stdlib's .py files; return {'train'|'val'|'heldout': [(relpath, text)], 'skipped': [...]}."""
    root = Path(root)
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "val": [], "heldout": []}
    skipped: list[str] = []
    paths: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                paths.append(Path(dirpath) / fn)
    paths.sort(key=lambda p: p.relative_to(root).as_posix())
    if max_files is not None:
        # keep a deterministic subset for smoke tests, always including some of each split
        paths = paths[:: max(1, len(paths) // max_files)]
    for p in paths:
        rel = p.relative_to(root).as_posix()
        try:
            text = p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(rel)
            continue
        if not text.strip():
            continue
        splits[split_of(rel)].append((rel, text))
    return {**splits, "skipped": skipped}


# --------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def encode_docs(tok, texts: list[str]) -> list[np.ndarray]:
    """<|bos|> text <|eos|> per document, through the parallel encode_batch fast path."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    encs = tok.encode_batch(texts, add_special_tokens=False)
    out = []
    for e in encs:
        ids = np.empty(len(e.ids) + 2, dtype=np.int32)
        ids[0] = bos
        ids[1:-1] = e.ids
        ids[-1] = eos
        out.append(ids)
    return out


# --------------------------------------------------------------------------------------------
# model (LLaMA, parameter names as in transformers' LlamaForCausalLM)


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.h, self.kv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.h // self.kv  # query head i reads KV head i // rep (as transformers' repeat_kv)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, dropout: float):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, cos, sin):
        x = x + self.dropout(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))


class Backbone(nn.Module):
    def __init__(self, c: ModelConfig, dropout: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, dropout) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyLlama(nn.Module):
    def __init__(self, c: ModelConfig, dropout: float = 0.0):
        super().__init__()
        self.config = c
        self.model = Backbone(c, dropout)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.dropout = nn.Dropout(dropout)
        inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._init_weights()

    def _init_weights(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                s = (
                    std / math.sqrt(2 * self.config.num_hidden_layers)
                    if name.endswith(("o_proj.weight", "down_proj.weight"))
                    else std
                )
                nn.init.normal_(p, mean=0.0, std=s)

    def rope(self, t: int, device):
        pos = torch.arange(t, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def forward(self, idx):
        cos, sin = self.rope(idx.shape[1], idx.device)
        x = self.dropout(self.model.embed_tokens(idx))
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def count_params(model: nn.Module) -> dict:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = model.model.embed_tokens.weight.numel()
    head = 0 if model.config.tie_word_embeddings else model.lm_head.weight.numel()
    return {"total": total, "embedding": emb, "lm_head": head, "non_embedding": total - emb - head}


# --------------------------------------------------------------------------------------------
# data


def make_windows(docs: list[np.ndarray], seq_len: int, pad_id: int):
    """Held-out protocol: each doc cut into windows predicting seq_len tokens each (see module doc)."""
    xs, ys = [], []
    for d in docs:
        for s in range(0, len(d) - 1, seq_len):
            chunk = d[s : s + seq_len + 1]
            x = np.full(seq_len, pad_id, dtype=np.int64)
            y = np.full(seq_len, -100, dtype=np.int64)
            x[: len(chunk) - 1] = chunk[:-1]
            y[: len(chunk) - 1] = chunk[1:]
            xs.append(x)
            ys.append(y)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


@torch.no_grad()
def eval_loss(model, x, y, batch_size: int, device, autocast: bool) -> tuple[float, int]:
    """Sum-NLL / count over windows (x, y); returns (mean nll, number of predicted tokens)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb = x[i : i + batch_size].to(device, non_blocking=True)
        yb = y[i : i + batch_size].to(device, non_blocking=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(xb)
        nll = F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            yb.view(-1),
            ignore_index=-100,
            reduction="sum",
        )
        total += nll.item()
        count += int((yb != -100).sum().item())
    model.train(was_training)
    return total / max(count, 1), count


class Batcher:
    """Epochs over the packed training stream: random offset per epoch, shuffled sequences."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int, device):
        self.stream, self.L, self.B, self.device = stream, seq_len, batch_size, device
        self.g = torch.Generator().manual_seed(seed)
        self.epoch = -1
        self._new_epoch()

    def _new_epoch(self):
        self.epoch += 1
        off = int(torch.randint(0, self.L, (1,), generator=self.g))
        n = (len(self.stream) - off - 1) // self.L
        self.starts = off + self.L * torch.randperm(n, generator=self.g)
        self.pos = 0

    def next(self):
        if self.pos + self.B > len(self.starts):
            self._new_epoch()
        starts = self.starts[self.pos : self.pos + self.B].to(self.device)
        self.pos += self.B
        idx = starts[:, None] + torch.arange(self.L + 1, device=self.device)[None]
        chunk = self.stream[idx].long()
        return chunk[:, :-1], chunk[:, 1:]


# --------------------------------------------------------------------------------------------
# export


def hf_config_dict(c: ModelConfig, tok) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": c.tie_word_embeddings,
        "use_cache": True,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "pad_token_id": tok.token_to_id(PAD),
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def save_hf_dir(out: Path, model: TinyLlama, tok, c: ModelConfig, max_len: int):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = {}
    for k, v in model.state_dict().items():
        if c.tie_word_embeddings and k == "lm_head.weight":
            continue
        sd[k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config_dict(c, tok), indent=2) + "\n")
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
    added = {
        str(ids[s]): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s in SPECIAL_TOKENS
    }
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>"],
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "padding_side": "left",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    stm = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>"],
    }
    (out / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")
    gen = {
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "do_sample": False,
        "max_new_tokens": 128,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def check_with_transformers(
    out: Path, model: TinyLlama, device, prompt: str, new_tokens: int
) -> dict:
    """Load the saved dir with transformers; compare logits with ours and greedy-complete a prompt."""
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    hf = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).to(device).eval()
    tk = AutoTokenizer.from_pretrained(str(out))
    ours = copy.deepcopy(model).float().eval()
    with torch.no_grad():  # our model with the same bf16-rounded weights
        for p in ours.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    enc = tk(prompt, return_tensors="pt")
    ids = enc["input_ids"].to(device)
    with torch.no_grad():
        a = hf(ids).logits.float()
        b = ours(ids).float()
    diff = (a - b).abs().max().item()
    with torch.no_grad():
        gen = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tk.pad_token_id,
            eos_token_id=tk.eos_token_id,
        )
    completion = tk.decode(gen[0][ids.shape[1] :], skip_special_tokens=True)
    chat = tk.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    del hf, ours
    return {
        "hf_logits_max_abs_diff": diff,
        "hf_logits_scale": a.abs().max().item(),
        "prompt": prompt,
        "completion": completion,
        "chat_template_example": chat,
    }


def plot_losses(log: list[dict], path: Path, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tr = [r for r in log if r["type"] == "train"]
    ev = [r for r in log if r["type"] == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    ax.plot(
        [r["tokens"] / 1e6 for r in tr], [r["loss"] for r in tr], lw=0.8, label="train (batch mean)"
    )
    if ev:
        ax.plot(
            [r["tokens"] / 1e6 for r in ev],
            [r["val_loss"] for r in ev],
            "o-",
            ms=3,
            label="validation files",
        )
        ax.plot(
            [r["tokens"] / 1e6 for r in ev],
            [r["heldout_loss"] for r in ev],
            "s-",
            ms=3,
            label="held-out files",
        )
    for r in log:
        if r["type"] == "schedule":
            ax.axvline(r["tokens"] / 1e6, color="gray", ls="--", lw=0.8)
            ax.annotate(
                f"cosine decay from step {r['rewound_to_step']}",
                (r["tokens"] / 1e6, 0.98),
                xycoords=("data", "axes fraction"),
                fontsize=8,
                ha="right",
                va="top",
                rotation=90,
                color="gray",
            )
    ax.set_xlabel("tokens processed (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title, fontsize=10)
    lo = min([r["loss"] for r in tr] + [r["val_loss"] for r in ev] or [0.0])
    ax.set_ylim(max(0.0, lo - 0.2), min(8.5, max(r["loss"] for r in tr) + 0.2) if tr else None)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_card(out: Path, m: dict):
    cfg = m["model_config"]
    hp = m["hyperparameters"]
    text = f"""---
license: other
license_name: psf-2.0
tags: [code, python, llama, tiny]
pipeline_tag: text-generation
---

# tiny-coder

A {m["params"]["total"] / 1e6:.1f}M-parameter LLaMA-architecture causal language model trained from
scratch on the Python standard library's own source, by `scripts/train_tiny_coder.py` in the
tidegate repository. It exists so that tidegate's embedded default prints Python-looking code and
so that KV-cache and weight quantization can be judged on weights that were actually trained.
It is **not** a useful coding assistant.

## Data

- Source: every `.py` file of the standard library of {m["corpus_label"]}, test suite included
  (`site-packages` excluded, files that are not valid UTF-8 skipped: {m["corpus"]["skipped_files"]}).
  {m["corpus_note"]}
  {m["corpus"]["files"]["train"] + m["corpus"]["files"]["val"] + m["corpus"]["files"]["heldout"]} files, {m["corpus"]["bytes_total"] / 1e6:.1f} MB.
- License of the data: the Python standard library is distributed under the
  [PSF License Agreement (PSF-2.0)](https://docs.python.org/3/license.html); the weights are a
  derivative of that text.
- Split by file, fixed: `bucket = int(sha1(relpath).hexdigest(), 16) % 20` where `relpath` is the
  path relative to the stdlib root with `/` separators. Bucket 0 is the **held-out** test set
  ({m["corpus"]["files"]["heldout"]} files, {m["corpus"]["tokens"]["heldout"]:,} tokens; listed in
  `heldout_files.txt`; never trained on, never used for a decision), bucket 1 is the validation
  set ({m["corpus"]["files"]["val"]} files; periodic loss, choice of the checkpoint), the rest
  ({m["corpus"]["files"]["train"]} files, {m["corpus"]["tokens"]["train"]:,} tokens) is training data.
  The tokenizer saw the training files only.

## Model

| | |
|---|---|
| architecture | `LlamaForCausalLM` (RoPE θ={cfg["rope_theta"]:g}, RMSNorm, SwiGLU, GQA) |
| parameters | {m["params"]["total"]:,} ({m["params"]["non_embedding"]:,} without embeddings and head) |
| layers / hidden / intermediate | {cfg["num_hidden_layers"]} / {cfg["hidden_size"]} / {cfg["intermediate_size"]} |
| heads / KV heads / head dim | {cfg["num_attention_heads"]} / {cfg["num_key_value_heads"]} / {cfg["hidden_size"] // cfg["num_attention_heads"]} |
| vocabulary | {cfg["vocab_size"]} (byte-level BPE) |
| max positions | {cfg["max_position_embeddings"]} (trained on {hp["seq_len"]}-token sequences) |
| tied embeddings | {cfg["tie_word_embeddings"]} |
| weights | bf16, `model.safetensors` |

Tokenizer: byte-level BPE trained with `tokenizers`; special tokens `<|pad|>`=0, `<|bos|>`=1,
`<|eos|>`=2, `<|system|>`, `<|user|>`, `<|assistant|>`. Encoding prepends `<|bos|>`. Training
documents are `<|bos|> file text <|eos|>`. The chat template (`tokenizer_config.json`) is
`<|bos|><|role|>\\ncontent<|eos|>\\n…<|assistant|>\\n`; the model never saw chat data, so it is there
for the plumbing only.

## Training

| | |
|---|---|
| device | {m["device_name"]} |
| time budget / training time | {hp["time_budget_s"]} s / {m["train_time_s"]:.1f} s (training loop incl. periodic evals) |
| steps / tokens seen | {m["steps"]:,} / {m["tokens_seen"]:,} ({m["epochs"]:.1f} epochs of the training split), all processed tokens |
| shipped weights | after {m["best_step"]:,} steps along their own trajectory, {m["tokens_in_final_weights"]:,} tokens ({m["epochs_in_final_weights"]:.1f} epochs) |
| throughput | {m["tokens_per_s"]:,.0f} tokens/s |
| batch | {hp["batch_size"]} × {hp["seq_len"]} tokens, packed |
| optimizer | AdamW β=({hp["beta1"]}, {hp["beta2"]}), weight decay {hp["weight_decay"]} (matrices only), grad clip {hp["grad_clip"]} |
| learning rate | linear warm-up ({hp["warmup_steps"]} steps) to {hp["lr"]:g}, held while the validation loss improves, then (trigger: {m["schedule"]["trigger"]}, after {m["schedule"]["peak_steps"]:,} steps, rewound to the best validation point) a half-cosine decay to {hp["min_lr"]:g} over {m["schedule"]["decay_steps"]:,} steps |
| precision | bf16 autocast, fp32 master weights |
| regularisation | residual/embedding dropout {hp["dropout"]}; the checkpoint with the best validation loss is shipped |
| evaluation during training | validation and held-out loss every {hp["eval_every"]} steps; decisions use the validation files only |
| seed | {m["seed"]} |
| software | torch {m["torch_version"]}, tokenizers {m["tokenizers_version"]} |

![loss curves](loss.png)

`train_log.jsonl` has every logged point; `metrics.json` every number on this page.
Re-running the script with the same seed reproduces a model of the same quality, not the same bits.

## Held-out evaluation

Token-level perplexity over all {m["corpus"]["files"]["heldout"]} held-out files, with the saved
bf16 weights computed in float32: each file is `<|bos|> text <|eos|>`, cut into windows of
{hp["seq_len"]} predicted tokens (the context restarts at each window); every token after
`<|bos|>` is predicted exactly once.

| | |
|---|---|
| held-out perplexity | **{m["heldout_ppl"]:.3f}** ({m["heldout_nll"]:.4f} nats/token over {m["heldout_tokens"]:,} tokens) |
| held-out bits per byte | {m["heldout_bits_per_byte"]:.4f} |
| best validation loss | {m["best_val_loss"]:.4f} nats/token |

Greedy completion of `{m["sample"]["prompt"]}` ({m["sample"]["new_tokens"]} new tokens):

```python
{m["sample"]["prompt"]}{m["sample"]["completion"]}
```

## Intended use

Testing and benchmarking LLM-serving code (tidegate's embedded default, perplexity and greedy
agreement checks for KV-cache and weight quantization, kernel correctness on real weight
statistics). Small enough for a CPU.

## Limitations

- Tiny and trained on one small corpus ({m["epochs"]:.0f} passes over ~{m["corpus"]["tokens"]["train"] / 1e6:.0f}M tokens): it
  imitates the look of stdlib code, often repeats itself, invents names, and its code is usually
  wrong. It does not follow instructions and was never trained on chat data.
- Knows only Python as written in the CPython standard library (no third-party libraries,
  little non-Python text except comments and docstrings).
- It may reproduce passages of the standard library verbatim (PSF-licensed).
- The held-out files are other files of the same library, so the perplexity above flatters it
  relative to code in the wild.
"""
    (out / "README.md").write_text(text)


# --------------------------------------------------------------------------------------------
# main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="output Hugging Face directory")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=420.0,
        help="hard wall-clock budget of the training loop",
    )
    p.add_argument(
        "--max-steps", type=int, default=None, help="stop after this many steps (smoke tests)"
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=384)
    p.add_argument("--intermediate-size", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--max-position-embeddings", type=int, default=2048)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=2e-4)
    p.add_argument("--warmup-steps", type=int, default=300)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--log-every", type=int, default=50, help="log the training loss every N steps")
    p.add_argument(
        "--eval-every",
        type=int,
        default=100,
        help="validation (and logged held-out) loss every N steps",
    )
    p.add_argument(
        "--eval-windows", type=int, default=0, help="windows per periodic evaluation (0: all)"
    )
    p.add_argument(
        "--patience",
        type=int,
        default=4,
        help="evaluations without improvement before the decay starts",
    )
    p.add_argument(
        "--min-delta",
        type=float,
        default=1e-3,
        help="improvement of the validation loss that counts",
    )
    p.add_argument(
        "--decay-frac",
        type=float,
        default=0.3,
        help="decay length as a share of the steps before it",
    )
    p.add_argument("--min-decay-steps", type=int, default=200)
    p.add_argument(
        "--decay-at",
        type=float,
        default=0.75,
        help="start the decay at this share of the budget at the latest",
    )
    p.add_argument(
        "--stdlib-root",
        type=Path,
        default=None,
        help="stdlib directory to read (default: sysconfig.get_paths()['stdlib'] of this interpreter)",
    )
    p.add_argument(
        "--corpus-label",
        default=None,
        help="what --stdlib-root is, for the card (default: this interpreter)",
    )
    p.add_argument(
        "--corpus-note", default="", help="a sentence for the card about where the corpus came from"
    )
    p.add_argument(
        "--max-files",
        type=int,
        default=None,
        help="use a deterministic subset of files (smoke tests)",
    )
    p.add_argument("--sample-prompt", default="def fibonacci(n):")
    p.add_argument("--sample-tokens", type=int, default=64)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    use_cuda = device.type == "cuda"
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    autocast = use_cuda or device.type == "cpu"
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log_f = open(out / "train_log.jsonl", "w")  # noqa: SIM115 - appended to for the whole run
    log: list[dict] = []

    def emit(rec: dict):
        log.append(rec)
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    def say(msg: str):
        print(f"[{time.time() - t_start:7.1f}s] {msg}", flush=True)

    # 1. corpus ------------------------------------------------------------------------------
    stdlib = Path(args.stdlib_root or sysconfig.get_paths()["stdlib"])
    corpus_label = (
        args.corpus_label or f"{platform.python_implementation()} {platform.python_version()}"
    )
    corpus = load_stdlib_corpus(stdlib, args.max_files)
    nbytes = {
        k: sum(len(t.encode("utf-8")) for _, t in corpus[k]) for k in ("train", "val", "heldout")
    }
    say(
        f"corpus {stdlib}: "
        + ", ".join(f"{k} {len(corpus[k])} files {nbytes[k] / 1e6:.2f} MB" for k in nbytes)
        + f", skipped {len(corpus['skipped'])} non-UTF-8"
    )
    (out / "heldout_files.txt").write_text("".join(rel + "\n" for rel, _ in corpus["heldout"]))

    # 2. tokenizer ---------------------------------------------------------------------------
    t0 = time.time()
    tok = train_tokenizer([t for _, t in corpus["train"]], args.vocab_size)
    say(f"tokenizer trained in {time.time() - t0:.1f}s, vocab {tok.get_vocab_size()}")
    t0 = time.time()
    docs = {k: encode_docs(tok, [t for _, t in corpus[k]]) for k in ("train", "val", "heldout")}
    ntok = {k: int(sum(len(d) for d in docs[k])) for k in docs}
    say(
        f"encoded in {time.time() - t0:.1f}s: "
        + ", ".join(f"{k} {ntok[k]:,} tokens" for k in ntok)
        + f" ({nbytes['train'] / ntok['train']:.2f} bytes/token)"
    )

    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(docs["train"]))
    stream = (
        torch.from_numpy(np.concatenate([docs["train"][i] for i in order]))
        .to(torch.int32)
        .to(device)
    )
    pad_id = tok.token_to_id(PAD)
    val_x, val_y = make_windows(docs["val"], args.seq_len, pad_id)
    ho_x, ho_y = make_windows(docs["heldout"], args.seq_len, pad_id)

    # periodic evaluations: all windows, or a fixed seeded subset of --eval-windows (smoke tests)
    def sub(x, y):
        if args.eval_windows:
            i = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))[
                : args.eval_windows
            ]
            x, y = x[i], y[i]
        return x.to(device), y.to(device)

    val_set, ho_set = sub(val_x, val_y), sub(ho_x, ho_y)

    # 3. model -------------------------------------------------------------------------------
    mc = ModelConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=args.tie_embeddings,
    )
    model = TinyLlama(mc, dropout=args.dropout).to(device)
    params = count_params(model)
    say(f"model: {params['total']:,} parameters ({params['non_embedding']:,} non-embedding)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=use_cuda,
    )
    batcher = Batcher(stream, args.seq_len, args.batch_size, args.seed, device)
    device_name = (
        torch.cuda.get_device_name(device)
        if use_cuda
        else (platform.processor() or platform.machine() or "cpu")
    )

    def sync():
        if use_cuda:
            torch.cuda.synchronize(device)

    # 4. training ----------------------------------------------------------------------------
    # LR schedule ("warm-up, hold, cosine decay"): linear warm-up to the peak, held there while the
    # validation loss improves. When it has not improved by --min-delta for --patience evaluations
    # (or --decay-at of the budget is used up), the weights and optimizer state are rewound to the
    # best validation point and the LR follows a half cosine from the peak to --min-lr over a decay
    # phase of --decay-frac times the steps that led to that point (at least --min-decay-steps),
    # cut short so that it ends within the budget. The exported weights are those with the best
    # validation loss seen at any evaluation. The held-out files play no part in any of this.
    budget = args.time_budget_s
    best = {"val_loss": float("inf"), "step": 0, "path_tokens": 0, "state": None}
    sched = {
        "phase": "warmup",
        "snap": None,
        "bad": 0,
        "decay_start_step": None,
        "decay_steps": None,
        "f0": None,
        "trigger": None,
        "rewound_to_step": None,
        "peak_steps": None,
    }
    # path_step / path_tokens: counted along the trajectory of the final weights (rewinds undo them)
    step, tokens, path_step, path_tokens = 0, 0, 0, 0
    model.train()
    sync()
    t_train = time.perf_counter()
    loss_acc = torch.zeros((), device=device)
    n_acc = 0
    t_last, tok_last = t_train, 0

    def used() -> float:
        f = (time.perf_counter() - t_train) / budget
        if args.max_steps:
            f = max(f, step / args.max_steps)
        return f

    def lr_now() -> float:
        if sched["phase"] != "decay":
            return args.lr * min(1.0, (path_step + 1) / max(1, args.warmup_steps))
        p = decay_progress()
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))

    def decay_progress() -> float:
        by_steps = (step - sched["decay_start_step"]) / sched["decay_steps"]
        by_budget = (used() - sched["f0"]) / max(1e-9, 1.0 - sched["f0"])
        return max(by_steps, by_budget)

    def start_decay(reason: str):
        nonlocal path_step, path_tokens
        snap = sched["snap"]
        if snap is not None:  # rewind to the best validation point of the constant-LR phase
            model.load_state_dict(snap["model"])
            opt.load_state_dict(snap["opt"])
            path_step, path_tokens = snap["path_step"], snap["path_tokens"]
        sched.update(
            phase="decay",
            trigger=reason,
            decay_start_step=step,
            f0=used(),
            peak_steps=path_step,
            rewound_to_step=path_step,
            decay_steps=max(args.min_decay_steps, round(args.decay_frac * path_step)),
        )
        sched["snap"] = None
        emit(
            {
                "type": "schedule",
                "step": step,
                "tokens": tokens,
                "event": "decay",
                "trigger": reason,
                "rewound_to_step": path_step,
                "decay_steps": sched["decay_steps"],
                "elapsed_s": round(time.perf_counter() - t_train, 2),
            }
        )
        say(
            f"cosine decay starts ({reason}): rewound to step {path_step}, {sched['decay_steps']} decay steps"
        )

    def periodic_eval():
        elapsed = time.perf_counter() - t_train
        vl, _ = eval_loss(model, *val_set, 64, device, autocast)
        hl, _ = eval_loss(model, *ho_set, 64, device, autocast)  # logged for the plot only
        emit(
            {
                "type": "eval",
                "step": step,
                "path_step": path_step,
                "tokens": tokens,
                "elapsed_s": round(elapsed, 2),
                "val_loss": vl,
                "heldout_loss": hl,
                "phase": sched["phase"],
            }
        )
        say(
            f"eval step {step} ({sched['phase']}, epoch {batcher.epoch}): val {vl:.4f} held-out {hl:.4f}"
        )
        improved = vl < best["val_loss"] - args.min_delta
        if vl < best["val_loss"]:
            best.update(
                val_loss=vl,
                step=path_step,
                path_tokens=path_tokens,
                state={k: v.detach().clone() for k, v in model.state_dict().items()},
            )
            if sched["phase"] != "decay":
                sched["snap"] = {
                    "model": best["state"],
                    "opt": copy.deepcopy(opt.state_dict()),
                    "path_step": path_step,
                    "path_tokens": path_tokens,
                }
        if sched["phase"] == "warmup" and path_step >= args.warmup_steps:
            sched["phase"] = "hold"
        if sched["phase"] == "hold":
            sched["bad"] = 0 if improved else sched["bad"] + 1
            if sched["bad"] >= args.patience:
                start_decay("validation plateau")

    while True:
        f = used()
        if f >= 1.0:
            break
        if sched["phase"] == "decay" and decay_progress() >= 1.0:
            break
        if sched["phase"] != "decay" and f >= args.decay_at:
            start_decay("budget")
        lr = lr_now()
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batcher.next()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        path_step += 1
        tokens += x.numel()
        path_tokens += x.numel()
        loss_acc += loss.detach()
        n_acc += 1
        if step % args.log_every == 0 or step == 1:
            sync()
            now = time.perf_counter()
            mean_loss = (loss_acc / n_acc).item()
            tps = (tokens - tok_last) / max(now - t_last, 1e-9)
            emit(
                {
                    "type": "train",
                    "step": step,
                    "path_step": path_step,
                    "tokens": tokens,
                    "loss": mean_loss,
                    "lr": lr,
                    "elapsed_s": round(now - t_train, 2),
                    "tokens_per_s": round(tps),
                    "epoch": batcher.epoch,
                }
            )
            if step % (args.log_every * 10) == 0 or step == 1:
                say(
                    f"step {step} loss {mean_loss:.4f} lr {lr:.2e} {tps:,.0f} tok/s epoch {batcher.epoch}"
                )
            loss_acc.zero_()
            n_acc = 0
            t_last, tok_last = now, tokens
        if step % args.eval_every == 0 or step == 1:
            periodic_eval()
    sync()
    train_time = time.perf_counter() - t_train
    if step % args.eval_every != 0:
        periodic_eval()
    sched.pop("snap", None)
    say(
        f"training done: {step} steps, {tokens:,} tokens in {train_time:.1f}s; best val {best['val_loss']:.4f} "
        f"(trajectory step {best['step']}, {best['path_tokens']:,} tokens)"
    )
    model.load_state_dict(best["state"])
    model.eval()

    # 5. export + held-out perplexity with the saved (bf16) weights ----------------------------
    save_hf_dir(out, model, tok, mc, args.max_position_embeddings)
    from safetensors.torch import load_file

    ev = TinyLlama(mc).to(device)
    ev.load_state_dict(
        {k: v.float() for k, v in load_file(str(out / "model.safetensors")).items()},
        strict=not mc.tie_word_embeddings,
    )
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    nll, n_pred = eval_loss(ev, ho_x, ho_y, 64, device, autocast=False)
    ppl = math.exp(nll)
    # bits per byte of the held-out text; <|bos|> and <|eos|> count as one byte each per file
    bpb = nll * n_pred / math.log(2) / (nbytes["heldout"] + 2 * len(corpus["heldout"]))
    say(
        f"held-out: {n_pred:,} tokens, nll {nll:.4f}, ppl {ppl:.3f}, {bpb:.4f} bits/byte ({time.time() - t0:.1f}s)"
    )
    del ev

    check = check_with_transformers(out, model, device, args.sample_prompt, args.sample_tokens)
    say(f"transformers check: max |logit diff| {check['hf_logits_max_abs_diff']:.2e}")
    say("sample:\n" + args.sample_prompt + check["completion"])

    import tokenizers

    metrics = {
        "params": params,
        "tokens_seen": tokens,
        "steps": step,
        "epochs": tokens / max(1, (len(stream) - 1)),
        "train_time_s": train_time,
        "tokens_per_s": tokens / train_time,
        "time_budget_s": budget,
        "heldout_ppl": ppl,
        "heldout_nll": nll,
        "heldout_tokens": n_pred,
        "heldout_bits_per_byte": bpb,
        "heldout_protocol": (
            f"per file <|bos|> text <|eos|>; windows of {args.seq_len} predicted tokens, context reset per "
            "window; every token after <|bos|> predicted once; saved bf16 weights computed in float32"
        ),
        "best_val_loss": best["val_loss"],
        "best_step": best["step"],
        "tokens_in_final_weights": best["path_tokens"],
        "epochs_in_final_weights": best["path_tokens"] / max(1, (len(stream) - 1)),
        "schedule": sched,
        "final_train_loss": next((r["loss"] for r in reversed(log) if r["type"] == "train"), None),
        "seed": args.seed,
        "device": str(device),
        "device_name": device_name,
        "python_version": platform.python_version(),
        "stdlib_root": str(stdlib),
        "corpus_label": corpus_label,
        "corpus_note": args.corpus_note,
        "torch_version": torch.__version__,
        "tokenizers_version": tokenizers.__version__,
        "split_rule": "bucket = int(sha1(relpath_posix.encode()).hexdigest(), 16) % 20; 0 = held-out, 1 = validation, else train",
        "corpus": {
            "files": {k: len(corpus[k]) for k in ("train", "val", "heldout")},
            "bytes": nbytes,
            "bytes_total": sum(nbytes.values()),
            "tokens": ntok,
            "skipped_files": len(corpus["skipped"]),
        },
        "model_config": {**asdict(mc)},
        "hyperparameters": {
            "time_budget_s": budget,
            "max_steps": args.max_steps,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "min_lr": args.min_lr,
            "warmup_steps": args.warmup_steps,
            "weight_decay": args.weight_decay,
            "beta1": 0.9,
            "beta2": 0.95,
            "grad_clip": args.grad_clip,
            "dropout": args.dropout,
            "autocast": "bf16" if autocast else "none",
            "torch_compile": False,
            "max_files": args.max_files,
            "eval_every": args.eval_every,
            "patience": args.patience,
            "min_delta": args.min_delta,
            "decay_frac": args.decay_frac,
            "min_decay_steps": args.min_decay_steps,
            "decay_at": args.decay_at,
        },
        "transformers_check": {k: check[k] for k in ("hf_logits_max_abs_diff", "hf_logits_scale")},
        "sample": {
            "prompt": args.sample_prompt,
            "new_tokens": args.sample_tokens,
            "completion": check["completion"],
        },
        "chat_template_example": check["chat_template_example"],
        "total_wall_s": time.time() - t_start,
    }
    plot_losses(
        log,
        out / "loss.png",
        f"tiny-coder {params['total'] / 1e6:.1f}M on {device_name}: held-out ppl {ppl:.2f}",
    )
    write_card(out, metrics)
    metrics["total_wall_s"] = time.time() - t_start
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log_f.close()
    size = sum(f.stat().st_size for f in out.iterdir())
    say(f"wrote {out} ({size / 1e6:.2f} MB): " + ", ".join(sorted(f.name for f in out.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
