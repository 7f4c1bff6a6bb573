# `make run` and `make test` work on a fresh clone: each creates .venv on first use.
PYTHON ?= python3
# The torch build, as pip arguments, installed first and on its own so that no later requirement
# picks one. The default pins the CPU wheel the project is developed with; on Linux that same pin
# from PyPI is a multi-GB CUDA build. For another build give the index your platform's wheels come
# from (PyTorch's install page lists them: CPU-only, CUDA, ROCm, XPU), e.g.
#   make test TORCH='torch==2.13.0 --index-url <wheel index for your platform>'
# Changing TORCH reinstalls the environment.
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: run test setup clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[dev]'
	# ALOHA meshes and MJCF only: gym-aloha pins MuJoCo < 3.9, so it comes without its
	# dependencies and hetlab never imports its code (see hetlab.assets).
	$(PIP) install -q --no-deps gym-aloha==0.1.5
	# The G1 motion clip g1-track-motion follows by default, likewise files only (holosoma pins numpy < 2).
	$(PIP) install -q --no-deps holosoma==0.0.3
	echo '$(TORCH)' > $(VENV)/.torch
	touch $@

setup:
	@test "$$(cat $(VENV)/.torch 2>/dev/null)" = '$(TORCH)' || rm -f $(VENV)/.installed
	@$(MAKE) --no-print-directory $(VENV)/.installed

# The main job: PPO on the Go1 joystick task for 14 minutes, sized for a 2-core CPU machine
# (512 envs, smaller networks than rsl_rl's 512-256-128, gentler initial exploration).
run: setup
	$(VENV)/bin/hetlab train --algo ppo --task go1-joystick-flat --envs 512 --max-seconds 840 \
		--ppo.actor-hidden 256 128 64 --ppo.critic-hidden 256 128 64 --ppo.init-noise-std 0.5

test: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
