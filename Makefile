# tidegate — the two commands that matter are `make serve` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is pinned here (not in pyproject, which keeps a range): on a CPU-only
# machine with the local wheel this is a seconds-long install; an unpinned
# torch would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: all install serve test test-vllm proto lint bench-scheduler clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/tidegate serve $(ARGS)

# Two parts: most tests wait on sockets, subprocesses and timers, so they run two at a time
# (pytest-xdist; CI has 2 cores: ~9.5 min instead of ~17); the few that time live decisions
# against a replay (marker `serial`) then run alone. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -q -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS selected none here

# vLLM as an engine (backend/engine/vllm.py) against vLLM's own outputs, in the environment of
# vLLM's CPU build (made by ../shared/peers/vllm-cpu/setup.sh when missing: ~3.4 GB, minutes).
PEERS_DIR   ?= $(HOME)/.cache/tidegate-peers
VLLM_PYTHON ?= $(PEERS_DIR)/vllm-venv/bin/python
test-vllm: $(STAMP)
	@test -x $(VLLM_PYTHON) || PEERS_DIR=$(PEERS_DIR) bash ../shared/peers/vllm-cpu/setup.sh
	TIDEGATE_VLLM_PYTHON=$(VLLM_PYTHON) $(PY) -m pytest -q -m vllm tests/test_vllm_engine.py tests/test_vllm_kv_events.py $(PYTEST_ARGS)

# Regenerate proto/tidegate_pb2.py from proto/tidegate.proto (checked in; a test compares).
proto: $(STAMP)
	$(PY) -m proto.generate

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench-scheduler: $(STAMP)
	$(PY) -m bench.scheduler.batcher

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
