"""Fill-in-the-middle end to end: `tidegate serve` on a checkpoint whose tokenizer has
DeepSeek-Coder's FIM tokens, driven by the openai SDK. The prompt the backend received must be
the FIM layout, and the completion transformers' greedy continuation of it."""
from __future__ import annotations

from pathlib import Path

import openai
import pytest
from serve_helpers import serving

from tests.backend_helpers import hf_greedy, hf_model, make_checkpoint
from tokenizer.byte_level import build_byte_level_tokenizer_json

FIM = ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"]  # ids 259, 260, 261
pytestmark = pytest.mark.slow


def fim_checkpoint(root: Path) -> Path:
    from tokenizers import Tokenizer

    path = make_checkpoint(root, "gqa1_untied_oddvocab")  # vocab 263: bytes, 3 specials, 3 FIM, 1
    tok = Tokenizer.from_str(build_byte_level_tokenizer_json())
    tok.add_special_tokens(FIM)
    assert [tok.token_to_id(t) for t in FIM] == [259, 260, 261]
    (path / "tokenizer.json").write_text(tok.to_str())
    return path


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    path = fim_checkpoint(tmp_path_factory.mktemp("fim"))
    with serving("--model", str(path)) as s:
        yield {**s, "path": path}


def test_suffix_builds_the_fim_prompt_and_generates_the_middle(fim_server):
    sdk = openai.OpenAI(base_url=fim_server["url"] + "/v1", api_key="unused", max_retries=0)
    prefix, suffix = "def add(a, b):\n    ", "\n    return c\n"
    out = sdk.completions.create(model=fim_server["model"], prompt=prefix, suffix=suffix,
                                 max_tokens=8, temperature=0,
                                 extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = out.choices[0]
    want_prompt = [256, 259, *prefix.encode(), 260, *suffix.encode(), 261]
    assert choice.prompt_token_ids == want_prompt
    assert choice.token_ids == hf_greedy(hf_model(fim_server["path"]), want_prompt, 8)
    assert out.usage.prompt_tokens == len(want_prompt)
    # streaming gives the same middle
    chunks = list(sdk.completions.create(model=fim_server["model"], prompt=prefix, suffix=suffix,
                                         max_tokens=8, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text


def test_token_prompt_with_suffix_is_a_400(fim_server):
    sdk = openai.OpenAI(base_url=fim_server["url"] + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model=fim_server["model"], prompt=[1, 2, 3], suffix="x",
                               max_tokens=2)
    assert info.value.body["param"] == "suffix"
