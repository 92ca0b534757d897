# Every target creates/updates the virtual environment first, so on a fresh clone
# `make test` and `make demo` are the only commands anyone needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test test-unit demo docs check-docs clean

$(STAMP): pyproject.toml setup.py dlctl/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,test]'
	@# Editable installs skip data files: put the man pages where `man` looks next to the venv's bin/.
	mkdir -p $(VENV)/share/man/man1 && cp man/*.1 $(VENV)/share/man/man1/
	touch $(STAMP)

install: $(STAMP)

test: install
	$(PY) -m pytest -q

demo: install
	bash scripts/demo.sh

test-unit: install
	$(PY) -m pytest -q tests/unit

docs: install
	$(PY) -m dlctl.cli.docs
	mkdir -p $(VENV)/share/man/man1 && rm -f $(VENV)/share/man/man1/dl*.1 && cp man/*.1 $(VENV)/share/man/man1/

check-docs: install
	$(PY) -m dlctl.cli.docs --check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
