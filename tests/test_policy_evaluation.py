"""Deterministic evaluation during training: one episode per env of its own, the same numbers
for the same actor, and the actor's mode left as it was."""

from __future__ import annotations

import torch

from hetlab.train.config import config_from_options
from hetlab.train.evaluation import PolicyEvaluation


def test_the_same_actor_scores_the_same_and_stays_in_training_mode():
    cfg = config_from_options({"task": "cartpole-balance", "envs": 8, "ppo": {"actor_hidden": (16,), "critic_hidden": (16,)}})
    actor = cfg.build_algorithm(torch.device("cpu")).actor.train()
    evaluation = PolicyEvaluation("cartpole-balance", "mujoco", envs=6, seed=0, device=torch.device("cpu"))
    first, second = evaluation.run(actor), evaluation.run(actor)
    assert first == second
    assert 1 <= first["eval/episode_length"] <= evaluation.task.max_episode_steps
    # An untrained cartpole policy drops the pole before the time limit; each step's reward is at most 1.
    assert first["eval/episode_length"] < evaluation.task.max_episode_steps
    assert 0 < first["eval/return"] <= first["eval/episode_length"]
    assert actor.training
    other = PolicyEvaluation("cartpole-balance", "mujoco", envs=6, seed=1, device=torch.device("cpu")).run(actor)
    assert other != first  # the evaluation envs follow the run's seed


def test_the_score_does_not_depend_on_the_physics_threads():
    """Training evaluates on a collector's physics threads: the episodes must not change with them."""
    cfg = config_from_options({"task": "go1-joystick-flat", "envs": 8, "ppo": {"actor_hidden": (16,), "critic_hidden": (16,)}})
    actor = cfg.build_algorithm(torch.device("cpu")).actor
    one, two = (PolicyEvaluation("go1-joystick-flat", "mujoco", envs=8, seed=0, device=torch.device("cpu"),
                                 threads=threads).run(actor) for threads in (1, 2))
    assert one == two and one["eval/episode_length"] > 10
