#!/usr/bin/env python3
r"""Build tiny-coder's training corpus from Python sources already on this machine (no download).

Sources:
  * the standard library of the running interpreter (``sysconfig`` stdlib; test suite included,
    ``site-packages`` and ``__pycache__`` skipped) -- licence PSF-2.0;
  * every installed distribution of a ``site-packages`` directory (default: this interpreter's,
    i.e. the ``.venv`` that ``make install`` made): the ``.py`` files its ``RECORD`` lists,
    minus vendored copies of other projects (any path with a ``_vendor``/``vendor``/``vendored``
    directory: their licences are not the distribution's own, and they duplicate upstream code).

Licences. Each distribution's licence is read from its ``METADATA`` (``License-Expression``,
else the ``License`` field, else the ``License ::`` classifiers) and mapped to SPDX identifiers.
A distribution is used for training only when every identifier is on ``PERMISSIVE`` (MIT, BSD,
Apache-2.0, PSF-2.0, ISC, ...); anything else -- a copyleft licence such as MPL-2.0, or a
licence text we cannot map -- keeps it out of the training data. Such a distribution may still be
a *held-out* package: it is only read for evaluation, and nothing derived from it is shipped.

Split (chosen before any training; whole packages, never single files):
  * ``HELDOUT`` -- test set: never trained on, never used for any decision;
  * ``VALIDATION`` -- model selection (hyper-parameter proxies, checkpoint choice);
  * everything else that passes the licence rule -- training.

De-duplication over all kept files, in priority order held-out > validation > training (so a
training file that duplicates a held-out or validation file is the one dropped):
  * exact: SHA-256 of the text with trailing whitespace stripped from each line;
  * near: MinHash (``NUM_PERM`` permutations) over word 5-gram shingles, LSH with ``BANDS`` bands
    of ``ROWS`` rows; a candidate pair whose signatures agree on >= ``NEAR_DUP_JACCARD`` of the
    permutations (estimated Jaccard similarity) is a duplicate, and the lower-priority file of
    the pair is dropped.

Then at most ``MAX_SOURCE_BYTES`` (20 MB) of training text per installed distribution, files in
sha1(path) order (the standard library is exempt): transformers and torch would otherwise be ~40%
of the corpus, and the compressed corpus must fit one ~35 MB transfer to the training machine.

Then doctest-heavy training files are thinned (``DOCTEST_MAX_SHARE``, ``thin_doctests``): one
whose doctest blocks are more than 3% of its bytes is kept with probability 0.03 / that share.

Files that are not UTF-8, empty, larger than ``MAX_FILE_BYTES`` or look generated (a line longer
than ``MAX_LINE_CHARS``) are skipped and counted.

Output (``--out DIR``):
  * ``corpus.jsonl`` -- one JSON object per kept file: ``{"split", "source", "path", "text"}``
    where ``path`` is ``stdlib/<relative path>`` or ``site-packages/<relative path>``;
  * ``manifest.json`` -- per source: name, version, licence as read, SPDX ids, verdict, role,
    files and bytes kept/dropped; the de-duplication and skip counts; the split rule.

    python -m training.corpus --out /tmp/tiny-corpus
"""
from __future__ import annotations

import argparse
import csv
import email.parser
import hashlib
import json
import os
import re
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np

# Whole packages, chosen before training (by distribution name, lower case). Held-out: projects
# of different kinds (an async HTTP framework, a property-testing library, a template engine, a
# CLI toolkit), none of them vendored by another installed project.
HELDOUT = ("aiohttp", "hypothesis", "jinja2", "click")
VALIDATION = ("fsspec", "anyio", "pyparsing", "httpx2", "h11")
# Not source code we want to learn from or not ours to use: our own repository.
SKIP_DISTS = ("tidegate",)

PERMISSIVE = {
    "MIT", "MIT-CMU", "BSD-2-Clause", "BSD-3-Clause", "BSD", "0BSD", "Apache-2.0", "PSF-2.0",
    "ISC", "Zlib", "CC0-1.0", "BSL-1.0", "CNRI-Python", "LLVM-exception", "Unlicense",
    "Matplotlib",  # matplotlib's own licence: a PSF-style permissive licence
}
# free-text licence fields and classifiers -> SPDX
TEXT_TO_SPDX = [
    (re.compile(r"^apache(\s+software)?(\s+license)?[\s,-]*(2(\.0)?)?(\s+license)?$", re.IGNORECASE),
     "Apache-2.0"),
    (re.compile(r"^mit(\s+license)?$", re.IGNORECASE), "MIT"),
    (re.compile(r"^(new |modified |3-clause )?bsd( 3-clause)?( license)?$", re.IGNORECASE), "BSD"),
    (re.compile(r"^3-clause bsd license$", re.IGNORECASE), "BSD-3-Clause"),
    (re.compile(r"^python software foundation license$", re.IGNORECASE), "PSF-2.0"),
    (re.compile(r"^isc license( \(iscl\))?$", re.IGNORECASE), "ISC"),
    (re.compile(r"^license agreement for matplotlib", re.IGNORECASE), "Matplotlib"),
    (re.compile(r"^mozilla public license 2\.0 \(mpl 2\.0\)$", re.IGNORECASE), "MPL-2.0"),
]
VENDOR_DIRS = {"_vendor", "vendor", "vendored", "_vendored"}
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# At most this much text from one installed distribution (files kept in path-hash order; the
# standard library is exempt): the largest (transformers, torch) would otherwise be ~40% of the
# corpus, and the whole compressed corpus has to travel to the training machine in one ~35 MB carry.
MAX_SOURCE_BYTES = 20_000_000
# Doctest-heavy training files (sympy's reStructuredText `Examples` sections above all) are
# thinned to about this share of doctest text: the v2 model's greedy completions fell into
# loops of near-identical doctest lines (issue 36)
DOCTEST_MAX_SHARE = 0.03
MAX_FILE_BYTES = 400_000
MAX_LINE_CHARS = 2_000
NUM_PERM, BANDS, ROWS = 128, 32, 4  # LSH candidates from ~J >= (1/32)^(1/4) = 0.42
NEAR_DUP_JACCARD = 0.8
SHINGLE = 5
STDLIB = "python-stdlib"
SPLIT_RANK = {"heldout": 0, "val": 1, "train": 2}


# ---- licences ------------------------------------------------------------------------------

def spdx_ids(expr: str) -> list[str]:
    """SPDX identifiers of an expression like 'Apache-2.0 AND (MIT OR BSD-3-Clause)'."""
    out = []
    for t in re.split(r"[\s()]+", expr):
        if t and t.upper() not in {"AND", "OR", "WITH"}:
            out.append(t)
    return out


def licence_of(meta) -> tuple[str, list[str]]:
    """(licence as read, SPDX ids; [] when it could not be mapped)."""
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        return expr, spdx_ids(expr)
    text = (meta.get("License") or "").strip().split("\n")[0].strip()
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::") and "OSI Approved" != c.split("::")[-1].strip()]
    for candidate in [text, *classifiers]:
        for rx, spdx in TEXT_TO_SPDX:
            if candidate and rx.match(candidate):
                return candidate, [spdx]
    if len(classifiers) > 1:  # e.g. 'MIT License' and 'Apache Software License': dual licence
        ids = []
        for c in classifiers:
            for rx, spdx in TEXT_TO_SPDX:
                if rx.match(c):
                    ids.append(spdx)
        if ids:
            return " / ".join(classifiers), ids
    return text or "; ".join(classifiers) or "(none given)", []


def permissive(ids: list[str]) -> bool:
    return bool(ids) and all(i in PERMISSIVE for i in ids)


# ---- sources -------------------------------------------------------------------------------

def stdlib_files(root: Path) -> list[tuple[str, Path]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = Path(dirpath) / fn
                out.append(("stdlib/" + p.relative_to(root).as_posix(), p))
    return sorted(out)


def distributions(site: Path) -> list[dict]:
    dists = []
    for di in sorted(site.glob("*.dist-info")):
        mp = di / "METADATA"
        if not mp.is_file() or not (di / "RECORD").is_file():
            continue
        meta = email.parser.Parser().parsestr(mp.read_text(errors="replace"), headersonly=True)
        name = meta["Name"]
        read, ids = licence_of(meta)
        files, vendored = [], 0
        for row in csv.reader((di / "RECORD").read_text().splitlines()):
            if not row or not row[0].endswith(".py") or row[0].startswith(".."):
                continue
            rel = row[0]
            if VENDOR_DIRS & set(rel.split("/")[:-1]):
                vendored += 1
                continue
            p = site / rel
            if p.is_file():
                files.append(("site-packages/" + rel, p))
        dists.append({"name": name, "key": name.lower().replace("_", "-"),
                      "version": meta["Version"], "licence": read, "spdx": ids,
                      "files_listed": sorted(files), "vendored_files_skipped": vendored})
    return dists


def read_text(p: Path) -> tuple[str | None, str]:
    try:
        raw = p.read_bytes()
    except OSError:
        return None, "unreadable"
    if len(raw) > MAX_FILE_BYTES:
        return None, "too large"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    if not text.strip():
        return None, "empty"
    if max(map(len, text.split("\n"))) > MAX_LINE_CHARS:
        return None, "generated-looking (long line)"
    return text, ""


# ---- de-duplication ------------------------------------------------------------------------

def normalized_digest(text: str) -> bytes:
    return hashlib.sha256("\n".join(s.rstrip() for s in text.split("\n")).strip().encode()).digest()


_WORD = re.compile(r"\w+|[^\w\s]")
_perm_rng = np.random.default_rng(20261202)
_PRIME = np.uint64(4294967291)  # largest prime below 2^32: a * x < 2^64 stays exact in uint64
_PA = _perm_rng.integers(1, int(_PRIME), NUM_PERM, dtype=np.uint64)
_PB = _perm_rng.integers(0, int(_PRIME), NUM_PERM, dtype=np.uint64)


def minhash(text: str, word_ids: dict) -> np.ndarray:
    """MinHash signature over word 5-gram shingles (words: \\w+ runs and single punctuation)."""
    words = _WORD.findall(text)
    ids = np.fromiter((word_ids.setdefault(w, zlib.crc32(w.encode())) for w in words),
                      dtype=np.uint64, count=len(words))
    if len(ids) < SHINGLE:
        ids = np.concatenate([ids, np.zeros(SHINGLE - len(ids), np.uint64)])
    # shingle hash: a polynomial over the 5 word hashes mod 2^32
    h = np.zeros(len(ids) - SHINGLE + 1, dtype=np.uint64)
    for k in range(SHINGLE):
        h = (h * np.uint64(1_000_003) + ids[k:len(ids) - SHINGLE + 1 + k]) & np.uint64(0xFFFFFFFF)
    h = np.unique(h) % _PRIME
    sig = np.empty(NUM_PERM, dtype=np.uint64)
    for i in range(0, NUM_PERM, 16):  # (a*x + b) mod p, 16 permutations at a time
        v = (_PA[i:i + 16, None] * h[None] % _PRIME + _PB[i:i + 16, None]) % _PRIME
        sig[i:i + 16] = v.min(axis=1)
    return sig


def dedupe(items: list[dict], say) -> dict:
    """Mark items[i]['dup'] = None | 'exact: <path>' | 'near: <path>'. Items are in priority order.
    An item may carry its own 'digest' (`normalized_digest`) and 'minhash' (`minhash`), computed
    elsewhere (in parallel: `training.device_corpus`); the rest are computed here."""
    seen: dict[bytes, str] = {}
    for it in items:
        d = it.get("digest") or normalized_digest(it["text"])
        it["dup"] = f"exact: {seen[d]}" if d in seen else None
        seen.setdefault(d, it["path"])
    live = [i for i, it in enumerate(items) if it["dup"] is None]
    say(f"exact duplicates: {len(items) - len(live)}")
    word_ids: dict = {}
    t0 = time.time()
    sigs = np.stack([items[i]["minhash"] if items[i].get("minhash") is not None
                     else minhash(items[i]["text"], word_ids) for i in live]) if live \
        else np.zeros((0, NUM_PERM), dtype=np.uint64)
    say(f"minhash of {len(live)} files in {time.time() - t0:.1f}s")
    buckets: dict = {}
    pairs = set()
    for b in range(BANDS):
        band = sigs[:, b * ROWS:(b + 1) * ROWS]
        keys = [bytes(r) for r in band.view(np.uint8).reshape(len(live), -1)]
        for j, k in enumerate(keys):
            lst = buckets.setdefault((b, k), [])
            for i in lst[-50:]:  # bounded: a huge bucket is one cluster anyway
                pairs.add((i, j))
            lst.append(j)
    near = 0
    # earlier (higher-priority) file wins; a dropped file still drops the ones after it that
    # only it matched (clusters collapse onto their first member)
    for i, j in sorted(pairs, key=lambda p: (p[1], p[0])):
        if items[live[j]]["dup"] is not None or items[live[i]]["dup"] is not None:
            continue
        if float((sigs[i] == sigs[j]).mean()) >= NEAR_DUP_JACCARD:
            items[live[j]]["dup"] = f"near: {items[live[i]]['path']}"
            near += 1
    say(f"near duplicates (estimated Jaccard >= {NEAR_DUP_JACCARD}): {near} of {len(pairs)} "
        f"candidate pairs")
    return {"exact": len(items) - len(live), "near": near, "candidate_pairs": len(pairs)}


# ---- per-source cap -------------------------------------------------------------------------

def cap_sources(items: list[dict], max_bytes: int) -> int:
    """Mark training files past `max_bytes` of their source (in sha1(path) order) as
    items[i]['dup'] = 'cap'; returns how many. Held-out and validation files and the standard
    library are never capped."""
    by_source: dict[str, list[dict]] = {}
    for it in items:
        if it["dup"] is None and it["split"] == "train" and it["source"] != STDLIB:
            by_source.setdefault(it["source"], []).append(it)
    capped = 0
    for lst in by_source.values():
        total = 0
        for it in sorted(lst, key=lambda it: hashlib.sha1(it["path"].encode()).hexdigest()):
            total += len(it["text"].encode())
            if total > max_bytes:
                it["dup"] = "cap"
                capped += 1
    return capped


def doctest_block_bytes(text: str) -> int:
    """UTF-8 bytes of the doctest blocks: `>>>` prompts, their `...` continuations and the
    non-blank output lines that follow them up to the next blank line or the docstring's
    closing quotes."""
    n, inside = 0, False
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if s.startswith(">>>") or (inside and s and '"""' not in s and "'''" not in s):
            inside = True
            n += len(line.encode())
        else:
            inside = False
    return n


def thin_doctests(items: list[dict], max_share: float) -> int:
    """Down-weight doctest-heavy training files: one whose doctest blocks are more than
    `max_share` of its bytes is kept only when its path's hash fraction is below
    max_share / share (a file of 20% doctests with max_share 0.05: 1 in 4), so the kept files
    carry about max_share of their bytes in doctests, on average. Marks the others
    items[i]['dup'] = 'doctests'; returns how many. Held-out and validation files are never
    thinned; max_share >= 1 turns the rule off."""
    thinned = 0
    if max_share >= 1:
        return 0
    for it in items:
        if it["dup"] is not None or it["split"] != "train":
            continue
        share = doctest_block_bytes(it["text"]) / max(1, len(it["text"].encode()))
        if share > max_share:
            frac = int(hashlib.sha1(it["path"].encode()).hexdigest()[:12], 16) / 16**12
            if frac >= max_share / share:
                it["dup"] = "doctests"
                thinned += 1
    return thinned


def doctest_bytes(text: str) -> int:
    """UTF-8 bytes of the lines that are doctest prompts (`>>>` after the indentation)."""
    return sum(len(line.encode()) for line in text.splitlines(keepends=True)
               if line.lstrip().startswith(">>>"))


def training_shares(items: list[dict], top: int = 10) -> dict:
    """Training text still kept, by source: the `top` largest sources' bytes and share of all
    training bytes, and how much of it is doctest prompt lines (the sympy-style `>>>` examples
    that the v2 model's greedy completions fall into)."""
    by: dict[str, list[int]] = {}
    for it in items:
        if it["dup"] is None and it["split"] == "train":
            b = by.setdefault(it["source"], [0, 0, 0])
            b[0] += len(it["text"].encode())
            b[1] += doctest_bytes(it["text"])
            b[2] += doctest_block_bytes(it["text"])
    total = sum(b[0] for b in by.values()) or 1
    doc = sum(b[1] for b in by.values())
    block = sum(b[2] for b in by.values())
    largest = sorted(by.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return {"bytes": total, "doctest_bytes": doc, "doctest_share": doc / total,
            "doctest_block_bytes": block, "doctest_block_share": block / total,
            "sources": [{"name": n, "bytes": b, "share": b / total, "doctest_bytes": d,
                         "share_of_doctest_bytes": d / max(1, doc),
                         "doctest_block_bytes": k} for n, (b, d, k) in largest]}


def say_shares(say, when: str, sh: dict) -> None:
    say(f"training text {when}: {sh['bytes'] / 1e6:.1f} MB, doctest prompt lines "
        f"{sh['doctest_share']:.1%} (doctest blocks {sh.get('doctest_block_share', 0):.1%}); "
        "largest: " + ", ".join(
            f"{s['name']} {s['share']:.1%} (doctests {s['share_of_doctest_bytes']:.0%})"
            for s in sh["sources"][:8]))


# ---- a built corpus with a lower per-source cap (what travels to the GPU must fit) ----------

def recap(src: Path, out: Path, max_bytes: int) -> dict:
    """Write `out` = the built corpus `src` (corpus.jsonl or corpus.jsonl.xz + manifest.json)
    with the per-source cap lowered to `max_bytes` (`cap_sources`: training files in sha1(path)
    order, the standard library exempt, held-out and validation untouched). The manifest keeps
    everything else and records the re-cap. Returns {'files_dropped', 'bytes_dropped'}."""
    import lzma

    plain = src / "corpus.jsonl"
    opener = open if plain.is_file() else lzma.open
    with opener(plain if plain.is_file() else src / "corpus.jsonl.xz", "rt", encoding="utf-8") as f:
        items = [{**json.loads(line), "dup": None} for line in f]
    before = training_shares(items)
    dropped = cap_sources(items, max_bytes)
    manifest = json.loads((src / "manifest.json").read_text())
    by_name = {s["name"]: s for s in manifest["sources"]}
    nbytes = 0
    for it in items:
        if it["dup"] == "cap":
            s = by_name[it["source"]]
            b = len(it["text"].encode())
            s["files"] -= 1
            s["bytes"] -= b
            s["capped_files"] = s.get("capped_files", 0) + 1
            manifest["totals"]["train"]["files"] -= 1
            manifest["totals"]["train"]["bytes"] -= b
            nbytes += b
    manifest["recapped"] = {"from_max_source_bytes": manifest.get("max_source_bytes"),
                            "max_source_bytes": max_bytes, "files_dropped": dropped,
                            "bytes_dropped": nbytes,
                            "rule": "training/corpus.py recap: cap_sources again on the built "
                                    "corpus (after its de-duplication, cap and doctest thinning)"}
    manifest["max_source_bytes"] = max_bytes
    manifest.setdefault("training_shares", {})["before_recap"] = before
    manifest["training_shares"]["after_recap"] = training_shares(items)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for it in items:
            if it["dup"] is None:
                f.write(json.dumps({k: it[k] for k in ("split", "source", "path", "text")},
                                   ensure_ascii=False) + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return {"files_dropped": dropped, "bytes_dropped": nbytes}


# ---- main ----------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--site-packages", type=Path, default=Path(sysconfig.get_paths()["purelib"]))
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--max-source-bytes", type=float, default=MAX_SOURCE_BYTES,
                    help="training text kept per installed distribution (the standard library "
                         "is exempt); lower it to dilute the largest sources, e.g. sympy's "
                         "doctests (manifest.json's training_shares: before / after the cap)")
    ap.add_argument("--doctest-max-share", type=float, default=DOCTEST_MAX_SHARE,
                    help="a training file whose doctest blocks are more than this share of it "
                         "is kept with probability share-limit / its share (1: keep all; the "
                         "v2 model's corpus)")
    ap.add_argument("--recap-from", type=Path, default=None, metavar="CORPUS_DIR",
                    help="instead of building: copy this built corpus with the per-source cap "
                         "lowered to --max-source-bytes (`recap`)")
    args = ap.parse_args(argv)
    if args.recap_from is not None:
        print(json.dumps(recap(args.recap_from, args.out, int(args.max_source_bytes))))
        return 0
    t_start = time.time()

    def say(msg):
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    sources = [{"name": STDLIB, "key": STDLIB,
                "version": sys.version.split()[0], "licence": "PSF-2.0", "spdx": ["PSF-2.0"],
                "files_listed": stdlib_files(args.stdlib), "vendored_files_skipped": 0}]
    sources += distributions(args.site_packages)
    items, skipped = [], {}
    for s in sources:
        key = s["key"]
        if key in HELDOUT:
            role = "heldout"
        elif key in VALIDATION:
            role = "val"
        elif key in SKIP_DISTS:
            role = "skipped (our own repository)"
        elif not permissive(s["spdx"]):
            role = "excluded (licence)"
        else:
            role = "train"
        s["role"] = role
        s["files"] = s["bytes"] = 0
        if role not in SPLIT_RANK:
            continue
        for path, p in s["files_listed"]:
            text, why = read_text(p)
            if text is None:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            items.append({"split": role, "source": s["name"], "path": path, "text": text})
    say(f"{len(items)} files read; skipped {skipped}")
    items.sort(key=lambda it: (SPLIT_RANK[it["split"]], it["path"]))
    dd = dedupe(items, say)
    before = training_shares(items)
    dd["capped"] = cap_sources(items, int(args.max_source_bytes))
    say(f"over the {args.max_source_bytes / 1e6:g} MB per-source cap: {dd['capped']} files")
    after_cap = training_shares(items)
    dd["doctests_thinned"] = thin_doctests(items, args.doctest_max_share)
    say(f"doctest-heavy files (doctest blocks over {args.doctest_max_share:.0%} of the file) "
        f"thinned: {dd['doctests_thinned']} dropped")
    shares = {"before_cap": before, "after_cap": after_cap,
              "after_doctest_thinning": training_shares(items)}
    say_shares(say, "before the cap", shares["before_cap"])
    say_shares(say, "after the cap", shares["after_cap"])
    say_shares(say, "after thinning doctests", shares["after_doctest_thinning"])
    finish(args, sources, items, skipped, dd, say, shares)
    return 0


def finish(args, sources, items, skipped, dd, say, shares: dict | None = None) -> None:
    """Write corpus.jsonl and manifest.json for the files still marked dup=None."""
    by_source = {s["name"]: s for s in sources}
    kept = [it for it in items if it["dup"] is None]
    for it in kept:
        s = by_source[it["source"]]
        s["files"] += 1
        s["bytes"] += len(it["text"].encode())
    for it in items:
        if it["dup"] is not None:
            s = by_source[it["source"]]
            key = {"cap": "capped_files", "doctests": "doctest_thinned_files"}.get(
                it["dup"], "dropped_duplicates")
            s[key] = s.get(key, 0) + 1
    args.out.mkdir(parents=True, exist_ok=True)
    # uncompressed: xz of ~200 MB on a busy 2-core machine takes longer than everything else
    with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for it in kept:
            f.write(json.dumps({k: it[k] for k in ("split", "source", "path", "text")},
                               ensure_ascii=False) + "\n")
    totals = {}
    for it in kept:
        t = totals.setdefault(it["split"], {"files": 0, "bytes": 0})
        t["files"] += 1
        t["bytes"] += len(it["text"].encode())
    manifest = {
        "heldout_packages": list(HELDOUT), "validation_packages": list(VALIDATION),
        "split_rule": "whole distributions: held-out and validation packages fixed in "
                      "training/corpus.py before training; the rest is training "
                      "data when its licence is permissive",
        "permissive_spdx": sorted(PERMISSIVE),
        "dedupe": {**dd, "rule": f"exact: sha256 of rstripped lines; near: MinHash {NUM_PERM} "
                   f"permutations over word {SHINGLE}-grams, LSH {BANDS}x{ROWS}, estimated "
                   f"Jaccard >= {NEAR_DUP_JACCARD}; priority held-out > validation > training"},
        "max_source_bytes": int(getattr(args, "max_source_bytes", MAX_SOURCE_BYTES)),
        "doctest_max_share": float(getattr(args, "doctest_max_share", 1.0)),
        "training_shares": shares,
        "skipped_files": skipped,
        "limits": {"max_file_bytes": MAX_FILE_BYTES, "max_line_chars": MAX_LINE_CHARS},
        "totals": totals,
        "python": sys.version.split()[0],
        "sources": [{k: s.get(k, 0) for k in ("name", "version", "licence", "spdx", "role",
                                               "files", "bytes", "dropped_duplicates",
                                               "capped_files", "doctest_thinned_files",
                                               "vendored_files_skipped")}
                    | {"files_listed": len(s["files_listed"])} for s in sources],
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"kept {len(kept)} files: " + ", ".join(f"{k} {v['files']} files {v['bytes'] / 1e6:.1f} MB"
                                               for k, v in totals.items()))


if __name__ == "__main__":
    sys.exit(main())
