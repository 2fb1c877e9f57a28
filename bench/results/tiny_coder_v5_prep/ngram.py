"""Issue 36, v5 preparation: how well each training mix predicts the validation packages' tokens
under a count model that, unlike a 300-step tiny network, uses every token of the mix: an
interpolated absolute-discounting (Kneser-Ney-style, D=0.75) token n-gram model, n=1..4, fitted
on a prepared training stream (`train prepare`'s train.npy, FIM documents included) and scored
on the validation files (val_ids.npy, whole files <bos> text <eos>), in nats per token.
Usage: python ngram.py PREP_DIR [PREP_DIR ...]"""
import sys
from pathlib import Path

import numpy as np

V = 8192
D = 0.75


def keys(a: np.ndarray, n: int) -> np.ndarray:
    k = np.zeros(len(a) - n + 1, dtype=np.int64)
    for i in range(n):
        k = k * V + a[i:len(a) - n + 1 + i].astype(np.int64)
    return k


def score(train: np.ndarray, val: np.ndarray, order: int) -> float:
    # p_1: add-one unigram; p_n = max(c(h,w)-D,0)/c(h) + D*N1+(h)/c(h) * p_{n-1}
    uni = np.bincount(train, minlength=V).astype(np.float64) + 1.0
    p = uni[val] / uni.sum()
    for n in range(2, order + 1):
        kt, kh = keys(train, n), keys(train[:-1], n - 1)
        ug, cg = np.unique(kt, return_counts=True)
        uh, ch = np.unique(kh, return_counts=True)
        # distinct continuations per history
        hist_of_gram = ug // V
        uh2, n1 = np.unique(hist_of_gram, return_counts=True)
        vg = keys(val, n)
        vh = vg // V
        i = np.searchsorted(ug, vg)
        i[i >= len(ug)] = 0
        c = np.where(ug[i] == vg, cg[i], 0).astype(np.float64)
        j = np.searchsorted(uh, vh)
        j[j >= len(uh)] = 0
        h = np.where(uh[j] == vh, ch[j], 0).astype(np.float64)
        m = np.searchsorted(uh2, vh)
        m[m >= len(uh2)] = 0
        nn = np.where(uh2[m] == vh, n1[m], 0).astype(np.float64)
        lower = p[n - 1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            pn = np.where(h > 0, np.maximum(c - D, 0) / h + D * nn / h * lower, lower)
        p = np.concatenate([p[:n - 1], pn])
    return float(-np.log(p).mean())


for d in map(Path, sys.argv[1:]):
    tr = np.load(d / "train.npy").astype(np.int64)
    va = np.load(d / "val_ids.npy").astype(np.int64)
    print(d, f"train {len(tr):,} tokens, val {len(va):,}:",
          "  ".join(f"n={n} {score(tr, va, n):.4f}" for n in (1, 2, 3, 4)), flush=True)
