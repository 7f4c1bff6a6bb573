"""A task's physics step other than its own (`sim_dt`): checked before any work starts.

A coarser step makes the physics cheaper, and a policy trained at it is worth having only if the
physics is still stable there: the step must divide the control step (a whole number of substeps
per action), and the scene's keyframe, held by its own controls, must stand as still for a second
as it does at the task's own step.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from hetlab.errors import UserError

STAND_SECONDS = 1.0
# How much further (m or rad, the largest joint coordinate) the keyframe may drift in STAND_SECONDS
# than at the task's own step: a settling contact moves millimetres, an unstable step far more.
DRIFT_TOLERANCE = 0.05


def check_physics_step(cls, cfg) -> None:
    """UserError if `cfg.sim_dt` does not divide `cls`'s control step, or the keyframe does not
    stand still at it."""
    substeps = cls.control_dt / cfg.sim_dt
    if cfg.sim_dt < 0 or cfg.sim_dt > cls.control_dt or not math.isclose(substeps, round(substeps), rel_tol=1e-6):
        raise UserError(f"--sim-dt {cfg.sim_dt:g} must divide {cls.name}'s control step of {cls.control_dt:g} s "
                        f"into whole substeps (e.g. {cls.control_dt / 2:g} or {cls.control_dt / 4:g}); 0 = the task's own")
    own = keyframe_drift(cls.build_spec(cfg))
    coarse = keyframe_drift(cls.physics_spec(cfg))
    if not coarse <= own + DRIFT_TOLERANCE:  # NaN (a diverged state) fails too
        raise UserError(f"--sim-dt {cfg.sim_dt:g} is unstable for {cls.name}: its keyframe drifts {coarse:.3g} in "
                        f"{STAND_SECONDS:g} s standing (at its own step {own:.3g}); use a finer step")


def keyframe_drift(spec: mujoco.MjSpec) -> float:
    """The largest change of a joint coordinate while the scene's first keyframe (or its initial
    state) is held by its controls for STAND_SECONDS; inf if the physics diverges."""
    model = spec.compile()
    data = mujoco.MjData(model)
    if model.nkey:
        mujoco.mj_resetDataKeyframe(model, data, 0)
    start = data.qpos.copy()
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: None)  # a diverging step is the answer here, not news
    try:
        for _ in range(round(STAND_SECONDS / model.opt.timestep)):
            mujoco.mj_step(model, data)
    finally:
        mujoco.set_mju_user_warning(previous)
    if not np.isfinite(data.qpos).all() or data.warning[mujoco.mjtWarning.mjWARN_BADQACC].number:
        return math.inf
    return float(np.abs(data.qpos - start).max())
