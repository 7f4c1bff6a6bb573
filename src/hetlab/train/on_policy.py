"""The on-policy loop of `hetlab train`: PPO and APPO.

Top to bottom: lay out the rollout ring and the weight broadcast in shared memory; start the
collectors through the pool; then per iteration take a staged batch, update, publish the new
weights, log, and checkpoint. `sync` mode is collect → learn → collect (the collectors wait
for each new version); `async` mode lets them run ahead into free ring slots. Whatever ends
the run — the iteration or time budget, Ctrl-C, SIGTERM or SIGHUP (at the next iteration
boundary, with a final checkpoint), a failed collector — the collectors are stopped and shared
memory is unlinked; a run that was not failed writes its summary, trace and plots.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from hetlab.algos.contract import OnPolicyAlgorithm
from hetlab.devices import LearnerDevice
from hetlab.runtime.collector import CollectorSpec, fresh_episodes, run_collector
from hetlab.runtime.pool import CollectorJob, CollectorPool
from hetlab.runtime.rollout_ring import RolloutRing
from hetlab.runtime.staging import DeviceStager
from hetlab.measure.timeline import SpanRecorder
from hetlab.runtime.weights import WeightBroadcast
from hetlab.train.cadence import Cadence
from hetlab.train.run import EpisodeWindow, RunRecord, mean
from hetlab.train.video import PolicyVideos


def train_on_policy(cfg, run_dir: Path, device: LearnerDevice, algo: OnPolicyAlgorithm, resume_state: dict | None,
                    physics_threads: int, pool: CollectorPool) -> None:
    sync = cfg.resolved_mode == "sync"
    iteration = 0
    if resume_state is not None:
        algo.load_state_dict(resume_state["algo"])
        iteration = resume_state["iteration"]
    collector_states = resume_state["collectors"] if resume_state else [None] * cfg.collectors
    episodes = EpisodeWindow()
    first_iteration = iteration
    with RunRecord(run_dir, cfg, first_iteration=iteration) as record, \
            PolicyVideos(cfg, run_dir, record) as videos, \
            RolloutRing(cfg.rollout_layout(), cfg.resolved_ring_slots) as ring, \
            WeightBroadcast(algo.actor.state_dict()) as weights, pool:
        timeline = record.timeline
        cadence = Cadence(cfg, record, torch.device(device.torch_device), physics_threads, videos)

        def checkpoint(iterations: int) -> None:
            _checkpoint(record, iterations, algo, collector_states, sync, cfg.keep_checkpoints)

        stager = None
        try:
            weights.publish(algo.actor.state_dict(), version=iteration)
            actor_copy = copy.deepcopy(algo.actor).cpu()
            jobs = []
            for index in range(cfg.collectors):
                spec = CollectorSpec(
                    index=index, task=cfg.task,
                    task_options=cfg.task_kwargs(cfg.envs_per_collector, physics_threads, cfg.seed * 1000 + index),
                    horizon=cfg.horizon, sync=sync, torch_threads=physics_threads,
                    seed=cfg.seed * 1000 + index, resume_state=collector_states[index],
                )
                # A replacement starts fresh episodes: the task state of the lost one is gone with it.
                replace = lambda _, attempt, spec=spec: (fresh_episodes(spec, attempt, resume_state=None), actor_copy,
                                                         ring, weights)
                jobs.append(CollectorJob(run_collector, (spec, actor_copy, ring, weights), replace=replace))
            pool.start(jobs)
            stager = DeviceStager(ring, cfg.collectors, device, by_collector=sync)
            stager.start()
            learner = SpanRecorder()
            latest: dict = {}  # the iteration update() learned from, for after() to log

            def staged():
                with learner.span("wait_data"):
                    return pool.next_staged(stager, record.interrupted)

            def update(iteration: int, rollout) -> bool:
                batch, metas = rollout
                if sync and any(meta["version"] != iteration for meta in metas):
                    raise RuntimeError(f"a sync rollout was collected with weights {[m['version'] for m in metas]}, "
                                       f"not the newest ({iteration})")
                with learner.span("update"):
                    metrics = algo.update(batch)
                    weights.publish(algo.actor.state_dict(), version=iteration + 1)
                for meta in metas:
                    episodes.add(meta)
                    timeline.add(iteration, f"collector {meta['collector']}", meta["spans"])
                    timeline.add(iteration, "stager", meta.get("transfer_spans", []))
                    collector_states[meta["collector"]] = meta["state"]
                lag = float(iteration - batch["policy_version"].float().mean().item())
                latest.update(metas=metas, metrics=metrics, lag=lag)
                return True

            def after(iterations: int) -> str | None:
                iteration, metas = iterations - 1, latest["metas"]
                evaluated = {}
                if cadence.evaluates(iteration):
                    with learner.span("evaluate"):
                        evaluated = cadence.evaluation.run(algo.actor)
                timeline.add(iteration, "learner", learner.take())
                steps = iterations * cfg.horizon * cfg.envs  # over the whole run, earlier launches included
                wall = record.elapsed()
                returns = episodes.row()
                record.log({
                    "iteration": iteration,
                    "env_steps": steps,
                    "wall_seconds": wall,
                    "env_steps_per_s": (iterations - first_iteration) * cfg.horizon * cfg.envs / wall,
                    **returns,
                    "policy_lag": latest["lag"],
                    "learner_utilisation": timeline.fraction("learner", ("update",)),
                    "collector_utilisation": mean([timeline.fraction(f"collector {i}", ("env_step", "inference", "write"))
                                                   for i in range(cfg.collectors)]),
                    **{f"loss/{k}": v for k, v in latest["metrics"].items()},
                    **pool.metrics(),
                    **evaluated,
                }, {name: mean([m["reward_terms"][name] for m in metas]) for name in metas[0]["reward_terms"]})
                return cadence.after(iterations, evaluated, returns, algo.actor, checkpoint)

            iteration, stopped_by = record.loop(iteration, iter(staged, None), update, after, checkpoint,
                                                completed="max_iterations", ended=lambda: pool.ended_by)
        finally:
            wall = record.elapsed()  # the run's own time, before the shutdown below
            if stager is not None:
                stager.stop()
            pool.stop(ring.drain_one)
    record.finish(wall, stopped_by, (iteration - first_iteration) * cfg.horizon * cfg.envs)


def _checkpoint(record: RunRecord, iteration: int, algo, collector_states: list, sync: bool, keep: int) -> None:
    # The collectors' states match the learner's at a sync run's iteration boundaries (also
    # when it stops early); an async run resumes from fresh episodes instead.
    exact = sync and all(state is not None for state in collector_states)
    record.checkpoint(iteration, {
        "iteration": iteration,
        "algo": algo.state_dict(),
        "collectors": collector_states if exact else [None] * len(collector_states),
    }, keep=keep)
