"""A scripted expert for the ALOHA cube transfer: end-effector waypoints → IK → joint actions.

The script follows the timing of ACT's scripted transfer policy (Zhao et al. 2023): the right
arm opens and pitches its gripper down where it stands (steps 0–30), moves above the cube (–90),
goes down to it (–130), closes (–170), carries it up to a meeting point in the middle of the
table (–220) and waits there; meanwhile the left arm turns to face it (0–100) and slides in
around the cube (–260), closes (–300); then the right gripper opens (–330) and both arms draw
apart (–360) and hold still to the end (400).

ACT drove mocap bodies welded to the grippers and recorded the joint angles that followed;
that weld behaves differently on MuJoCo ≥ 3. Here each arm's grasp-point pose is interpolated
between waypoints (positions linearly, orientations by normalised quaternion blending) and
turned into the next joint-angle target by damped least-squares IK (hetlab.aloha.ik), warm-started
from the previous step's solution. The waypoints read only where the cube lies at the start.

The right wrist starts bent up (wrist_angle −0.3) and grasps bent down (about +1), so on the way
it passes straight, where forearm_roll and wrist_rotate turn the gripper about one axis. The
gripper pitches down before the arm swings towards the cube, so the wrist passes straight while
nothing asks it to turn sideways, and the forearm stays unrolled. Swinging first, the only joint
path that kept the gripper facing −x rolled the forearm over into the flipped wrist
(hetlab.aloha.ik): to +π or −π by the side of the table the cube lay on.

An episode succeeds if, after the last step, the LEFT gripper holds the cube: both of its
fingers touch it, the table does not, and it is at least LIFTED_Z above the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import mujoco
import numpy as np
from rich.progress import Progress

from hetlab.aloha.env import (ARMS, EPISODE_STEPS, START_ARM_POSE, START_FINGER, AlohaTransferCube, RenderQuality,
                              normalise_gripper)
from hetlab.aloha.ik import ArmIK
from hetlab.errors import UserError
from hetlab.runtime.workers import WorkerPool

CAMERA = "top"
MEET = np.array([0.0, 0.5, 0.25])  # where the right arm brings the cube: mid-table, 25 cm up
ABOVE_CUBE_Z = 0.10  # the right grasp point's height before it goes down to the cube
# The right grasp point closes 8 mm above the cube's centre (cube: 4 cm, resting at z = 0.02),
# so the fingertips, which reach 3.4 cm past it, stay clear of the table.
GRASP_Z = 0.028
CUBE_BELOW_GRASP = GRASP_Z - 0.02  # so at the meeting point the cube's centre is this far below MEET
LEFT_REACH_IN = -0.01  # the left grasp point stops 1 cm short of the cube's centre (the right fingers are beyond)
PITCHED = 30  # the step by which the right gripper is pitched down, before it moves towards the cube
APART = 0.10  # how far each arm backs off from the meeting point, before and after the handover
PICK_PITCH = np.deg2rad(60)  # the right gripper points 60° down, as in ACT
LIFTED_Z = 0.05  # success: cube centre at least 3 cm higher than resting on the table


def _quat_from_axes(x_axis, y_axis) -> np.ndarray:
    """The orientation whose frame has these x (approach) and y (finger slide) axes in the world."""
    x_axis, y_axis = np.asarray(x_axis, dtype=np.float64), np.asarray(y_axis, dtype=np.float64)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.column_stack([x_axis, y_axis, np.cross(x_axis, y_axis)]).ravel())
    return quat


# The right arm faces -x: pitched down towards the cube, fingers closing along y (on two faces).
RIGHT_PICK_QUAT = _quat_from_axes([-np.cos(PICK_PITCH), 0.0, -np.sin(PICK_PITCH)], [0.0, -1.0, 0.0])
# The left arm faces +x, level, fingers closing along z: on the faces the right fingers leave free.
LEFT_HANDOVER_QUAT = _quat_from_axes([1.0, 0.0, 0.0], [0.0, 0.0, 1.0])


@dataclass(frozen=True)
class Waypoint:
    step: int  # the control step at which the grasp point reaches this pose
    position: np.ndarray  # grasp point, world frame (m)
    quat: np.ndarray  # gripper orientation, world frame (w x y z)
    gripper: float  # normalised opening, 0 closed, 1 open


@dataclass(frozen=True)
class ExpertEpisode:
    seed: int
    images: np.ndarray | None  # (T, H, W, 3) uint8 from camera "top", None when not rendered
    state: np.ndarray  # (T, 14) float32: agent_pos observed at each frame
    action: np.ndarray  # (T, 14) float32: the action sent after observing that frame
    success: bool
    max_reward: int


def transfer_waypoints(cube_xy: np.ndarray, start: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, list[Waypoint]]:
    """Each arm's waypoints for a cube resting at `cube_xy`; `start` is each arm's initial grasp pose."""
    opening = float(normalise_gripper(START_FINGER))
    above = np.array([*cube_xy, ABOVE_CUBE_Z])
    grasp = np.array([*cube_xy, GRASP_Z])
    right_apart = MEET + [APART, 0.0, 0.0]
    handover = MEET + [LEFT_REACH_IN, 0.0, -CUBE_BELOW_GRASP]
    left_apart = handover - [APART, 0.0, 0.0]
    right = [
        Waypoint(0, *start["right"], opening),
        Waypoint(PITCHED, start["right"][0], RIGHT_PICK_QUAT, 1.0),
        Waypoint(90, above, RIGHT_PICK_QUAT, 1.0),
        Waypoint(130, grasp, RIGHT_PICK_QUAT, 1.0),
        Waypoint(170, grasp, RIGHT_PICK_QUAT, 0.0),
        Waypoint(200, MEET + [0.05, 0.0, 0.0], RIGHT_PICK_QUAT, 0.0),
        Waypoint(220, MEET, RIGHT_PICK_QUAT, 0.0),
        Waypoint(310, MEET, RIGHT_PICK_QUAT, 0.0),
        Waypoint(330, MEET, RIGHT_PICK_QUAT, 1.0),
        Waypoint(360, right_apart, RIGHT_PICK_QUAT, 1.0),
        Waypoint(EPISODE_STEPS, right_apart, RIGHT_PICK_QUAT, 1.0),
    ]
    left = [
        Waypoint(0, *start["left"], opening),
        Waypoint(100, left_apart, LEFT_HANDOVER_QUAT, 1.0),
        Waypoint(260, handover, LEFT_HANDOVER_QUAT, 1.0),
        Waypoint(300, handover, LEFT_HANDOVER_QUAT, 0.0),
        Waypoint(360, left_apart, LEFT_HANDOVER_QUAT, 0.0),
        Waypoint(EPISODE_STEPS, left_apart, LEFT_HANDOVER_QUAT, 0.0),
    ]
    return {"left": left, "right": right}


def pose_at(waypoints: list[Waypoint], step: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Grasp-point position, orientation and gripper opening at `step`, between the waypoints around it."""
    if step >= waypoints[-1].step:
        last = waypoints[-1]
        return last.position, last.quat, last.gripper
    after = next(i for i, w in enumerate(waypoints) if w.step > step)
    a, b = waypoints[after - 1], waypoints[after]
    f = (step - a.step) / (b.step - a.step)
    # Blend along the shorter arc (q and -q are one rotation); the waypoints are close enough
    # that a normalised blend is as good as slerp.
    quat = (1 - f) * a.quat + f * (b.quat if a.quat @ b.quat >= 0 else -b.quat)
    return a.position + f * (b.position - a.position), quat / np.linalg.norm(quat), a.gripper + f * (b.gripper - a.gripper)


def left_gripper_holds_cube(env: AlohaTransferCube) -> bool:
    """Both left fingers touch the cube, the table does not, and the cube is lifted."""
    touching = env.geoms_touching_cube()
    fingers = {env.model.geom(f"vx300s_left/10_{side}_gripper_finger").id for side in ("left", "right")}
    lifted = env.data.qpos[env.cube_qpos + 2] >= LIFTED_Z
    return fingers <= touching and env.table_geom not in touching and bool(lifted)


def rollout_expert(seed: int, *, render: bool = False, height: int = 480, width: int = 640,
                   steps: int = EPISODE_STEPS, render_quality: RenderQuality = "high") -> ExpertEpisode:
    """One scripted episode of `steps` frames; frame t is the observation before action t."""
    if steps < 1:
        raise UserError(f"an expert episode needs at least 1 step, got {steps}")
    env = AlohaTransferCube(height=height, width=width, cameras=(CAMERA,) if render else (),
                            render_quality=render_quality)
    try:
        observation, _ = env.reset(seed=seed)
        solvers = {arm: ArmIK(env.model, arm) for arm in ARMS}
        joints = {arm: START_ARM_POSE.copy() for arm in ARMS}
        cube_xy = env.data.qpos[env.cube_qpos : env.cube_qpos + 2].copy()
        plan = transfer_waypoints(cube_xy, {arm: solvers[arm].grasp_pose(START_ARM_POSE) for arm in ARMS})
        images = np.empty((steps, height, width, 3), np.uint8) if render else None
        state = np.empty((steps, 14), np.float32)
        action = np.empty((steps, 14), np.float32)
        max_reward = 0
        for t in range(steps):
            state[t] = observation["agent_pos"]
            if render:
                images[t] = observation["pixels"][CAMERA]
            for index, arm in enumerate(ARMS):
                # Aim for where the grasp point should be once this action has been held for a step.
                position, quat, gripper = pose_at(plan[arm], t + 1)
                joints[arm] = solvers[arm].solve(position, quat, joints[arm])
                action[t, 7 * index : 7 * index + 7] = [*joints[arm], gripper]
            # The env reports success (reward 4) as `terminated`; the script runs on regardless so
            # every episode has the same length.
            observation, reward, _, _, _ = env.step(action[t])
            max_reward = max(max_reward, int(reward))
        return ExpertEpisode(seed, images, state, action, left_gripper_holds_cube(env), max_reward)
    finally:
        env.close()


def _succeeds(_, job: tuple[int, int]) -> bool:
    """A worker's job: (index, seed) → whether the expert succeeds on the seed."""
    return rollout_expert(job[1]).success


def run_expert(seeds: Sequence[int], workers: int = 1, progress: Progress | None = None) -> dict:
    """Run the expert on every seed without rendering; `workers` > 1 runs episodes in spawned processes."""
    seeds = list(seeds)
    if not seeds:
        raise UserError("no seeds to run the expert on")
    if workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    task = progress.add_task("expert episodes", total=len(seeds)) if progress else None
    jobs = list(enumerate(seeds))
    outcomes = [False] * len(seeds)
    with ExitStack() as stack:
        if workers == 1:
            finished = ((job, _succeeds(None, job)) for job in jobs)
        else:
            pool = stack.enter_context(WorkerPool(min(workers, len(seeds)), _succeeds, name="expert"))
            finished = pool.as_completed(jobs)
        for (index, _), success in finished:
            outcomes[index] = success
            if progress:
                progress.advance(task)
    successes = sum(outcomes)
    return {
        "episodes": len(seeds),
        "successes": successes,
        "success_rate": successes / len(seeds),
        "failed_seeds": [seed for seed, success in zip(seeds, outcomes) if not success],
    }
