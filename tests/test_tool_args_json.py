"""gateway/tool_args_json.py: the streamed rewrite of a call's JSON arguments. Whatever JSON the
model writes (any whitespace, any escapes, surrogate pairs, numbers in any form) and however the
text is cut into pieces, the pieces add up to exactly json.dumps(json.loads(text),
ensure_ascii=False), the arguments string of a call returned whole; and the writer stops where
json.loads would refuse the text."""
from __future__ import annotations

import json
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tool_args_json import JsonArgsWriter, rewrite

SCALARS = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.text(max_size=6), kids, max_size=4), max_leaves=20)
OBJECTS = st.dictionaries(st.text(max_size=8), VALUES, max_size=5)


def _string(s: str, rng: random.Random) -> str:
    """`s` as a JSON string, each character written one of the ways json.loads reads it."""
    out = ['"']
    for ch in s:
        named = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
                 "\f": "\\f", "/": "\\/"}
        ways = []
        if ch in named:
            ways.append(named[ch])
        if ch not in '"\\' and ord(ch) >= 0x20:
            ways.append(ch)
        if ord(ch) < 0x10000:
            ways.append(f"\\u{ord(ch):04x}")
            ways.append(f"\\u{ord(ch):04X}")
        else:  # a surrogate pair
            hi, lo = 0xD800 + ((ord(ch) - 0x10000) >> 10), 0xDC00 + ((ord(ch) - 0x10000) & 0x3FF)
            ways.append(f"\\u{hi:04x}\\u{lo:04x}")
        out.append(rng.choice(ways))
    out.append('"')
    return "".join(out)


def _number(v, rng: random.Random) -> str:
    if isinstance(v, float) and math.isfinite(v) and rng.random() < 0.3:
        return f"{v:.17e}" if rng.random() < 0.5 else f"{v:.17E}"
    return json.dumps(v)


def _write(v, rng: random.Random) -> str:
    """`v` as JSON text with random whitespace and escapes (as a model might write it)."""
    def ws():
        return rng.choice(["", "", " ", "\n", "  ", "\t", "\r\n "])
    if isinstance(v, dict):
        items = [ws() + _string(k, rng) + ws() + ":" + ws() + _write(x, rng) + ws()
                 for k, x in v.items()]
        return "{" + (",".join(items) if items else ws()) + "}"
    if isinstance(v, list):
        items = [ws() + _write(x, rng) + ws() for x in v]
        return "[" + (",".join(items) if items else ws()) + "]"
    if isinstance(v, str):
        return _string(v, rng)
    if isinstance(v, (bool, type(None))):
        return json.dumps(v)
    return _number(v, rng)


def _pieces(text: str, cuts: list[int], start: int = 0) -> tuple[JsonArgsWriter, list[str]]:
    w = JsonArgsWriter(start)
    got = []
    for c in sorted(set(cuts)) + [len(text)]:
        got.append(w.write(text, c))
    got.append(w.write(text, len(text), final=True))
    return w, got


@settings(max_examples=400, deadline=None)
@given(OBJECTS, st.integers(0, 2**32), st.lists(st.integers(0, 4000), max_size=30))
def test_pieces_add_up_to_the_whole_rewrite_whatever_the_chunking(obj, seed, cuts):
    rng = random.Random(seed)
    text = _write(obj, rng) + rng.choice(["", "\n", "}\n</tool_call>"])
    want = json.dumps(obj, ensure_ascii=False)
    body = text[:len(_write_end(text))]
    assert json.dumps(json.loads(body), ensure_ascii=False) == want
    w, got = _pieces(text, [c % (len(text) + 1) for c in cuts])
    assert w.done and not w.invalid and "".join(got) == want == w.text
    assert w.end == len(body)
    # per character: the most pieces a stream can send
    w, got = _pieces(text, list(range(len(text))))
    assert "".join(got) == want


def _write_end(text: str) -> str:
    w = rewrite(text)
    return text[:w.end]


@settings(max_examples=300, deadline=None)
@given(OBJECTS, st.integers(0, 2**32), st.data())
def test_a_cut_object_gives_a_prefix_and_ends_invalid(obj, seed, data):
    rng = random.Random(seed)
    text = _write(obj, rng)
    n = data.draw(st.integers(0, len(text) - 1))
    w = JsonArgsWriter(0)
    got = w.write(text[:n], n)  # (while more may come, what is written is the whole's start)
    assert json.dumps(obj, ensure_ascii=False).startswith(got)
    w.write(text[:n], n, final=True)  # (at the end, a number there is taken as written)
    assert not w.done and w.invalid


# damaged JSON: the writer stops exactly where json.loads gives up, and never raises
@settings(max_examples=600, deadline=None)
@given(OBJECTS, st.integers(0, 2**32), st.data())
def test_damaged_json_agrees_with_json_loads(obj, seed, data):
    rng = random.Random(seed)
    text = _write(obj, rng)
    k = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.sampled_from(['"', "\\", "\\u12", "\\x", ",", ":", "}", "]", "{", "[",
                                      "01", "-", "1.", "1e", "tru", "\x01", " ", "nul", "-I",
                                      "\\ud800", "\\ud800\\u12g4", "\\ud800\\udc00"]))
    bad = text[:k] + junk + text[k + data.draw(st.integers(0, 2)):]
    w, got = _pieces(bad, [data.draw(st.integers(0, len(bad)))])
    pairs: list = []

    def hook(kv):
        pairs.append([k for k, _ in kv])
        return dict(kv)
    try:
        value = json.loads(bad[:w.end] if w.done else bad, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        value = None
    if w.done:  # a complete object: json.loads reads it the same (keys repeated aside)
        assert isinstance(value, dict)
        if all(len(ks) == len(set(ks)) for ks in pairs):
            assert "".join(got) == json.dumps(value, ensure_ascii=False)
    else:
        assert w.invalid and not isinstance(value, dict)


def test_a_long_string_goes_out_as_it_is_written():
    text = '{"path": "a.py", "content": "' + "x = 1\\n" * 2000 + '"}'
    w = JsonArgsWriter(0)
    got = [w.write(text, n) for n in range(0, len(text), 97)] + [w.write(text, len(text))]
    assert sum(1 for g in got if g) > 100 and "".join(got) == json.dumps(json.loads(text))
    # only a token's end is waited for: an escape cut in two waits for its second half
    w = JsonArgsWriter(0)
    assert w.write('{"a": "x\\', 9) == '{"a": "x'
    assert w.write('{"a": "x\\n', 10) == "\\n"
    assert w.write('{"a": "x\\nyz", "b": 12', 22) == 'yz", "b": '  # (12 may go on: 123)
    assert w.write('{"a": "x\\nyz", "b": 123}', 24) == "123}" and w.done


def test_repeated_keys_are_kept_as_written():
    # json.loads keeps the last value; a stream cannot take back the first, so both stay
    assert rewrite('{"a": 1, "a": 2}').text == '{"a": 1, "a": 2}'
