"""A model directory with a preset's config and a byte-level BPE tokenizer of the preset's
vocabulary size, trained here on this Python's standard library (no download).

    python -m bench.structured.vocab OUT_DIR [--preset deepseek-coder-33b] [--max-mb 24]

With `--load-format dummy` the directory serves random weights of the preset's shape behind a
tokenizer as large as DeepSeek-Coder's (32,000 merges' worth), so a grammar's mask costs what it
would with the real vocabulary; the presets' own tokenizer is byte-level (258 ids), whose masks
are far cheaper than a real model's.
"""
from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from backend.config import PRESETS_DIR

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]


def corpus(max_bytes: int):
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        total += len(text)
        if total > max_bytes:
            return
        yield text


def build(out: Path, preset: str, max_mb: float) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    config = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    vocab = int(config["vocab_size"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 8, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(int(max_mb * 2**20)), trainer)
    out.mkdir(parents=True, exist_ok=True)
    config.update(bos_token_id=1, eos_token_id=2)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": True}))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--preset", default="deepseek-coder-33b")
    p.add_argument("--max-mb", type=float, default=24.0)
    args = p.parse_args(argv)
    out = build(Path(args.out), args.preset, args.max_mb)
    from tokenizers import Tokenizer

    n = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    print(f"{out}: {args.preset} config, BPE tokenizer of {n} ids")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
