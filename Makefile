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

.PHONY: all install serve test proto lint bench-scheduler clean

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

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Regenerate proto/tidegate_pb2.py from proto/tidegate.proto (checked in; a test compares).
proto: $(STAMP)
	$(PY) -m proto.generate

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench-scheduler: $(STAMP)
	$(PY) -m scheduler.batcher_bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
