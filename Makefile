# Two commands get a fresh machine from clone to results:
#   make demo   set up .venv, then run the main job
#   make test   set up .venv, then run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel of torch (pinned here only: the package's own range stays open for users).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,plot,ctranslate2,dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) training/demo.py $(ARGS)

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build dist *.egg-info
