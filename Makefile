# The two commands: `make demo` (train on the CPU demo config) and `make test` (the test suite).
# Both create .venv on first use. Without CUDA the CPU build of torch is installed first; override with
# `make TORCH_SPEC="torch==X" TORCH_INDEX=URL ...` (e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
# on a laptop whose default index serves CUDA builds).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0)
TORCH_INDEX ?=
PIP_INDEX := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist), each with its own local Ray cluster. Two keep a 2-core machine ~85% busy (Ray
# workers wait on each other, tests on subprocesses); four were slower (596 s against 469-559 s).
TEST_WORKERS ?= 2

# --no-compile: byte-compiling every installed file took 43 of the set-up's 104 s; Python compiles (and caches)
# only the modules a process imports, the first time it imports them.
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check --no-compile $(PIP_INDEX)

.PHONY: test test-unit demo lint format clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) "$(TORCH_SPEC)"
	$(PIP_INSTALL) -e ".[dev]"
	touch $(STAMP)

# pyright runs beside the suite, niced, its report printed after the suite's: the suite leaves part of the two
# cores idle (its Ray workers wait on each other), and pyright takes up that slack instead of a minute of its own.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	@nice -n 10 $(VENV)/bin/pyright > $(VENV)/pyright.log 2>&1 & typecheck=$$!; \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal; suite=$$?; \
	wait $$typecheck; typed=$$?; echo "pyright:"; cat $(VENV)/pyright.log; \
	test $$suite -eq 0 -a $$typed -eq 0

# The fast tier: everything but the end-to-end runs (no Ray cluster, no demo-policy builds).
test-unit: $(STAMP)
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal -m "not gpu and not slow and not integration"

demo: $(STAMP)
	$(VENV)/bin/asyncppo train examples/configs/demo.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/pyright

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests
	$(VENV)/bin/ruff format src tests

clean-venv:
	rm -rf $(VENV)
