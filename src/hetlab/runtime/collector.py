"""A collector: a CPU process that owns a sim, a task and a policy, and fills shared buffers.

On-policy (`run_collector`): between rollouts it picks up the newest published weights (in
sync mode it first waits for the version after the one it last used), takes a free ring slot,
steps the task `horizon` times writing straight into the slot's shared memory, and commits
the slot with a small message: its episode statistics, reward terms, timing spans and, in
sync mode (for an exact resume), the task's and its sampler's state after the rollout.

Off-policy (`run_transition_collector`): it writes one replay row per env step and commits
it, acting uniformly at random for the first `learning_starts` steps and then with its
policy: its own CPU actor copy kept current from the weight broadcast (`LocalPolicy`), or
the learner's device through `hetlab.runtime.inference_server`. It keeps the update-to-data
ratio from the other side: it waits while it is more than `lead` steps ahead of the learner.

Both run in a process of the collector pool (`hetlab.runtime.pool`), which reports their
exceptions and hands them the `stop` signal they poll. They reach the learner's regions through
the Protocols of `hetlab.runtime.collector_side`, which the regions and their Ray ports both meet.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hetlab.measure.timeline import SpanRecorder
from hetlab.runtime.collector_side import RolloutSlots, TransitionSink, WeightSource
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


def run_collector(spec: CollectorSpec, actor: torch.nn.Module, ring: RolloutSlots, weights: WeightSource, *,
                  stop) -> None:
    """An on-policy collector's process, until `stop` is set."""
    try:
        torch.set_num_threads(spec.torch_threads)
        ring.attach()
        weights.attach()
        _collect(spec, actor, ring, weights, stop)
    finally:
        ring.close()
        weights.close()


def _collect(spec: CollectorSpec, actor: torch.nn.Module, ring: RolloutSlots, weights: WeightSource, stop) -> None:
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
    while not stop.is_set():
        with recorder.span("wait_weights"):
            # Polling the version is cheap; reading copies and checks every weight.
            while spec.sync and weights.version <= used_version and not stop.is_set():
                time.sleep(0.0005)
            version = weights.read(actor_state)
        with recorder.span("wait_slot"):
            slot = None
            while slot is None and not stop.is_set():
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
    episode_metrics: dict[str, list[float]] = defaultdict(list)
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
                for name, values in info["episode_metrics"].items():
                    episode_metrics[name].extend(values.tolist())
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
        "episode_metrics": dict(episode_metrics),
        # Each term: the mean over the rollout's steps of its mean over envs.
        "reward_terms": {name: total / horizon for name, total in term_sums.items()},
        "diverged": diverged,
    }


@dataclass(frozen=True)
class TransitionCollectorSpec:
    index: int
    task: str
    task_options: dict[str, Any]
    torch_threads: int
    seed: int
    learning_starts: int  # steps of uniform random actions before the policy acts
    updates_per_step: float  # the learner's update-to-data ratio
    lead: int  # steps a collector may run ahead of that ratio
    first_step: int = 0  # steps this collector has already written (a resumed run continues its rows)
    update_offset: int = 0  # learner updates done before the buffer's data began


def fresh_episodes(spec, attempt: int, **changes):
    """A collector spec (on- or off-policy) for one that takes over from a lost collector, its
    `attempt`-th replacement: the same envs, fresh episodes from a seed of its own, `changes`."""
    seed = spec.seed + 104_729 * attempt
    return dataclasses.replace(spec, seed=seed, task_options={**spec.task_options, "seed": seed}, **changes)


class LocalPolicy:
    """The collector's own CPU copy of the actor, refreshed whenever a newer version is published."""

    def __init__(self, actor: torch.nn.Module, weights: WeightSource, seed: int):
        self._actor, self._weights, self._seed = actor, weights, seed

    def attach(self) -> None:
        self._weights.attach()
        self._state = self._actor.state_dict()
        self._version = -1
        self._generator = torch.Generator().manual_seed(self._seed)

    def explore(self, obs: np.ndarray, stop) -> tuple[np.ndarray, int]:
        if self._weights.version > self._version:
            self._version = self._weights.read(self._state)
        with torch.no_grad():
            return self._actor.explore(torch.from_numpy(obs), self._generator).numpy(), self._version

    def close(self) -> None:
        self._weights.close()


def run_transition_collector(spec: TransitionCollectorSpec, policy, replay: TransitionSink, *, stop) -> None:
    """An off-policy collector's process, until `stop` is set."""
    try:
        torch.set_num_threads(spec.torch_threads)
        replay.attach()
        policy.attach()
        _collect_transitions(spec, policy, replay, stop)
    finally:
        replay.close()
        policy.close()


def _collect_transitions(spec: TransitionCollectorSpec, policy, replay: TransitionSink, stop) -> None:
    task = make_task(spec.task, **spec.task_options)
    random_actions = torch.Generator().manual_seed(spec.seed)
    obs = task.reset()
    replay.end_episodes(spec.index, spec.first_step)  # its earlier rows end where these episodes begin
    recorder = SpanRecorder()
    step, version = spec.first_step, -1
    while not stop.is_set():
        with recorder.span("wait_learner"):
            # The learner's updates since the buffer's data began pay for that many / ratio steps.
            while (step >= spec.learning_starts + spec.lead
                   + (replay.learner_updates - spec.update_offset) / spec.updates_per_step
                   and not stop.is_set()):
                time.sleep(0.0005)
        with recorder.span("inference"):
            if step < spec.learning_starts:
                actions = (torch.rand((task.num_envs, task.action_size), generator=random_actions) * 2 - 1).numpy()
            else:
                acted = policy.explore(obs["policy"], stop)
                if acted is None:
                    return
                actions, version = acted
        with recorder.span("env_step"):
            next_obs, reward, terminated, truncated, info = task.step(actions)
        with recorder.span("write"):
            final = {group: next_obs[group].copy() for group in ("policy", "critic")}
            returns, lengths, episode_metrics = [], [], {}
            if "done_ids" in info:
                for group in final:
                    final[group][info["done_ids"]] = info["final_obs"][group]
                returns, lengths = info["episode_return"].tolist(), info["episode_length"].tolist()
                episode_metrics = {name: values.tolist() for name, values in info["episode_metrics"].items()}
            replay.write(spec.index, step, {
                "policy_obs": obs["policy"], "critic_obs": obs["critic"], "actions": actions,
                "rewards": reward, "terminated": terminated, "truncated": truncated,
                "next_policy_obs": final["policy"], "next_critic_obs": final["critic"],
            })
        step += 1
        obs = next_obs
        meta = {
            "collector": spec.index, "steps": step, "version": version,
            "episode_returns": returns, "episode_lengths": lengths, "episode_metrics": episode_metrics,
            "reward_terms": info["reward_terms"], "diverged": info["diverged"], "spans": recorder.take(),
        }
        if not replay.commit(meta, stop):
            return
