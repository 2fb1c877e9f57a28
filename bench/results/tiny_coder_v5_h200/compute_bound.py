"""Issue 36: the training compute of tiny-coder v3/v4/v5 and the compute-optimal size for it.

    .venv/bin/python bench/results/tiny_coder_v5_h200/compute_bound.py > compute_bound.json

Reads the three H200 calls' metrics.json (parameters, tokens seen, steps, training seconds).
Training FLOPs: 6*N*D (N: all 26.75M parameters; the tied embedding counts once, as the output
matmul), and beside it the attention-score term 6*L*T*d per token (Kaplan et al. 2020, eq. 2.2:
2*n_layer*n_ctx*d_attn forward, x3 with the backward). Compute-optimal size for that C: (a) the
rule of thumb D = 20 N (Hoffmann et al. 2022), N = sqrt(C / 120); (b) the minimum over N of the
parametric loss L(N, D) = E + A/N^alpha + B/D^beta at fixed C = 6ND, for Hoffmann et al.'s fit
(E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28) and Besiroglu et al. 2024's re-fit (E 1.8172,
A 482.01, B 2085.43, alpha 0.3478, beta 0.3658). Both fits are for web text in nats per token
and for models of >= 44M parameters: here only the *shape* (where the optimum lies, how flat it
is) is used, not the levels. Also: the 30 MB checkpoint goal as a parameter cap (int8, the
shipped 26,950,392 bytes for 26,747,392 parameters).

What twice the tokens would buy at this size, from the runs themselves: L(D) = E + B (D/1e8)^-b
fitted to the validation loss of the constant-learning-rate part of v4's and v5's runs (evals at
>= 750 steps and lr = peak; `train_log.jsonl`: v4's in models/tiny-coder, v5's here), read at
the run's tokens and at twice them; the drop, in nats per token and in validation bits per byte
(the final decay's own bonus is assumed unchanged).
"""
import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"v3": HERE.parent / "tiny_coder_v3_h200" / "metrics.json",
        "v4": HERE.parent / "tiny_coder_v4_h200" / "metrics.json",
        "v5": HERE / "metrics.json"}
H200_BF16_DENSE = 989e12  # FLOP/s, NVIDIA's H200 SXM figure without sparsity
FITS = {"hoffmann2022": {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28},
        "besiroglu2024": {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}}
CKPT_BYTES_PER_PARAM = 26_950_392 / 26_747_392
CAP_BYTES = 30e6


def loss(fit, n, d):
    return fit["E"] + fit["A"] / n ** fit["alpha"] + fit["B"] / d ** fit["beta"]


def optimum(fit, c):
    """N minimizing L(N, C/6N) (golden-section search on log N)."""
    lo, hi = math.log(1e5), math.log(1e10)
    g = (math.sqrt(5) - 1) / 2
    f = lambda x: loss(fit, math.exp(x), c / 6 / math.exp(x))
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(200):
        if f(a) < f(b):
            hi = b
        else:
            lo = a
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    return math.exp((lo + hi) / 2)


out = {}
for name, path in RUNS.items():
    m = json.loads(path.read_text())
    n, d = m["params"]["total"], m["tokens_seen"]
    cfg = m["model_config"]
    seq = m["hyperparameters"]["seq_len"]
    attn_per_token = 6 * cfg["num_hidden_layers"] * seq * cfg["hidden_size"]
    c = 6 * n * d
    c_attn = c + attn_per_token * d
    row = {"params": n, "tokens_seen": d, "steps": m["steps"], "passes": round(m["epochs"], 2),
           "train_s": round(m["train_time_s"], 1), "budget_s": m["time_budget_s"],
           "stream_tokens": m["prep"]["train_tokens"],
           "heldout_bpb_int8": round(m["heldout_int8"]["bits_per_byte"], 4),
           "best_step": m.get("best_step"),
           "flops_6ND": c, "flops_with_attention": c_attn,
           "tokens_per_param": round(d / n, 1),
           "achieved_flops_per_s": c_attn / m["train_time_s"],
           "mfu_vs_989T": round(c_attn / m["train_time_s"] / H200_BF16_DENSE, 3),
           "chinchilla_20x": {"N": math.sqrt(c / 120), "D": 20 * math.sqrt(c / 120)}}
    for fname, fit in FITS.items():
        nopt = optimum(fit, c)
        row[fname] = {"N_opt": nopt, "D_opt": c / 6 / nopt, "D_over_N": c / 6 / nopt / nopt,
                      "loss_here": loss(fit, n, d), "loss_at_opt": loss(fit, nopt, c / 6 / nopt),
                      # same compute, other sizes: the loss cost of 2x / 0.5x parameters
                      "loss_2N_same_C": loss(fit, 2 * n, d / 2),
                      "loss_half_N_same_C": loss(fit, n / 2, 2 * d),
                      # twice the compute at this size (e.g. a second call warm-started)
                      "loss_same_N_2C": loss(fit, n, 2 * d),
                      "loss_opt_2C": loss(fit, optimum(fit, 2 * c), 2 * c / 6 / optimum(fit, 2 * c))}
    out[name] = row
LOGS = {"v4": HERE.parent.parent.parent / "models" / "tiny-coder" / "train_log.jsonl",
        "v5": HERE / "train_log.jsonl"}
VAL_BYTES_PER_TOKEN = 2_298_296 / 604_348  # metrics.json: validation bytes / tokens


def curve(d, e, b, beta):
    return e + b * (d / 1e8) ** (-beta)


try:
    import numpy as np
    from scipy.optimize import curve_fit
except ImportError:  # the fit is optional
    curve_fit = None
for name, path in LOGS.items():
    if curve_fit is None or not path.exists():
        continue
    ev = [json.loads(x) for x in path.read_text().splitlines() if '"eval"' in x]
    ev = [e for e in ev if e["type"] == "eval"]
    peak = max(e["lr"] for e in ev)
    const = [e for e in ev if e["lr"] >= peak - 1e-12 and e["step"] >= 750]
    (e0, b0, beta0), _ = curve_fit(curve, np.array([e["tokens"] for e in const], float),
                                   np.array([e["val_loss"] for e in const]),
                                   p0=[1.5, 0.5, 0.5], maxfev=20000)
    d_end = ev[-1]["tokens"]
    drop = curve(d_end, e0, b0, beta0) - curve(2 * d_end, e0, b0, beta0)
    out[name]["twice_the_tokens"] = {
        "fit": {"E": e0, "B": b0, "beta": beta0, "points": len(const),
                "tokens": [const[0]["tokens"], const[-1]["tokens"]]},
        "val_loss_final": ev[-1]["val_loss"],
        "constant_lr_curve_at_end": curve(d_end, e0, b0, beta0),
        "drop_nats_per_token": drop,
        "drop_val_bits_per_byte": drop / math.log(2) / VAL_BYTES_PER_TOKEN}
out["param_cap_30MB_int8"] = CAP_BYTES / CKPT_BYTES_PER_PARAM
print(json.dumps(out, indent=1))
