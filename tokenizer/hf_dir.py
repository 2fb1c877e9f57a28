"""A Hugging Face model directory's tokenizer, read without torch: `tokenizer.json`,
`tokenizer_config.json` (chat_template, bos/eos tokens; a `chat_template.jinja` file wins when
present), `generation_config.json` / `config.json` eos ids. The backend loads its model's this way
(`backend.model.tokenizer`), and the gateway loads the one it gives HTTP backends
(`tidegate serve --tokenizer DIR`). Problems raise `TokenizerFileError` (a ValueError).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizer.bundle import TokenizerBundle


class TokenizerFileError(ValueError):
    """A tokenizer file is missing or unreadable."""


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.exists():
        if required:
            raise TokenizerFileError(f"missing file {path}")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerFileError(f"{path} is not valid JSON ({exc})") from None


def _token_str(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_hf_dir(path: Path) -> TokenizerBundle:
    tj_path = path / "tokenizer.json"
    if not tj_path.exists():
        raise TokenizerFileError(f"missing file {tj_path} (only fast tokenizers are supported)")
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
        raise TokenizerFileError(f"{tj_path} cannot be parsed: {str(exc).splitlines()[0]}") from None

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
