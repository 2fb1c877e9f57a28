"""Issue 35, session 27: read `scripts/gpu_mixed_excess_run.sh`'s two profiles. Prints (1) the mixed
points' device time with the decodes' KV blocks scattered against contiguous, (2) the pause check's
mixed step run right after other steps (sustained back to back; the patterns with 1 / 3 decode steps
between) against the same step paused, device time both, and wall time as before.

    python bench/results/fidelity_onset_s27/mixed_excess_read.py CONTIGUOUS.json [SCATTERED.json]
"""
import json
import statistics
import sys
from pathlib import Path


def points(doc: dict) -> dict:
    return {(p["num_decode_seqs"], p["num_prefill_tokens"]): p for p in doc["points"]
            if not p.get("prefill_context_len") and p.get("num_prefill_seqs", 1) <= 1}


def main(paths: list[str]) -> None:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    print(f"device: {docs[0].get('device_name')}; git as the log says")
    if len(docs) > 1:
        a, b = points(docs[0]), points(docs[1])
        print("1. points, device ms median: contiguous / scattered KV blocks (ratio)")
        for key in sorted(a):
            if key in b and a[key].get("device_ms_median") and b[key].get("device_ms_median"):
                x, y = a[key]["device_ms_median"], b[key]["device_ms_median"]
                print(f"   d {key[0]:3d} p {key[1]:4d}: {x:8.3f} / {y:8.3f} ms  ({y / x:.4f})")
    runs = {r["run"]: r for r in (docs[0].get("pause_check") or {}).get("runs", [])}
    sm = runs.get("sustained_mixed")
    if sm is None:
        print("2. no sustained_mixed run in the pause check")
        return
    pd = sm.get("paused_device_ms_median")
    sd = sm.get("spin_device_ms_median")
    print(f"2. the pause check's mixed step (d {sm['num_decode_seqs']}, p {sm['num_prefill_tokens']}, "
          f"context {sm['decode_context_len']}): paused wall {sm['paused_ms_median']:.3f} ms, device "
          f"{pd if pd is None else round(pd, 3)} ms (60 ms idle, then queued behind a spin)"
          + (f"; queued behind the spin with no idle before: {sd:.3f} ms ({sd / pd:.4f})" if sd and pd else ""))
    dev = sm.get("trace_device_ms")
    if dev and pd:
        late = dev[len(dev) // 2:]
        print(f"   sustained back to back: device {statistics.median(late):.3f} ms ({statistics.median(late) / pd:.4f} "
              f"x paused device); wall {sm['step_ms_median']:.3f} ({sm['step_ms_median'] / sm['paused_ms_median']:.4f} x paused wall)")
    st = runs.get("stream_mixed")
    if st:
        print(f"   stream_mixed: {len(st['shapes'])} mixed shapes in turn, pipelined / paused device {st['ratio']:.4f} "
              "(" + ", ".join(f"d {d} p {p}: {b / a:.3f}" for (d, p, _c), a, b in
                              zip(st["shapes"], st["paused_device_ms"], st["pipelined_device_ms"])) + ")")
    for n in (1, 3):
        r = runs.get(f"mixed_pattern_{n}")
        if r is None:
            continue
        line = (f"   pattern, {n} decode step(s) between: wall {r['step_ms_median']:.3f} "
                f"({r['step_ms_median'] / r['paused_ms_median']:.4f} x paused wall)")
        if r.get("device_ms_median") and pd:
            line += (f"; device (synchronous: the host's input preparation inside) {r['device_ms_median']:.3f} "
                     f"({r['device_ms_median'] / pd:.4f} x paused device)")
        if r.get("pipelined_device_ms_median") and pd:
            line += (f"; pipelined as live {r['pipelined_device_ms_median']:.3f} "
                     f"({r['pipelined_device_ms_median'] / pd:.4f} x paused device), its decode steps "
                     f"{r.get('pipelined_decode_device_ms_median', float('nan')):.3f} ms")
        print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
