"""`python -m bench.engine.speculation`: speculative decoding's acceptance and TPOT, one request
at a time (c = 1), through the real engine (scheduler, block manager, runner, sampler).

Workloads (held-out code of the model's evaluation set, `evals.data`):

    off          greedy completion without speculation (the reference; its outputs feed the
                 oracle predictions below)
    lookup       the same completions with speculation on and no prediction: prompt lookup and
                 the session's earlier outputs
    oracle-P     the same completions with a prediction: the reference output with 100 - P % of
                 its lines altered (P = 100, 75, 50: what an editor sends when it holds the
                 answer), as `tidegate bench serve --workload edit --oracle` alters them
    copy         an edit the model really makes: the prompt is a file's chunk, a separator and
                 the chunk's first line again; the prediction is the chunk (the model's own
                 acceptance, not an oracle's); against `copy-off`, the same without speculation

Runs are interleaved prompt by prompt (every mode sees the same drift of a shared machine's
speed) and each starts with an empty session store (the prompts recur across modes).

Greedy outputs must equal `off`'s in every mode but `copy` (checked: identical tokens), so the
comparison is the mechanism's time alone. TPOT per request is (time of its last token - time of
its first) / (tokens - 1), from the returns of the engine's serving turns (`Engine.advance`, as
the worker runs it: async scheduling on CUDA). One engine serves every mode; `off` turns
speculation off per request.

    python -m bench.engine.speculation --model models/tiny-coder --prompts 12 \\
        --prompt-tokens 384 --max-tokens 128 --json out.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import numpy as np

from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams
from engine_flags import default_model
from evals.data import default_heldout_list, load_heldout
from scheduler.speculation import SpeculationConfig
from sims.edit_workload import lines_to_alter


def _alter_ids(ids: list[int], tok, keep: float, rng: np.random.Generator) -> list[int]:
    """The oracle's prediction, as `tidegate bench serve --workload edit --oracle` makes it
    (bench.serving.edit.alter_token_lines; not imported: it needs aiohttp): round((1 - keep) *
    lines) lines of `ids` get other ids of the same output; a line ends at a token whose text
    holds a newline, or, with fewer than 8 of them (dummy weights), is 12 tokens."""
    spans, start = [], 0
    for j, t in enumerate(ids):
        if "\n" in tok.decode([t], skip_special_tokens=False):
            spans.append((start, j + 1))
            start = j + 1
    if start < len(ids):
        spans.append((start, len(ids)))
    if len(spans) < 8:
        spans = [(a, min(a + 12, len(ids))) for a in range(0, len(ids), 12)]
    out = list(ids)
    for i in lines_to_alter(len(spans), keep, rng):
        a, b = spans[i]
        for j in range(a, b):
            for step in range(1, len(ids)):
                other = ids[(j * 7919 + step) % len(ids)]
                if other != ids[j]:
                    out[j] = other
                    break
    return out


def _prompts(tok, files, n, prompt_tokens, rng):
    """(name, prompt ids) cut from held-out files: a window of `prompt_tokens` ending at a line
    break about two thirds into the file."""
    out = []
    for rel, text in files:
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) < prompt_tokens + 64:
            continue
        cut = min(len(ids) - 64, max(prompt_tokens, int(len(ids) * 0.66)))
        out.append((rel, ids[cut - prompt_tokens:cut]))
        if len(out) >= n:
            break
    return out


def _copy_cases(tok, files, n, chunk_lines=30):
    """(name, prompt ids, prediction ids): chunk + blank line + the chunk's first line; the
    prediction is the rest of the chunk."""
    out = []
    for rel, text in files:
        lines = [ln for ln in text.split("\n")]
        if len(lines) < chunk_lines + 5:
            continue
        start = len(lines) // 3
        chunk = lines[start:start + chunk_lines]
        if sum(len(ln.strip()) > 0 for ln in chunk) < chunk_lines // 2:
            continue
        body = "\n".join(chunk)
        prompt = body + "\n\n\n" + chunk[0] + "\n"
        pred = "\n".join(chunk[1:]) + "\n"
        out.append((rel, tok.encode(prompt, add_special_tokens=False),
                     tok.encode(pred, add_special_tokens=False)))
        if len(out) >= n:
            break
    return out


def _serve_one(engine, rid, prompt, params, prediction=None, off=False):
    assert engine.add_request(rid, prompt, params, prediction=prediction,
                              speculation_off=off) is None
    tokens, times, last = [], [], None
    steps = 0
    while engine.has_unfinished():
        # the serving loop's turn: with async scheduling (CUDA) the next step is launched
        # before this one is read back, as the worker does
        outs = engine.advance()
        now = time.perf_counter()
        steps += 1
        for o in outs:
            if o.new_token_ids:
                tokens += o.new_token_ids
                times += [now] * len(o.new_token_ids)
            last = o
    tpot = (times[-1] - times[0]) / (len(tokens) - 1) if len(tokens) > 1 else float("nan")
    return tokens, tpot, steps, last


def _summary(rows):
    tpots = [r["tpot_ms"] for r in rows]
    return {"tpot_p50_ms": statistics.median(tpots), "tpot_mean_ms": statistics.fmean(tpots),
            "steps": sum(r["steps"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
            "drafted": sum(r["drafted"] for r in rows), "accepted": sum(r["accepted"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine.speculation",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=384)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--modes", default="off,lookup,oracle-100,oracle-75,oracle-50,copy")
    ap.add_argument("--max-draft-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", help="model dtype (auto: bf16 on CUDA)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    np_rng = np.random.default_rng(args.seed)
    modes = [m for m in args.modes.split(",") if m]

    def build(spec: bool):
        cfg = SpeculationConfig(max_draft_tokens=args.max_draft_tokens) if spec else None
        return create_engine(BackendConfig(model=args.model, device=args.device,
                                           load_format=args.load_format, dtype=args.dtype,
                                           speculation_config=cfg))

    # one engine (a 33B model fits once): the off runs turn speculation off per request
    on_engine, loaded = build(True)
    tok = loaded.tokenizer
    try:
        held = load_heldout(default_heldout_list(args.model))
        files = held.files
        print(f"corpus: {held.describe()}", flush=True)
    except FileNotFoundError:  # a model without a held-out list (a preset)
        files = []
    if len(files) < args.prompts:  # elsewhere (a GPU host without the packages): the stdlib
        import sysconfig
        from pathlib import Path

        root = Path(sysconfig.get_paths()["stdlib"])
        extra = [(str(p.relative_to(root)), p.read_text(errors="replace"))
                 for p in sorted(root.glob("*.py"))[:200]]
        print(f"corpus: {len(files)} held-out files found; adding the stdlib's", flush=True)
        files = files + extra
    cases = _prompts(tok, files, args.prompts, args.prompt_tokens, rng)
    if not cases:
        print("no held-out file is long enough", file=sys.stderr)
        return 1
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    # warm-up (first-use costs out of the timed runs)
    for off in (True, False):
        _serve_one(on_engine, f"warm{off}", cases[0][1][:64],
                   SamplingParams(max_tokens=16, ignore_eos=True), off=off)
    results: dict[str, dict] = {}
    reference: dict = {}
    # interleaved, prompt by prompt (a shared machine's speed drifts: every mode sees the same
    # drift); each run's session store starts empty (the same prompts recur across modes)
    work = []
    for i, (name, prompt) in enumerate(cases):
        work += [(m, i, name, prompt) for m in modes if m != "copy"]
    if "copy" in modes:
        for i, (name, prompt, pred) in enumerate(_copy_cases(tok, files, args.prompts)):
            work += [("copy-off", i, name, (prompt, pred)), ("copy", i, name, (prompt, pred))]
    rows_by: dict[str, list] = {}
    mismatches: dict[str, int] = {}
    per_source_by: dict[str, dict] = {}
    for mode, i, name, prompt in work:
        pred = None
        if mode.startswith("copy"):
            prompt, pred = prompt
            if mode == "copy-off":
                pred = None
        eng = on_engine
        off = mode in ("off", "copy-off")
        if mode.startswith("oracle-"):
            keep = int(mode.split("-")[1]) / 100.0
            pred = _alter_ids(reference[name], tok, keep, np_rng)
        sp = eng.speculator
        if sp is not None:
            sp.sessions.clear()
        before = (dict(sp.num_drafted), dict(sp.num_accepted)) if sp is not None else None
        toks, tpot, steps, last = _serve_one(eng, f"{mode}-{i}", prompt, params, pred, off)
        if mode in ("off", "copy-off"):
            reference[(mode, name)] = toks
            if mode == "off":
                reference[name] = toks
        else:
            ref = reference[("copy-off" if mode == "copy" else "off", name)]
            if toks != ref:  # counted, not fatal: bf16 near-ties can flip a token (GPU)
                same = next((j for j, (a, b) in enumerate(zip(toks, ref)) if a != b),
                            min(len(toks), len(ref)))
                print(f"{mode} {name}: output differs from speculation off after {same} of "
                      f"{len(ref)} tokens", flush=True)
                mismatches[mode] = mismatches.get(mode, 0) + 1
        per_source = per_source_by.setdefault(mode, {"drafted": {}, "accepted": {}})
        if sp is not None:
            for key, now, old in (("drafted", sp.num_drafted, before[0]),
                                  ("accepted", sp.num_accepted, before[1])):
                for src, v in now.items():
                    per_source[key][src] = per_source[key].get(src, 0) + v - old.get(src, 0)
        rows_by.setdefault(mode, []).append({
            "name": name, "tokens": len(toks), "steps": steps, "tpot_ms": tpot * 1e3,
            "drafted": last.num_draft_tokens, "accepted": last.num_accepted_draft_tokens,
            "prediction_accepted": last.num_accepted_prediction_tokens,
            "prediction_rejected": last.num_rejected_prediction_tokens})
    for mode, rows in rows_by.items():
        per_source = per_source_by[mode]
        s = _summary(rows)
        s["per_source"] = per_source
        s["outputs_differing_from_off"] = mismatches.get(mode, 0)
        s["rows"] = rows
        results[mode] = s
        by_source = {k: f"{per_source['accepted'].get(k, 0)}/{v}"
                     for k, v in per_source["drafted"].items() if v}
        print(f"{mode:>10}: TPOT p50 {s['tpot_p50_ms']:.3f} ms (mean {s['tpot_mean_ms']:.3f}), "
              f"{s['tokens']} tokens in {s['steps']} steps, drafted {s['drafted']} accepted "
              f"{s['accepted']} ({s['accepted'] / max(1, s['drafted']):.0%}); accepted/drafted "
              f"by source {by_source}", flush=True)
    if "off" in results:
        for mode, s in results.items():
            base = results["copy-off" if mode.startswith("copy") else "off"]["tpot_p50_ms"]
            s["tpot_p50_vs_off"] = s["tpot_p50_ms"] / base
        print("TPOT p50 / off: " + ", ".join(f"{m} {s['tpot_p50_vs_off']:.2f}"
                                             for m, s in results.items()))
    sp = on_engine.speculator
    engine_stats = {
        "launch_ms": on_engine._launch_s * 1e3, "async_scheduling": on_engine.async_scheduling,
        "steps_off_by_load": sp.policy.num_steps_off_by_load if sp is not None else None,
        "step_cost_ms": {b: t * 1e3 for b, t in sp.policy.cost.table().items()}
        if sp is not None and getattr(sp.policy, "cost", None) is not None else None}
    print(f"engine: {engine_stats}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "engine": engine_stats}, f,
                      indent=1)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
