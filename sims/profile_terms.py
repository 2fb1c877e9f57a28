"""The measured cost model's engine terms a profile itself supports, for every simulation on it.

`tidegate sim validate` (issue 35) charges a CUDA profile's steps as the live engine runs them: the
async loop launches a step while the one before it runs (the launch hidden, each step planned a
lead before the step in flight ends), the H200's power limiter slows steps by what ran before them
(the pause check), by the power each kind of step draws (the capped mixed step's sustained run).
Those terms took the grid's cells inside their bounds (BENCHMARKS, the fidelity table). Until
session 26 every `sim` command that takes `--profile` (run, sweep, search, slo, window, agent,
retry-bound) charged the bare profile instead (a step's wall time with its launch, no cap) and no
prefill cap while decoding (the simulator's default; the CUDA engine's is 256 tokens), a model no
validation had scored. Against the H200 grid's live runs
(bench/results/sim_profile_terms_s26, P50 errors at 0.5 / 0.8 / 0.95x) it put TTFT 29-55 % low on
every part, the prompts prefilled whole; with the engine's terms TTFT reads -12..+3 % and TPOT
-4..+3 % (6.7B mixed lengths: TTFT -47 / -54 / -55 -> -12 / -12 / -12 %, TPOT -1 / -4 / -6 ->
-1 / -1 / -2 %). The TTFT left is the gateway's: its delivery path and event loop, which `sim
validate` fits from a live run's logs (`--delivery-delay-ms`, `--delivery-per-stream-ms` here).

`engine_terms` reads from the profile alone what `sim validate` reads from it (the terms measured
from a live run's logs are not the profile's and stay at their flags). `--profile-terms off` gives
the bare profile.
"""
from __future__ import annotations

from sims.profile_cost import plan_leads


def has_sustained_mixed(profile_doc: dict) -> bool:
    """The profile's pause check has the mixed step's sustained run, which the power-by-kind cap
    reads (sims.profile_cost, "Power by step kind")."""
    return any(r.get("run") == "sustained_mixed" for r in (profile_doc.get("pause_check") or {}).get("runs", []))


def has_pause_check(profile_doc: dict) -> bool:
    """Measured with `--pause-ms`: its points are of a GPU idle before them (the power cap's
    reference), which live steps under load are not."""
    return bool(profile_doc.get("pause_check")) and float(profile_doc.get("pause_ms") or 0) > 0


def engine_terms(profile_doc: dict) -> dict:
    """{"cost": CostSpec's terms, "engine": EngineConfig's, "device": "cuda" | "cpu"} for a
    simulation on this profile, as the live engine that measured it runs: on a CUDA profile with
    launch times the async loop (launch hidden; the plan leads by the kind of the step in flight,
    `plan_leads`), the power cap where the profile has its pause check, by step kind where it has
    the mixed step's sustained run; the device, whose default prefill cap while decoding the
    scheduler takes (`scheduler.capacity.prefill_cap_from_args`: 256 tokens on CUDA, where the
    simulator's own default is none). A CPU profile, or one without launch times: the engine's loop
    is synchronous, nothing to hide."""
    device = "cuda" if str(profile_doc.get("device", "")).startswith("cuda") else "cpu"
    cost = {"power_cap": has_pause_check(profile_doc)}
    if cost["power_cap"] and has_sustained_mixed(profile_doc):
        cost["cap_by_power"] = True
    engine = {}
    leads = plan_leads(profile_doc) if device == "cuda" else None
    if leads is not None:
        cost["hide_launch"] = True
        engine = {"async_plan_lead_s": leads["decode_only_s"],
                  "async_plan_lead_prefill_s": leads["with_prefill_s"]}
    return {"cost": cost, "engine": engine, "device": device}
