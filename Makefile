# Two commands get a fresh machine from clone to results:
#   make demo   set up .venv, then run the main job
#   make test   set up .venv, then run the test suite; then the same for the tests marked `floor`
#               in .venv-floor, which holds the oldest versions pyproject.toml accepts
PYTHON ?= python3
VENV := .venv
TORCH_INDEX ?=
PY := $(VENV)/bin/python
# The oldest supported versions: every floor of pyproject.toml pinned (tests/floor_requirements.py).
FLOOR_VENV := .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python

.PHONY: setup setup-floor demo test test-floor test-slow test-gpu clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.13.0, the newest torch tested (the floor run tests the oldest, .venv-floor). On Linux, PyPI's build is
	# CUDA's (GBs of nvidia-* wheels); TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build instead.
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[train,plot,ctranslate2,dev]'
	touch $@

setup: $(VENV)/.installed

$(FLOOR_VENV)/.installed: pyproject.toml tests/floor_requirements.py
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	# torch's floor comes from PyPI as a CUDA build (PyPI has no CPU build of it); it runs on the CPU as it is.
	# Its import loads 11 of its 14 nvidia-* packages (cuBLAS, cuDNN, NCCL...): with the rest, 3 GB of wheels,
	# 2-4 minutes here. Not cached (pip would keep the 3 GB).
	$(FLOOR_PY) -m pip install -q --no-cache-dir -e '.[train]' pytest $$($(PYTHON) tests/floor_requirements.py)
	touch $@

setup-floor: $(FLOOR_VENV)/.installed

demo: setup
	$(PY) training/demo.py $(ARGS)

# ruff's lint and format check (configured in pyproject.toml); `ruff format .` and `ruff check --fix .` mend most.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The suite runs in TEST_PROCESSES processes (pytest-xdist; a test file stays in one), one thread each
# (tests/conftest.py): the cores this process may use, at most 4 (tests/cores.py). TEST_PROCESSES=0: in one.
TEST_PROCESSES ?= $(shell $(PYTHON) tests/cores.py 2>/dev/null || echo 1)

# The linter, the whole suite on the newest versions, then the tests marked `floor` on the oldest ones.
test: setup
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n $(TEST_PROCESSES) --dist loadfile
	$(MAKE) --no-print-directory test-floor

test-floor: setup-floor
	VANILLA_TRANSFORMER_FLOOR_RUN=1 $(FLOOR_PY) -m pytest -q -p no:cacheprovider -m 'floor and not slow'

test-slow: setup
	$(PY) -m pytest -q -m slow

# The tests marked `gpu` (they skip without CUDA): each training lever against the plain step on one GPU.
# GPU_PY=python3 runs them with a Python that has CUDA's torch and the package's dependencies already
# (a machine without network), instead of setting up .venv.
GPU_PY ?=
test-gpu: $(if $(GPU_PY),,setup)
	$(or $(GPU_PY),$(PY)) -m pytest -p no:cacheprovider -m gpu -v -ra --durations=0 tests/test_gpu_levers.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) build dist *.egg-info
