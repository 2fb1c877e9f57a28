"""The tokenizer bundle: vocabulary, chat template and special tokens, as both ends use them.

The backend sends `tokenizer_json` and `chat_template` in `BackendInfo`; the gateway rebuilds
the same `TokenizerBundle` from them (`TokenizerBundle.from_parts`), so both ends always agree
on the vocabulary. This package is a leaf: `tokenizers` and `jinja2` only (imported lazily), no
torch and nothing of ours, so the gateway and the backend may both import it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any


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
