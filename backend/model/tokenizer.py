"""Where a backend's tokenizer comes from: an HF model directory or a preset name. No torch here.

- an HF model directory (`tokenizer.hf_dir`);
- a preset name: `tiny` (and the random-weight deepseek presets, which ship no tokenizer) get
  the byte-level tokenizer of `tokenizer.byte_level`.
The bundle itself lives in the torch-free `tokenizer/` package, which the gateway imports too.
"""
from __future__ import annotations

import os
from pathlib import Path

from backend.errors import ModelLoadError
from tokenizer.bundle import TokenizerBundle
from tokenizer.byte_level import byte_level_bundle
from tokenizer.hf_dir import TokenizerFileError, load_hf_dir


def load_tokenizer_bundle(path_or_preset: str | os.PathLike) -> TokenizerBundle:
    """Tokenizer of an HF model directory, or the byte-level tokenizer of a preset name."""
    path = Path(path_or_preset)
    if not path.is_dir():
        from backend.config import PRESETS  # data only, no torch

        if str(path_or_preset) in PRESETS:
            return byte_level_bundle(str(path_or_preset))
        raise ModelLoadError(f"model {str(path_or_preset)!r} is neither a directory nor a preset "
                             f"({', '.join(PRESETS)})")
    try:
        return load_hf_dir(path)
    except TokenizerFileError as exc:
        raise ModelLoadError(str(exc)) from None


def check_vocab(bundle: TokenizerBundle, model_vocab_size: int) -> None:
    """A tokenizer may have fewer ids than the model's (padded) embedding, never more."""
    if bundle.vocab_size > model_vocab_size:
        raise ModelLoadError(
            f"tokenizer {bundle.name!r} has {bundle.vocab_size} tokens but the model's vocab_size "
            f"is {model_vocab_size}: tokenizer and model do not match")
