"""Issue 35, session 18 (H35P): a profile without the "sustained_packed" run is charged exactly as
before the change — every committed H200 profile, under every cost-model form the validate builds.

    python identity.py dump OUT.json          # with PYTHONPATH at one tree (the base, then this one)
    python identity.py compare A.json B.json  # max |a - b| per quantity; exit 1 if any differs

`dump` builds `ProfileCost.from_json` for each profile (PROFILES, relative to this tree's
bench/results) with the forms FORMS, and writes, at a fixed set of step shapes (decode batches 0-128,
prefill 0-2,048 tokens in 1-5 chunks, some from a cached prefix, three contexts): `step_time`,
`compute_share`, `cap_weight`, and `prefill_slowdown` at busy / decode shares in {0, 0.3, 0.6, 1}
(with the step's compute share where the model caps by compute); plus the model's cap terms
(f_ref, tau, window).
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROFILES = [
    "fidelity_grid_h200_s17/33b-fp8/profile_33b-fp8.json",   # has sustained + sustained_mixed
    "fidelity_grid_h200_s16/33b-fp8/profile_33b-fp8.json",   # sustained trace
    "fidelity_grid_h200_s16/6.7b-fp8/profile_6.7b-fp8.json",  # r <= 1 (the cap off)
    "fidelity_grid_h200_s16/6.7b/profile_6.7b.json",
    "fidelity_grid_h200_s13/33b-seeds/profile_33b-seeds.json",  # 100 ms window (no trace)
    "fidelity_cost_s16/profile_s16_33b-fp8_whatif_mixed.json",  # the stand-in mixed run
]
FORMS = {
    "default": {},
    "hide_launch+power_cap": {"hide_launch": True, "power_cap": True},
    "+cap_by_power": {"hide_launch": True, "power_cap": True, "cap_by_power": True},
    "+cap_by_power, not by compute": {"hide_launch": True, "power_cap": True, "cap_by_power": True,
                                      "cap_by_compute": False},
    "+cap_by_power, slope": {"hide_launch": True, "power_cap": True, "cap_by_power": True,
                             "decode_extrapolation": "slope"},
}


def shapes():
    out = []
    for c in (512, 576, 640):
        for d in (0, 1, 3, 8, 17, 32, 33, 48, 64, 65, 96, 128):
            out.append((d, 0, d * c, None))
            for chunks in ([64], [256], [(256, 256)], [512], [256, 256], [1024], [512] * 4,
                           [(256, 256), 512, 512, 512, 217], [2048], [1024, 1024]):
                pairs = [(x, 0) if isinstance(x, int) else x for x in chunks]
                p = sum(n for n, _ in pairs)
                if d + p > 2048:
                    continue
                out.append((d, p, d * c + sum(n + s for n, s in pairs), chunks))  # as fidelity_steps
    return out


def dump(path):
    sys.path.append(str(ROOT))  # after PYTHONPATH: the tree under test's code
    from sims.profile_cost import ProfileCost
    res = ROOT / "bench" / "results"
    # the profiles are read from this script's tree (the base tree has no bench/results)
    doc = {}
    for prof in PROFILES:
        for form, kw in FORMS.items():
            cost = ProfileCost.from_json(res / prof, **kw)
            rows = []
            for d, p, ctx, chunks in shapes():
                ch = None if chunks is None else [x if isinstance(x, int) else tuple(x) for x in chunks]
                t = cost.step_time(d, p, ctx, ch)
                share = cost.compute_share(d, p, ctx, ch)
                w = cost.cap_weight(d, p, ctx, ch)
                sl = [cost.prefill_slowdown(f, g, share if cost.caps_by_compute else None)
                      for f in (0.0, 0.3, 0.6, 1.0) for g in (0.0, 0.3, 0.6)]
                rows.append([t, share, w] + sl)
            doc[f"{prof} | {form}"] = {"rows": rows, "f_ref": cost.power_cap_f_ref,
                                       "tau_s": cost.power_cap_tau_s, "window_s": cost.power_cap_window_s,
                                       "weights": cost.weights_cap_by_power}
    Path(path).write_text(json.dumps(doc))
    print(f"{len(doc)} profile x form, {len(shapes())} shapes each -> {path}")


def compare(a_path, b_path):
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    bad = 0
    for key in a:
        ra, rb = a[key], b.get(key)
        if rb is None:
            print(f"MISSING {key}")
            bad += 1
            continue
        diff = max(abs(x - y) for xa, xb in zip(ra["rows"], rb["rows"], strict=True)
                   for x, y in zip(xa, xb, strict=True))
        same_terms = all(ra[k] == rb[k] for k in ("f_ref", "tau_s", "window_s", "weights"))
        ok = diff == 0.0 and same_terms
        bad += not ok
        print(f"{'identical' if ok else 'DIFFERS  '} {key}: max |diff| {diff:.3g}, cap terms "
              f"{'equal' if same_terms else 'differ'}, weights {ra['weights']}")
    print(f"{len(a)} compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
