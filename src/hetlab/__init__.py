"""hetlab: robot policy training with each stage of the loop on the device that suits it.

From Python, the command line's two main steps (imported only when called, so `import hetlab` stays light):

    import hetlab
    run = hetlab.train_policy(task="cartpole-balance", envs=64, max_iterations=60, ppo={"actor_hidden": (64, 64)})
    policy = hetlab.load_policy(run)
    actions = policy.act(observations)  # numpy (batch, policy obs) → (batch, actions), deterministic
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def train_policy(**options) -> Path:
    """Train as `hetlab train` does and return the run directory. Options are the command line's
    (`task`, `algo`, `envs`, `max_iterations`, …) with underscores; an algorithm's own go in a dict
    under its name (`ppo={"gamma": 0.98}`), and so do `off_policy` and `ray_pool`. Options not
    given take the task's recipe (without `algo`) and, on a CPU learner, CPU-sized defaults."""
    from hetlab.train.config import config_from_options, given_in_options
    from hetlab.train.launch import train

    return train(config_from_options(options), given_in_options(options))


def load_policy(run_dir: str | Path, checkpoint: int | str | None = None):
    """The deterministic policy of a run's newest checkpoint (or `checkpoint`: an iteration, "best" or
    "latest"), on the CPU: `.act(obs)`."""
    from hetlab.deploy.policy import load_policy as load

    return load(run_dir, checkpoint)
