"""The Unitree G1 humanoid as the G1 tasks share it: joint order, poses and the flat-ground scene.

The scene is Playground's (feet-only collisions, 2 ms Euler steps, kp 75 position actuators,
softer ankles and wrists) with the feet on the floor by geom contact rather than explicit pairs,
so the floor's friction is a per-env model field that domain randomisation can vary.
"""

from __future__ import annotations

import mujoco
import numpy as np

from hetlab.assets import scene_xml
from hetlab.tasks.symmetry import Mirror

LEG = ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll")
ARM = ("shoulder_pitch", "shoulder_roll", "shoulder_yaw", "elbow", "wrist_roll", "wrist_pitch", "wrist_yaw")
# Menagerie's order, which is also the order of the model's qpos and of its actuators.
JOINTS = ([f"{side}_{j}_joint" for side in ("left", "right") for j in LEG] + [f"waist_{j}_joint" for j in ("yaw", "roll", "pitch")]
          + [f"{side}_{j}_joint" for side in ("left", "right") for j in ARM])
# In a mirror left and right joints trade places; roll and yaw angles change sign, pitch (knees and
# elbows too) does not.
JOINT_MIRROR = Mirror.of_names(
    JOINTS, partner=lambda joint: joint.replace("left", "#").replace("right", "left").replace("#", "right"),
    negated=lambda joint: "_roll_" in joint or "_yaw_" in joint)
# The scene's "knees_bent" keyframe, in JOINTS order.
DEFAULT_POSE = np.array([-0.312, 0, 0, 0.669, -0.363, 0] * 2 + [0, 0, 0.073]
                        + [0.2, 0.2, 0, 0.6, 0, 0, 0] + [0.2, -0.2, 0, 0.6, 0, 0, 0])
FEET = ("left_foot", "right_foot")
FOOT_MIRROR = Mirror.of_items([1, 0], Mirror.same(1))  # a value per foot: the feet trade places
FLOOR_FRICTION = 0.6  # Playground's foot-floor friction
SOFT_LIMIT_FACTOR = 0.95  # joint-limit penalties start this far into each range


def g1_flat_spec() -> mujoco.MjSpec:
    """The G1 on flat ground, with foot positions and every actuator's force as sensors."""
    spec = mujoco.MjSpec.from_file(str(scene_xml("g1_flat")))
    for pair in list(spec.pairs):
        if pair.name in ("left_foot_floor", "right_foot_floor"):
            spec.delete(pair)
    floor = spec.geom("floor")
    floor.contype, floor.conaffinity, floor.condim, floor.priority = 1, 0, 3, 1
    floor.friction = [FLOOR_FRICTION, 0.005, 0.0001]
    for foot in FEET:
        spec.geom(foot).conaffinity = 1
        spec.add_sensor(name=f"{foot}_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS,
                        objtype=mujoco.mjtObj.mjOBJ_SITE, objname=foot)
    for joint in JOINTS:  # the actuators are named after their joints
        spec.add_sensor(name=f"{joint}_force", type=mujoco.mjtSensor.mjSENS_ACTUATORFRC,
                        objtype=mujoco.mjtObj.mjOBJ_ACTUATOR, objname=joint)
    return spec


class G1Joints:
    """Where the 29 joints sit in a sim's qpos and qvel, and their soft limits."""

    def __init__(self, sim):
        first = sim.joint_index(JOINTS[0])
        if [sim.joint_index(j)[0] for j in JOINTS] != list(range(first[0], first[0] + len(JOINTS))):
            raise ValueError("the G1 model's joints are not stored in order")
        self.qpos = slice(first[0], first[0] + len(JOINTS))
        self.qvel = slice(first[1], first[1] + len(JOINTS))
        ranges = np.array([sim.joint_range(j) for j in JOINTS])
        self.low, self.high = ranges[:, 0], ranges[:, 1]
        centre, half = ranges.mean(axis=1), 0.5 * (self.high - self.low)
        self.soft_low, self.soft_high = centre - SOFT_LIMIT_FACTOR * half, centre + SOFT_LIMIT_FACTOR * half
