"""evals.data: held-out file lookup, the training script's window protocol, prompts."""
from __future__ import annotations

import pytest

from evals.data import (
    agreement_prompts,
    default_heldout_list,
    encode_doc,
    encode_docs,
    load_heldout,
    make_windows,
    spaced_indices,
    truncate_windows,
)
from tokenizer.byte_level import byte_level_bundle


def test_windows_predict_every_token_after_bos_once():
    doc = list(range(1, 1 + 1 + 1100))  # bos + 1100 tokens
    for window in (1, 7, 512, 2000):
        wins = make_windows(doc, window)
        targets = [t for _, y in wins for t in y]
        assert targets == doc[1:]
        for i, (x, y) in enumerate(wins):
            # window i reads doc[i*L : i*L+L] and predicts doc[i*L+1 : i*L+L+1]
            assert x == doc[i * window:i * window + len(x)] and len(x) == len(y) <= window
            assert y == doc[i * window + 1:i * window + 1 + len(y)]


def test_truncate_windows_cuts_the_last_window():
    wins = make_windows(list(range(20)), 8)  # 19 predicted tokens: 8 + 8 + 3
    cut = truncate_windows(wins, 10)
    assert [len(y) for _, y in cut] == [8, 2]
    assert cut[1] == (wins[1][0][:2], wins[1][1][:2])
    assert truncate_windows(wins, None) == wins
    assert sum(len(y) for _, y in truncate_windows(wins, 100)) == 19


def test_spaced_indices():
    assert spaced_indices(10, 2) == [2, 7]
    assert spaced_indices(5, 10) == [0, 1, 2, 3, 4]
    idx = spaced_indices(1103, 8)
    assert len(set(idx)) == 8 and idx == sorted(idx) and 0 < idx[0] and idx[-1] < 1103


def test_encode_doc_adds_bos_and_eos():
    tok = byte_level_bundle()
    assert encode_doc(tok, "ab") == [256, ord("a"), ord("b"), 257]
    assert encode_docs(tok, ["ab", "c"]) == [encode_doc(tok, "ab"), encode_doc(tok, "c")]


def test_load_heldout_skips_missing_and_non_utf8(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "b.py").write_bytes(b"\xff\xfe not utf-8")
    (root / "c.py").write_text("y = 2\r\n")  # read as bytes: the CR stays, as in training
    listing = tmp_path / "heldout_files.txt"
    listing.write_text("pkg/a.py\nb.py\nmissing.py\nc.py\n")
    h = load_heldout(listing, root)
    assert [rel for rel, _ in h.files] == ["pkg/a.py", "c.py"]
    assert h.files[1][1] == "y = 2\r\n"
    assert h.missing == ["missing.py"] and h.unreadable == ["b.py"] and h.listed == 4
    assert "2 of 4 held-out files" in h.describe() and "2 skipped" in h.describe()
    assert [rel for rel, _ in load_heldout(listing, root, max_files=1).files] == ["pkg/a.py"]
    with pytest.raises(FileNotFoundError):
        load_heldout(tmp_path / "nope.txt", root)


def test_default_heldout_list_falls_back_to_tiny_coder(tmp_path):
    assert default_heldout_list("tiny").parts[-2:] == ("tiny-coder", "heldout_files.txt")
    (tmp_path / "heldout_files.txt").write_text("a.py\n")
    assert default_heldout_list(str(tmp_path)) == tmp_path / "heldout_files.txt"


def test_agreement_prompts_are_deterministic_and_spread():
    docs = [[1] + list(range(100 * k, 100 * k + 90)) for k in range(1, 4)] + [[1, 5, 6]]
    prompts = agreement_prompts(docs, 7, 10, bos_token_id=1)
    assert prompts == agreement_prompts(docs, 7, 10, bos_token_id=1)
    assert len(prompts) == 7 and all(len(p) == 11 and p[0] == 1 for p in prompts)
    # round 0 starts at 1/2 of each usable document (the 3-token one is skipped), round 1 at 1/4
    assert prompts[0][1:] == docs[0][45:55] and prompts[3][1:] == docs[0][22:32]
    assert prompts[6][1:] == docs[0][68:78]  # round 2: 3/4
    with pytest.raises(ValueError):
        agreement_prompts([[1, 2]], 1, 10, bos_token_id=1)
