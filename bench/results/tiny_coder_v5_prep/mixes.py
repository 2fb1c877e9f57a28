"""Issue 36, v5 preparation: two training mixes of equal size from the development machine's
corpus (.carry-tc-6mb/corpus, v3's), for a tiny CPU training that compares them on the
validation packages (never the held-out ones).

  A  v4's shares: the scientific / ML group (training.device_corpus.SCIENTIFIC + torch) 70.8% of
     the bytes, the rest general-purpose code, no standard-library tests (the image has none).
  B  v5's shares (science capped at 3 MB per source on the device: 104.6 MB, general 75.8 MB,
     the carried stdlib tests 18.9 MB): science 52.5%, general 38.0%, stdlib tests 9.5%.

Each file is drawn by sha1(path) order within its class until the class's bytes are reached.
Usage: python mixes.py SRC_CORPUS OUT_DIR TOTAL_MB
"""
import hashlib
import json
import lzma
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from training import device_corpus as D

src, out, total = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) * 1e6
SCI = {D.norm_key(x) for x in D.SCIENTIFIC} | {"torch"}
MIXES = {"A": {"sci": 0.708, "gen": 0.292, "tests": 0.0},
         "B": {"sci": 0.525, "gen": 0.380, "tests": 0.095}}
classes = {"sci": [], "gen": [], "tests": []}
hv = []
with lzma.open(src / "corpus.jsonl.xz", "rt", encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        if r["split"] != "train":
            if r["split"] == "val" or len([x for x in hv if x["split"] == "heldout"]) < 2:
                hv.append(r)
            continue
        if r["source"] == "python-stdlib" and D.is_stdlib_test(r["path"]):
            c = "tests"
        elif D.norm_key(r["source"]) in SCI:
            c = "sci"
        else:
            c = "gen"
        classes[c].append(r)
for c, lst in classes.items():
    lst.sort(key=lambda r: hashlib.sha1(r["path"].encode()).hexdigest())
    print(c, len(lst), round(sum(len(r["text"].encode()) for r in lst) / 1e6, 1), "MB")
for name, shares in MIXES.items():
    d = out / name / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    n = {}
    with open(d / "corpus.jsonl", "w", encoding="utf-8") as w:
        for r in hv:
            w.write(json.dumps(r) + "\n")
        for c, share in shares.items():
            got = 0
            for r in classes[c]:
                if got >= share * total:
                    break
                got += len(r["text"].encode())
                w.write(json.dumps(r) + "\n")
            n[c] = round(got / 1e6, 2)
    print(name, n)
