"""FIM template detection and layout on byte-level tokenizers with and without FIM tokens."""
import pytest

from tokenizer.bundle import TokenizerBundle
from tokenizer.byte_level import build_byte_level_tokenizer_json
from tokenizer.fim import FimTemplate, find_fim_template


def bundle_with(tokens):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(build_byte_level_tokenizer_json())
    tok.add_special_tokens(tokens)
    return TokenizerBundle.from_parts(tok.to_str(), None, 256, (257,), "t")


def test_deepseek_and_starcoder_families_are_found_and_laid_out():
    b = bundle_with(["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"])
    t = find_fim_template(b)
    assert t.encode(b, "ab", "c") == [256, 259, 97, 98, 260, 99, 261]
    assert t.encode(b, "", "") == [256, 259, 260, 261]
    b = bundle_with(["<fim_prefix>", "<fim_middle>", "<fim_suffix>"])
    assert find_fim_template(b).encode(b, "a", "b") == [256, 259, 97, 261, 98, 260]


def test_no_fim_tokens_means_no_template_and_an_operator_template_wins():
    plain = TokenizerBundle.from_parts(build_byte_level_tokenizer_json(), None, 256, (257,))
    assert find_fim_template(plain) is None
    t = find_fim_template(plain, "<|eos|>{suffix}<|pad|>{prefix}")
    assert t.encode(plain, "a", "b") == [256, 257, 98, 258, 97]


@pytest.mark.parametrize("bad", ["{prefix}", "{prefix}{prefix}{suffix}", "no placeholders"])
def test_bad_templates_are_refused(bad):
    with pytest.raises(ValueError):
        FimTemplate(bad)
