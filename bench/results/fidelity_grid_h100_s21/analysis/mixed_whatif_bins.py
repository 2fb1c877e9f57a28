"""Issue 35, session 20, a what-if: prefill_bins.py with the decode-only spread multiple (the
decode kernel's launch model at the measured kappa) applied to the decodes' context of the steps
with prefill too. It over-charges them (1.04-1.11 x live at 9-256 decodes on the 6.7B): a mixed
step runs another tiling of the paged kernel (max_query_len 2, beside the chunk's programs).

    python mixed_whatif_bins.py PART_DIR
"""
import sys

from prefill_bins import main

from bench.simulator.fidelity_steps import busy_shares


def model_step_ms(cost, steps, window_s=0.1):
    """fidelity_steps.model_step_ms (the compute-share cap, as the grid state's model) with the
    spread multiple on every step's decode contexts."""
    idle_launch = cost.launch_time if getattr(cost, "hides_launch", False) else None
    spread = cost.decode_context_multiple if getattr(cost, "charges_decode_spread", False) else None
    tau = getattr(cost, "power_cap_tau_s", None)
    if tau is not None:
        window_s = max(window_s, cost.power_cap_window_s)
    out = []
    for k, s in enumerate(steps):
        if not s["d"] and not s["p"]:
            continue
        chunks = s["chunks"] or None
        dctx = s["ctx"]
        if spread is not None and len(s.get("ctxs") or ()) >= 2:
            dctx = int(dctx * spread(s["ctxs"]))
        ctx = dctx + sum(n + st for n, st in s["chunks"])
        t = cost.step_time(s["d"], s["p"], ctx, chunks)
        f, g = busy_shares(steps, k, window_s, tau)
        t *= cost.prefill_slowdown(f, g, cost.compute_share(s["d"], s["p"], ctx, chunks))
        if idle_launch is not None and s["idle_before"]:
            t += idle_launch(s["d"], s["p"])
        out.append((k, 1e3 * t, f))
    return out


if __name__ == "__main__":
    main(sys.argv[1:], model_step_ms)
