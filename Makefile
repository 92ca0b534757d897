# Every target creates/updates the virtual environment first, so on a fresh clone
# `make test` and `make demo` are the only commands anyone needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install bytecode test test-unit demo docs check-docs clean

$(STAMP): pyproject.toml setup.py dlctl/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,test]'
	@# Editable installs skip data files: put the man pages where `man` looks next to the venv's bin/.
	mkdir -p $(VENV)/share/man/man1 && cp man/*.1 $(VENV)/share/man/man1/
	touch $(STAMP)

install: $(STAMP)

# Where the environment sets PYTHONDONTWRITEBYTECODE (CI's does), nothing writes dlctl's bytecode
# cache, and every agent, CLI call and Spark worker compiles the package anew (about 0.2 s of CPU
# each). Compile it here: Python still reads .pyc files, and passes over stale ones.
bytecode: install
	$(PY) -m compileall -q dlctl agent

# Two or more workers (pytest-xdist), each test file on one worker: the integration tests mostly
# wait on processes, so the suite takes about half the time of a serial run on two cores.
test: bytecode
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations 15

demo: bytecode
	bash scripts/demo.sh

test-unit: bytecode
	$(PY) -m pytest -q tests/unit

docs: install
	$(PY) -m dlctl.cli.docs
	mkdir -p $(VENV)/share/man/man1 && rm -f $(VENV)/share/man/man1/dl*.1 && cp man/*.1 $(VENV)/share/man/man1/

check-docs: install
	$(PY) -m dlctl.cli.docs --check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
