"""BatchSim on MuJoCo Warp (the `warp` extra): the same MuJoCo model, every env a world of one
batch on an NVIDIA GPU.

The physics stays on the device: `step` runs its substeps as one CUDA graph (captured once per
substep count), and state crosses to the host once per call, to meet the contract's numpy
arrays: `qpos`, `qvel` and `ctrl` go in before the substeps and the state and the derived fields
that were asked for come back after them. That round trip is what a task written in numpy costs
on a GPU engine; `hetlab bench sim` measures the bare stepping without it. The solver's warm
start and actuator activations never leave the device, and a reset or `forward` of some envs
leaves the others' untouched.

`--sim warp` asks for a CUDA device and refuses without one. Warp also runs its kernels on the
CPU (slowly, compiled on first use); `device="cpu"` takes that path, which the tests use. There
`.numpy()` is a view of the device's memory, so a snapshot that must outlive the next kernel is
copied.
"""

from __future__ import annotations

from collections.abc import Callable

import mujoco
import numpy as np

from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.sim.model_state import HostState, MujocoOutputs

# Past these the simulation has blown up: the mujoco.batch backend's acceleration limit, and
# MuJoCo's own bound on positions and velocities (mjMAXVAL), which MuJoCo Warp does not check.
MAX_ABS_QACC = 1e8
MAX_ABS_STATE = 1e10


def modules():
    """(warp, mujoco_warp), imported, Warp's kernel-loading log off."""
    wp = require("warp", "warp", "--sim warp")
    mjw = require("warp", "mujoco_warp", "--sim warp")
    wp.config.quiet = True
    return wp, mjw


def cuda_device() -> str:
    """The CUDA device Warp steps on; UserError where there is none."""
    wp, _ = modules()
    wp.init()
    if wp.get_cuda_device_count() == 0:
        raise UserError("it needs an NVIDIA GPU with CUDA and Warp finds none here; use --sim mujoco or --sim motrix")
    return "cuda:0"


class WarpBatchSim(HostState, MujocoOutputs):
    """`num_envs` worlds of the model `spec` compiles to, stepped by MuJoCo Warp on `device`
    (None: the CUDA device; "cpu": Warp's CPU kernels). `threads` is not used: the GPU steps them."""

    def __init__(
        self,
        spec: mujoco.MjSpec,
        num_envs: int,
        threads: int = 0,
        seed: int = 0,
        keyframe: str | None = None,
        device: str | None = None,
    ):
        if num_envs < 1:
            raise UserError(f"the number of envs must be at least 1, got {num_envs}")
        wp, mjw = modules()
        self._wp, self._mjw = wp, mjw
        self.device = wp.get_device(cuda_device() if device is None else device)
        model = spec.compile()
        super().__init__(model, num_envs, keyframe, seed)
        self.threads = 1  # the host thread that launches the GPU's work
        self.timestep = float(model.opt.timestep)
        with wp.ScopedDevice(self.device):
            # Fields that domain randomisation varies, and the constants set_const derives from
            # them, get one row per world.
            self._m = mjw.put_model(model, batch_sizes={name: num_envs for name in _PER_WORLD})
            self._d = mjw.make_data(model, nworld=num_envs)
            if keyframe is not None:
                mjw.reset_data_keyframe(self._m, self._d, model.key(keyframe).id)
        # The device's own state (warm start, activations) a reset restores: its first world's.
        self._device_initial = {name: getattr(self._d, name).numpy()[0].copy() for name in _DEVICE_STATE}
        self._graphs: dict[int, object] = {}
        self._fields: dict[str, np.ndarray] = {}  # per-env model fields handed out, on the host
        # Derived fields copied to the host after each call: name → host array, filled on first use.
        self._derived_arrays: dict[str, np.ndarray] = {}
        self.forward(np.arange(num_envs))

    # -- state between host and device ---------------------------------------------------------

    def _push(self) -> None:
        d = self._d
        d.qpos.assign(self.qpos.astype(np.float32))
        d.qvel.assign(self.qvel.astype(np.float32))
        d.ctrl.assign(self.ctrl.astype(np.float32))
        if self.model.nmocap:
            d.mocap_pos.assign(self.mocap_pos.astype(np.float32))
            d.mocap_quat.assign(self.mocap_quat.astype(np.float32))

    def _pull(self, rows: np.ndarray | slice) -> None:
        d = self._d
        self.qpos[rows] = d.qpos.numpy()[rows]
        self.qvel[rows] = d.qvel.numpy()[rows]
        for name, values in self._derived_arrays.items():
            values[rows] = getattr(d, name).numpy()[rows]

    def _run(self, substeps: int) -> None:
        wp, mjw = self._wp, self._mjw
        with wp.ScopedDevice(self.device):
            if not self.device.is_cuda:
                for _ in range(substeps):
                    mjw.step(self._m, self._d)
                return
            if substeps not in self._graphs:
                with wp.ScopedCapture() as capture:
                    for _ in range(substeps):
                        mjw.step(self._m, self._d)
                self._graphs[substeps] = capture.graph
            wp.capture_launch(self._graphs[substeps])

    def step(self, ctrl: np.ndarray | None, substeps: int) -> np.ndarray:
        if ctrl is not None:
            self.ctrl[:] = ctrl
        written_bad = ~((np.abs(self.qpos) <= MAX_ABS_STATE).all(axis=1) & (np.abs(self.qvel) <= MAX_ABS_STATE).all(axis=1)
                        & np.isfinite(self.ctrl).all(axis=1))
        self.reset(np.flatnonzero(written_bad))
        self._push()
        self._run(substeps)
        self._pull(slice(None))
        qacc = self._d.qacc.numpy()
        diverged = (written_bad | ~(np.abs(self.qpos) <= MAX_ABS_STATE).all(axis=1)
                    | ~(np.abs(self.qvel) <= MAX_ABS_STATE).all(axis=1) | ~(np.abs(qacc) <= MAX_ABS_QACC).all(axis=1))
        if diverged.any():
            ids = np.flatnonzero(diverged)
            self.divergences += len(ids)
            self.reset(ids)
            self.forward(ids)
        return diverged

    def reset(self, env_ids: np.ndarray, noise: float = 0.0) -> None:
        ids = np.unique(np.asarray(env_ids, dtype=np.int64))
        if ids.size == 0:
            return
        self._write_rows(ids, self._device_initial)
        super().reset(ids, noise)

    def _write_rows(self, ids: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Device-only state (warm start, activations) of rows `ids`, through the host: resets are rare."""
        for name, value in values.items():
            array = getattr(self._d, name)
            host = array.numpy()
            host[ids] = value
            array.assign(host)

    def forward(self, env_ids: np.ndarray) -> None:
        ids = np.unique(np.asarray(env_ids, dtype=np.int64))
        if ids.size == 0:
            return
        # MuJoCo Warp's forward pass covers every world; the others keep their warm start, and
        # their derived fields on the host stay what their last step left.
        kept = {name: getattr(self._d, name).numpy().copy() for name in _DEVICE_STATE}
        self._push()
        with self._wp.ScopedDevice(self.device):
            self._mjw.forward(self._m, self._d)
        others = np.setdiff1d(np.arange(self.num_envs), ids)
        self._write_rows(others, {name: value[others] for name, value in kept.items()})
        self._pull(ids)

    def get_state(self) -> dict:
        return self.host_state() | {name: getattr(self._d, name).numpy().copy() for name in _DEVICE_STATE}

    def set_state(self, state: dict) -> None:
        self.load_host_state(state)
        self.forward(np.arange(self.num_envs))
        self._write_rows(np.arange(self.num_envs), {name: state[name] for name in _DEVICE_STATE})

    # -- derived outputs ------------------------------------------------------------------------

    def _derived(self, field: str) -> np.ndarray:
        if field not in self._derived_arrays:
            self._derived_arrays[field] = getattr(self._d, field).numpy().astype(np.float64)
        return self._derived_arrays[field]

    # DomainRandomisable
    def model_field(self, name: str) -> np.ndarray:
        if name not in _RANDOMISABLE:
            raise UserError(f"{name!r} is not a model field MuJoCo Warp varies per env here; it can: "
                            f"{', '.join(_RANDOMISABLE)}")
        if name not in self._fields:
            nominal = getattr(self.model, name)
            self._fields[name] = np.tile(nominal, (self.num_envs,) + (1,) * nominal.ndim)
        return self._fields[name]

    def commit_model_fields(self, env_ids: np.ndarray | None = None) -> None:
        for name, values in self._fields.items():
            getattr(self._m, name).assign(values.astype(np.float32))
        if {"body_mass", "body_inertia"} & set(self._fields):
            # Masses feed the subtree masses and the solver's inverse weights, per world. set_const
            # recomputes every world's in float32, so the other envs keep what they had.
            derived = {name: getattr(self._m, name).numpy().copy() for name in _DERIVED}
            with self._wp.ScopedDevice(self.device):
                self._mjw.set_const(self._m, self._d)
            if env_ids is not None:
                others = np.setdiff1d(np.arange(self.num_envs), env_ids)
                for name, before in derived.items():
                    array = getattr(self._m, name)
                    after = array.numpy()
                    after[others] = before[others]
                    array.assign(after)


_RANDOMISABLE = ("body_mass", "body_inertia", "geom_friction", "actuator_gainprm", "actuator_biasprm")
_DERIVED = ("body_subtreemass", "body_invweight0", "dof_invweight0", "actuator_acc0")
_PER_WORLD = _RANDOMISABLE + _DERIVED

# Each world's integration state that only the device holds (the host holds the rest: HostState).
_DEVICE_STATE = ("act", "qacc_warmstart", "time")


def bare_physics(spec: mujoco.MjSpec, num_envs: int, threads: int, keyframe: str | None) -> Callable[[int], None]:
    """The substeps as one CUDA graph from the keyframe, nothing copied: what the GPU physics alone costs."""
    sim = WarpBatchSim(spec, num_envs, keyframe=keyframe)

    def step(substeps: int) -> None:
        sim._run(substeps)
        sim._wp.synchronize_device(sim.device)

    return step
