"""Fill-in-the-middle prompts: the model family's template, found among the tokenizer's tokens.

A FIM prompt puts the text before and after the hole around the family's sentinel tokens; the
model then generates the middle. The sentinels must be single tokens of the vocabulary (special
added tokens), otherwise the model was never taught FIM and the request is refused.

    DeepSeek-Coder  <｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>
    StarCoder       <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>
    Qwen2.5-Coder   <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>

A template given by the operator (`--fim-template`) uses the same `{prefix}` / `{suffix}`
placeholders; its literal parts are tokenized as text (added tokens inside them are matched).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tokenizer.bundle import TokenizerBundle

KNOWN_TEMPLATES = (
    "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
    "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
    "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
)
_PLACEHOLDER = re.compile(r"\{(prefix|suffix)\}")


@dataclass(frozen=True)
class FimTemplate:
    template: str

    def __post_init__(self) -> None:
        names = _PLACEHOLDER.findall(self.template)
        if sorted(names) != ["prefix", "suffix"]:
            raise ValueError("a FIM template needs exactly one {prefix} and one {suffix}, got "
                             f"{self.template!r}")

    def encode(self, bundle: TokenizerBundle, prefix: str, suffix: str) -> list[int]:
        """Prompt ids: BOS (when the tokenizer adds one), then the template with the two texts
        tokenized on their own (no text merges into a sentinel; special-token text inside
        them is matched as in any prompt)."""
        texts = {"prefix": prefix, "suffix": suffix}
        ids = [bundle.bos_token_id] if _adds_bos(bundle) else []
        pos = 0
        for m in _PLACEHOLDER.finditer(self.template):
            literal = self.template[pos:m.start()]
            if literal:
                ids += bundle.encode(literal, add_special_tokens=False)
            if texts[m.group(1)]:
                ids += bundle.encode(texts[m.group(1)], add_special_tokens=False)
            pos = m.end()
        if self.template[pos:]:
            ids += bundle.encode(self.template[pos:], add_special_tokens=False)
        return ids


def _adds_bos(bundle: TokenizerBundle) -> bool:
    if bundle.bos_token_id is None:
        return False
    return bundle.encode("a")[:1] == [bundle.bos_token_id]


def _sentinels(template: str) -> list[str]:
    return [s for s in _PLACEHOLDER.split(template) if s and s not in ("prefix", "suffix")]


def find_fim_template(bundle: TokenizerBundle, template: str | None = None) -> FimTemplate | None:
    """The operator's template, else the first known family whose sentinels are all single
    tokens of this vocabulary; None when the model has no FIM tokens."""
    if template:
        return FimTemplate(template)
    tok = bundle.tokenizer
    for known in KNOWN_TEMPLATES:
        if all(tok.token_to_id(s) is not None for s in _sentinels(known)):
            return FimTemplate(known)
    return None
