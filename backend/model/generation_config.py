"""A model's sampling defaults from its `generation_config.json`, as vLLM's `--generation-config`.

    tidegate backend --model DIR [--generation-config auto|none|DIR]

`auto` (the default) reads `DIR/generation_config.json` of the model when there is one; `none`
(or `vllm`, vLLM's name for it) uses the API's own defaults; any other value is a directory whose
`generation_config.json` is read instead. Of that file only the sampling fields vLLM takes are
used (`ModelConfig.get_diff_sampling_param`: temperature, top_p, top_k, min_p,
repetition_penalty, and max_new_tokens as max_tokens), plus presence_penalty and
frequency_penalty, which vLLM's requests have and Hugging Face's file may carry; the rest of the
file (token ids, do_sample, ...) is ignored, as vLLM ignores it. The backend sends the result in
`BackendInfo.generation_defaults`; the gateway uses a default for a field only when the request
leaves that field out (`gateway.generation_defaults`). A value the API would refuse in a request
is refused here, at start-up.

stdlib only: the gateway's tests and `tidegate serve` read it too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from backend.errors import ModelLoadError

FILE = "generation_config.json"
OFF = ("none", "vllm")
# file key -> request field, and the range the request's own validation accepts
FIELDS: dict[str, tuple[str, float, float]] = {
    "temperature": ("temperature", 0.0, 2.0),
    "top_p": ("top_p", 0.0, 1.0),
    "top_k": ("top_k", -1.0, 2**31 - 1),
    "min_p": ("min_p", 0.0, 1.0),
    "repetition_penalty": ("repetition_penalty", 0.0, 10.0),
    "presence_penalty": ("presence_penalty", -2.0, 2.0),
    "frequency_penalty": ("frequency_penalty", -2.0, 2.0),
    "max_new_tokens": ("max_tokens", 1.0, 2**31 - 1),
}
INTEGER = ("top_k", "max_tokens")


def generation_config_path(source: str, model: str) -> Path | None:
    """The file `source` names for `model` (module docstring); None: no defaults."""
    if source in OFF:
        return None
    if source == "auto":
        path = Path(model) / FILE
        return path if path.is_file() else None  # a preset or a directory without one
    path = Path(source)
    path = path / FILE if path.is_dir() else path
    if not path.is_file():
        raise ModelLoadError(f"--generation-config {source!r}: no {FILE} there (give auto, none "
                             f"or a directory holding one)")
    return path


def sampling_defaults(config: dict) -> dict[str, float]:
    """The request fields a generation config sets: {field: value}, checked (ModelLoadError)."""
    out: dict[str, float] = {}
    for key, (field, lo, hi) in FIELDS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or not lo <= value <= hi:
            raise ModelLoadError(f"{FILE}: {key} must be a number in [{lo:g}, {hi:g}], "
                                 f"got {value!r}")
        if field in INTEGER and value != int(value):
            raise ModelLoadError(f"{FILE}: {key} must be an integer, got {value!r}")
        if key in ("top_p", "repetition_penalty") and value == 0:
            raise ModelLoadError(f"{FILE}: {key} must be > 0, got 0")
        out[field] = float(value)
    return out


def load_generation_defaults(source: str, model: str) -> dict[str, float]:
    """`--generation-config SOURCE` for `--model MODEL`: the sampling defaults to announce."""
    path = generation_config_path(source, model)
    if path is None:
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a JSON generation config ({exc})") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: not a JSON object")
    return sampling_defaults(config)
