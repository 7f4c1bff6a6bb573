"""BatchSim on MuJoCo 4's `mujoco.batch.Batch`: one model, many envs, a persistent C++ thread pool.

The batch keeps each env's integration state in a row of one array and steps the rows on
its own threads (the caller's included) without the GIL; `bind` gives live numpy views of
those rows. Results are bit-identical at any thread count, so a seed fixes a trajectory.
"""

from __future__ import annotations

from collections.abc import Callable

import mujoco
import mujoco.batch
import numpy as np

from hetlab.errors import UserError
from hetlab.sim.model_state import ModelLookups, MujocoOutputs, ResetNoise

# MuJoCo's instability warnings: mj_step has already reset an env that raised one.
_UNSTABLE_WARNINGS = [
    int(mujoco.mjtWarning.mjWARN_BADQPOS),
    int(mujoco.mjtWarning.mjWARN_BADQVEL),
    int(mujoco.mjtWarning.mjWARN_BADQACC),
]


class MujocoBatchSim(ModelLookups, MujocoOutputs):
    """`num_envs` copies of the model `spec` compiles to, on `threads` CPU threads (0 = all cores)."""

    def __init__(
        self,
        spec: mujoco.MjSpec,
        num_envs: int,
        threads: int = 0,
        seed: int = 0,
        keyframe: str | None = None,
        max_abs_qacc: float = 1e8,
    ):
        if num_envs < 1:
            raise UserError(f"the number of envs must be at least 1, got {num_envs}")
        self.model = model = spec.compile()
        self.num_envs = num_envs
        self.timestep = float(model.opt.timestep)
        self.divergences = 0
        self.max_abs_qacc = max_abs_qacc
        self.batch = mujoco.batch.Batch(model, num_envs, nthread=threads)
        self._rng = np.random.default_rng(seed)
        self._noise = ResetNoise(model, self._rng)
        self._keyframe = -1 if keyframe is None else model.key(keyframe).id
        self.qpos = self.batch.bind("qpos")
        self.qvel = self.batch.bind("qvel")
        self.ctrl = self.batch.bind("ctrl")
        self._qacc = self.batch.bind("qacc")
        self._bound_derived: set[str] = set()
        self._unstable = self.batch.warning[:, _UNSTABLE_WARNINGS, 1]  # a copy: refreshed in step
        # Each env is its row of integration state (positions, velocities, controls, warm
        # start, ...): a reset writes the keyframe's row, which costs no MuJoCo call.
        self.batch.reset(keyframe=self._keyframe, stage=mujoco.mjtStage.mjSTAGE_NONE)
        self._initial_state = self.batch.state[0].copy()
        # The forward pass after a reset computes what the sensors need, and no more.
        needs_acc = np.any(model.sensor_needstage == int(mujoco.mjtStage.mjSTAGE_ACC))
        self._forward_stage = mujoco.mjtStage.mjSTAGE_ACC if needs_acc else mujoco.mjtStage.mjSTAGE_VEL
        self.forward(np.arange(num_envs))

    @property
    def threads(self) -> int:
        return self.batch.nthread

    def step(self, ctrl: np.ndarray | None, substeps: int) -> np.ndarray:
        if ctrl is not None:
            self.ctrl[:] = ctrl
        failed = None
        try:
            self.batch.step(nstep=substeps)
        except mujoco.batch.SimulationError as e:
            failed = e.ids  # these kept their pre-call state; the rest ran to completion
        np.take(self.batch.warning[:, :, 1], _UNSTABLE_WARNINGS, axis=1, out=self._unstable)
        diverged = self._unstable.any(axis=1)
        # MuJoCo resets an env on NaN/inf itself (and warns); its own limit for a "huge"
        # acceleration is 1e10, far past where a robot sim is already garbage.
        diverged |= np.abs(self._qacc).max(axis=1) > self.max_abs_qacc
        if failed is not None:
            diverged[failed] = True
        if diverged.any():
            ids = np.flatnonzero(diverged)
            self.divergences += len(ids)
            self.reset(ids)
            self.forward(ids)
        return diverged

    def reset(self, env_ids: np.ndarray, noise: float = 0.0) -> None:
        ids = _sorted_ids(env_ids)
        if ids.size == 0:
            return
        # No forward pass here: callers perturb the state further, then call forward once.
        self.batch.state[ids] = self._initial_state
        self.batch.warning[ids] = 0
        self._noise.add(self.qpos, self.qvel, ids, noise)

    def forward(self, env_ids: np.ndarray) -> None:
        self.batch.forward(_sorted_ids(env_ids), stage=self._forward_stage)

    def get_state(self) -> dict:
        return {"rows": self.batch.state.copy(), "divergences": self.divergences, "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        rows = np.asarray(state["rows"])
        if rows.shape != self.batch.state.shape:
            raise UserError(f"sim state of shape {rows.shape} does not fit this sim's {self.batch.state.shape}")
        self.batch.state[...] = rows
        self.batch.warning[...] = 0
        self.divergences = int(state["divergences"])
        self._rng.bit_generator.state = state["rng"]
        self.forward(np.arange(self.num_envs))

    def _derived(self, field: str) -> np.ndarray:
        """A derived field's live array. The batch copies out only the fields bound before a
        call, and each one costs a copy per call, so they are bound on first use, and filled
        for every env then by one forward pass."""
        first_use = field not in self._bound_derived
        array = self.batch.bind(field)
        if first_use:
            self._bound_derived.add(field)
            self.batch.forward(stage=self._forward_stage)
        return array

    def mocap_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        mocap = self.mocap_id(name)
        # Mocap poses are part of each env's state row, so these are views like qpos.
        return self.batch.bind("mocap_pos")[:, mocap], self.batch.bind("mocap_quat")[:, mocap]

    # DomainRandomisable
    def model_field(self, name: str) -> np.ndarray:
        if name not in mujoco.batch.MODEL_FIELDS:
            raise UserError(f"{name!r} is not a MuJoCo model field that can vary per env")
        return self.batch.expand(name)

    def commit_model_fields(self, env_ids: np.ndarray | None = None) -> None:
        if any(self.batch.expanded(f) is not None for f in mujoco.MjModel._setconst_inputs):
            self.batch.set_const(env_ids)

    # Renderable
    def render_state(self, env_id: int, model: mujoco.MjModel | None = None,
                     data: mujoco.MjData | None = None) -> tuple[mujoco.MjModel, mujoco.MjData]:
        # Domain randomisation gives each env its own model (masses move the tracked COM), so both are copied.
        model, data = self.batch.get_model(env_id, model), self.batch.get_data(env_id, data)
        mujoco.mj_forward(model, data)
        return model, data


def _sorted_ids(env_ids: np.ndarray) -> np.ndarray:
    # mujoco.batch takes sorted, unique simulation ids.
    return np.unique(np.asarray(env_ids, dtype=np.int64))


def bare_physics(spec: mujoco.MjSpec, num_envs: int, threads: int, keyframe: str | None) -> Callable[[int], None]:
    """Plain `Batch.step` from the keyframe, with no checks and no copies: what the physics
    alone costs."""
    model = spec.compile()
    batch = mujoco.batch.Batch(model, num_envs, nthread=threads)
    batch.reset(keyframe=-1 if keyframe is None else model.key(keyframe).id)
    return lambda substeps: batch.step(nstep=substeps)
