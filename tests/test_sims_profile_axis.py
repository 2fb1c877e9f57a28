"""Packed and cached-prefix prefills in the measured cost model (`sims.profile_cost.ProfileCost`).

A profile point may say its prefill tokens were `num_prefill_seqs` prompts packed in one step, each
starting at `prefill_context_len` (docs/contracts.md, "profile JSON"). The model must charge k packed
prompts of p tokens by Σp_i², not (kp)², and still read old profiles (one chunk from position 0).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from bench.engine import profile as bprofile
from sims.profile_cost import ProfileCost

# "true" step time of the synthetic backend, seconds: fixed + per decode + per token + KV read
# + causal attention within each chunk + attention over cached prefixes + per prefill sequence
A, B, C, E, F, G, H = 2e-3, 5e-5, 1e-5, 2e-8, 4e-8, 3e-4, 3e-8


def true_time(d: int, c: int, chunks: list[tuple[int, int]]) -> float:
    p = sum(n for n, _ in chunks)
    ctx = d * c + sum(n + s for n, s in chunks)
    return (A + B * d + C * p + E * ctx + F * sum(n * n for n, _ in chunks)
            + G * len(chunks) + H * sum(n * s for n, s in chunks))


def synthetic_doc(packed=(2, 4), prefix=(256, 1024), noise=0.01, seed=0) -> dict:
    """A profile JSON as `tidegate backend profile` writes it, timed by `true_time` (+ noise)."""
    rng = np.random.default_rng(seed)
    shapes = bprofile.step_shapes([0, 1, 8, 32, 64], [0, 128, 512, 2048], [128, 1024], list(packed),
                                  list(prefix), None, max_num_seqs=256, max_num_batched_tokens=4096,
                                  max_model_len=4096)
    points = []
    for d, p, c, k, s in shapes:
        t = true_time(d, c, [(p // k, s)] * k if p else []) * (1 + noise * rng.standard_normal())
        points.append(bprofile.point(d, p, c, k, s, [t * 1e3]))
    return {"format": "tidegate-profile/1", "block_size": 16, "num_kv_blocks": 1000, "points": points}


def write(tmp_path, doc, name="profile.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def ctx_of(d, c, chunks):
    return d * c + sum(n + s for n, s in chunks)


HELD_OUT = [  # (d, c, chunks): packed steps the profile did not measure
    (0, 128, [(96, 0)] * 3),
    (0, 128, [(64, 0)] * 8),
    (0, 128, [(300, 0), (100, 0), (40, 0)]),
    (16, 512, [(128, 0)] * 4),
    (48, 700, [(256, 0)] * 6),
    (4, 2000, [(200, 0)] * 5),
]


def test_packed_prompts_are_predicted_from_their_own_measurements(tmp_path):
    doc = synthetic_doc()
    assert any(p["num_prefill_seqs"] > 1 for p in doc["points"])
    cost = ProfileCost.from_json(write(tmp_path, doc))
    old = ProfileCost.from_json(write(tmp_path, synthetic_doc(packed=(), prefix=()), "old.json"))
    for d, c, chunks in HELD_OUT:
        want = true_time(d, c, chunks)
        p, ctx = sum(n for n, _ in chunks), ctx_of(d, c, chunks)
        got = cost.step_time(d, p, ctx, prefill_chunks=chunks)
        assert got == pytest.approx(want, rel=0.04), (d, c, chunks)
        # the chunk objects the scheduler plans work too
        objs = [SimpleNamespace(token_ids=[0] * n, start_pos=s) for n, s in chunks]
        assert cost.step_time(d, p, ctx, objs) == got
    # the gap this fixes: charged as one long prompt, 8 packed prompts of 64 cost far more
    d, c, chunks = 0, 128, [(64, 0)] * 8
    one_long = old.step_time(d, 512, 512)
    assert one_long > 1.1 * true_time(d, c, chunks)
    # and a single chunk from 0 is still a single chunk
    assert cost.step_time(8, 512, 8 * 1024 + 512) == pytest.approx(true_time(8, 1024, [(512, 0)]), rel=0.04)
    assert cost.step_time(8, 512, 8 * 1024 + 512, [512]) == cost.step_time(8, 512, 8 * 1024 + 512)
    assert cost.describe()["packed_prefill_points"] > 0 and "g_s_per_prefill_seq" in cost.describe()["coef"]


def test_cached_prefix_chunks(tmp_path):
    cost = ProfileCost.from_json(write(tmp_path, synthetic_doc()))
    for d, c, chunks in [(0, 128, [(512, 700)]), (8, 1024, [(128, 300)]), (32, 256, [(256, 1000)]),
                         (0, 128, [(256, 512), (64, 0), (64, 0)])]:
        p, ctx = sum(n for n, _ in chunks), ctx_of(d, c, chunks)
        assert cost.step_time(d, p, ctx, chunks) == pytest.approx(true_time(d, c, chunks), rel=0.04)
    assert "h_s_per_prefill_tok_prefix_tok" in cost.describe()["coef"]


def test_old_format_profile_loads_unchanged(tmp_path):
    doc = synthetic_doc(packed=(), prefix=(), noise=0.02, seed=3)
    for p in doc["points"]:  # as written before the new axis existed
        del p["num_prefill_seqs"], p["prefill_context_len"]
    cost = ProfileCost.from_json(write(tmp_path, doc))
    pts = np.array([(p["num_decode_seqs"], p["num_prefill_tokens"], p["num_context_tokens"])
                    for p in doc["points"]])
    ref = ProfileCost(pts, np.array([p["step_ms"] * 1e-3 for p in doc["points"]]))
    np.testing.assert_allclose(cost.coef, ref.coef)
    assert len(cost.coef) == 5 and set(cost.describe()["coef"]) == {
        "a_s", "b_s_per_seq", "c_s_per_prefill_tok", "e_s_per_ctx_tok", "f_s_per_prefill_tok2"}
    for d, p, ctx in [(0, 300, 300), (20, 0, 20 * 500), (8, 512, 8 * 1024 + 512)]:
        assert cost.step_time(d, p, ctx) == ref.step_time(d, p, ctx)
        assert cost.step_time(d, p, ctx, [p] if p else []) == ref.step_time(d, p, ctx)
    # exact at the measured points (the residual interpolation still runs)
    for p in doc["points"][:10]:
        assert cost.step_time(p["num_decode_seqs"], p["num_prefill_tokens"], p["num_context_tokens"]) \
            == pytest.approx(p["step_ms"] * 1e-3, rel=1e-6, abs=1e-9)


def test_step_shapes_and_points():
    shapes = bprofile.step_shapes([0, 1, 4], [0, 32], [16, 100], [2, 4, 3], [16], None,
                                  max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    grid = [s for s in shapes if s[3:] == (1, 0)]
    assert {s[:3] for s in grid} == {(0, 32, 0), (1, 0, 16), (1, 32, 16), (4, 0, 16), (4, 32, 16),
                                     (1, 0, 100), (1, 32, 100), (4, 0, 100), (4, 32, 100)}
    extra = set(shapes) - set(grid)
    # packed (k = 3 does not divide 32) and cached-prefix points at d = 0 and the largest d, first c
    assert extra == {(0, 32, 0, 2, 0), (0, 32, 0, 4, 0), (4, 32, 16, 2, 0), (4, 32, 16, 4, 0),
                     (0, 32, 0, 1, 16), (4, 32, 16, 1, 16)}
    # limits: d + k sequences, s + p/k positions
    tight = bprofile.step_shapes([6], [32], [16], [4], [240], [6], max_num_seqs=8,
                                 max_num_batched_tokens=64, max_model_len=256)
    assert tight == [(6, 32, 16, 1, 0)]
    chunks = bprofile.make_step(2, 32, 40, 16, 1000, 50, k=4, s=20)
    pre = [c for c in chunks if c.is_prefill]
    assert len(chunks) == 6 and len(pre) == 4 and {len(c.token_ids) for c in pre} == {8}
    assert all(c.start_pos == 20 and len(c.block_table) == 2 for c in pre)
    pt = bprofile.point(2, 32, 40, 4, 20, [1.0, 3.0])
    assert pt["num_prefill_seqs"] == 4 and pt["prefill_context_len"] == 20
    assert pt["num_context_tokens"] == 2 * 40 + 32 + 4 * 20 and pt["step_ms"] == 2.0
    pt = bprofile.point(3, 0, 40, 1, 0, [1.0])
    assert pt["num_prefill_seqs"] == 0 and pt["prefill_context_len"] == 0


@pytest.mark.filterwarnings("ignore:profile. residual interpolation disabled")  # 7 points in 5-d
def test_tiny_profile_on_cpu_writes_the_new_axis(tmp_path):
    from gateway.tidegate_cli import main as tidegate

    def main(argv):  # `tidegate backend profile ...`
        return tidegate(["backend", *argv])

    out = tmp_path / "profile.json"
    rc = main(["profile", "--model", "tiny", "--device", "cpu", "--num-blocks", "64", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "64", "--max-model-len", "256", "--decode-batch-sizes", "0,2",
               "--prefill-tokens", "0,32", "--context-lens", "16", "--packed-prefill-seqs", "4",
               "--prefill-context-lens", "32", "--repeats", "1", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    pts = json.loads(out.read_text())["points"]
    assert {(p["num_decode_seqs"], p["num_prefill_tokens"], p["num_prefill_seqs"], p["prefill_context_len"])
            for p in pts} == {(0, 32, 1, 0), (2, 0, 0, 0), (2, 32, 1, 0), (0, 32, 4, 0), (2, 32, 4, 0),
                              (0, 32, 1, 32), (2, 32, 1, 32),
                              # the mixed spread point: 2 decodes (16, 64) beside 64 - 2 tokens (session 20)
                              (2, 62, 1, 0)}
    cost = ProfileCost.from_json(out)
    assert cost.step_time(2, 32, 2 * 16 + 32, [8] * 4) > 0


def _bucket_profile_points():
    """A step's time by the CUDA-graph bucket it runs as: 5 ms + 0.1 ms per token of the bucket
    >= d + p for steps with prefill tokens (no attention term at all), 5 ms + 0.05 ms per decode
    for decode-only steps."""
    import numpy as np

    from sims.profile_cost import LEGACY_CUDA_TOKEN_BUCKETS

    buckets = np.array(LEGACY_CUDA_TOKEN_BUCKETS)

    def true_ms(d, p):
        if not p:
            return 5.0 + 0.05 * d
        return 5.0 + 0.1 * buckets[np.searchsorted(buckets, d + p)]

    pts, times = [], []
    for d in (0, 1, 8, 16, 32):
        for p in (0, 512, 1024):
            if d + p:
                pts.append((d, p, d * 600 + p, 1 if p else 0, 0))
                times.append(true_ms(d, p) / 1e3)
    for d in (0, 32):  # packed points: 2 x 256
        pts.append((d, 512, d * 600 + 512, 2, 0))
        times.append(true_ms(d, 512) / 1e3)
    return np.array(pts, dtype=np.float64), np.array(times), true_ms


def test_profile_charges_a_mixed_step_for_its_cuda_graph_bucket():
    """Issue 18: two 512-token prompts and 16 decodes run as the 1,280-token graph. Fitted without
    the buckets the Σp_i² term took up the buckets' steps and charged that step 112 ms against
    129-133 measured on the H200; with them it is charged for its bucket."""
    from sims.profile_cost import LEGACY_CUDA_TOKEN_BUCKETS, ProfileCost

    pts, times, true_ms = _bucket_profile_points()
    with_b = ProfileCost(pts, times, token_buckets=LEGACY_CUDA_TOKEN_BUCKETS)
    without = ProfileCost(pts, times)
    want = true_ms(16, 1024)  # bucket 1280: 133 ms
    packed = [(512, 0), (512, 0)]
    assert with_b.step_time(16, 1024, 16 * 600 + 1024, packed) * 1e3 == pytest.approx(want, rel=0.02)
    assert abs(without.step_time(16, 1024, 16 * 600 + 1024, packed) * 1e3 / want - 1) > 0.05
    # an unmeasured 3 x 300-token step + 20 decodes (920 tokens): bucket 1024
    three = [(300, 0)] * 3
    assert with_b.step_time(20, 900, 20 * 600 + 900, three) * 1e3 == pytest.approx(true_ms(20, 900), rel=0.02)


def test_cuda_profile_without_buckets_gets_the_engines_defaults(tmp_path):
    """Profiles measured on CUDA before `cuda_graph_token_buckets` was written get the engine's
    default buckets of then; CPU profiles get none; a profile that names its buckets, those."""
    import json

    from sims.profile_cost import LEGACY_CUDA_TOKEN_BUCKETS, ProfileCost

    pts, times, _ = _bucket_profile_points()
    points = [{"num_decode_seqs": int(d), "num_prefill_tokens": int(p), "num_context_tokens": int(c),
               "num_prefill_seqs": int(k), "step_ms": float(t * 1e3)}
              for (d, p, c, k, _), t in zip(pts, times)]
    for device, mnbt, want in (("cuda:0", 1024, [b for b in LEGACY_CUDA_TOKEN_BUCKETS if b <= 1024]),
                               ("cpu", 1024, None)):
        path = tmp_path / f"{device[:3]}.json"
        path.write_text(json.dumps({"device": device, "max_num_batched_tokens": mnbt, "points": points}))
        got = ProfileCost.from_json(path).token_buckets
        assert (got is None) if want is None else (list(got) == want)
    path = tmp_path / "named.json"
    path.write_text(json.dumps({"device": "cuda:0", "cuda_graph_token_buckets": [640, 1280],
                                "points": points}))
    assert list(ProfileCost.from_json(path).token_buckets) == [640, 1280]
