"""The byte-level tokenizer built in code (no files): ids 0..255 are the bytes, then
<|bos|>, <|eos|>, <|pad|>. The `tiny` preset, the echo backend and the random-weight presets
(which ship no tokenizer) use it; tests build fake backends with it."""
from __future__ import annotations

from tokenizer.bundle import TokenizerBundle

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
