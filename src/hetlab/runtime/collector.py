"""A collector: a CPU process that owns a sim, a task and a copy of the actor, and fills ring slots.

Between rollouts it picks up the newest published weights (in sync mode it first waits for
the version after the one it last used), takes a free slot, steps the task `horizon` times
writing straight into the slot's shared memory, and commits the slot with a small message:
its episode statistics, reward terms, timing spans and, in sync mode (for an exact resume),
the task's and its sampler's state after the rollout.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hetlab.runtime.rollout_ring import RolloutRing
from hetlab.runtime.timeline import SpanRecorder
from hetlab.runtime.weights import WeightBroadcast
from hetlab.tasks import make_task


@dataclass(frozen=True)
class CollectorSpec:
    index: int
    task: str
    task_options: dict[str, Any]  # make_task options: num_envs, threads, seed, ...
    horizon: int
    sync: bool  # wait for the learner's next weights after every rollout
    torch_threads: int
    seed: int
    resume_state: dict[str, Any] | None = field(default=None, compare=False)


def run_collector(spec: CollectorSpec, actor: torch.nn.Module, ring: RolloutRing, weights: WeightBroadcast,
                  stop, errors) -> None:
    """Process entry point; reports any exception with its traceback on `errors`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when to stop
    try:
        torch.set_num_threads(spec.torch_threads)
        ring.attach()
        weights.attach()
        _collect(spec, actor, ring, weights, stop)
    except BaseException:
        errors.put((spec.index, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        ring.close()
        weights.close()


def _collect(spec: CollectorSpec, actor: torch.nn.Module, ring: RolloutRing, weights: WeightBroadcast, stop) -> None:
    task = make_task(spec.task, **spec.task_options)
    sampler = torch.Generator().manual_seed(spec.seed)
    if spec.resume_state is None:
        obs = task.reset()
    else:
        obs = task.load_state_dict(spec.resume_state["task"])
        sampler.set_state(torch.from_numpy(spec.resume_state["sampler"]))
    actor_state = actor.state_dict()
    recorder = SpanRecorder()
    used_version = -1
    learner = multiprocessing.parent_process()
    while not stop.is_set() and learner.is_alive():
        with recorder.span("wait_weights"):
            # Polling the version is cheap; reading copies and checks every weight.
            while spec.sync and weights.version <= used_version and not stop.is_set() and learner.is_alive():
                time.sleep(0.0005)
            version = weights.read(actor_state)
        with recorder.span("wait_slot"):
            slot = None
            while slot is None and not stop.is_set() and learner.is_alive():
                slot = ring.acquire(timeout=0.1)
        if slot is None:
            return
        used_version = version
        stats = _rollout(task, actor, sampler, obs, ring.views(slot), spec.horizon, recorder)
        obs = stats.pop("obs")
        ring.views(slot)["policy_version"][...] = version
        stats |= {
            "collector": spec.index,
            "version": version,
            "spans": recorder.take(),
            # Only a sync run can resume exactly, so only it ships the state it would need.
            "state": {"task": task.state_dict(), "sampler": sampler.get_state().numpy()} if spec.sync else None,
        }
        ring.commit(slot, stats)


def _rollout(task, actor, sampler, obs, slot: dict[str, np.ndarray], horizon: int, recorder: SpanRecorder) -> dict:
    returns, lengths, diverged = [], [], 0
    term_sums: dict[str, float] = defaultdict(float)
    for t in range(horizon):
        with recorder.span("inference"), torch.no_grad():
            actions, log_probs = actor.act(torch.from_numpy(obs["policy"]), generator=sampler)
            actions = actions.numpy()
        with recorder.span("write"):
            slot["policy_obs"][t] = obs["policy"]
            slot["critic_obs"][t] = obs["critic"]
            slot["actions"][t] = actions
            slot["log_probs"][t] = log_probs.numpy()
        with recorder.span("env_step"):
            obs, reward, terminated, truncated, info = task.step(actions)
        with recorder.span("write"):
            slot["rewards"][t] = reward
            slot["terminated"][t] = terminated
            slot["truncated"][t] = truncated
            final_critic = slot["final_critic_obs"][t]
            final_critic[...] = 0.0
            if "done_ids" in info:
                timed_out = truncated[info["done_ids"]]
                final_critic[info["done_ids"][timed_out]] = info["final_obs"]["critic"][timed_out]
                returns.extend(info["episode_return"].tolist())
                lengths.extend(info["episode_length"].tolist())
            for name, value in info["reward_terms"].items():
                term_sums[name] += value
            diverged += info["diverged"]
    with recorder.span("write"):
        slot["policy_obs"][horizon] = obs["policy"]
        slot["critic_obs"][horizon] = obs["critic"]
    return {
        "obs": obs,
        "episode_returns": returns,
        "episode_lengths": lengths,
        # Each term: the mean over the rollout's steps of its mean over envs.
        "reward_terms": {name: total / horizon for name, total in term_sums.items()},
        "diverged": diverged,
    }
