"""Issue 36: what the 32-case FIM figure can tell. Every held-out FIM case against the 32.

    .venv/bin/python bench/results/tiny_coder_v5_h200/fim_sample.py > fim_sample.json

Input: `fim_all/{v3,v4,v5}_fim_all_{defaults,greedy}.json.gz`, each `tidegate eval code --parts
fim --fim-cases 100000 --generation-config auto|none` (the construction of the 32-case figure,
evenly spaced over *all* 2,942 held-out functions with a usable line, so every function once,
with the line the seeded RNG picks for it: the 32 cases are the functions at `spaced_indices(2942, 32)` of this list). v3
(3670d90's checkpoint) was run at today's defaults, `--generation-config models/tiny-coder`
(frequency 0.8), not at its own, so the three are decoded alike.

For each model and decoding:
- the whole set: exact-line rate with a Wilson 95% interval, and with a 95% interval from a
  bootstrap over held-out *files* (cases of one file are not independent; 4,000 resamples);
  mean edit similarity with the same file bootstrap;
- the 32-case figure as a sample of it: the official 32 (recomputed from the set, checked
  against the 32-case run's middles); the figure's spread over 20,000 random draws of 32 of the
  2,942 (2.5 / 97.5 percentiles) and over every shifted even spacing (floor((k + u) N / 32),
  u = j / 92); P(exact >= 8 / 32), P(similarity >= 0.6), P(both);
- `--fim-cases 256`'s figure (the 256 evenly spaced cases of the set);
- per package, per length of the removed line (characters, indentation left out), and the mean
  length of the written line against the removed one.
Paired, v4 against v5 (and v3): both right / only one right, the exact McNemar p-value, the
difference in rate and in similarity with the file-bootstrap 95% interval; and each model's
greedy run against its run at the defaults.
"""
import gzip
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALL = HERE / "fim_all"
B = 4000
DRAWS = 20000
GOAL_EXACT, GOAL_SIM = 8, 0.6


def spaced_indices(total, n):  # evals.data.spaced_indices
    n = min(n, total)
    return [int((k + 0.5) * total / n) for k in range(n)]


def wilson(k, n, z=1.959964):
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [c - h, c + h]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def package(path):
    parts = path.split("/")
    return parts[1] if parts[0] == "site-packages" and len(parts) > 2 else parts[-1]


def file_bootstrap(cases_by_file, stat, seed=0):
    rng = random.Random(seed)
    files = list(cases_by_file)
    out = []
    for _ in range(B):
        pick = [cases_by_file[f] for f in (rng.choice(files) for _ in files)]
        out.append(stat([c for group in pick for c in group]))
    return [pct(out, 0.025), pct(out, 0.975)]


def mcnemar_exact(b, c):
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * p)


def load(name, tag):
    p = ALL / f"{name}_fim_all_{tag}.json.gz"
    return json.loads(gzip.decompress(p.read_bytes()))["fim"] if p.exists() else None


def summarize(f, official=None):
    cases = f["cases"]
    n = len(cases)
    exact = [int(c["match"]) for c in cases]
    sim = [c["similarity"] for c in cases]
    by_file = defaultdict(list)
    for i, c in enumerate(cases):
        by_file[c["path"]].append(i)
    k = sum(exact)
    row = {"cases": n, "files": len(by_file), "exact": k, "rate": k / n,
           "rate_wilson95": wilson(k, n),
           "rate_file_bootstrap95": file_bootstrap(
               by_file, lambda idx: sum(exact[i] for i in idx) / len(idx)),
           "similarity": sum(sim) / n,
           "similarity_file_bootstrap95": file_bootstrap(
               by_file, lambda idx: sum(sim[i] for i in idx) / len(idx), seed=1),
           "token_accuracy": f["token_accuracy"], "stopped_with_eos": f["stopped_with_eos"],
           "copies_a_neighbour": f["copies_a_neighbour"],
           "mean_len_written": sum(len(c["got"]) for c in cases) / n,
           "mean_len_removed": sum(len(c["expected"]) for c in cases) / n}
    idx32 = spaced_indices(n, 32)
    row["official32"] = {"exact": sum(exact[i] for i in idx32),
                         "similarity": sum(sim[i] for i in idx32) / 32}
    if official is not None:
        oc = official["cases"]
        row["official32"]["same_removed_lines"] = sum(
            cases[i]["expected"] == o["expected"] and cases[i]["path"] == o["path"]
            for i, o in zip(idx32, oc))
        row["official32"]["same_written_lines"] = sum(
            cases[i]["got"] == o["got"] for i, o in zip(idx32, oc))
        row["official32"]["run_32"] = {"exact": official["exact"],
                                       "similarity": official["mean_line_similarity"]}
    idx256 = spaced_indices(n, 256)
    row["fim_cases_256"] = {"exact": sum(exact[i] for i in idx256),
                            "rate": sum(exact[i] for i in idx256) / 256,
                            "rate_wilson95": wilson(sum(exact[i] for i in idx256), 256),
                            "similarity": sum(sim[i] for i in idx256) / 256}
    rng = random.Random(32)
    ks, ss, hit_k, hit_s, hit_both = [], [], 0, 0, 0
    for _ in range(DRAWS):
        pick = rng.sample(range(n), 32)
        kk = sum(exact[i] for i in pick)
        s = sum(sim[i] for i in pick) / 32
        ks.append(kk)
        ss.append(s)
        hit_k += kk >= GOAL_EXACT
        hit_s += s >= GOAL_SIM
        hit_both += kk >= GOAL_EXACT and s >= GOAL_SIM
    row["random32"] = {"exact_p2.5_p50_p97.5": [pct(ks, 0.025), pct(ks, 0.5), pct(ks, 0.975)],
                       "similarity_p2.5_p50_p97.5": [round(pct(ss, q), 3) for q in (0.025, 0.5, 0.975)],
                       "P_exact_ge_8": hit_k / DRAWS, "P_similarity_ge_0.6": hit_s / DRAWS,
                       "P_both": hit_both / DRAWS}
    shifted_k, shifted_s = [], []
    for j in range(92):
        u = j / 92
        idx = sorted({min(n - 1, int((kk + u) * n / 32)) for kk in range(32)})
        shifted_k.append(sum(exact[i] for i in idx))
        shifted_s.append(sum(sim[i] for i in idx) / len(idx))
    row["shifted_spacings32"] = {"exact_min_median_max": [min(shifted_k), pct(shifted_k, 0.5),
                                                          max(shifted_k)],
                                 "similarity_min_median_max": [round(min(shifted_s), 3),
                                                               round(pct(shifted_s, 0.5), 3),
                                                               round(max(shifted_s), 3)],
                                 "share_exact_ge_8": sum(k >= 8 for k in shifted_k) / 92}
    per = defaultdict(lambda: [0, 0, 0.0])
    for c in cases:
        p = per[package(c["path"])]
        p[0] += 1
        p[1] += int(c["match"])
        p[2] += c["similarity"]
    lengths = {}
    for lo, hi in ((0, 10), (10, 20), (20, 40), (40, 80), (80, 10 ** 6)):
        sel = [i for i, c in enumerate(cases) if lo <= len(c["expected"].strip()) < hi]
        lengths[f"{lo}-{hi if hi < 10 ** 6 else ''}"] = {
            "cases": len(sel), "exact": sum(exact[i] for i in sel),
            "rate": round(sum(exact[i] for i in sel) / max(1, len(sel)), 3),
            "similarity": round(sum(sim[i] for i in sel) / max(1, len(sel)), 3),
            "official32_cases": sum(lo <= len(cases[i]["expected"].strip()) < hi for i in idx32),
            "official32_exact": sum(exact[i] for i in idx32
                                    if lo <= len(cases[i]["expected"].strip()) < hi)}
    row["by_removed_line_chars"] = lengths
    row["per_package"] = {k: {"cases": v[0], "exact": v[1], "rate": round(v[1] / v[0], 3),
                              "similarity": round(v[2] / v[0], 3)}
                          for k, v in sorted(per.items(), key=lambda kv: -kv[1][0])}
    return row


def paired(fa, fb):
    a, b = fa["cases"], fb["cases"]
    assert [c["expected"] for c in a] == [c["expected"] for c in b]
    both = sum(x["match"] and y["match"] for x, y in zip(a, b))
    only_a = sum(x["match"] and not y["match"] for x, y in zip(a, b))
    only_b = sum(y["match"] and not x["match"] for x, y in zip(a, b))
    by_file = defaultdict(list)
    for i, c in enumerate(a):
        by_file[c["path"]].append(i)
    d_exact = [int(x["match"]) - int(y["match"]) for x, y in zip(a, b)]
    d_sim = [x["similarity"] - y["similarity"] for x, y in zip(a, b)]
    idx32 = spaced_indices(len(a), 32)
    return {"both": both, "only_first": only_a, "only_second": only_b,
            "mcnemar_exact_p": mcnemar_exact(only_a, only_b),
            "rate_difference": sum(d_exact) / len(a),
            "rate_difference_file_bootstrap95": file_bootstrap(
                by_file, lambda idx: sum(d_exact[i] for i in idx) / len(idx), seed=2),
            "similarity_difference": sum(d_sim) / len(a),
            "similarity_difference_file_bootstrap95": file_bootstrap(
                by_file, lambda idx: sum(d_sim[i] for i in idx) / len(idx), seed=3),
            "official32": {"only_first": sum(a[i]["match"] and not b[i]["match"] for i in idx32),
                           "only_second": sum(b[i]["match"] and not a[i]["match"] for i in idx32)}}


def main():
    report = {"construction": "tidegate eval code --parts fim --fim-cases 100000: every held-out "
                              "function of 4-40 lines with a single-line body statement, one "
                              "line each (seed 0), as the 32-case figure is built"}
    official = {("v4", "greedy"): HERE / "v4_at_head" / "eval_cpu.json",
                ("v4", "defaults"): HERE / "v4_at_head" / "eval_defaults_cpu.json",
                ("v5", "greedy"): HERE / "eval_cpu.json",
                ("v5", "defaults"): HERE / "eval_defaults_cpu.json"}
    for tag in ("defaults", "greedy"):
        runs = {m: load(m, tag) for m in ("v3", "v4", "v5")}
        for m, f in runs.items():
            if f is None:
                continue
            off = official.get((m, tag))
            off = json.loads(off.read_text())["fim"] if off and off.exists() else None
            report[f"{m}_{tag}"] = summarize(f, off)
            print(f"{m} {tag} done", file=sys.stderr)
        for a, b in (("v4", "v5"), ("v3", "v4"), ("v3", "v5")):
            if runs[a] is not None and runs[b] is not None:
                report[f"{a}_vs_{b}_{tag}"] = paired(runs[a], runs[b])
    for m in ("v3", "v4", "v5"):
        g, d = load(m, "greedy"), load(m, "defaults")
        if g is not None and d is not None:
            report[f"{m}_greedy_vs_defaults"] = paired(g, d)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
