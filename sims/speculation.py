"""Speculative decoding in the simulator (issue 28): one backend's steps with the real
`StepScheduler` and the SAME speculation objects as the engine (`scheduler.speculation`:
`Speculator` -> `SpeculationPolicy` -> proposers), a cost model instead of the GPU.

Each step, as the engine does it: the policy weighs the decoding sequences (class, measured
acceptance, the step's load against the knee) and the proposers draft; `schedule(drafts=...)`
turns those decodes into verify chunks; the step is charged by the cost model with every verify
as a short prefill chunk (its last token and k drafts: k + 1 query tokens at its position, the
way the engine runs it in its mixed-step graphs) and the plain decodes as decodes; the
step's time goes into the policy's `StepCostModel` (its measured knee), as the engine records
it. What a verify accepts comes from an `Acceptance`:

    OracleAcceptance     the request's output is known (greedy output of an oracle edit run):
                         drafts are accepted while they equal it; the acceptance is whatever
                         the proposers' drafts earn against it (prediction with re-sync, prompt
                         lookup), so the policy sees the same acceptance it would live
    RateAcceptance       each draft token accepted with probability alpha (or alpha_i by draft
                         position), independently: acceptance from a distribution
    TraceAcceptance      alpha_i estimated from a recorded trace of verifies (JSONL lines
                         {"drafted": k, "accepted": a}, as `bench serve` writes them)

Arrivals are open (each request's `arrival`) or closed (`concurrency`: a new request starts
when one finishes, as `bench serve --max-concurrency` sends them). Tokens of one step arrive
together at its end (one StepOutput). TPOT is vLLM bench's: (last token - first token) /
(tokens - 1); ITL: the gaps between a request's arrivals of tokens.

    from sims.speculation import SpecRequest, simulate_speculation
    out = simulate_speculation(requests, cost, SchedulerConfig(...), SpeculationConfig(),
                               OracleAcceptance(), concurrency=1)
"""
from __future__ import annotations

import heapq
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from scheduler.speculation import SessionStore, SpeculationConfig, Speculator, StepCostModel
from scheduler.step_plan import SchedulerConfig, StepResult
from scheduler.step_scheduler import StepScheduler


@dataclass(frozen=True)
class SpecRequest:
    """One request: its prompt, the output the model gives (greedy), and its prediction."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    prediction: tuple[int, ...] | None = None
    arrival: float = 0.0  # seconds (open arrivals; ignored with `concurrency`)
    max_draft_tokens: int = 0  # the request's `speculation.max_draft_tokens` (0: the server's)
    off: bool = False  # `speculation: "off"`


# ---- acceptance ---------------------------------------------------------------------------------
class OracleAcceptance:
    """Drafts accepted while they equal the known output."""

    def accepted(self, draft: Sequence[int], truth: Sequence[int], rng: np.random.Generator
                 ) -> int:
        a = 0
        for d, t in zip(draft, truth):
            if d != t:
                break
            a += 1
        return a


class RateAcceptance:
    """Each draft token accepted with probability `alpha` (a float, or one per draft position:
    the last repeats), independently of the tokens."""

    def __init__(self, alpha: float | Sequence[float]) -> None:
        self.alpha = [float(alpha)] if isinstance(alpha, (int, float)) else [float(a) for a in alpha]
        if not self.alpha or any(not 0.0 <= a <= 1.0 for a in self.alpha):
            raise ValueError("acceptance rates must be in [0, 1]")

    def accepted(self, draft: Sequence[int], truth: Sequence[int], rng: np.random.Generator
                 ) -> int:
        a, last = 0, len(self.alpha) - 1
        for i in range(len(draft)):
            p = self.alpha[min(i, last)]
            if p < 1.0 and rng.random() >= p:
                break
            a += 1
        return a


class TraceAcceptance(RateAcceptance):
    """alpha_i (acceptance at draft position i, given the draft reached it) from recorded
    verifies: accepted at i / verifies that drafted i and accepted everything before it."""

    def __init__(self, records: Sequence[tuple[int, int]]) -> None:
        k_max = max((k for k, _ in records), default=0)
        if k_max == 0:
            raise ValueError("the trace has no verify with a draft")
        reached = np.zeros(k_max)
        passed = np.zeros(k_max)
        for k, a in records:
            for i in range(min(k, a + 1)):
                reached[i] += 1
                passed[i] += i < a
        alpha = [passed[i] / reached[i] if reached[i] else 0.0 for i in range(k_max)]
        super().__init__(alpha)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> TraceAcceptance:
        records = []
        for line in Path(path).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                records.append((int(r["drafted"]), int(r["accepted"])))
        return cls(records)


# ---- the simulation -------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    arrival: float
    token_times: list[float] = field(default_factory=list)
    finish: float = 0.0
    drafted: int = 0
    accepted: int = 0
    verifies: int = 0

    @property
    def tpot(self) -> float | None:
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


@dataclass
class SpecSimResult:
    records: list[RequestRecord]
    steps: list[tuple[float, int, int, int, int]]  # (seconds, plain decodes, verifies, drafts, prefill)
    decisions: list[dict[str, int]]  # per step: request id -> draft tokens the policy gave
    makespan: float
    source_stats: dict
    outputs: dict[int, list[int]] = field(default_factory=dict)  # request -> generated tokens
    host_turn_s: list[float] = field(default_factory=list)  # each drafting step's host turn

    def summary(self) -> dict:
        tpots = [r.tpot for r in self.records if r.tpot is not None]
        ttfts = [r.token_times[0] - r.arrival for r in self.records if r.token_times]
        itl = [b - a for r in self.records
               for a, b in zip(r.token_times, r.token_times[1:]) if b > a]
        drafted = sum(r.drafted for r in self.records)
        accepted = sum(r.accepted for r in self.records)
        verifies = sum(r.verifies for r in self.records)
        out_tokens = sum(len(r.token_times) for r in self.records)
        steps_drafting = sum(1 for d in self.decisions if d)

        def pct(xs, q):
            return float(np.percentile(xs, q)) if xs else None

        return {
            "num_requests": len(self.records), "output_tokens": out_tokens,
            "makespan_s": self.makespan,
            "output_throughput_tok_s": out_tokens / self.makespan if self.makespan else 0.0,
            "tpot_p50_s": pct(tpots, 50), "tpot_p90_s": pct(tpots, 90),
            "tpot_mean_s": float(np.mean(tpots)) if tpots else None,
            "itl_p50_s": pct(itl, 50), "itl_p90_s": pct(itl, 90),
            "ttft_p50_s": pct(ttfts, 50),
            "num_steps": len(self.steps), "steps_drafting": steps_drafting,
            "draft_tokens": drafted, "accepted_tokens": accepted, "verifies": verifies,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_per_verify": accepted / verifies if verifies else None,
            "tokens_per_step_per_seq": out_tokens / max(1, sum(s[1] + s[2] for s in self.steps)),
            "by_source": self.source_stats,
            "host_turn_ms_mean": float(np.mean(self.host_turn_s)) * 1e3 if self.host_turn_s
            else None,
        }


def _step_cost(cost, plan) -> tuple[float, int]:
    """(seconds, tokens) of a step: plain decodes as decodes; verifies and prefill chunks as
    prefill chunks (a verify: its k + 1 tokens at its position), the verifies' drafts named to
    a cost model whose profile timed verify steps."""
    plain = 0
    chunks = []
    ctx = 0
    drafts = 0
    for c in plan.chunks:
        n = len(c.token_ids)
        ctx += c.start_pos + n
        if not c.is_prefill and not c.num_draft:
            plain += 1
        else:
            chunks.append((n, c.start_pos))
            drafts += c.num_draft
    tokens = plain + sum(n for n, _ in chunks)
    p = tokens - plain
    if getattr(cost, "measures_verifies", False):
        return cost.step_time(plain, p, ctx, prefill_chunks=chunks, num_draft_tokens=drafts), tokens
    if getattr(cost, "accepts_prefill_chunks", False):
        return cost.step_time(plain, p, ctx, prefill_chunks=chunks), tokens
    return cost.step_time(plain, p, ctx), tokens


def simulate_speculation(requests: Sequence[SpecRequest], cost, sched_config: SchedulerConfig,
                         spec_config: SpeculationConfig | None, acceptance=None, *,
                         concurrency: int | None = None, seed: int = 0,
                         warmup: Sequence[SpecRequest] = (), keep_sessions: bool = False,
                         async_scheduling: bool = False, reset_on_resync: bool = True,
                         host_turn: str = "launch",
                         max_steps: int = 10_000_000) -> SpecSimResult:
    """Run `requests` through one simulated backend. `spec_config` None: no speculation (the
    same steps a plain engine runs). `warmup`: requests run first on the same backend (its
    prefix cache and the speculator's measured knee), not in the result: the live oracle's
    baseline before its measured runs; its outputs leave the session store afterwards
    (`keep_sessions` False), as bench's oracle flushes them out of the live engine's.
    `async_scheduling`: the CUDA engine's turns (`EngineTurns`); False: the CPU engine's;
    `reset_on_resync` False: those turns as they were before the back-off ended when a
    prediction re-synchronises (`scheduler.speculation.DraftBackoff`), for comparison.
    `host_turn`: what a drafting step (not pipelined, async scheduling) pays for the host's
    turn before it (`EngineTurns.HOST_TURNS`)."""
    acceptance = acceptance or OracleAcceptance()
    rng = np.random.default_rng(seed)
    sched = StepScheduler(sched_config)
    spec = Speculator(spec_config, StepCostModel()) if spec_config is not None else None
    if spec is not None:
        spec.backoff.reset_on_align = reset_on_resync
    all_reqs = list(warmup) + list(requests)
    records = [RequestRecord(0.0) for _ in all_reqs]
    generated = [0] * len(all_reqs)
    outputs: dict[int, list[int]] = {}
    steps: list[tuple[float, int, int, int, int]] = []
    decisions: list[dict[str, int]] = []
    now = 0.0
    budget = [max_steps]
    turns = EngineTurns(async_scheduling, sched_config.max_num_seqs,
                        sched_config.max_num_batched_tokens, host_turn)
    if warmup:
        now, _, _ = _run_phase(range(len(warmup)), all_reqs, now, sched, spec, cost, acceptance,
                               rng, concurrency, records, generated, {}, budget, turns)
        if spec is not None and not keep_sessions:  # as bench's oracle flushes the live store
            store = spec.sessions
            spec.sessions = spec.session.store = SessionStore(
                store.n_min, store.n_max, store.max_sessions, store.max_tokens)
    first = len(warmup)
    start = now
    turns.charged_s = []  # the measured phase's only
    now, steps, decisions = _run_phase(range(first, len(all_reqs)), all_reqs, now, sched, spec,
                                       cost, acceptance, rng, concurrency, records, generated,
                                       outputs, budget, turns)
    stats = spec.stats() if spec is not None else {}
    return SpecSimResult(records[first:], steps, decisions, now - start, stats,
                         {i - first: o for i, o in outputs.items()}, turns.charged_s)


class EngineTurns:
    """When the engine asks its Speculator for drafts, and with what (backend.engine.continuous:
    `_may_speculate` and `_drafts`), so that the simulator's policy decisions are the engine's.

    With async scheduling (the CUDA engine) a step is planned while the one before runs, and
    drafts need that step's tokens: the engine reads it back first only after a step that
    drafted, or when drafting may pay (some sequence speculates and the load is not
    saturated); after asking and getting nothing it stays pipelined for 1, 3, 7, 15, 16 turns
    unless a prediction finds its place again (the Speculator's own `DraftBackoff`, the
    engine's object).
    The policy's plan gets the step's logit-row room under the graphs (max_num_seqs + 1 -
    running) and twice the host's launch time (what a read-back costs the device). Without
    async scheduling (the CPU engine) it asks every step."""

    # What a drafting step pays for the host's turn before it (with async scheduling; a
    # pipelined step's turn runs in the device's shadow): "launch", one more host launch of the
    # step's shape from the profile's launch fit (deterministic; for a simulator run elsewhere
    # than the backend's host); "measured", the wall time this simulator's own run of the same
    # code takes on this host (the Speculator's drafting, the StepScheduler's schedule and
    # update, the acceptance and the speculator's bookkeeping: what the engine runs in that
    # turn, less its records and the worker's delivery), for a simulator run on the host the
    # backend ran on (issue 28's H200 validation); not reproducible run to run
    HOST_TURNS = ("launch", "measured")

    def __init__(self, async_scheduling: bool = False, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int = 2048, host_turn: str = "launch") -> None:
        if host_turn not in self.HOST_TURNS:
            raise ValueError(f"host_turn must be one of {self.HOST_TURNS}, not {host_turn!r}")
        self.async_scheduling = async_scheduling
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.host_turn = host_turn
        self.drafted_last = False
        self.last_post_s = 0.0  # the measured handling of the last step's tokens
        self.charged_s: list[float] = []  # each drafting step's host turn charged

    def turn_seconds(self, cost, plan, planning_s: float) -> float:
        """The host turn a drafting step waits for (see HOST_TURNS)."""
        if self.host_turn == "measured":
            return self.last_post_s + planning_s
        launch = getattr(cost, "launch_time", None)
        if launch is None:
            return 0.0
        return launch(sum(1 for c in plan.chunks if not c.is_prefill and not c.num_draft),
                      sum(len(c.token_ids) for c in plan.chunks if c.is_prefill or c.num_draft))

    def _may_speculate(self, spec, sched) -> bool:
        if spec.backoff.skip():
            return False
        num = sched.decodes.num_decoding
        if num == 0 or spec.policy.saturated(num + min(
                sched.num_waiting_tokens, self.max_num_batched_tokens - num)):
            return False
        return any(not st.off for st in spec.states.values())

    def drafts(self, spec, sched, cost) -> dict[str, list[int]]:
        if self.async_scheduling and not self.drafted_last and \
                not self._may_speculate(spec, sched):
            return {}
        self.drafted_last = False
        seqs = sched.decoding_sequences()
        if not seqs:
            return {}
        num_prefill = sched.planned_prefill_tokens()
        if spec.policy.saturated(len(seqs) + num_prefill):
            spec.policy.num_steps_off_by_load += 1
            return {}
        loads = []
        for q in seqs:
            load = spec.load(q.request_id, q.max_tokens - q.num_output_tokens, q.rank)
            if load is not None:
                loads.append(load)
        max_rows = None
        fixed_s = 0.0
        if self.async_scheduling:
            if self.max_num_seqs is not None:
                max_rows = self.max_num_seqs + 1 - len(sched.running)
            launch = getattr(cost, "launch_time", None)
            fixed_s = 2 * launch(len(seqs), num_prefill) if launch is not None else 0.0
        drafts = spec.plan(loads, len(seqs), num_prefill, max_rows, fixed_s) or {}
        spec.backoff.asked(bool(drafts))
        self.drafted_last = bool(drafts)
        return drafts


def _run_phase(indexes: range, requests: Sequence[SpecRequest], now: float, sched, spec, cost,
               acceptance, rng, concurrency: int | None, records: list[RequestRecord],
               generated: list[int], outputs: dict[int, list[int]], budget: list[int],
               turns: EngineTurns) -> tuple[float, list, list]:
    """Requests `indexes` from `now` until they all finish -> (end time, steps, decisions)."""
    ids = list(indexes)
    n = len(ids)
    t0 = now
    # arrivals: (time, index); closed loop releases the next one at each finish
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        arrivals = [(t0, i) for i in ids[:concurrency]]
        next_closed = len(arrivals)
    else:
        arrivals = [(t0 + float(requests[i].arrival), i) for i in ids]
        next_closed = n
    heapq.heapify(arrivals)
    steps: list[tuple[float, int, int, int, int]] = []
    decisions: list[dict[str, int]] = []
    done = 0
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            raise RuntimeError("the simulation did not finish in its step budget")
        while arrivals and arrivals[0][0] <= now:
            t, i = heapq.heappop(arrivals)
            r = requests[i]
            records[i].arrival = t
            rid = str(i)
            sched.add_request(rid, list(r.prompt), len(r.output), t)
            if spec is not None:
                spec.add(rid, r.prompt, r.prediction, r.max_draft_tokens, r.off)
        if not sched.has_unfinished():
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        t_plan = time.perf_counter()
        drafts = turns.drafts(spec, sched, cost) if spec is not None else {}
        decisions.append({rid: len(d) for rid, d in drafts.items()})
        plan = sched.schedule(list_decodes=True, drafts=drafts)
        planning_s = time.perf_counter() - t_plan
        if not plan.chunks:
            if not arrivals:
                raise RuntimeError("the scheduler can run nothing and nothing arrives")
            now = max(now, arrivals[0][0])
            continue
        seconds, tokens = _step_cost(cost, plan)
        if spec is not None and turns.async_scheduling:
            spec.index_ahead()  # while the step runs, as the CUDA engine does after a launch
        if drafts and turns.async_scheduling:
            # a step with drafts is not pipelined: the host's turn before it (the step before
            # read back and its tokens handled, delivered, this step planned) runs while the
            # device waits, where a pipelined step hides it. The profile times a step from its
            # launch to its read-back (its verify points too), not that turn (`EngineTurns.
            # HOST_TURNS`). Live H200 drafting steps ran 0.6-1.9 ms over the profile's time for
            # their shape at c = 1 / 8 / 32 (33B, ~3,100-token edits), and 2.3-2.8 ms at
            # c = 32 while prompt-lookup indexes caught up in the planning, which now runs
            # after the launch (`Speculator.index_ahead`)
            turn_s = turns.turn_seconds(cost, plan, planning_s)
            turns.charged_s.append(turn_s)
            seconds += turn_s
        t_post = time.perf_counter()
        now += seconds
        if spec is not None and spec.policy.cost is not None:
            spec.policy.cost.observe(tokens, seconds)
        sampled: dict[str, int] = {}
        accepted: dict[str, list[int]] = {}
        new_tokens: dict[str, list[int]] = {}
        num_verify = num_draft = num_plain = num_prefill = 0
        for c in plan.chunks:
            if c.is_prefill:
                num_prefill += len(c.token_ids)
            elif c.num_draft:
                num_verify += 1
                num_draft += c.num_draft
            else:
                num_plain += 1
            if not c.sample:
                continue
            i = int(c.request_id)
            out = requests[i].output
            g = generated[i]
            if c.num_draft:
                draft = c.token_ids[1:]
                a = acceptance.accepted(draft, out[g:g + len(draft)], rng)
                accepted[c.request_id] = list(draft[:a])
                tok = out[g + a]
                new = list(draft[:a]) + [tok]
                rec = records[i]
                rec.drafted += len(draft)
                rec.accepted += a
                rec.verifies += 1
                spec.verified(c.request_id, len(draft), a)
            else:
                tok = out[g]
                new = [tok]
            sampled[c.request_id] = tok
            new_tokens[c.request_id] = new
        steps.append((seconds, num_plain, num_verify, num_draft, num_prefill))
        finished = sched.update(plan, StepResult(sampled, set(), accepted=accepted))
        for rid, new in new_tokens.items():
            i = int(rid)
            generated[i] += len(new)
            records[i].token_times.extend([now] * len(new))
            if spec is not None:
                spec.append(rid, new)
        for f in finished:
            i = int(f.request_id)
            records[i].finish = now
            outputs[i] = list(f.output_token_ids)
            done += 1
            if spec is not None:
                spec.finish(f.request_id)
            if next_closed < n:
                heapq.heappush(arrivals, (now, ids[next_closed]))
                next_closed += 1
        turns.last_post_s = time.perf_counter() - t_post
        if done == n:
            break
    return now, steps, decisions


# ---- workloads ------------------------------------------------------------------------------------
def synthetic_edit_requests(num_requests: int, prompt_len: int, output_len: int, keep: float,
                            *, line_tokens: int = 12, vocab: int = 30000, seed: int = 0,
                            rate: float | None = None) -> list[SpecRequest]:
    """Oracle edit requests on token ids: an output of `output_len` tokens in lines of
    `line_tokens` (the last one the newline id 0), a prediction equal to it but for
    round((1 - keep) * lines) lines (`sims.edit_workload.alter_tokens`), a prompt of random ids.
    `rate`: Poisson arrivals at that rate; None: all at 0 (closed-loop runs)."""
    from sims.edit_workload import alter_tokens

    rng = np.random.default_rng(seed)
    t = 0.0
    out = []
    for _ in range(num_requests):
        toks = rng.integers(1, vocab, size=output_len).tolist()
        for j in range(line_tokens - 1, output_len, line_tokens):
            toks[j] = 0
        pred, _ = alter_tokens(toks, keep, newline=0, fresh_id=vocab, seed=rng)
        prompt = rng.integers(1, vocab, size=prompt_len).tolist()
        if rate:
            t += float(rng.exponential(1.0 / rate))
        out.append(SpecRequest(tuple(prompt), tuple(toks), tuple(pred), arrival=t))
    return out


def load_trace(path: str | Path, concurrency_arrivals: bool = True) -> list[SpecRequest]:
    """Requests recorded by `tidegate bench serve --workload edit --oracle --trace-dir` (one JSON
    line each: prompt, output and prediction token ids), in order, all arriving at 0 (for a
    closed-loop replay at the live run's concurrency)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        pred = r.get("prediction")
        out.append(SpecRequest(tuple(r["prompt"]) or (0,), tuple(r["output"]),
                               tuple(pred) if pred else None))
    if not out:
        raise ValueError(f"{path}: no request")
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m sims.speculation: the oracle edit workload (synthetic or a live run's trace)
    through the simulator with speculation off and on, side by side."""
    import argparse

    from sims.cost import ConstantCost
    from sims.profile_cost import ProfileCost

    p = argparse.ArgumentParser(prog="python -m sims.speculation", description=main.__doc__)
    p.add_argument("--profile", help="measured profile JSON (tidegate backend profile)")
    p.add_argument("--step-ms", type=float, default=None, help="constant step time instead")
    p.add_argument("--trace", nargs="+", default=[], help="bench --trace-dir JSONL file(s); "
                   "one run each (the requests' prompts, outputs and predictions)")
    p.add_argument("--keep", default="1,0.75,0.5", help="synthetic: lines left unchanged")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--line-tokens", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--acceptance", default="oracle", help="oracle | rate:ALPHA | trace:FILE")
    p.add_argument("--max-draft-tokens", type=int, default=SpeculationConfig.max_draft_tokens)
    p.add_argument("--knee-tokens", type=int, default=SpeculationConfig.knee_tokens)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="the CUDA engine's turns (default: on with a CUDA profile)")
    p.add_argument("--reset-on-resync", action=argparse.BooleanOptionalAction, default=True,
                   help="the engine's back-off ends when a prediction re-synchronises (default; "
                        "--no-reset-on-resync: the rule before it, for comparison)")
    p.add_argument("--host-turn", choices=EngineTurns.HOST_TURNS, default="launch",
                   help="a drafting step's wait for the host's turn before it: one more host "
                        "launch from the profile (default), or this run's own time for the same "
                        "code (only where the backend ran: its host)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.profile:
        cost = ProfileCost.from_json(args.profile)
    elif args.step_ms:
        cost = ConstantCost(args.step_ms / 1e3)
    else:
        p.error("give --profile or --step-ms")
    async_sched = args.async_scheduling
    if async_sched is None:
        async_sched = str(getattr(cost, "meta", {}).get("device", "")).startswith("cuda")
    kind, _, value = args.acceptance.partition(":")
    acceptance = {"oracle": lambda: OracleAcceptance(),
                  "rate": lambda: RateAcceptance(float(value)),
                  "trace": lambda: TraceAcceptance.from_jsonl(value)}[kind]()
    sched = SchedulerConfig(max_model_len=args.max_model_len,
                            num_blocks=cost.num_kv_blocks(args.block_size),
                            max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens,
                            block_size=args.block_size, enable_prefix_caching=True)
    spec = SpeculationConfig(max_draft_tokens=args.max_draft_tokens,
                             knee_tokens=args.knee_tokens)
    if args.trace:
        workloads = {Path(t).stem: load_trace(t) for t in args.trace}
    else:
        workloads = {f"keep={float(k):g}": synthetic_edit_requests(
            args.num_requests, args.input_len, args.output_len, float(k),
            line_tokens=args.line_tokens, seed=args.seed)
            for k in str(args.keep).split(",") if k.strip()}
    report: dict = {"concurrency": args.concurrency, "cost": cost.describe(),
                    "speculation": vars(args), "runs": {}}
    print(f"{'run':<14}{'spec':>9}{'TPOT p50 ms':>13}{'ITL p50':>9}{'tok/s':>9}"
          f"{'accept':>8}{'ratio':>7}")
    for name, reqs in workloads.items():
        # as the live oracle runs: the baseline (speculation off) first, then the measured run
        # on the same backend (its prefix cache holds the prompts by then)
        baseline = [replace(r, off=True) for r in reqs]
        # the reference is timed warm too (bench's `off`: a second pass over the same prompts);
        # the cold pass is `off_cold`. Against the cold one the simulated c=8 and c=32 "off"
        # TPOTs came out 1.29x and 2.25x the live warm reference (the prefills the cold pass
        # runs beside its decodes)
        off_cold = simulate_speculation(reqs, cost, sched, None, concurrency=args.concurrency,
                                        seed=args.seed, async_scheduling=async_sched).summary()
        off = simulate_speculation(reqs, cost, sched, None, warmup=baseline,
                                   concurrency=args.concurrency, seed=args.seed,
                                   async_scheduling=async_sched).summary()
        on = simulate_speculation(reqs, cost, sched, spec, acceptance, warmup=baseline,
                                  concurrency=args.concurrency, seed=args.seed,
                                  async_scheduling=async_sched,
                                  reset_on_resync=args.reset_on_resync,
                                  host_turn=args.host_turn).summary()
        ratio = on["tpot_p50_s"] / off["tpot_p50_s"] if off["tpot_p50_s"] else None
        report["runs"][name] = {"off_cold": off_cold, "off": off, "on": on,
                                "tpot_p50_ratio": ratio}
        for label, s in (("off_cold", off_cold), ("off", off), ("on", on)):
            acc = s["acceptance_rate"]
            print(f"{name:<14}{label:>9}{s['tpot_p50_s'] * 1e3:>13.2f}"
                  f"{(s['itl_p50_s'] or 0) * 1e3:>9.2f}{s['output_throughput_tok_s']:>9.1f}"
                  f"{'' if acc is None else f'{acc:.3f}':>8}"
                  f"{'' if label != 'on' or ratio is None else f'{ratio:.3f}':>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
