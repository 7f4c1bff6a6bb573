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
	# ALOHA meshes and MJCF only: gym-aloha pins MuJoCo < 3.9, so it comes without its
	# dependencies and hetlab never imports its code (see hetlab.assets).
	$(PIP) install -q --no-deps gym-aloha==0.1.5
	touch $@

setup: $(VENV)/.installed

# The main job: PPO on the Go1 joystick task for 14 minutes, sized for a 2-core CPU box
# (512 envs, smaller networks than rsl_rl's 512-256-128, gentler initial exploration).
run: setup
	$(VENV)/bin/hetlab train --algo ppo --task go1-joystick-flat --envs 512 --max-seconds 840 \
		--ppo.actor-hidden 256 128 64 --ppo.critic-hidden 256 128 64 --ppo.init-noise-std 0.5

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
