"""Engine step time with and without structured-output rows, same engine, same run.

    python -m bench.structured.steps [--model models/tiny-coder] [--batch 16] [--steps 48]
        [--fraction 0.5] [--temperature 0,0.7] [--device cpu] [--repeats 2] [--json out.json]
    # H200, 33B preset (dummy weights; the mask is the tokenizer's, see BENCHMARKS.md):
    python -m bench.structured.steps --model deepseek-coder-33b --load-format dummy \\
        --device cuda --batch 64 --fraction 0.5 --steps 128

A batch of `--batch` sequences decodes `--steps` steps; in the grammar configuration a
`--fraction` of them carry a JSON schema (an object holding an array of at least 10,000
integers, so no row finishes inside the window) and the rest are free (ignore_eos). The
configurations alternate `--repeats` times (A B A B) and each line is the median step time of
its runs, with the ratio to the free batch. On CUDA the loop is the serving one
(`Engine.advance`: async scheduling, graphs); on the CPU `Engine.step`. Also printed: the
engine's count of masked rows, how many steps the grammar rows spent pipelined, and the grammar's
own time per step (summed over its parts, so the machine's other load hardly enters it): on the
step's critical path (waiting for the mask, masking, redoing greedy rows' argmax) and on the
mask thread beside the forward.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import backend.runner.grammar as grammar_mod
import backend.runner.sampler as sampler_mod
import backend.runner.step as step_mod
from backend.engine.assemble import BackendConfig, create_engine
from backend.runner.sampler import SamplingParams
from tokenizer.grammar import GrammarSpec

# Seconds spent in the grammar's parts, summed (the machine's other load does not enter them):
# on the step's critical path (waiting for a mask, masking sampled rows, redoing the argmax of
# greedy rows) and on the mask thread (beside the forward).
TIMERS = {"wait": 0.0, "apply": 0.0, "mask_greedy": 0.0, "fill": 0.0}


def _timed(owner, name: str, key: str) -> None:
    fn = getattr(owner, name)

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            TIMERS[key] += time.perf_counter() - t0
    setattr(owner, name, timed)


_timed(grammar_mod.StepMasks, "result", "wait")
_timed(sampler_mod, "apply_token_bitmask", "apply")
_timed(step_mod.ModelRunner, "mask_greedy", "mask_greedy")
_timed(grammar_mod.GrammarManager, "_fill_native", "fill")

LONG_ARRAY = {"type": "object", "properties": {"values": {
    "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
    "minItems": 10000}}, "required": ["values"], "additionalProperties": False}


def run(engine, prompt: list[int], batch: int, num_grammar: int, steps: int, temperature: float,
        tag: str) -> dict:
    spec = GrammarSpec.json_schema(LONG_ARRAY)
    warmup = 4
    for i in range(batch):
        params = SamplingParams(max_tokens=steps + warmup + 8, temperature=temperature, seed=i,
                                ignore_eos=True, grammar=spec if i < num_grammar else None)
        assert engine.add_request(f"{tag}-{i}", prompt, params) is None
    turn = engine.advance if engine.overlaps_device else engine.step
    while engine.scheduler.num_waiting or any(  # prefill and a few decodes first
            s.num_generated < warmup for s in engine.states.values()):
        turn()
    times, pipelined, eager = [], 0, 0
    before = dict(TIMERS)
    graphs = getattr(engine.runner, "graphs", None) is not None
    for _ in range(steps):
        t0 = time.perf_counter()
        turn()
        times.append(time.perf_counter() - t0)
        step = engine._inflight or engine.last_step
        if step is not None and step.pipelined and step.mask_rows:
            pipelined += 1
        if step is not None and graphs and step.launched.graph_launch is None:
            eager += 1  # a step that did not replay a graph although graphs exist
    grammar_ms = {k: (TIMERS[k] - before[k]) * 1e3 / steps for k in TIMERS}
    for rid in list(engine.states):
        engine.abort(rid)
    while engine.has_unfinished():
        turn()
    return {"median_ms": statistics.median(times) * 1e3, "pipelined_grammar_steps": pipelined,
            "eager_steps": eager, "grammar_ms_per_step": grammar_ms}


def measure(engine, prompt, num_grammar: int, temperature: float, args) -> dict:
    """Free and constrained batches alternating `--repeats` times at one temperature."""
    runs: dict[str, list[dict]] = {"free": [], "grammar": []}
    for r in range(args.repeats):
        for name, g in (("free", 0), ("grammar", num_grammar)):
            runs[name].append(run(engine, prompt, args.batch, g, args.steps, temperature,
                                  f"{name}{r}t{temperature}"))
    free = statistics.median(x["median_ms"] for x in runs["free"])
    result = {"temperature": temperature, "runs": runs}
    for name in ("free", "grammar"):
        ms = statistics.median(x["median_ms"] for x in runs[name])
        result[f"{name}_ms"] = ms
        print(f"temperature {temperature:g}: {name:8s} batch {args.batch} "
              f"({num_grammar if name == 'grammar' else 0} with a JSON schema): {ms:.2f} ms/step"
              f"  x{ms / free:.3f}  pipelined grammar steps "
              f"{[x['pipelined_grammar_steps'] for x in runs[name]]}, eager steps "
              f"{[x['eager_steps'] for x in runs[name]]}")
    result["ratio"] = result["grammar_ms"] / free
    g = runs["grammar"]
    crit = statistics.median(sum(x["grammar_ms_per_step"][k] for k in ("wait", "apply",
                                                                       "mask_greedy"))
                             for x in g)
    fill = statistics.median(x["grammar_ms_per_step"]["fill"] for x in g)
    result["grammar_critical_ms"], result["grammar_fill_ms"] = crit, fill
    print(f"temperature {temperature:g}: grammar rows' cost per step: {crit:.3f} ms on the "
          f"step's critical path (mask wait, masking, greedy redo), {fill:.3f} ms on the mask "
          "thread beside the forward")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="models/tiny-coder")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--temperature", default="0",
                   help="one or more, comma-separated (one engine load for all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    engine, loaded = create_engine(BackendConfig(model=args.model, load_format=args.load_format,
                                                 device=args.device,
                                                 max_num_seqs=max(args.batch, 16)))
    tok = loaded.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "Reply with a JSON object."}]) \
        if tok.chat_template else tok.encode("{")
    num_grammar = round(args.batch * args.fraction)
    result = {"model": args.model, "device": args.device, "batch": args.batch,
              "grammar_rows": num_grammar, "steps": args.steps,
              "vocab": loaded.config.vocab_size,
              "by_temperature": [measure(engine, prompt, num_grammar, float(t), args)
                                 for t in args.temperature.split(",")],
              "masked_rows": engine.grammars.num_masked_rows if engine.grammars else 0}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
