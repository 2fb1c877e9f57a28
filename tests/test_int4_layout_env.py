"""`TIDEGATE_INT4_LAYOUT` picks the int4 keys' layout for a whole process (the GPU runs that
decide the default set it instead of editing `backend.kv.formats`): g16 gives 16-channel groups
with fp16 scales in the same bytes as the default g32; anything else fails at import, loudly."""
import os
import subprocess
import sys

CODE = (
    "from backend.kv.formats import QuantizedPages, INT4_GROUP\n"
    "p = QuantizedPages('int4', 2, 16, 2, 128, 'cpu')\n"
    "print(INT4_GROUP, str(p.scale.dtype), tuple(p.scale.shape), p.data.nbytes + p.scale.nbytes,\n"
    "      sep='|')\n"
)


def run(layout):
    env = {**os.environ}
    env.pop("TIDEGATE_INT4_LAYOUT", None)
    if layout is not None:
        env["TIDEGATE_INT4_LAYOUT"] = layout
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=False)


def test_default_and_g16_layouts_take_the_same_bytes():
    default, g16 = run(None), run("g16")
    assert default.returncode == 0 and g16.returncode == 0, default.stderr + g16.stderr
    group_a, dtype_a, shape_a, bytes_a = default.stdout.strip().split("|")
    group_b, dtype_b, shape_b, bytes_b = g16.stdout.strip().split("|")
    assert (group_a, dtype_a) == ("32", "torch.float32")
    assert (group_b, dtype_b) == ("16", "torch.float16")
    assert shape_a != shape_b and bytes_a == bytes_b
    assert run("g32").stdout == default.stdout


def test_an_unknown_layout_fails_at_import():
    bad = run("g8")
    assert bad.returncode != 0 and "TIDEGATE_INT4_LAYOUT='g8'" in bad.stderr


def test_register_cap_switch_forces_or_forbids_the_cap():
    """TIDEGATE_QUANT_DECODE_MAXNREG (A/B of the quantized decode's register cap): unset, the
    policy caps a batch-8 int4 decode of the 33B (64 programs: 6 splits at 168 registers instead
    of 4); 0 never caps; N always caps at N (and counts the programs N registers leave room for)."""
    code = ("from backend.kernels import paged_attention as pa\n"
            "print(*pa.quant_decode_plan(64, 8192), *pa.quant_decode_plan(512, 8192), sep='|')\n")
    outs = []
    for value in (None, "0", "128"):
        env = {**os.environ}
        env.pop("TIDEGATE_QUANT_DECODE_MAXNREG", None)
        if value is not None:
            env["TIDEGATE_QUANT_DECODE_MAXNREG"] = value
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout.strip())
    assert outs == ["6|168|1|None", "4|None|1|None", "8|128|1|128"]
