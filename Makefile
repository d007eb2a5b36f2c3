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
# Test processes (pytest-xdist). The suite keeps about one core busy (Ray workers wait on each other, tests
# wait on subprocesses), so two workers fill a 2-core machine; each starts its own local Ray cluster.
TEST_WORKERS ?= 2

.PHONY: test test-unit demo lint format clean-venv

# torch goes through pip, which reads the machine's pip configuration (a local CPU build, constraints, TORCH_INDEX).
# The rest goes through uv when it installs and resolves (about 20 s against 1.5-2 min with pip on 2 cores; it keeps
# the installed torch), with pip as the fallback. Bytecode is compiled at install, as pip does: otherwise every Ray
# worker of the test suite would compile the same modules on first import.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(PIP_INDEX) "$(TORCH_SPEC)"
	( $(PY) -m pip install --quiet --disable-pip-version-check uv && \
	  $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode -e ".[dev]" ) || \
	  $(PY) -m pip install --quiet --disable-pip-version-check $(PIP_INDEX) -e ".[dev]"
	touch $(STAMP)

# pyright runs beside the suite, its report printed after it: the suite leaves a core idle much of the time (Ray
# workers wait on each other), and pyright's ~50 s of one core fit there. Either failing fails the target.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	@log=$$(mktemp); $(VENV)/bin/pyright > $$log 2>&1 & checker=$$!; \
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal; suite=$$?; \
	wait $$checker; checked=$$?; echo "pyright:"; cat $$log; rm -f $$log; \
	test $$suite -eq 0 && test $$checked -eq 0

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
