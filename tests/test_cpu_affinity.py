"""--cpu-affinity (issue 32): which cores a CPU backend pins itself to, and that `tidegate serve`
starts its embedded backend with `auto` unless told otherwise."""
import os

import pytest

from backend.server.affinity import apply_cpu_affinity, choose_cores, parse_cores
from gateway.serve import build_parser, embedded_backend_argv


def test_auto_takes_the_last_cores_and_leaves_one_over():
    assert choose_cores("auto", [0, 1], 1) == [1]
    assert choose_cores("auto", [3, 0, 2, 1], 2) == [2, 3]
    assert choose_cores("auto", [0], 1) is None  # nothing left for the gateway: no pinning
    assert choose_cores("auto", [0, 1], 2) is None
    assert choose_cores("none", [0, 1], 1) is None


def test_explicit_lists():
    assert parse_cores("0,2-3") == [0, 2, 3]
    assert choose_cores("1", [0, 1], 1) == [1]
    with pytest.raises(ValueError, match="not among"):
        choose_cores("5", [0, 1], 1)
    with pytest.raises(ValueError, match="core list"):
        parse_cores("fast")


def test_gpu_engines_are_never_pinned():
    before = os.sched_getaffinity(0)
    assert apply_cpu_affinity("0", "cuda", 1) is None
    assert os.sched_getaffinity(0) == before


def test_the_embedded_backend_gets_auto_unless_given():
    argv = embedded_backend_argv(build_parser().parse_args([]), "ipc:///tmp/x.sock")
    assert argv[argv.index("--cpu-affinity") + 1] == "auto"
    argv = embedded_backend_argv(build_parser().parse_args(["--cpu-affinity", "none"]), "ipc:///x")
    assert argv.count("--cpu-affinity") == 1 and argv[argv.index("--cpu-affinity") + 1] == "none"
