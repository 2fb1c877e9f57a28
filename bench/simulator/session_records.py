"""A committed `sim validate` session read back run by run: which arrivals and gateway windows
belong to which (seed, load) run, the streams of the live step that gave each request its first
token, and a run's client <-> gateway path records. Used by `bench.simulator.validate_replay` and
`bench.simulator.gateway_loop` (issue 35); its own module so that `sim validate`, which imports the
gateway-loop model, does not import the replay tool through it."""
from __future__ import annotations


def run_arrivals(validate: dict, arrivals, batches) -> dict[tuple[int, int], tuple[list, list]]:
    """(seed index, load index) -> that run's arrivals (log order) and the gateway's windows of
    them, as `sim validate` read them after each run (the warm-up's are not any run's)."""
    from bench.simulator.fidelity_resim import prompt_identity

    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].t)
    _, runs = prompt_identity(validate["config"], len(arrivals))
    run_of = {arrivals[i].request_id: r for i, r in zip(order, runs, strict=True)}
    out: dict[tuple[int, int], tuple[list, list]] = {}
    for a in arrivals:
        r = run_of[a.request_id]
        if r != (-1, -1):
            out.setdefault(r, ([], []))[0].append(a)
    for b in batches:
        r = run_of.get(b.request_ids[0]) if b.request_ids else None
        if r is not None and r != (-1, -1):
            out[r][1].append(b)
    return out


def first_token_streams(step_rows: list[dict]) -> dict[str, int]:
    """Request id -> the streams (decodes + prefill chunks) of the live step that gave its first
    token (the step of its last prefill chunk)."""
    seqs: dict[str, int] = {}
    for r in step_rows:
        for rid, _n, _p in r["prefill"]:
            seqs[rid] = int(r["decodes"]) + len(r["prefill"])
    return seqs


def path_records(run: dict, ids: list[str], streams: dict[str, int]) -> tuple[dict, dict | None]:
    """One run's (path medians, per-request records) as `delivery_path` reads them: the recorded
    ones, or (sessions before them) the run's median `out` and the step log's streams."""
    med = run.get("ttft_path_ms") or {}
    pr = run.get("ttft_path_requests")
    if pr is None and med.get("num_requests"):
        seqs = [streams[r] for r in ids if r in streams]
        pr = {"step_seqs": seqs, "out_ms": [med["out"]]} if seqs else None
    return med, pr
