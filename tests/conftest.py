"""Shared fixtures: small scenes, and sims built on every BatchSim backend.

Every test that takes the `backend` fixture (or `make_sim`) runs once per backend registered
in `hetlab.sim.SIMS`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import pytest

from hetlab.aloha.record import RecordConfig, record
from hetlab.figures import FIGURES_ENV
from hetlab.sim import SIMS
from hetlab.tasks import TASKS, make_config
from hetlab.tasks.base import Task
from hetlab.tasks.cartpole import CartpoleBalance
from hetlab.tasks.go1_joystick import Go1JoystickFlat

# A run's end-of-run figures cost it one to two seconds: the tests that check them ask for them
# (the `figures` fixture); the others, and the commands they start, skip them.
os.environ.setdefault(FIGURES_ENV, "0")


@pytest.fixture
def figures(monkeypatch) -> None:
    """Runs started in this test (in this process or as commands) draw their figures."""
    monkeypatch.setenv(FIGURES_ENV, "1")


SimFactory = Callable[..., object]  # (model, num_envs, *, threads, seed, keyframe) -> BatchSim

# A model with every joint type (free, slide, hinge, ball), two kinds of actuator, sensors
# of three widths and a keyframe whose state and controls all differ from the defaults, so a
# reset to the keyframe is distinguishable from a reset to qpos0.
TOY_XML = """
<mujoco model="toy">
  <compiler angle="radian"/>
  <option timestep="0.005"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="box" pos="0 0 1">
      <freejoint name="free"/>
      <geom name="box" type="box" size="0.1 0.1 0.1" mass="1"/>
    </body>
    <body name="cart" pos="2 0 1">
      <joint name="slide" type="slide" axis="1 0 0" damping="0.1"/>
      <geom name="cart" type="box" size="0.1 0.1 0.05" mass="1" contype="0" conaffinity="0"/>
      <body name="pole">
        <joint name="hinge" type="hinge" axis="0 1 0" damping="0.01" range="-1 1.5"/>
        <geom name="pole" type="capsule" fromto="0 0 0 0 0 0.5" size="0.03" mass="0.2"
              contype="0" conaffinity="0"/>
        <site name="tip" pos="0 0 0.5"/>
        <body name="bob" pos="0 0 0.5">
          <joint name="ball" type="ball" damping="0.01"/>
          <geom name="bob" type="sphere" size="0.05" pos="0 0 0.1" mass="0.1"
                contype="0" conaffinity="0"/>
        </body>
      </body>
    </body>
    <body name="target" mocap="true" pos="0 1 1">
      <geom name="target" type="sphere" size="0.05" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <motor name="push" joint="slide" gear="10" ctrlrange="-1 1"/>
    <position name="swing" joint="hinge" kp="5"/>
  </actuator>
  <sensor>
    <jointpos name="hinge_pos" joint="hinge"/>
    <framepos name="tip_pos" objtype="site" objname="tip"/>
    <framequat name="tip_quat" objtype="site" objname="tip"/>
  </sensor>
  <keyframe>
    <key name="start" qpos="0.1 0 1.5 1 0 0 0  0.3  0.2  0.9238795 0 0.3826834 0"
         qvel="0.5 0 0 0 0 0.2  -0.1  0.4  0 0 0.3" ctrl="0.5 0.1" mpos="0 1 1.2" mquat="0 1 0 0"/>
  </keyframe>
</mujoco>
"""


@dataclasses.dataclass(frozen=True)
class Scene:
    name: str
    spec: mujoco.MjSpec  # what backends are built from
    model: mujoco.MjModel  # the spec compiled by MuJoCo: names, sizes and keyframes to check against
    keyframe: str | None

    @property
    def key_id(self) -> int:
        return self.model.key(self.keyframe).id

    @property
    def key_qpos(self) -> np.ndarray:
        return self.model.key_qpos[self.key_id]

    @property
    def key_qvel(self) -> np.ndarray:
        return self.model.key_qvel[self.key_id]

    @property
    def key_ctrl(self) -> np.ndarray:
        return self.model.key_ctrl[self.key_id]


def _scene(name: str, spec: mujoco.MjSpec, keyframe: str | None) -> Scene:
    return Scene(name, spec, spec.compile(), keyframe)


@pytest.fixture(scope="session")
def toy_scene() -> Scene:
    return _scene("toy", mujoco.MjSpec.from_string(TOY_XML), "start")


@pytest.fixture(scope="session")
def cartpole_scene() -> Scene:
    return _scene("cartpole", CartpoleBalance.build_spec(CartpoleBalance.Config()), CartpoleBalance.keyframe)


@pytest.fixture(scope="session")
def go1_scene() -> Scene:
    return _scene("go1", Go1JoystickFlat.build_spec(Go1JoystickFlat.Config()), Go1JoystickFlat.keyframe)


@pytest.fixture(params=["toy", "cartpole", "go1"])
def scene(request) -> Scene:
    """Each small scene in turn."""
    return request.getfixturevalue(f"{request.param}_scene")


# Tasks a backend cannot run: their runs on it are deselected, and tests/sim/test_backends.py checks
# the one-line refusal that names the part of the scene the backend cannot read.
BACKEND_CANNOT_RUN = {("motrix", "g1-walk-flat")}


def pytest_collection_modifyitems(config, items):
    def impossible(item) -> bool:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        return (params.get("backend"), params.get("task_name", params.get("name"))) in BACKEND_CANNOT_RUN

    dropped = [item for item in items if impossible(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not impossible(item)]


# The backends installed here: `make test` installs MotrixSim with the dev extra; MuJoCo Warp
# joins where its extra is (`pip install -e '.[dev,warp]'`).
INSTALLED_SIMS = [name for name, backend in SIMS.items() if backend.missing() is None]


@pytest.fixture(params=INSTALLED_SIMS)
def backend(request) -> SimFactory:
    """Each installed BatchSim backend's constructor in turn. MuJoCo Warp with no CUDA device steps
    on Warp's CPU kernels (compiled on first use, then cached)."""
    backend = SIMS[request.param]
    if request.param == "warp" and backend.unavailable() is not None:
        from hetlab.sim.mujoco_warp import WarpBatchSim

        return functools.partial(WarpBatchSim, device="cpu")
    return backend.make


@pytest.fixture
def assert_stored(request, backend):
    """`assert_stored(actual, desired)`: state read back equals the float64 values it was set from,
    exactly on a float64 backend, to float32 rounding on one that stores float32 (MotrixSim)."""
    rounding = SIMS[request.node.callspec.params["backend"]].rounding

    def check(actual, desired) -> None:
        np.testing.assert_allclose(actual, desired, rtol=rounding, atol=0)

    return check


@pytest.fixture
def derived_atol(request, backend) -> float:
    """Absolute tolerance for a derived value (a sensor, a body pose) against the same computed in
    float64: 1e-12 on a float64 backend, a few float32 rounding steps on a float32 one."""
    return 1e-12 if SIMS[request.node.callspec.params["backend"]].rounding == 0 else 1e-6


@pytest.fixture
def make_sim(backend):
    """`make_sim(scene, num_envs=4, threads=1, seed=0)`: a sim of `scene` on this backend."""

    def make(scene: Scene, num_envs: int = 4, threads: int = 1, seed: int = 0):
        return backend(scene.spec, num_envs, threads=threads, seed=seed, keyframe=scene.keyframe)

    return make


@pytest.fixture
def make_task_on(backend):
    """Like hetlab.tasks.make_task, but the task's sim comes from this test's backend."""

    def make(name: str, **overrides) -> Task:
        overrides.setdefault("threads", 1)
        cfg = make_config(name, **overrides)
        cls = TASKS[name]
        sim = backend(cls.build_spec(cfg), cfg.num_envs, threads=cfg.threads, seed=cfg.seed, keyframe=cls.keyframe)
        return cls(sim, cfg)

    return make


@pytest.fixture
def random_actions():
    """`random_actions(task, steps, seed=0, scale=1.0)`: (steps, num_envs, action_size) float32
    actions in ±scale from a fixed generator."""

    def draw(task: Task, steps: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.uniform(-scale, scale, (steps, task.num_envs, task.action_size)).astype(np.float32)

    return draw


# A real ALOHA cube-transfer dataset, recorded once per session by the real recorder: 2 episodes
# of 60 frames at 64×96 (64 is AV1's smallest side), seeds 0 and 1. 60 steps end the episodes long
# before the handover, so the expert "fails" and they are recorded anyway. About 15 s. Rendering
# picks its headless GL backend itself (hetlab.headless_gl).
TINY_ALOHA = dict(episodes=2, height=64, width=96, steps=60)


@pytest.fixture(scope="session")
def tiny_aloha_dataset(tmp_path_factory) -> Path:
    """The dataset directory (read-only by convention: copy it before damaging it)."""
    out = tmp_path_factory.mktemp("tiny_aloha") / "aloha"
    record(RecordConfig(out=out, successful_only=False, workers=1, **TINY_ALOHA))
    return out


@pytest.fixture
def assert_same_weights():
    """Check that two RL runs ended with the same actor and critic weights, bit for bit, at `iteration`."""

    def check(run_a: Path, run_b: Path, iteration: int) -> None:
        from safetensors.torch import load_file

        a, b = (load_file(run / "checkpoints" / f"{iteration:07d}" / "tensors.safetensors") for run in (run_a, run_b))
        weights = [key for key in a if "/actor/" in key or "/critic/" in key]
        assert weights and a.keys() == b.keys()
        for key in weights:
            assert (a[key] == b[key]).all(), key

    return check


@pytest.fixture
def refusal(capsys):
    """`refusal(*args)`: the one line `hetlab ARGS` prints before it exits with status 2. It runs
    `hetlab.cli.main`, as the console script does, in this process: the bad-input checks would
    otherwise each pay a new interpreter's imports (tests/test_cli.py runs the script itself)."""
    from hetlab.cli import main

    def refused(*args) -> str:
        with pytest.raises(SystemExit) as exit_:
            main([str(arg) for arg in args])
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2, err
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
        return err

    return refused



def hetlab_in_process(*args) -> subprocess.CompletedProcess:
    """`hetlab ARGS` run by `hetlab.cli.main` in this process, as the console script runs it, and its
    CompletedProcess (exit status, stdout, stderr). A new interpreter would pay its imports again
    (~4 s a training run); the tests of the console script itself — the command line meta.json
    records, signals, a crash's traceback — start it."""
    import torch

    from hetlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()  # a run sets its thread budget
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main([str(arg) for arg in args])
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["hetlab", *map(str, args)], status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def hetlab_here():
    """`hetlab_in_process`, for tests and for fixtures of any scope."""
    return hetlab_in_process
