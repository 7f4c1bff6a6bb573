"""BatchSim on MotrixSim (the optional `motrix` extra): a second CPU engine behind the same contract.

MotrixSim reads the task's MJCF itself and steps a batch of envs on a process-wide thread pool,
in float32. Its state differs from MuJoCo's in three ways the adapter hides: it hands out copies
rather than live arrays, it may order free joints differently, and its quaternions
are xyzw (MuJoCo: wxyz). So the adapter owns `qpos`, `qvel` and `ctrl` in MuJoCo's layout
(float64, rounded to float32 on the way in) and copies them into MotrixSim before each `step`
and back after it; sensors and body poses are refreshed into arrays it owns in the same way.
Names, indices, ranges and keyframes come from the MuJoCo model compiled from the same spec, so
tasks see one layout whichever engine steps them.

MotrixSim ignores some MJCF options (`cone`, `impratio`, `ls_iterations`, `eulerdamp`) and has
its own solver, so its trajectories agree with MuJoCo's only to within the differences between
two engines (tests/sim/test_backends.py bounds them on Go1 standing). Force sensors it does not
compute: a task that reads one is refused, naming it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np

from hetlab.devices import cpu_count
from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.sim.model_state import HostState, named

# Velocities past this are a blown-up simulation (MuJoCo's backend checks accelerations instead;
# MotrixSim does not expose them).
MAX_ABS_QVEL = 1e4
_QUAT_SENSORS = (int(mujoco.mjtSensor.mjSENS_FRAMEQUAT), int(mujoco.mjtSensor.mjSENS_BALLQUAT))
# MuJoCo's wxyz → MotrixSim's xyzw, as indices into a MuJoCo quaternion.
_XYZW = np.array([1, 2, 3, 0])
_WXYZ = np.array([3, 0, 1, 2])

_pool_threads: int | None = None  # MotrixSim's thread pool, started once per process


def motrixsim():
    """The motrixsim module, its own log quietened (it warns about every MJCF field it skips;
    the module docstring lists the ones that matter)."""
    os.environ.setdefault("RUST_LOG", "error")
    with _stderr_silenced():  # it announces its profiler on import
        return require("motrix", "motrixsim", "--sim motrix")


def start_thread_pool(threads: int) -> int:
    """MotrixSim's pool size. It has one pool per process: the first sim starts it with `threads`
    (0 = every core) and later sims step on it whatever they ask for (each collector is a process
    of its own, so `--threads` holds there); a sim's `threads` reports the pool it runs on."""
    global _pool_threads
    if _pool_threads is None:
        _pool_threads = threads or cpu_count()
        motrixsim().init_thread_pool(_pool_threads)
    return _pool_threads


def load_mjcf(spec: mujoco.MjSpec):
    """MotrixSim's model of a compiled `spec`, its mesh and texture folders made absolute so the
    MJCF loads from anywhere."""
    mx = motrixsim()
    spec = spec.copy()
    # Textures only colour what a renderer draws, and MotrixSim's parser refuses some of MuJoCo's.
    for material in spec.materials:
        material.textures = [""] * len(material.textures)
    for texture in list(spec.textures):
        spec.delete(texture)
    base = Path(spec.modelfiledir or ".")
    spec.meshdir = str(base / spec.meshdir) if spec.meshdir else str(base)
    spec.texturedir = str(base / spec.texturedir) if spec.texturedir else str(base)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scene.xml"
        path.write_text(spec.to_xml())
        try:
            return mx.load_model(str(path))
        except BaseException as e:  # a Rust panic is not an Exception subclass
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise UserError(f"MotrixSim cannot load the model {spec.modelname!r}: {str(e).splitlines()[0]}") from None


class _Layout:
    """Where each of MuJoCo's qpos/qvel entries sits in MotrixSim's dof arrays: MotrixSim's
    positions are `qpos[:, pos]` and velocities `qvel[:, vel]`."""

    def __init__(self, model: mujoco.MjModel, mx_model):
        free_joints = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        other = [j for j in range(model.njnt) if model.jnt_type[j] != mujoco.mjtJoint.mjJNT_FREE]
        if len(free_joints) != len(mx_model.floating_bases) or len(other) != mx_model.num_joints:
            raise UserError(f"MotrixSim reads {len(mx_model.floating_bases)} free and {mx_model.num_joints} other "
                            f"joints where MuJoCo has {len(free_joints)} and {len(other)}")
        pos = np.full(model.nq, -1)
        vel = np.full(model.nv, -1)
        for base, j in zip(mx_model.floating_bases, free_joints):
            q, v = model.jnt_qposadr[j], model.jnt_dofadr[j]
            pos[base.dof_pos_start : base.dof_pos_start + 7] = np.concatenate([q + np.arange(3), q + 3 + _XYZW])
            vel[base.dof_vel_start : base.dof_vel_start + 6] = v + np.arange(6)
        for k, j in enumerate(other):
            name = model.joint(j).name
            if name and mx_model.joint_names[k] != name:
                raise UserError(f"MotrixSim orders joint {name!r} differently from MuJoCo")
            q, v = model.jnt_qposadr[j], model.jnt_dofadr[j]
            start_q, start_v = mx_model.joint_dof_pos_indices[k], mx_model.joint_dof_vel_indices[k]
            if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_BALL:
                pos[start_q : start_q + 4] = q + _XYZW
                vel[start_v : start_v + 3] = v + np.arange(3)
            else:
                pos[start_q], vel[start_v] = q, v
        if sorted(pos) != list(range(model.nq)) or sorted(vel) != list(range(model.nv)):
            raise UserError(f"MotrixSim lays out the state of model {model.names[:model.names.index(0)].decode()!r} "
                            "in a way hetlab cannot map to MuJoCo's")
        self.pos, self.vel = pos, vel


class MotrixBatchSim(HostState):
    """`num_envs` copies of the model `spec` describes, stepped by MotrixSim on `threads` threads
    (0 = every core; see `start_thread_pool`)."""

    def __init__(
        self,
        spec: mujoco.MjSpec,
        num_envs: int,
        threads: int = 0,
        seed: int = 0,
        keyframe: str | None = None,
    ):
        if num_envs < 1:
            raise UserError(f"the number of envs must be at least 1, got {num_envs}")
        self._pool = start_thread_pool(threads)
        mx = motrixsim()
        model = spec.compile()
        super().__init__(model, num_envs, keyframe, seed)
        self._mx = load_mjcf(spec)
        self.timestep = float(model.opt.timestep)
        self._layout = _Layout(model, self._mx)
        if [a or "" for a in self._mx.actuator_names] != self.actuator_names():
            raise UserError("MotrixSim orders the model's actuators differently from MuJoCo")
        self._data = mx.SceneData(self._mx, batch=[num_envs])
        mocap_bodies = sorted(np.flatnonzero(model.body_mocapid >= 0), key=lambda b: model.body_mocapid[b])
        self._mocaps = [self._mx.get_body(model.body(b).name).mocap for b in mocap_bodies]
        # Derived outputs the caller has asked for: name → (array, refresh(rows)).
        self._derived: dict[str, tuple[np.ndarray, Callable[[np.ndarray | slice], None]]] = {}
        self._fields: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per-env model fields: (values, nominal)
        self.forward(np.arange(num_envs))

    @property
    def threads(self) -> int:
        return self._pool

    # -- state in and out of MotrixSim ---------------------------------------------------------

    def _push(self, data, rows: np.ndarray | slice) -> None:
        data.set_dof_pos(_float32(self.qpos[rows][:, self._layout.pos]), self._mx)
        data.set_dof_vel(_float32(self.qvel[rows][:, self._layout.vel]))
        data.actuator_ctrls = _float32(self.ctrl[rows])
        for m, mocap in enumerate(self._mocaps):
            mocap.set_pose(data, _float32(np.concatenate([self.mocap_pos[rows, m], self.mocap_quat[rows, m][:, _XYZW]],
                                                         axis=1)))

    def _pull(self) -> None:
        self.qpos[:, self._layout.pos] = self._data.dof_pos
        self.qvel[:, self._layout.vel] = self._data.dof_vel

    def _refresh(self, rows: np.ndarray | slice) -> None:
        for _, refresh in self._derived.values():
            refresh(rows)

    def step(self, ctrl: np.ndarray | None, substeps: int) -> np.ndarray:
        if ctrl is not None:
            self.ctrl[:] = ctrl
        # MotrixSim refuses a non-finite state outright, so those envs restart before the step.
        written_bad = self.written_non_finite()
        self.reset(np.flatnonzero(written_bad))
        self._push(self._data, slice(None))
        self._mx.step_n(self._data, substeps)
        self._pull()
        diverged = written_bad | ~np.isfinite(self.qpos).all(axis=1) | ~(np.abs(self.qvel) <= MAX_ABS_QVEL).all(axis=1)
        self._refresh(slice(None))
        if diverged.any():
            ids = np.flatnonzero(diverged)
            self.divergences += len(ids)
            self.reset(ids)
            self.forward(ids)
        return diverged

    def forward(self, env_ids: np.ndarray) -> None:
        ids = np.unique(np.asarray(env_ids, dtype=np.int64))
        if ids.size == 0:
            return
        mask = np.zeros(self.num_envs, bool)
        mask[ids] = True
        subset = self._data[mask]
        self._push(subset, ids)
        motrixsim().forward_kinematic(self._mx, subset)
        # What MotrixSim stores is float32: the state now reads back as it will step.
        self.qpos[ids[:, None], self._layout.pos] = subset.dof_pos
        self.qvel[ids[:, None], self._layout.vel] = subset.dof_vel
        self._refresh(ids)

    def get_state(self) -> dict:
        """The state in MuJoCo's layout. MotrixSim keeps its solver's warm start to itself, so a sim
        restored from this continues from the same state but not bit for bit as the original did
        (Go1 under random controls: 0.07 apart after 20 control steps)."""
        return self.host_state()

    def set_state(self, state: dict) -> None:
        self.load_host_state(state)
        self.forward(np.arange(self.num_envs))

    # -- derived outputs ------------------------------------------------------------------------

    def sensor(self, name: str) -> np.ndarray:
        sensor = named(self.model.sensor, "sensor", name)
        if name not in self._derived:
            quaternion = int(sensor.type[0]) in _QUAT_SENSORS
            values = np.empty((self.num_envs, int(sensor.dim[0])))

            def refresh(rows, name=name, values=values, quaternion=quaternion):
                read = self._mx.get_sensor_value(name, self._data)
                values[rows] = (read[:, _WXYZ] if quaternion else read)[rows]

            try:
                with _stderr_silenced():  # a Rust panic prints its backtrace there first
                    refresh(slice(None))
            except BaseException as e:  # MotrixSim panics on a sensor it did not build
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                raise UserError(f"MotrixSim does not compute sensor {name!r} (type "
                                f"{mujoco.mjtSensor(int(sensor.type[0])).name}); leave it out of the model") from None
            self._derived[name] = (values, refresh)
        return self._derived[name][0]

    def body_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        named(self.model.body, "body", name)
        key = f"body:{name}"
        if key not in self._derived:
            link = self._mx.get_link_index(name)
            if link is None:
                raise UserError(f"MotrixSim has no link for body {name!r}")
            pose = np.empty((self.num_envs, 7))

            def refresh(rows, link=link, pose=pose):
                read = self._mx.get_link_poses(self._data, [link])[:, 0]
                pose[rows, :3] = read[rows, :3]
                pose[rows, 3:] = read[rows][:, 3:][:, _WXYZ]

            refresh(slice(None))
            self._derived[key] = (pose, refresh)
        pose = self._derived[key][0]
        return pose[:, :3], pose[:, 3:]

    # -- DomainRandomisable: the fields MotrixSim can override per env ------------------------

    def model_field(self, name: str) -> np.ndarray:
        if name not in _OVERRIDES:
            raise UserError(f"{name!r} is not a model field MotrixSim can vary per env; it can: "
                            f"{', '.join(sorted(_OVERRIDES))}")
        if name not in self._fields:
            nominal = getattr(self.model, name).copy()
            self._fields[name] = (np.tile(nominal, (self.num_envs,) + (1,) * nominal.ndim), nominal)
        return self._fields[name][0]

    def commit_model_fields(self, env_ids: np.ndarray | None = None) -> None:
        ids = np.arange(self.num_envs) if env_ids is None else np.unique(np.asarray(env_ids, dtype=np.int64))
        mask = np.zeros(self.num_envs, bool)
        mask[ids] = True
        subset = self._data[mask]
        for name, (values, nominal) in self._fields.items():
            changed = np.flatnonzero((values != nominal).reshape(self.num_envs, nominal.shape[0], -1).any(axis=(0, 2)))
            for index in changed:
                _OVERRIDES[name](self, subset, int(index), values[ids, index])

    def _link(self, body: int):
        name = self.model.body(body).name
        link = self._mx.get_link(name) if name else None
        if link is None:
            raise UserError(f"MotrixSim has no link for body {body} ({name or 'unnamed'}) to vary per env")
        return link

    def _geom(self, geom: int):
        name = self.model.geom(geom).name
        found = self._mx.get_geom(name) if name else None
        if found is None:
            raise UserError(f"only named geoms can vary per env on MotrixSim; geom {geom} has no name")
        return found


def _inertia_tensor(sim: MotrixBatchSim, body: int, moments: np.ndarray) -> np.ndarray:
    """MuJoCo's principal moments (in the body's inertial frame) → MotrixSim's tensor in the
    body frame, [Ixx, Iyy, Izz, Ixy, Ixz, Iyz] per env."""
    rotation = np.empty(9)
    mujoco.mju_quat2Mat(rotation, sim.model.body_iquat[body])
    r = rotation.reshape(3, 3)
    full = np.einsum("ij,ej,kj->eik", r, moments, r)
    return np.stack([full[:, 0, 0], full[:, 1, 1], full[:, 2, 2], full[:, 0, 1], full[:, 0, 2], full[:, 1, 2]], axis=1)


def _actuator(sim: MotrixBatchSim, index: int, kind: str):
    actuator = sim._mx.actuators[index]
    if not hasattr(actuator, f"set_{kind}_override"):
        raise UserError(f"MotrixSim cannot vary the {kind} of actuator {sim.actuator_names()[index]!r} "
                        f"({type(actuator).__name__}) per env")
    return actuator


def _set_bias(sim: MotrixBatchSim, subset, index: int, values: np.ndarray) -> None:
    # MotrixSim's general actuator: force = gain·ctrl + bias − stiffness·q − damping·q̇.
    actuator = _actuator(sim, index, "stiffness")
    actuator.set_bias_override(subset, _float32(values[:, 0]))
    actuator.set_stiffness_override(subset, _float32(-values[:, 1]))
    actuator.set_damping_override(subset, _float32(-values[:, 2]))


# MuJoCo model field → how MotrixSim takes one object's per-env values (`values` is (k, ...)).
_OVERRIDES: dict[str, Callable] = {
    "body_mass": lambda sim, subset, i, values: sim._link(i).set_mass_override(subset, _float32(values)),
    "body_inertia": lambda sim, subset, i, values: sim._link(i).set_inertia_override(
        subset, _float32(_inertia_tensor(sim, i, values))),
    "geom_friction": lambda sim, subset, i, values: sim._geom(i).set_friction_override(subset, _float32(values)),
    "actuator_gainprm": lambda sim, subset, i, values: _actuator(sim, i, "gain").set_gain_override(subset, _float32(values[:, 0])),
    "actuator_biasprm": _set_bias,
}


@contextlib.contextmanager
def _stderr_silenced():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _float32(values: np.ndarray) -> np.ndarray:
    # MotrixSim reads an array's buffer as C-ordered float32 whatever its strides say.
    return np.ascontiguousarray(values, dtype=np.float32)


def bare_physics(spec: mujoco.MjSpec, num_envs: int, threads: int, keyframe: str | None) -> Callable[[int], None]:
    """Plain `step_n` from the keyframe, with no copies in or out: what the physics alone costs."""
    start_thread_pool(threads)
    model = load_mjcf(spec)
    data = motrixsim().SceneData(model, batch=[num_envs])
    if keyframe is not None:
        next(k for k in model.keyframes if k.name == keyframe).apply(data)
    return lambda substeps: model.step_n(data, substeps)
