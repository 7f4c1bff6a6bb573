"""The off-policy loop of `hetlab train`: SAC, TD3, FastSAC and FlashSAC.

Top to bottom: lay out the replay buffer in shared memory (refilled from the checkpoint when
resuming a run that saved it); start the inference server when the exploring policy runs on
the learner device; start the collectors through the pool; start the replay stager, which
samples and copies each minibatch while the learner updates on the previous one. Then per
update: take the staged minibatch, update, publish the update count (the collectors keep the
update-to-data ratio from their side with it) and, every `weight_sync_every` updates, the
weights. An iteration is the updates that `horizon` env steps of every env pay for (horizon ×
updates_per_step); after each the learner logs, and checkpoints every `checkpoint_every`.
Shutdown is as in the on-policy loop, except that the final checkpoint is written before the
buffer goes away (it may include the buffer).
"""

from __future__ import annotations

import copy
import math
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from hetlab.algos.contract import Algorithm
from hetlab.checkpoint import checkpoint_dir
from hetlab.devices import LearnerDevice
from hetlab.runtime.collector import LocalPolicy, TransitionCollectorSpec, fresh_episodes, run_transition_collector
from hetlab.runtime.inference_server import InferenceServer
from hetlab.runtime.pool import CollectorJob, CollectorPool
from hetlab.runtime.replay import ReplayBuffer, ReplayStager
from hetlab.measure.timeline import SpanRecorder
from hetlab.runtime.weights import WeightBroadcast
from hetlab.tasks import task_class
from hetlab.train.cadence import Cadence
from hetlab.train.run import EpisodeWindow, RunRecord, mean
from hetlab.train.video import PolicyVideos


def train_off_policy(cfg, run_dir: Path, device: LearnerDevice, algo: Algorithm, resume_state: dict | None,
                     physics_threads: int, pool: CollectorPool) -> None:
    algo_cfg = cfg.algo_config
    task = task_class(cfg.task)
    layout = cfg.replay_layout()
    updates_per_iteration = cfg.updates_per_iteration
    sync_every = cfg.off_policy.weight_sync_every or max(1, math.ceil(algo_cfg.updates_per_step))
    on_learner = cfg.resolved_inference(device) == "learner"
    iteration = updates = 0
    steps = np.zeros(cfg.collectors, np.int64)  # env steps each collector has written into the buffer
    update_offset = 0  # updates done before the buffer's data began: the update-to-data ratio counts from there
    snapshot = None
    if resume_state is not None:
        algo.load_state_dict(resume_state["algo"])
        iteration, updates = resume_state["iteration"], resume_state["updates"]
        snapshot = checkpoint_dir(run_dir) / "replay"
        if snapshot.is_dir():
            steps = np.asarray(resume_state["replay_steps"], np.int64)
        else:  # saved without its buffer: collect afresh, random warm-up included
            snapshot, update_offset = None, updates

    episodes = EpisodeWindow()
    first_steps, first_updates = 0.0, updates  # where this launch of the run started
    with RunRecord(run_dir, cfg, first_iteration=iteration) as record, \
            PolicyVideos(cfg, run_dir, record) as videos, ReplayBuffer(layout) as replay, ExitStack() as resources, \
            pool:
        timeline = record.timeline
        cadence = Cadence(cfg, record, torch.device(device.torch_device), physics_threads, videos)
        stager = server = None

        def checkpoint(iterations: int) -> None:
            _checkpoint(record, cfg, iterations, updates, algo, replay, stager)

        try:
            if snapshot is not None:
                replay.load(snapshot, steps)
            replay.publish_updates(updates)
            if on_learner:
                server = resources.enter_context(InferenceServer(
                    algo.actor, cfg.collectors, layout.envs_per_collector, task.obs_sizes["policy"], task.action_size,
                    torch.device(device.torch_device), seed=cfg.seed))
                server.sync(algo.actor, updates)
                server.start()
            else:
                weights = resources.enter_context(WeightBroadcast(algo.actor.state_dict()))
                weights.publish(algo.actor.state_dict(), version=updates)
                actor_copy = copy.deepcopy(algo.actor).cpu()
            jobs = []
            for index in range(cfg.collectors):
                # A resumed run draws new episodes (a prime stride keeps the seeds of its launches apart).
                seed = cfg.seed * 1000 + index + 7919 * iteration
                spec = TransitionCollectorSpec(
                    index=index, task=cfg.task,
                    task_options=cfg.task_kwargs(layout.envs_per_collector, physics_threads, seed),
                    torch_threads=physics_threads, seed=seed,
                    learning_starts=algo_cfg.learning_starts, updates_per_step=algo_cfg.updates_per_step,
                    lead=cfg.off_policy.lead, first_step=int(steps[index]), update_offset=update_offset,
                )
                policy = server.client(index) if on_learner else LocalPolicy(actor_copy, weights, spec.seed)
                # A replacement's rows go on from the last step the lost one committed.
                replace = lambda last, attempt, spec=spec, policy=policy: (
                    fresh_episodes(spec, attempt, first_step=spec.first_step if last is None else last["steps"]),
                    policy, replay)
                jobs.append(CollectorJob(run_transition_collector, (spec, policy, replay), replace=replace))
            pool.start(jobs)
            stager = ReplayStager(
                replay, device, batch_size=algo_cfg.batch_size, gamma=algo_cfg.gamma, n_step=algo_cfg.n_step,
                updates_per_step=algo_cfg.updates_per_step, learning_starts=algo_cfg.learning_starts,
                seed=cfg.seed + 7919 * iteration, steps=steps, updates=updates, update_offset=update_offset,
            )
            stager.start()
            first_steps = stager.vector_steps
            learner = SpanRecorder()
            warm = False  # the learner's waits count from its first batch on, not during the random warm-up
            metas: list[dict] = []
            metrics: dict[str, float] = {}

            def staged():
                with learner.span("wait_data"):
                    return pool.next_staged(stager, record.interrupted,
                                            check=server.raise_if_failed if server is not None else None)

            def update(iteration: int, staged_batch) -> bool:
                nonlocal warm, metrics, updates
                batch, new_metas, transfer = staged_batch
                if not warm:
                    learner.take()
                    warm = True
                metas.extend(new_metas)
                with learner.span("update"):
                    metrics = algo.update(batch)
                updates += 1
                replay.publish_updates(updates)
                if updates % sync_every == 0:
                    with learner.span("publish"):
                        if on_learner:
                            server.sync(algo.actor, updates)
                        else:
                            weights.publish(algo.actor.state_dict(), version=updates)
                timeline.add(iteration, "stager", [transfer])
                return updates % updates_per_iteration == 0  # an iteration is complete

            def after(iterations: int) -> str | None:
                iteration = iterations - 1
                lags = []
                for meta in metas:
                    episodes.add(meta)
                    timeline.add(iteration, f"collector {meta['collector']}", meta["spans"])
                    if meta["version"] >= 0:
                        lags.append(updates - meta["version"])
                if server is not None:
                    timeline.add(iteration, "inference server", server.take_spans())
                evaluated = {}
                if cadence.evaluates(iteration):
                    with learner.span("evaluate"):
                        evaluated = cadence.evaluation.run(algo.actor)
                timeline.add(iteration, "learner", learner.take())
                vector_steps = stager.vector_steps
                wall = record.elapsed()
                terms = [meta["reward_terms"] for meta in metas]
                returns = episodes.row()
                record.log({
                    "iteration": iteration,
                    "updates": updates,
                    "env_steps": int(vector_steps * layout.envs),
                    "wall_seconds": wall,
                    "env_steps_per_s": (vector_steps - first_steps) * layout.envs / wall,
                    "updates_per_s": (updates - first_updates) / wall,  # this launch
                    **returns,
                    "policy_lag": mean(lags),
                    "learner_utilisation": timeline.fraction("learner", ("update",)),
                    "collector_utilisation": mean([timeline.fraction(f"collector {i}", ("env_step", "inference", "write"))
                                                   for i in range(cfg.collectors)]),
                    **{f"loss/{k}": v for k, v in metrics.items()},
                    **pool.metrics(),
                    **evaluated,
                }, {name: mean([t[name] for t in terms]) for name in terms[0]} if terms else {})
                metas.clear()
                return cadence.after(iterations, evaluated, returns, algo.actor, checkpoint)

            iteration, stopped_by = record.loop(iteration, iter(staged, None), update, after, checkpoint,
                                                completed="max_iterations", ended=lambda: pool.ended_by)
        finally:
            wall = record.elapsed()
            for thread in (stager, server):
                if thread is not None:
                    thread.stop()
            pool.stop(lambda: replay.receive(0.1))
    rows = record.session_rows
    session_steps = round(rows[-1]["env_steps"] - first_steps * layout.envs) if rows else 0
    record.finish(wall, stopped_by, session_steps)


def _checkpoint(record: RunRecord, cfg, iteration: int, updates: int, algo, replay: ReplayBuffer,
                stager: ReplayStager) -> None:
    # Holding the stager keeps it from reading commits, so the collectors, blocked on the
    # bounded queue, cannot overwrite the rows being saved.
    with stager.hold():
        steps = stager.snapshot_steps()
        record.checkpoint(
            iteration, {"iteration": iteration, "updates": updates, "algo": algo.state_dict(), "replay_steps": steps},
            keep=cfg.keep_checkpoints,
            write_extra=(lambda directory: replay.save(directory / "replay", steps)) if cfg.off_policy.save_replay else None,
        )
