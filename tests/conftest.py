"""Shared pytest fixtures. `@pytest.mark.gpu` tests are skipped when CUDA is unavailable."""
from __future__ import annotations

import importlib.util
import os
import signal

import pytest

# One OpenMP thread per test process (and the worker subprocesses they start): on a small CI
# machine, threads waiting for a busy core make tiny matmuls dozens of times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cuda_available() -> bool:
    # Only look at torch when it is installed and only when a gpu test is collected, so that
    # torch-free test modules (scheduler, gateway) never import it.
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _stop_signals_restored():
    """A test that runs a worker or gateway in-process installs their SIGTERM / SIGINT handlers,
    and their shutdown leaves SIG_IGN: put the test process's back after each test, so that what a
    later test meets does not depend on which tests ran before it in the same process (`make test`
    deals them out to two processes)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)
