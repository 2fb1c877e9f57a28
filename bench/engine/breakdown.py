"""`python -m bench.engine.breakdown`: where one engine step's time goes, per phase, at a few batch sizes.

Drives the real engine (scheduler, block manager, runner, model, sampler) on the CPU (or any
device) with B identical-shape requests, and times each phase of every step by wrapping the
objects the engine already calls (nothing in the engine changes for it):

    schedule    StepScheduler.schedule (block manager included)
    prepare     ModelRunner.prepare: the chunks -> static input buffers
    attention   the injected attention object (KV write + paged attention)
    linears     every nn.Linear in the decoder layers (qkv, o, gate_up, down)
    other model embedding, norms, rotary, SwiGLU = model forward - attention - linears
    logits      LM head (compute_logits)
    sampler     Sampler.__call__ (tensor build + sample + logprobs + .tolist())
    update      StepScheduler.update
    engine rest Engine.step - everything above (stop checks, RequestOutput records, specs)
    serialize   the worker's StepOutput build + protobuf/frames encode for the step's outputs
    host        schedule + prepare + sampler + update + engine rest + serialize

Times are this thread's CPU time by default (`--clock cpu`): on a shared machine wall time is
mostly waiting for a core. Prefill steps (any chunk is a prefill) and decode steps are reported apart. Wrapping adds a
perf_counter pair per call (~0.2 µs), small next to every phase measured here.

    python -m bench.engine.breakdown --model models/tiny-coder --batches 1,32,200 --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import torch

PHASES = ("schedule", "prepare", "attention", "linears", "other_model", "logits", "sampler",
          "update", "engine_rest", "serialize", "host")
# the engine's and worker's own work around the model (what async scheduling would hide)
HOST_PHASES = ("schedule", "prepare", "sampler", "update", "engine_rest", "serialize")


class _Timer:
    """Accumulates seconds per phase for the current step."""

    def __init__(self, clock) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.clock = clock

    def wrap(self, name: str, fn):
        acc = self.acc
        clock = self.clock

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += clock() - t0
        return timed


def instrument(engine, timer: _Timer) -> None:
    runner, model = engine.runner, engine.runner.model
    engine.scheduler.schedule = timer.wrap("schedule", engine.scheduler.schedule)
    engine.scheduler.update = timer.wrap("update", engine.scheduler.update)
    runner.prepare = timer.wrap("prepare", runner.prepare)
    runner.sampler.sample_specs = timer.wrap("sampler", runner.sampler.sample_specs)
    model.attn = timer.wrap("attention", model.attn)
    model.compute_logits = timer.wrap("logits", model.compute_logits)
    # model forward (total) -- patched on the instance so runner's call goes through it
    model.forward = timer.wrap("model", model.forward)
    for layer in model.layers:
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                    layer.mlp.down_proj):
            lin.forward = timer.wrap("linears", lin.forward)


def _serializer(engine):
    """The worker's StepOutput encode, run on a socket-less Worker (encode only)."""
    from backend.server.worker import Worker

    w = Worker.__new__(Worker)
    w.num_steps = 0
    w.pin_status = {}
    sent = []
    w._send = lambda identity, env, arrays=(): sent.append(
        __import__("proto.codec", fromlist=["encode_trusted"]).encode_trusted(env, arrays))
    return w, sent


def run_batch(engine, timer: _Timer, batch: int, prompt_len: int, output_len: int,
              seed: int) -> dict:
    from backend.runner.sampler import SamplingParams

    vocab = engine.runner.model.config.vocab_size
    rng = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=rng).tolist()
        assert engine.add_request(f"b{batch}-{i}", prompt, params) is None
    worker, sent = _serializer(engine)
    steps = {"prefill": [], "decode": []}
    clock = timer.clock
    while engine.has_unfinished():
        timer.acc.clear()
        t0 = clock()
        outs = engine.step()
        t1 = clock()
        if outs:
            worker._send_step_output(b"gw", outs)
        t2 = clock()
        sent.clear()
        a = dict(timer.acc)
        a["serialize"] = t2 - t1
        a["step"] = t1 - t0
        model_t = a.pop("model", 0.0)
        a["other_model"] = model_t - a.get("attention", 0.0) - a.get("linears", 0.0)
        a["engine_rest"] = a["step"] - sum(a.get(k, 0.0) for k in (
            "schedule", "prepare", "update", "sampler", "logits")) - model_t
        a["host"] = sum(a.get(k, 0.0) for k in HOST_PHASES)
        kind = "prefill" if _last_plan_had_prefill(engine) else "decode"
        a["num_outputs"] = len(outs)
        steps[kind].append(a)
    return steps


def _last_plan_had_prefill(engine) -> bool:
    return engine._last_plan_prefill


def _track_plans(engine) -> None:
    """Remember whether the last schedule()'s plan held a prefill chunk."""
    engine._last_plan_prefill = False
    inner = engine.scheduler.schedule

    def schedule(*args, **kwargs):
        plan = inner(*args, **kwargs)
        engine._last_plan_prefill = any(c.is_prefill for c in plan.chunks)
        return plan
    engine.scheduler.schedule = schedule


def summarize(steps: list[dict]) -> dict:
    if not steps:
        return {}
    out = {"num_steps": len(steps)}
    for k in ("step", *PHASES):
        out[k + "_ms"] = statistics.median(s.get(k, 0.0) for s in steps) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    from backend.engine.assemble import BackendConfig, create_engine

    p = argparse.ArgumentParser(prog="python -m bench.engine.breakdown", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/tiny-coder")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batches", default="1,32,200")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--cpu-threads", type=int, default=None)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="cpu: this thread's CPU time (right with --cpu-threads 1 on a shared "
                        "machine); wall: perf_counter")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    batches = [int(x) for x in a.batches.split(",") if x]
    cfg = BackendConfig(model=a.model, dtype=a.dtype, max_num_seqs=max(256, max(batches)),
                        max_model_len=2048, cpu_threads=a.cpu_threads)
    engine, loaded = create_engine(cfg)
    _track_plans(engine)
    # thread CPU time: on a shared machine a step's wall time is mostly waiting for a core;
    # with one intra-op thread the model's work runs on this thread, so its CPU time is the cost
    timer = _Timer(time.thread_time if a.clock == "cpu" else time.perf_counter)
    instrument(engine, timer)
    results = {"clock": a.clock, "model": a.model, "dtype": str(loaded.dtype), "threads": torch.get_num_threads(),
               "prompt_len": a.prompt_len, "output_len": a.output_len, "batches": {}}
    run_batch(engine, timer, 2, a.prompt_len, 4, seed=99)  # warm-up
    for b in batches:
        steps = run_batch(engine, timer, b, a.prompt_len, a.output_len, seed=b)
        results["batches"][b] = {k: summarize(v) for k, v in steps.items()}
        for kind in ("prefill", "decode"):
            s = results["batches"][b][kind]
            if s:
                print(f"B={b:4d} {kind:7s} n={s['num_steps']:3d} step {s['step_ms']:8.2f} ms | " +
                      " ".join(f"{k} {s[k + '_ms']:.2f}" for k in PHASES), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
