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

.PHONY: run test test-isa setup clean

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

# The main job: the Go1 joystick task's recipe (`hetlab tasks`), spread over this machine's cores as
# `hetlab tune` measured (about 90 s the first time, then cached), for at most 14 minutes, stopping once
# an evaluation passes its "solved" criteria; then the final policy judged over 128 episodes at the
# task's own physics step (the recipe trains at a coarser one) and one of them filmed (the last lines
# name the video).
run: setup
	$(VENV)/bin/hetlab train --task go1-joystick-flat --tune --max-seconds 840 --until-solved
	$(VENV)/bin/hetlab eval "$$(ls -td runs/go1-joystick-flat-*/*/ | head -n 1)" --sim-dt 0 --video 1

# Two passes: the tests in two pytest-xdist workers, then those marked `serial` (they time their own
# work, or learn at a pace set by how their processes are scheduled) in one, with nothing beside them.
# In the first, torch's thread pools default to one thread that sleeps rather than spins while it
# waits, since two workers share the cores.
test: setup
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -n 2 -m "not serial"
	$(PY) -m pytest -q -m serial

# The tests whose tolerances depend on which kernels run, again on an AVX2-only CPU's kernels (docs/reliability.md).
ISA_TESTS := tests/policies/test_ar_actor.py tests/offload/test_offload_export.py tests/offload/test_offload_backends.py \
	tests/offload/test_openvino_backend.py \
	tests/imitation/test_phase_b.py::test_offloaded_fp32_prefix_trains_like_the_learner_only_condition \
	tests/algos/test_ppo.py::test_a_compiled_update_takes_the_eager_ones_step \
	tests/algos/test_ppo.py::test_bf16_updates_within_bf16_rounding_of_fp32 \
	tests/algos/test_networks.py::test_output_layers_compute_in_fp32_under_bf16_autocast
test-isa: setup
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
		$(PY) -m pytest -q -n 2 $(ISA_TESTS)

clean:
	rm -rf $(VENV)
