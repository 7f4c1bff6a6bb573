"""The ALOHA bimanual cube transfer as a gymnasium env, on MuJoCo 4 without dm_control.

Two ViperX 300s arms stand at either end of a table; a 4 cm red cube lies in front of the
right arm. The right arm must pick it up and hand it to the left arm. This re-implements the
joint-position ("sim") transfer-cube task of ACT (Zhao et al. 2023, "Learning Fine-Grained
Bimanual Manipulation with Low-Cost Hardware") as packaged in gym-aloha 0.1.5, whose MJCF
and meshes it loads (see hetlab.assets.aloha_assets_dir); the numbers below are gym-aloha's:

- control at 50 Hz: each step holds the action for 0.02 s = 10 physics steps of 2 ms;
- action and `agent_pos` are 14 numbers, left arm then right arm: 6 absolute joint angles and
  a gripper opening normalised so 0 = closed and 1 = open (puppet finger positions
  0.01844 m → 0, 0.058 m → 1); the two fingers of a gripper mirror each other;
- every episode starts from the same arm pose, with the cube at a uniform random x in
  [0, 0.2] and y in [0.4, 0.6], dropped from z = 0.05 with no rotation;
- reward from the contacts after each step: 1 the right gripper touches the cube, 2 ... and
  the cube is off the table, 3 the left gripper touches it, 4 ... and it is off the table.
  Reward 4 is success, and (as in gym-aloha) ends the episode with `terminated`;
  stepping on after it is allowed, so fixed-length recordings can run to the end;
- an episode is truncated after 400 steps (8 s).

Images come from the scene's named cameras ("top" by default), rendered headless (EGL, else
OSMesa) by one mujoco.Renderer made on first use; `cameras=()` renders nothing. The render quality
is part of what a policy sees, so a dataset records it and evaluation renders the same way:
"high" is the scene file's own (4096² shadow map, 4× multisampling), "fast" draws no shadows
and no multisampling, about 8× cheaper a frame at 120×160.
"""

from __future__ import annotations

from collections.abc import Sequence

import mujoco
import numpy as np

from hetlab.aloha_config import EPISODE_STEPS, RENDER_QUALITIES, RenderQuality
from hetlab.assets import aloha_assets_dir
from hetlab.errors import UserError
from hetlab.headless_gl import make_renderer

import gymnasium
from gymnasium import spaces

SCENE_FILE = "bimanual_viperx_transfer_cube.xml"
CONTROL_DT = 0.02
ARMS = ("left", "right")
ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
# Per arm, qpos holds the 6 arm joints then the left and right finger slides.
QPOS_PER_ARM = 8
START_ARM_POSE = np.array([0.0, -0.96, 1.16, 0.0, -0.3, 0.0])
START_FINGER = 0.02239  # left finger slide at the start; the right finger is its negative
FINGER_CLOSED, FINGER_OPEN = 0.01844, 0.05800  # left finger slide that normalises to 0 and 1
CUBE_LOW = np.array([0.0, 0.4, 0.05])
CUBE_HIGH = np.array([0.2, 0.6, 0.05])
MAX_REWARD = 4


def normalise_gripper(finger: np.ndarray | float) -> np.ndarray | float:
    """Left finger slide (m) → gripper opening, 0 closed, 1 open."""
    return (finger - FINGER_CLOSED) / (FINGER_OPEN - FINGER_CLOSED)


def unnormalise_gripper(opening: np.ndarray | float) -> np.ndarray | float:
    """Gripper opening (0 closed, 1 open) → left finger slide (m)."""
    return FINGER_CLOSED + opening * (FINGER_OPEN - FINGER_CLOSED)


def sample_cube_pose(rng: np.random.Generator) -> np.ndarray:
    """The cube's free-joint qpos (x, y, z, quaternion w x y z) at the start of an episode."""
    return np.concatenate([rng.uniform(CUBE_LOW, CUBE_HIGH), [1.0, 0.0, 0.0, 0.0]])


class AlohaTransferCube(gymnasium.Env):
    """Bimanual ViperX cube transfer; observation {"pixels": {camera: uint8 HxWx3}, "agent_pos": (14,)}."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": round(1 / CONTROL_DT)}

    def __init__(self, height: int = 480, width: int = 640, cameras: Sequence[str] = ("top",),
                 render_quality: RenderQuality = "high"):
        if render_quality not in RENDER_QUALITIES:
            raise UserError(f"unknown render quality {render_quality!r}; choose one of {', '.join(RENDER_QUALITIES)}")
        self.model = mujoco.MjModel.from_xml_path(str(aloha_assets_dir() / SCENE_FILE))
        self.data = mujoco.MjData(self.model)
        self.cameras = tuple(cameras)
        known = {self.model.camera(i).name for i in range(self.model.ncam)}
        unknown = [c for c in self.cameras if c not in known]
        if unknown:
            raise UserError(f"unknown ALOHA camera(s) {', '.join(unknown)}; the scene has {', '.join(sorted(known))}")
        if self.cameras and (height < 1 or width < 1):
            raise UserError(f"image size must be positive, got {height}×{width}")
        self.height, self.width, self.render_quality = height, width, render_quality
        if render_quality == "fast":
            self.model.vis.quality.offsamples = 0  # read when the renderer's framebuffer is made
        self.substeps = round(CONTROL_DT / self.model.opt.timestep)
        self.cube_geom = self.model.geom("red_box").id
        self.table_geom = self.model.geom("table").id
        # gym-aloha's reward looks at one finger per gripper: the left arm's left finger, the right arm's right.
        self.finger_geoms = {arm: self.model.geom(f"vx300s_{arm}/10_{arm}_gripper_finger").id for arm in ARMS}
        self.cube_qpos = self.model.jnt_qposadr[self.model.joint("red_box_joint").id]
        self._renderer: mujoco.Renderer | None = None
        self._steps = 0

        arm_ctrl = self.model.actuator_ctrlrange[[a * QPOS_PER_ARM + j for a in range(2) for j in range(6)]]
        low = np.concatenate([arm_ctrl[:6, 0], [0.0], arm_ctrl[6:, 0], [0.0]])
        high = np.concatenate([arm_ctrl[:6, 1], [1.0], arm_ctrl[6:, 1], [1.0]])
        self.action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
        observation = {"agent_pos": spaces.Box(-np.inf, np.inf, (14,), np.float64)}
        if self.cameras:
            image = spaces.Box(0, 255, (height, width, 3), np.uint8)
            observation["pixels"] = spaces.Dict({c: image for c in self.cameras})
        self.observation_space = spaces.Dict(observation)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        mujoco.mj_resetData(self.model, self.data)
        start = np.concatenate([START_ARM_POSE, [START_FINGER, -START_FINGER]] * 2)
        self.data.qpos[: 2 * QPOS_PER_ARM] = start
        self.data.ctrl[:] = start
        self.data.qpos[self.cube_qpos : self.cube_qpos + 7] = sample_cube_pose(self.np_random)
        mujoco.mj_forward(self.model, self.data)
        self._steps = 0
        return self._observation(), {"is_success": False}

    def step(self, action: np.ndarray):
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (14,):
            raise ValueError(f"the ALOHA action has 14 numbers (6 joints + gripper per arm), got shape {action.shape}")
        ctrl = []
        for arm in action.reshape(2, 7):
            finger = unnormalise_gripper(arm[6])
            ctrl += [*arm[:6], finger, -finger]
        self.data.ctrl[:] = ctrl  # MuJoCo clamps each to its actuator's ctrlrange
        mujoco.mj_step(self.model, self.data, nstep=self.substeps)
        self._steps += 1
        reward = self.reward()
        success = reward == MAX_REWARD
        return self._observation(), float(reward), success, self._steps >= EPISODE_STEPS, {"is_success": success}

    def reward(self) -> int:
        """gym-aloha's reward levels 0–4 from the current contacts."""
        touching = self.geoms_touching_cube()
        on_table = self.table_geom in touching
        if self.finger_geoms["left"] in touching:
            return 3 if on_table else 4
        if self.finger_geoms["right"] in touching:
            return 1 if on_table else 2
        return 0

    def geoms_touching_cube(self) -> set[int]:
        pairs = self.data.contact.geom[: self.data.ncon]
        return {int(b if a == self.cube_geom else a) for a, b in pairs if self.cube_geom in (a, b)}

    def agent_pos(self) -> np.ndarray:
        """Joint angles with normalised grippers, left arm then right (gym-aloha's `qpos` observation)."""
        arms = self.data.qpos[: 2 * QPOS_PER_ARM].reshape(2, QPOS_PER_ARM)
        return np.concatenate([np.append(arm[:6], normalise_gripper(arm[6])) for arm in arms])

    def render(self) -> np.ndarray:
        """The first camera's image (gymnasium's rgb_array render)."""
        if not self.cameras:
            raise UserError("this ALOHA env was made with cameras=(), so it has nothing to render")
        return self._image(self.cameras[0])

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def _observation(self) -> dict:
        observation = {"agent_pos": self.agent_pos()}
        if self.cameras:
            observation["pixels"] = {camera: self._image(camera) for camera in self.cameras}
        return observation

    def _image(self, camera: str) -> np.ndarray:
        if self._renderer is None:
            globals_ = self.model.vis.global_
            globals_.offwidth, globals_.offheight = max(self.width, globals_.offwidth), max(self.height, globals_.offheight)
            self._renderer = make_renderer(self.model, self.width, self.height)
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = self.render_quality == "high"
        self._renderer.update_scene(self.data, camera=camera)
        return self._renderer.render()
