"""Tokenizer bundle: what a gateway needs to tokenize for a backend. No torch here.

The backend sends `tokenizer_json` and `chat_template` in `BackendInfo`; the gateway rebuilds
the same `TokenizerBundle` from them (`TokenizerBundle.from_parts`), so both ends always agree
on the vocabulary.

Sources:
- an HF model directory: `tokenizer.json`, `tokenizer_config.json` (chat_template, bos/eos
  tokens; a `chat_template.jinja` file wins when present), `generation_config.json` eos ids;
- a preset name: `tiny` (and the random-weight deepseek presets, which ship no tokenizer) get a
  byte-level tokenizer built in code: ids 0..255 are the bytes, then <|bos|>, <|eos|>, <|pad|>.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from backend.errors import ModelLoadError

BYTE_BOS, BYTE_EOS, BYTE_PAD = "<|bos|>", "<|eos|>", "<|pad|>"
BYTE_VOCAB_SIZE = 259

# A small ChatML-like template for the byte-level tokenizer.
SIMPLE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class TokenizerBundle:
    tokenizer_json: str
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    name: str = ""
    bos_token: str | None = None
    eos_token: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_parts(cls, tokenizer_json: str, chat_template: str | None, bos_token_id: int | None,
                   eos_token_ids: tuple[int, ...] | list[int], name: str = "") -> TokenizerBundle:
        """Rebuild a bundle from the fields carried by `BackendInfo`."""
        b = cls(tokenizer_json, chat_template or None, bos_token_id, tuple(eos_token_ids), name)
        tok = b.tokenizer
        bos = None if bos_token_id is None else tok.id_to_token(bos_token_id)
        eos = tok.id_to_token(b.eos_token_ids[0]) if b.eos_token_ids else None
        object.__setattr__(b, "bos_token", bos)
        object.__setattr__(b, "eos_token", eos)
        return b

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.tokenizer_json)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (including added special tokens)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render `messages` with the chat template (jinja2, sandboxed, HF conventions)."""
        if not self.chat_template:
            raise ValueError(f"tokenizer {self.name!r} has no chat template")
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a rendered chat; the template places the special tokens itself."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt),
                           add_special_tokens=False)

    @cached_property
    def _compiled_template(self):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent, ensure_ascii=False)
        return env.from_string(self.chat_template)

    def check_vocab(self, model_vocab_size: int) -> None:
        """A tokenizer may have fewer ids than the model's (padded) embedding, never more."""
        if self.vocab_size > model_vocab_size:
            raise ModelLoadError(
                f"tokenizer {self.name!r} has {self.vocab_size} tokens but the model's vocab_size "
                f"is {model_vocab_size}: tokenizer and model do not match")


def build_byte_level_tokenizer_json() -> str:
    """A byte-level BPE with no merges: one token per byte (id == byte value), then specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    byte_to_char = _bytes_to_unicode()
    assert sorted(alphabet) == sorted(byte_to_char.values())
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BYTE_BOS, BYTE_EOS, BYTE_PAD])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BYTE_BOS} $A", pair=f"{BYTE_BOS} $A $B", special_tokens=[(BYTE_BOS, 256)])
    return tok.to_str()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def byte_level_bundle(name: str = "tiny") -> TokenizerBundle:
    return TokenizerBundle(
        tokenizer_json=build_byte_level_tokenizer_json(), chat_template=SIMPLE_CHAT_TEMPLATE,
        bos_token_id=256, eos_token_ids=(257,), name=name, bos_token=BYTE_BOS, eos_token=BYTE_EOS)


def load_tokenizer_bundle(path_or_preset: str | os.PathLike) -> TokenizerBundle:
    """Tokenizer of an HF model directory, or the byte-level tokenizer of a preset name."""
    path = Path(path_or_preset)
    if not path.is_dir():
        from backend.config import PRESETS  # data only, no torch

        if str(path_or_preset) in PRESETS:
            return byte_level_bundle(str(path_or_preset))
        raise ModelLoadError(f"model {str(path_or_preset)!r} is neither a directory nor a preset "
                             f"({', '.join(PRESETS)})")
    return _load_hf_dir(path)


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise ModelLoadError(f"missing file {path}")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON ({exc})") from None


def _token_str(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


def _load_hf_dir(path: Path) -> TokenizerBundle:
    tj_path = path / "tokenizer.json"
    if not tj_path.exists():
        raise ModelLoadError(f"missing file {tj_path} (only fast tokenizers are supported)")
    tokenizer_json = tj_path.read_text(encoding="utf-8")
    tcfg = _read_json(path / "tokenizer_config.json", required=False)
    mcfg = _read_json(path / "config.json", required=False)
    gcfg = _read_json(path / "generation_config.json", required=False)

    chat_template = tcfg.get("chat_template")
    if isinstance(chat_template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in chat_template}
        chat_template = named.get("default") or next(iter(named.values()), None)
    jinja_file = path / "chat_template.jinja"
    if jinja_file.exists():
        chat_template = jinja_file.read_text(encoding="utf-8")

    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # noqa: BLE001 -- tokenizers raises plain Exception subclasses
        raise ModelLoadError(f"{tj_path} cannot be parsed: {str(exc).splitlines()[0]}") from None

    bos_token = _token_str(tcfg.get("bos_token"))
    eos_token = _token_str(tcfg.get("eos_token"))
    bos_id = tok.token_to_id(bos_token) if bos_token else None
    if bos_id is None:
        bos_id = gcfg.get("bos_token_id", mcfg.get("bos_token_id"))
    eos_ids: list[int] = []
    for source in (gcfg.get("eos_token_id"), mcfg.get("eos_token_id"),
                   tok.token_to_id(eos_token) if eos_token else None):
        for e in (source if isinstance(source, list) else [source]):
            if e is not None and int(e) not in eos_ids:
                eos_ids.append(int(e))
    if bos_token is None and bos_id is not None:
        bos_token = tok.id_to_token(int(bos_id))
    if eos_token is None and eos_ids:
        eos_token = tok.id_to_token(eos_ids[0])
    return TokenizerBundle(
        tokenizer_json=tokenizer_json, chat_template=chat_template,
        bos_token_id=None if bos_id is None else int(bos_id), eos_token_ids=tuple(eos_ids),
        name=path.name, bos_token=bos_token, eos_token=eos_token)
