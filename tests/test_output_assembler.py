"""The gateway's output assembly when one step brings several tokens (accepted draft tokens of
speculative decoding, issue 28): a stop string, min_tokens and the stop token end the output
exactly where decoding one token per step ends it — the same tokens, logprobs, text and finish
reason — so `completion_tokens` and `logprobs` never count tokens past the stop."""
from __future__ import annotations

import random

import pytest

from gateway.output import OutputAssembler

EOS = 300


def byte_decode(ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _lp(tok: int) -> tuple:
    return (-0.01 * (tok % 97), [tok], [-0.01 * (tok % 97)])


def assemble(ids, chunks, finish, stops, min_tokens=0, include=False):
    """Feed `ids` in chunks of the given sizes (the last chunk carries `finish`)."""
    asm = OutputAssembler(byte_decode, [], stops, include, min_tokens, (EOS,))
    sent_ids, sent_lps, text, i = [], [], "", 0
    sizes = [s for s in chunks if s] or [len(ids)]
    for n, size in enumerate(sizes):
        part = ids[i:i + size] if n < len(sizes) - 1 else ids[i:]
        i += size
        d = asm.add(part, float(n), finish if n == len(sizes) - 1 else None,
                    [_lp(t) for t in part])
        sent_ids += d.token_ids
        sent_lps += d.logprobs or []
        text += d.text
        if asm.finished:
            break
    assert sent_ids == asm.token_ids and sent_lps == asm.logprobs  # deltas add up
    assert len(asm.token_times) == len(asm.token_ids)
    return asm.token_ids, asm.logprobs, asm.text, asm.finish_reason, asm.stopped_by_string


def test_stop_string_inside_a_multi_token_step_cuts_tokens_and_logprobs():
    ids = list(b"x = 1\n\ndef g():\n") + [EOS]
    one = assemble(ids, [1] * len(ids), "stop", ["\n\n"])
    many = assemble(ids, [len(ids)], "stop", ["\n\n"])
    assert one == many
    tokens, lps, text, finish, by_string = many
    assert tokens == list(b"x = 1\n\n") and len(lps) == 7  # up to the token completing it
    assert (text, finish, by_string) == ("x = 1", "stop", True)


def test_min_tokens_is_counted_per_token_inside_a_step():
    ids = list(b"a;b;c;d;e") + [EOS]
    # min_tokens 3: the ';' at 2 is too early, the one at 4 ends the output; a step that
    # brings tokens 1..6 at once must not end at the first ';', nor skip the second
    for min_tokens, num_tokens in ((0, 2), (3, 4), (5, 6)):
        one = assemble(ids, [1] * len(ids), "stop", [";"], min_tokens)
        assert assemble(ids, [1, 6, 3], "stop", [";"], min_tokens) == one
        assert len(one[0]) == num_tokens


def test_a_stop_completed_before_held_back_text_is_found_there():
    """A step "D", "c", half of "😀": decoded whole, its text is held back (an incomplete
    character at the end), which must not hide the "END" that "D" completes, nor let the
    tokens after it through."""
    ids = list(b"xEN") + list("Dc😀!".encode())
    one = assemble(ids, [1] * len(ids), "length", ["END"])
    assert assemble(ids, [3, 3, 10], "length", ["END"]) == one
    assert one[0] == list(b"xEND") and one[2] == "x"


@pytest.mark.parametrize("seed", range(300))
def test_any_chunking_equals_one_token_per_step(seed):
    rng = random.Random(seed)
    words = ["ab", "é", "€", "😀", "\n", " ", "cd", "END", "EN", "D"]
    text = "".join(rng.choice(words) for _ in range(25))
    ids = list(text.encode())
    finish = rng.choice(["length", "stop"])
    if finish == "stop":
        ids.append(EOS)
    stops = rng.sample(["END", "\n\n", "€ ", "😀😀", "zz"], 2)
    min_tokens = rng.choice([0, 0, 4, 15])
    include = rng.random() < 0.3
    chunks = [rng.randint(1, 9) for _ in range(len(ids))]
    assert assemble(ids, chunks, finish, stops, min_tokens, include) == \
        assemble(ids, [1] * len(ids), finish, stops, min_tokens, include)
