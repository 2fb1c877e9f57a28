"""Incremental detokenization across split UTF-8 characters, and stop-string matching."""
from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from gateway.detokenizer import IncrementalDetokenizer, StopMatcher


def byte_decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def byte_level_tokenizer() -> Tokenizer:
    """A real `tokenizers` byte-level BPE whose vocabulary is the 256 single bytes."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = {b: c for b, c in zip(range(256), sorted(alphabet, key=_byte_of))}
    vocab = {byte_to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_of(ch: str) -> int:
    # GPT-2's byte<->unicode map: printable bytes map to themselves, the rest to 256+.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(cs, bs))[ord(ch)]


def run_detok(decode, ids, chunk_sizes):
    detok = IncrementalDetokenizer(decode)
    deltas, i = [], 0
    for size in chunk_sizes:
        deltas.append(detok.add(ids[i:i + size]))
        i += size
    deltas.append(detok.add(ids[i:]))
    deltas.append(detok.flush())
    return deltas


TEXTS = ["hello world", "naïve café", "€ and 😀 and 中文字符", "a\u0301 b", "日本語 テキスト 🎉🎉"]


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_never_emits_a_broken_character(text):
    ids = list(text.encode("utf-8"))
    deltas = run_detok(byte_decode, ids, [1] * len(ids))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_random_chunking_against_a_real_byte_level_tokenizer():
    tok = byte_level_tokenizer()
    decode = lambda ids: tok.decode(list(ids))
    rng = random.Random(0)
    for text in TEXTS * 5:
        ids = tok.encode(text).ids
        assert decode(ids) == text
        sizes = [rng.randint(1, 3) for _ in range(len(ids))]
        deltas = run_detok(decode, ids, sizes)
        assert "".join(deltas) == text
        assert all("\ufffd" not in d for d in deltas)


def test_split_euro_sign_is_held_until_complete():
    detok = IncrementalDetokenizer(byte_decode)
    euro = list("€".encode())
    assert detok.add(euro[:1]) == ""
    assert detok.add(euro[1:2]) == ""
    assert detok.add(euro[2:]) == "€"


def test_invalid_bytes_are_flushed_at_the_end():
    detok = IncrementalDetokenizer(byte_decode)
    assert detok.add([ord("a")]) == "a"
    assert detok.add([0xE2, 0x82]) == ""
    assert detok.flush() == "\ufffd"


def test_prompt_context_is_not_emitted():
    detok = IncrementalDetokenizer(byte_decode, prompt_ids=list(b"the prompt "))
    assert detok.add(list(b"ok")) == "ok"


def feed_all(stops, deltas):
    m = StopMatcher(stops)
    out = [m.feed(d) for d in deltas]
    out.append(m.flush())
    return out, m


def test_stop_string_split_across_deltas_is_held_and_excluded():
    out, m = feed_all(["STOP"], ["abc S", "T", "OP tail"])
    assert out == ["abc ", "", "", ""]
    assert m.stopped and m.matched == "STOP"


def test_partial_stop_prefix_released_when_it_does_not_complete():
    out, m = feed_all(["STOP"], ["abc ST", "x", "y"])
    assert "".join(out) == "abc STxy"
    assert out[0] == "abc "
    assert not m.stopped


def test_earliest_of_several_stops_wins():
    out, m = feed_all(["world", "lo"], ["hello world"])
    assert "".join(out) == "hel"
    assert m.matched == "lo"


def test_held_suffix_flushed_at_the_end():
    out, m = feed_all(["\n\n"], ["line\n"])
    assert out == ["line", "\n"]
    assert not m.stopped


@pytest.mark.parametrize("seed", range(20))
def test_stop_matching_equals_truncation_for_any_chunking(seed):
    rng = random.Random(seed)
    alphabet = "ab\nc"
    text = "".join(rng.choice(alphabet) for _ in range(60))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(2)]
    cuts = sorted(rng.sample(range(1, len(text)), 10))
    deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
    out, m = feed_all(stops, deltas)
    expected, matched = reference_stop(text, stops)
    assert "".join(out) == expected
    assert m.stopped == (matched is not None) and m.matched == matched


def reference_stop(text, stops, include=False):
    """Scan every end position; the first where a stop ends (the longest one) cuts the text."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return (text[:end] if include else text[:end - len(stop)]), stop
    return text, None


@pytest.mark.parametrize("seed", range(30))
def test_many_overlapping_stops_one_char_at_a_time(seed):
    rng = random.Random(100 + seed)
    alphabet = "abc"
    text = "".join(rng.choice(alphabet) for _ in range(80))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 7))) for _ in range(16)]
    include = seed % 2 == 1
    m = StopMatcher(stops, include_stop=include)
    out = "".join(m.feed(ch) for ch in text) + m.flush()
    expected, matched = reference_stop(text, stops, include)
    assert out == expected and m.matched == matched


def test_a_stop_that_starts_earlier_but_ends_later_loses():
    # generation stops at the first completed stop: "bc" ends before "abcd" does
    out, m = feed_all(["abcd", "bc"], ["xabcd"])
    assert "".join(out) == "xa" and m.matched == "bc"


def test_include_stop_str_keeps_the_stop():
    m = StopMatcher(["STOP"], include_stop=True)
    out = [m.feed("abc S"), m.feed("TOP and more"), m.flush()]
    assert out == ["abc ", "STOP", ""] and m.stopped


def test_skip_passes_text_through_unmatched_then_matching_resumes():
    m = StopMatcher(["\n"])
    assert m.skip("a\nb") == "a\nb" and not m.stopped
    assert m.feed("c\nd") == "c" and m.stopped
