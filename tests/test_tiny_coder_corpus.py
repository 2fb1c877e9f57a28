"""tiny-coder's corpus rules and FIM documents (training/corpus.py,
training/train.py prepare): licences, de-duplication, held-out packages, FIM layout."""
from __future__ import annotations

import email.message
import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    return importlib.import_module({"build_tiny_coder_corpus": "training.corpus",
                                    "train_tiny_coder": "training.train"}[name])


@pytest.fixture(scope="module")
def builder():
    return _module("build_tiny_coder_corpus")


@pytest.fixture(scope="module")
def trainer():
    pytest.importorskip("tokenizers")
    return _module("train_tiny_coder")


def _meta(**fields) -> email.message.Message:
    m = email.message.Message()
    for k, v in fields.items():
        if isinstance(v, list):
            for x in v:
                m[k.replace("_", "-")] = x
        else:
            m[k.replace("_", "-")] = v
    return m


def test_licence_rule(builder):
    ok = lambda meta: builder.permissive(builder.licence_of(meta)[1])
    assert ok(_meta(License_Expression="Apache-2.0 AND (MIT OR BSD-3-Clause)"))
    assert ok(_meta(License_Expression="Apache-2.0 WITH LLVM-exception"))
    assert not ok(_meta(License_Expression="MPL-2.0"))
    assert not ok(_meta(License_Expression="MPL-2.0 AND MIT"))  # every part must be permissive
    assert not ok(_meta(License_Expression="GPL-3.0-or-later"))
    assert ok(_meta(License="", Classifier=["License :: OSI Approved :: BSD License"]))
    assert ok(_meta(License="Apache 2.0 License"))
    assert not ok(_meta(License="Some custom terms"))  # unknown: left out
    assert not ok(_meta())


def test_heldout_and_validation_are_disjoint_packages(builder):
    assert not set(builder.HELDOUT) & set(builder.VALIDATION)


def test_near_duplicates_dropped_in_priority_order(builder):
    rng = random.Random(0)
    words = [f"name{i}" for i in range(300)]
    base = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(200))
    lines = base.split("\n")
    near = "\n".join(lines[:-3] + ["changed line one", "changed two"])  # ~98% the same
    other = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(200))
    items = [{"path": "heldout.py", "text": base}, {"path": "exact.py", "text": base + "  \n"},
             {"path": "near.py", "text": near}, {"path": "other.py", "text": other}]
    stats = builder.dedupe(items, lambda msg: None)
    assert items[0]["dup"] is None and items[3]["dup"] is None
    assert items[1]["dup"] == "exact: heldout.py"
    assert items[2]["dup"] == "near: heldout.py"
    assert stats["exact"] == 1 and stats["near"] == 1


def test_a_lower_source_cap_dilutes_the_largest_source(builder):
    doc = "def f(x):\n    \"\"\"\n    >>> f(1)\n    2\n    \"\"\"\n    return x + 1\n"
    plain = "x = 1\n" * 12
    d, p, prompt = len(doc), len(plain), len("    >>> f(1)\n")
    items = ([{"split": "train", "source": "big", "path": f"big/{i}.py", "text": doc, "dup": None}
              for i in range(8)]
             + [{"split": "train", "source": "small", "path": "small/a.py", "text": plain,
                 "dup": None},
                {"split": "train", "source": builder.STDLIB, "path": "std/a.py", "text": plain,
                 "dup": None},
                {"split": "heldout", "source": "h", "path": "h/a.py", "text": doc, "dup": None},
                {"split": "train", "source": "big", "path": "big/dup.py", "text": doc,
                 "dup": "exact: big/0.py"}])
    assert builder.doctest_bytes(doc) == prompt
    before = builder.training_shares(items)
    assert before["bytes"] == 8 * d + 2 * p  # held-out and dropped files do not count
    assert before["sources"][0]["name"] == "big"
    assert before["sources"][0]["share"] == pytest.approx(8 * d / (8 * d + 2 * p))
    assert before["doctest_share"] == pytest.approx(8 * prompt / (8 * d + 2 * p))
    assert before["sources"][0]["share_of_doctest_bytes"] == 1.0
    # a cap of 4.5 files keeps 4 of big's 8 (path-hash order); the standard library is exempt
    assert builder.cap_sources(items, 4 * d + d // 2) == 4
    after = builder.training_shares(items)
    assert after["bytes"] == 4 * d + 2 * p
    assert after["sources"][0]["share"] == pytest.approx(4 * d / (4 * d + 2 * p))
    assert after["sources"][0]["share"] < before["sources"][0]["share"]
    assert {it["path"] for it in items if it["dup"] == "cap"} <= {f"big/{i}.py" for i in range(8)}


def test_fim_documents(trainer):
    text = "".join(f"line {i} = {i * i}\n" for i in range(400))
    ids = {s: i for i, s in enumerate(trainer.SPECIAL_TOKENS)}
    docs, stats = trainer.build_documents([("a.py", text)], fim_rate=0.5, seg_chars=500, seed=3)
    assert stats["fim_documents"] > 0 and stats["plain_documents"] > 0
    rebuilt = []
    for d in docs:
        assert d[0] == ids[trainer.BOS] and d[-1] == ids[trainer.EOS]
        if d[1] == ids[trainer.FIM_BEGIN]:
            _, _, pre, hole, suf, end, mid, _ = d
            assert (hole, end) == (ids[trainer.FIM_HOLE], ids[trainer.FIM_END])
            rebuilt.append(pre + mid + suf)  # prefix-suffix-middle of one contiguous segment
        else:
            rebuilt.append(d[1])
    assert "".join(rebuilt) == text  # every character once, in order
    # same seed, same documents
    assert trainer.build_documents([("a.py", text)], 0.5, 500, 3)[0] == docs


def test_fim_tokens_are_deepseek_coders(trainer):
    assert trainer.FIM_TOKENS == ["<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
                                  "<\uff5cfim\u2581end\uff5c>"]


def test_recap_lowers_the_cap_of_a_built_corpus(builder, tmp_path):
    """`python -m training.corpus --recap-from DIR --out OUT --max-source-bytes N`: the same
    corpus with fewer training files of the largest sources, held-out/validation/stdlib kept,
    and a manifest whose counts follow."""
    import json
    import lzma

    src = tmp_path / "src"
    src.mkdir()
    recs = [{"split": "train", "source": "big", "path": f"big/{i}.py", "text": "x = 1\n" * 100}
            for i in range(8)]
    recs += [{"split": "train", "source": "python-stdlib", "path": f"stdlib/{i}.py",
              "text": "y = 2\n" * 100} for i in range(3)]
    recs += [{"split": "heldout", "source": "held", "path": "h.py", "text": "z = 3\n" * 500}]
    (src / "corpus.jsonl.xz").write_bytes(lzma.compress(
        "".join(json.dumps(r) + "\n" for r in recs).encode()))
    sources = [{"name": "big", "role": "train", "files": 8, "bytes": 4800},
               {"name": "python-stdlib", "role": "train", "files": 3, "bytes": 1800},
               {"name": "held", "role": "heldout", "files": 1, "bytes": 3000}]
    (src / "manifest.json").write_text(json.dumps({
        "max_source_bytes": 20_000_000, "sources": sources,
        "totals": {"train": {"files": 11, "bytes": 6600}, "heldout": {"files": 1, "bytes": 3000}}}))
    assert builder.main(["--recap-from", str(src), "--out", str(tmp_path / "out"),
                         "--max-source-bytes", "2000"]) == 0
    kept = [json.loads(x) for x in (tmp_path / "out" / "corpus.jsonl").read_text().splitlines()]
    assert sum(r["source"] == "big" for r in kept) == 3  # 3 x 600 bytes <= 2000
    assert sum(r["source"] == "python-stdlib" for r in kept) == 3
    assert sum(r["split"] == "heldout" for r in kept) == 1
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["max_source_bytes"] == 2000 and m["recapped"]["files_dropped"] == 5
    assert m["totals"]["train"] == {"files": 6, "bytes": 3600}
    big = next(s for s in m["sources"] if s["name"] == "big")
    assert (big["files"], big["bytes"], big["capped_files"]) == (3, 1800, 5)
