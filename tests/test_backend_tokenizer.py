import json
import subprocess
import sys

import pytest

from backend.errors import ModelLoadError
from backend.model.tokenizer import check_vocab, load_tokenizer_bundle
from tokenizer.bundle import TokenizerBundle
from tokenizer.byte_level import byte_level_bundle

DEEPSEEK_LIKE_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}### Instruction:\n{{ message['content'] }}\n"
    "{% else %}### Response:\n{{ message['content'] }}\n{{ eos_token }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}### Response:\n{% endif %}"
)


def write_hf_tokenizer(d, template=DEEPSEEK_LIKE_TEMPLATE, list_template=False):
    b = byte_level_bundle()
    (d / "tokenizer.json").write_text(b.tokenizer_json)
    ct = [{"name": "default", "template": template}] if list_template else template
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|bos|>", "special": True}, "eos_token": "<|eos|>",
        "chat_template": ct}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))


def test_tiny_byte_level_round_trip():
    b = load_tokenizer_bundle("tiny")
    text = "def f(x):\n    return 'héllo 日本'\n"
    ids = b.encode(text)
    assert ids[0] == b.bos_token_id == 256
    assert ids[1:] == list(text.encode("utf-8"))
    assert b.decode(ids) == text
    assert b.vocab_size == 259 and b.eos_token_ids == (257,)
    rendered = b.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered.endswith("<|assistant|>\n") and rendered.startswith("<|bos|>")
    ids = b.encode_chat([{"role": "user", "content": "hi"}])
    assert ids.count(256) == 1 and ids[0] == 256


def test_from_parts_round_trip():
    b = load_tokenizer_bundle("tiny")
    b2 = TokenizerBundle.from_parts(b.tokenizer_json, b.chat_template, b.bos_token_id, list(b.eos_token_ids))
    msgs = [{"role": "user", "content": "x"}]
    assert b2.apply_chat_template(msgs) == b.apply_chat_template(msgs)
    assert b2.encode("abc") == b.encode("abc")


@pytest.mark.parametrize("list_template", [False, True])
def test_hf_dir_matches_transformers(tmp_path, list_template):
    write_hf_tokenizer(tmp_path, list_template=list_template)
    b = load_tokenizer_bundle(tmp_path)
    assert b.bos_token_id == 256 and b.eos_token_ids == (257, 258)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "write f"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                 bos_token="<|bos|>", eos_token="<|eos|>")
    hf.chat_template = DEEPSEEK_LIKE_TEMPLATE
    expected = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert b.apply_chat_template(msgs) == expected
    assert b.encode("some text") == hf("some text")["input_ids"]


def test_chat_template_jinja_file_wins(tmp_path):
    write_hf_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert load_tokenizer_bundle(tmp_path).apply_chat_template([{"role": "user", "content": "a"}]) == "a!"


def test_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="missing file .*tokenizer.json"):
        load_tokenizer_bundle(tmp_path)
    with pytest.raises(ModelLoadError, match="neither a directory nor a preset"):
        load_tokenizer_bundle(tmp_path / "nope")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot be parsed"):
        load_tokenizer_bundle(tmp_path)
    with pytest.raises(ModelLoadError, match="has 259 tokens but the model's vocab_size is 100"):
        check_vocab(byte_level_bundle(), 100)
    check_vocab(byte_level_bundle(), 259)
    check_vocab(byte_level_bundle(), 32256)


def test_tokenizer_module_imports_no_torch():
    code = "import sys, backend.model.tokenizer as t; t.load_tokenizer_bundle('tiny').encode('x'); " \
           "assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
