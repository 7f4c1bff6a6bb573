"""What every backend reads off the MuJoCo model compiled from the task's spec: names → indices,
the keyframe's state and the reset noise; and, for an engine whose state lives outside numpy
(MotrixSim, MuJoCo Warp), the host's copy of that state in MuJoCo's layout."""

from __future__ import annotations

import mujoco
import numpy as np

from hetlab.errors import UserError

_NOISY_JOINTS = (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))


def named(lookup, kind: str, name: str):
    """`lookup(name)` (an MjModel accessor), or a UserError naming what the model lacks."""
    try:
        return lookup(name)
    except KeyError:
        raise UserError(f"the model has no {kind} named {name!r}") from None


class ModelLookups:
    """The contract's name lookups, answered from `self.model`."""

    model: mujoco.MjModel

    def joint_index(self, name: str) -> tuple[int, int]:
        joint = named(self.model.joint, "joint", name).id
        return int(self.model.jnt_qposadr[joint]), int(self.model.jnt_dofadr[joint])

    def joint_range(self, name: str) -> tuple[float, float]:
        joint = named(self.model.joint, "joint", name).id
        low, high = self.model.jnt_range[joint] if self.model.jnt_limited[joint] else (-np.inf, np.inf)
        return float(low), float(high)

    def actuator_names(self) -> list[str]:
        return [self.model.actuator(i).name for i in range(self.model.nu)]

    def object_id(self, kind: str, name: str) -> int:
        lookup = getattr(self.model, kind, None)
        if lookup is None:
            raise UserError(f"{kind!r} is not a kind of MuJoCo model object")
        return named(lookup, kind, name).id

    def mocap_id(self, name: str) -> int:
        body = named(self.model.body, "body", name).id
        mocap = int(self.model.body_mocapid[body])
        if mocap < 0:
            raise UserError(f"body {name!r} is not a mocap body (mocap=\"true\" in the MJCF)")
        return mocap


class MujocoOutputs:
    """`sensor` and `body_pose` for an engine that computes MuJoCo's own `sensordata`, `xpos` and
    `xquat`; `_derived(field)` is its live (num_envs, ...) array of one of them."""

    model: mujoco.MjModel

    def sensor(self, name: str) -> np.ndarray:
        sensor = named(self.model.sensor, "sensor", name)
        adr, dim = int(sensor.adr[0]), int(sensor.dim[0])
        return self._derived("sensordata")[:, adr : adr + dim]

    def body_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        body = named(self.model.body, "body", name).id
        return self._derived("xpos")[:, body], self._derived("xquat")[:, body]


class ResetNoise:
    """Uniform ±noise on hinge and slide joint positions and velocities, from the sim's generator."""

    def __init__(self, model: mujoco.MjModel, rng: np.random.Generator):
        noisy = [j for j in range(model.njnt) if model.jnt_type[j] in _NOISY_JOINTS]
        self.qpos_columns = model.jnt_qposadr[noisy]
        self.qvel_columns = model.jnt_dofadr[noisy]
        self.rng = rng

    def add(self, qpos: np.ndarray, qvel: np.ndarray, ids: np.ndarray, noise: float) -> None:
        if noise <= 0.0:
            return
        rows = ids[:, None]
        qpos[rows, self.qpos_columns] += self.rng.uniform(-noise, noise, (len(ids), len(self.qpos_columns)))
        qvel[rows, self.qvel_columns] += self.rng.uniform(-noise, noise, (len(ids), len(self.qvel_columns)))


class HostState(ModelLookups):
    """`qpos`, `qvel`, `ctrl` and mocap poses of every env in MuJoCo's layout and float64, owned
    on the host for an engine that keeps its own copy: the contract's live arrays, which the
    engine's adapter copies in before a step and out after it. Starts at, and resets to, the
    MuJoCo model's keyframe (its qpos0 without one)."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, keyframe: str | None, seed: int):
        self.model = model
        self.num_envs = num_envs
        key = None if keyframe is None else model.key(keyframe).id
        mocap_bodies = sorted(np.flatnonzero(model.body_mocapid >= 0), key=lambda b: model.body_mocapid[b])
        self.initial = {
            "qpos": model.qpos0.copy() if key is None else model.key_qpos[key].copy(),
            "qvel": np.zeros(model.nv) if key is None else model.key_qvel[key].copy(),
            "ctrl": np.zeros(model.nu) if key is None else model.key_ctrl[key].copy(),
            "mocap_pos": model.body_pos[mocap_bodies] if key is None else model.key_mpos[key].reshape(-1, 3),
            "mocap_quat": model.body_quat[mocap_bodies] if key is None else model.key_mquat[key].reshape(-1, 4),
        }
        self.qpos = np.tile(self.initial["qpos"], (num_envs, 1))
        self.qvel = np.tile(self.initial["qvel"], (num_envs, 1))
        self.ctrl = np.tile(self.initial["ctrl"], (num_envs, 1))
        self.mocap_pos = np.tile(self.initial["mocap_pos"], (num_envs, 1, 1))
        self.mocap_quat = np.tile(self.initial["mocap_quat"], (num_envs, 1, 1))
        self.divergences = 0
        self._rng = np.random.default_rng(seed)
        self._noise = ResetNoise(model, self._rng)

    def reset(self, env_ids: np.ndarray, noise: float = 0.0) -> None:
        ids = np.unique(np.asarray(env_ids, dtype=np.int64))
        if ids.size == 0:
            return
        for name, value in self.initial.items():
            getattr(self, name)[ids] = value
        self._noise.add(self.qpos, self.qvel, ids, noise)

    def written_non_finite(self) -> np.ndarray:
        """The envs whose written state or controls are not finite numbers."""
        return ~(np.isfinite(self.qpos).all(axis=1) & np.isfinite(self.qvel).all(axis=1)
                 & np.isfinite(self.ctrl).all(axis=1))

    def host_state(self) -> dict:
        return {name: getattr(self, name).copy() for name in self.initial} | {
            "divergences": self.divergences, "rng": self._rng.bit_generator.state}

    def load_host_state(self, state: dict) -> None:
        if np.shape(state["qpos"]) != self.qpos.shape:
            raise UserError(f"sim state of shape {np.shape(state['qpos'])} does not fit this sim's {self.qpos.shape}")
        for name in self.initial:
            getattr(self, name)[...] = state[name]
        self.divergences = int(state["divergences"])
        self._rng.bit_generator.state = state["rng"]

    def mocap_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        mocap = self.mocap_id(name)
        return self.mocap_pos[:, mocap], self.mocap_quat[:, mocap]

    # Renderable
    def render_state(self, env_id: int, model: mujoco.MjModel | None = None,
                     data: mujoco.MjData | None = None) -> tuple[mujoco.MjModel, mujoco.MjData]:
        model = self.model if model is None else model
        data = mujoco.MjData(model) if data is None else data
        data.qpos[:], data.qvel[:], data.ctrl[:] = self.qpos[env_id], self.qvel[env_id], self.ctrl[env_id]
        data.mocap_pos[:], data.mocap_quat[:] = self.mocap_pos[env_id], self.mocap_quat[env_id]
        mujoco.mj_forward(model, data)
        return model, data
