# `make run` and `make test` work on a fresh clone: each creates .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: run test setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU wheel on this machine's disk; a looser
	# requirement resolved by pip alone would download a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/hetlab bench sim --task go1-joystick-flat --envs 1024 --seconds 20

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
