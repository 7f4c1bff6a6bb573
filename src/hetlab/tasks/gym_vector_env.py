"""Any hetlab task as a `gymnasium.vector.VectorEnv`, for libraries that speak gymnasium.

    env = HetlabVectorEnv("cartpole-balance", num_envs=16)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

Observations are the task's `policy` group; the privileged `critic` group rides along in
`info["critic"]` (shape (num_envs, task.obs_sizes["critic"]), with an all-true `_critic`
mask) on every reset and step.

The task resets finished envs inside `step`, so this is gymnasium's SAME_STEP autoreset:
the returned observation of a finished env is already the first one of its next episode,
and the episode's last one is in `info["final_obs"]` (an object array of per-env rows, None
where the env did not finish, masked by `_final_obs`). `info["final_info"]` (masked by
`_final_info`) holds, for the finished envs, the final `critic` row and `episode` {"r": return,
"l": length}. The layout is exactly what gymnasium's SyncVectorEnv gives in SAME_STEP mode.

The task's batch-level logs (mean reward terms, divergence count) are not in `info`: gymnasium
expects every info entry to be a per-env array. Read them from `env.task` if needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetlab.tasks import make_task

from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


class HetlabVectorEnv(VectorEnv):
    """Task `task_name` built by `make_task(task_name, **task_options)`, e.g. num_envs, threads, seed."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, task_name: str, **task_options: Any):
        self.task_name = task_name
        self.task_options = task_options
        self.task = make_task(task_name, **task_options)
        self.num_envs = self.task.num_envs
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (self.task.obs_sizes["policy"],), np.float32)
        self.single_action_space = spaces.Box(-1.0, 1.0, (self.task.action_size,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env. With `seed`, the task is rebuilt with that seed (model, sim and task:
        a fraction of a second for cartpole, about a second for Go1), because a hetlab task
        draws its randomness, domain randomisation included, from generators seeded once at
        construction; the same seed and actions then give the same trajectory."""
        if options:
            raise ValueError(f"hetlab tasks take no reset options, got {sorted(options)}")
        if seed is not None:
            if not isinstance(seed, (int, np.integer)):
                raise TypeError(f"seed must be one int for all envs (hetlab seeds the whole batch), got {seed!r}")
            self.task = make_task(self.task_name, **{**self.task_options, "seed": int(seed)})
        obs = self.task.reset()
        return obs["policy"], self._critic_info(obs)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env; `actions` has shape (num_envs, action_size), else ValueError."""
        obs, reward, terminated, truncated, task_info = self.task.step(actions)
        info = self._critic_info(obs)
        if "done_ids" in task_info:
            final_obs = task_info["final_obs"]
            # gymnasium's own per-env packer, so the layout matches SyncVectorEnv's exactly.
            for row, env_id in enumerate(task_info["done_ids"]):
                episode = {"r": task_info["episode_return"][row], "l": task_info["episode_length"][row]}
                final_info = {"critic": final_obs["critic"][row], "episode": episode}
                info = self._add_info(info, {"final_obs": final_obs["policy"][row], "final_info": final_info}, env_id)
        return obs["policy"], reward, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        # The sim's threads and memory are freed with the last reference to the task.
        del self.task

    def _critic_info(self, obs: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"critic": obs["critic"], "_critic": np.ones(self.num_envs, dtype=bool)}
