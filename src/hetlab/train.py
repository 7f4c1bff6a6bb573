"""`hetlab train`: CPU collectors feed a learner on the best device through shared memory.

`train` resolves the config and the run directory and builds the algorithm on the learner
device; the off-policy algorithms then continue in `hetlab.train_off_policy`. The on-policy
loop (PPO, APPO), top to bottom: resolve the config and the run directory; build the algorithm on
the learner device; lay out the rollout ring and the weight broadcast in shared memory;
spawn the collectors; then per iteration take a staged batch, update, publish the new
weights, log, and checkpoint. `sync` mode is collect → learn → collect (the collectors
wait for each new version); `async` mode lets them run ahead into free ring slots.
Whatever ends the run — the iteration or time budget, Ctrl-C (at the next iteration
boundary, with a final checkpoint), a failed collector — the collectors are stopped and shared
memory is unlinked; a run that was not failed writes its summary, trace and plots.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import multiprocessing
import queue
import signal
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console

from hetlab.algos import ALGOS
from hetlab.algos.appo import APPOConfig
from hetlab.algos.fastsac import FastSACConfig
from hetlab.algos.flashsac import FlashSACConfig
from hetlab.algos.ppo import PPOConfig
from hetlab.algos.sac import SACConfig
from hetlab.algos.td3 import TD3Config
from hetlab.checkpoint import load_checkpoint, save_checkpoint
from hetlab.devices import LearnerDevice, apply_thread_budget, pick_device, thread_budget
from hetlab.errors import UserError
from hetlab.files import write_text_atomic
from hetlab.runtime.collector import CollectorSpec, run_collector
from hetlab.runtime.replay import ReplayLayout
from hetlab.runtime.rollout_ring import RolloutLayout, RolloutRing
from hetlab.runtime.staging import DeviceStager
from hetlab.runtime.timeline import SpanRecorder, Timeline
from hetlab.runtime.weights import WeightBroadcast
from hetlab.tasks import make_config, task_class

console = Console()
FAILURE_POLL_S = 0.25  # how often the learner checks on its collectors while it waits
OFF_POLICY = ("sac", "td3", "fastsac", "flashsac")
ALGO_CONFIGS = {"ppo": PPOConfig, "appo": APPOConfig, "sac": SACConfig, "td3": TD3Config, "fastsac": FastSACConfig,
                "flashsac": FlashSACConfig}


@dataclass(frozen=True)
class OffPolicyConfig:
    replay_capacity: int = 1_000_000  # transitions kept, over all envs
    # Where the exploring policy runs: each collector's CPU copy, or the learner's device through a
    # request/response ring; auto: the learner when it is an accelerator, else the collectors.
    inference: Literal["auto", "collector", "learner"] = "auto"
    lead: int = 4  # env steps a collector may run ahead of the update-to-data ratio
    weight_sync_every: int = 0  # updates between weight publishes; 0: the updates of one env step
    save_replay: bool = False  # checkpoints include the replay buffer, so a resumed run does not start empty


@dataclass(frozen=True)
class TrainConfig:
    """Train a policy: PPO (sync), APPO (async), or SAC, TD3, FastSAC, FlashSAC (off-policy) on a hetlab task."""

    algo: Literal["ppo", "appo", "sac", "td3", "fastsac", "flashsac"] = "ppo"
    task: str = "go1-joystick-flat"
    envs: int = 1024  # in total, split evenly over the collectors
    collectors: int = 1  # collector processes
    mode: Literal["sync", "async", "auto"] = "auto"  # auto: sync for PPO, async for APPO
    device: str = "auto"  # learner device: auto, cuda, xpu, mps or cpu
    threads: int = 0  # physics threads in total, split over the collectors; 0 = the thread budget's
    horizon: int = 24  # env steps per rollout (off-policy: per iteration)
    ring_slots: int = 0  # rollout slots in shared memory; 0 = one per collector (sync), two (async)
    max_iterations: int = 1000
    max_seconds: float = 0.0  # wall-clock budget; 0 = none
    seed: int = 0
    checkpoint_every: int = 50  # iterations
    runs_dir: str = "runs"
    resume: str | None = None  # a run directory to continue; its saved config is used
    ppo: PPOConfig = field(default_factory=PPOConfig)
    appo: APPOConfig = field(default_factory=APPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    td3: TD3Config = field(default_factory=TD3Config)
    fastsac: FastSACConfig = field(default_factory=FastSACConfig)
    flashsac: FlashSACConfig = field(default_factory=FlashSACConfig)
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)

    @property
    def is_off_policy(self) -> bool:
        return self.algo in OFF_POLICY

    @property
    def resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        return "sync" if self.algo == "ppo" else "async"

    def resolved_inference(self, device: LearnerDevice) -> str:
        if self.off_policy.inference != "auto":
            return self.off_policy.inference
        return "learner" if device.is_accelerator else "collector"

    @property
    def updates_per_iteration(self) -> int:
        """Off-policy: the updates that `horizon` env steps pay for."""
        return max(1, round(self.horizon * self.algo_config.updates_per_step))

    def replay_layout(self) -> ReplayLayout:
        task = task_class(self.task)
        return ReplayLayout(self.off_policy.replay_capacity // self.envs, self.collectors, self.envs // self.collectors,
                            dict(task.obs_sizes), task.action_size)

    @property
    def algo_config(self):
        return getattr(self, self.algo)

    @property
    def resolved_ring_slots(self) -> int:
        if self.ring_slots:
            return self.ring_slots
        return self.collectors if self.resolved_mode == "sync" else 2 * self.collectors

    def build_algorithm(self, device: torch.device):
        """The run's algorithm, freshly initialised from its seed."""
        task = task_class(self.task)
        return ALGOS[self.algo](task.obs_sizes, task.action_size, self.algo_config, device, seed=self.seed)

    def rollout_layout(self) -> RolloutLayout:
        task = task_class(self.task)
        return RolloutLayout(self.horizon, self.envs // self.collectors, dict(task.obs_sizes), task.action_size)


def _validate(cfg: TrainConfig) -> None:
    for name in ("collectors", "horizon", "max_iterations", "checkpoint_every"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.envs % cfg.collectors:
        raise UserError(f"--envs {cfg.envs} must split evenly over --collectors {cfg.collectors}")
    make_config(cfg.task, num_envs=cfg.envs // cfg.collectors, threads=cfg.threads, seed=cfg.seed)
    if cfg.is_off_policy:
        _validate_off_policy(cfg)
        return
    minibatches = cfg.algo_config.num_mini_batches
    if (cfg.horizon * cfg.envs) % minibatches:
        raise UserError(
            f"horizon × envs = {cfg.horizon * cfg.envs} samples do not split into {minibatches} minibatches; "
            "change --envs, --horizon or the minibatch count"
        )
    if cfg.ring_slots and cfg.ring_slots < cfg.collectors:
        raise UserError(f"--ring-slots {cfg.ring_slots} must be at least --collectors {cfg.collectors}")
    RolloutRing.check_fits(cfg.rollout_layout(), cfg.resolved_ring_slots)


def _validate_off_policy(cfg: TrainConfig) -> None:
    if cfg.mode == "sync":
        raise UserError(f"{cfg.algo} runs asynchronously (the update-to-data ratio keeps collectors and learner "
                        "in step); drop --mode sync")
    algo = cfg.algo_config
    # The stager works one update ahead of the learner; the collectors must be allowed the steps that pays for.
    least_lead = math.ceil(1 / algo.updates_per_step) + 1
    if cfg.off_policy.lead < least_lead:
        raise UserError(f"--off-policy.lead {cfg.off_policy.lead} is too short for {algo.updates_per_step} updates "
                        f"per step; use at least {least_lead}")
    if cfg.off_policy.weight_sync_every < 0:
        raise UserError("--off-policy.weight-sync-every must be ≥ 0")
    layout = cfg.replay_layout()
    if algo.learning_starts < 1 or algo.learning_starts + cfg.off_policy.lead >= layout.rows - layout.guard_rows:
        raise UserError(
            f"learning_starts must be at least 1 and, with the lead, below the {layout.rows - layout.guard_rows} "
            "steps per env the replay buffer keeps; raise --off-policy.replay-capacity or lower learning_starts"
        )
    layout.check_fits()


def load_run_config(run_dir: Path) -> TrainConfig:
    """The resolved config a run directory was trained with."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise UserError(f"{run_dir} has no config.json; pass a run directory written by `hetlab train`")
    data = json.loads(path.read_text())
    for name, config in ALGO_CONFIGS.items():
        if name in data:  # runs from before an algorithm existed lack its section
            data[name] = config(**data[name])
    data["off_policy"] = OffPolicyConfig(**data.get("off_policy", {}))
    return TrainConfig(**data)


def train(cfg: TrainConfig) -> Path:
    """Run training; returns the run directory."""
    from torch.utils.tensorboard import SummaryWriter  # slow to import; only training needs it

    resume_state = None
    if cfg.resume:
        run_dir = Path(cfg.resume)
        resume_state = load_checkpoint(run_dir)
        saved = load_run_config(run_dir)
        cfg = dataclasses.replace(saved, max_iterations=cfg.max_iterations, max_seconds=cfg.max_seconds,
                                  resume=cfg.resume)
    _validate(cfg)
    if not cfg.resume:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        run_dir = Path(cfg.runs_dir) / f"{cfg.task}-{cfg.algo}" / stamp
        run_dir.mkdir(parents=True)
        write_text_atomic(run_dir / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2))
    print(run_dir, flush=True)  # first line: where everything goes

    device = pick_device(cfg.device)
    sync = cfg.resolved_mode == "sync"
    budget = thread_budget(device, cfg.threads, overlap=not sync)
    apply_thread_budget(budget)
    physics_threads = max(1, budget.physics // cfg.collectors)
    algo = cfg.build_algorithm(torch.device(device.torch_device))
    if cfg.is_off_policy:
        from hetlab.train_off_policy import train_off_policy

        train_off_policy(cfg, run_dir, device, algo, resume_state, physics_threads)
        return run_dir
    iteration = 0
    if resume_state is not None:
        algo.load_state_dict(resume_state["algo"])
        iteration = resume_state["iteration"]

    envs_per_collector = cfg.envs // cfg.collectors
    ring = weights = stager = writer = None
    context = multiprocessing.get_context("spawn")
    stop, errors = context.Event(), context.Queue()
    processes = []
    timeline = Timeline()
    history: list[dict] = []
    episode_returns: deque[float] = deque(maxlen=100)
    episode_lengths: deque[float] = deque(maxlen=100)
    collector_states = resume_state["collectors"] if resume_state else [None] * cfg.collectors
    first_iteration = iteration
    start = time.perf_counter()
    stopped_by = "max_iterations"
    # Ctrl-C ends the run at the next iteration boundary, where the checkpoint is consistent.
    interrupted = threading.Event()
    previous_handler = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        ring = RolloutRing(cfg.rollout_layout(), cfg.resolved_ring_slots)
        weights = WeightBroadcast(algo.actor.state_dict())
        writer = SummaryWriter(str(run_dir / "tensorboard"))
        weights.publish(algo.actor.state_dict(), version=iteration)
        actor_copy = copy.deepcopy(algo.actor).cpu()
        for index in range(cfg.collectors):
            spec = CollectorSpec(
                index=index, task=cfg.task,
                task_options={"num_envs": envs_per_collector, "threads": physics_threads,
                              "seed": cfg.seed * 1000 + index},
                horizon=cfg.horizon, sync=sync, torch_threads=physics_threads,
                seed=cfg.seed * 1000 + index, resume_state=collector_states[index],
            )
            process = context.Process(target=run_collector, name=f"hetlab-collector-{index}", daemon=True,
                                      args=(spec, actor_copy, ring, weights, stop, errors))
            process.start()
            processes.append(process)
        stager = DeviceStager(ring, cfg.collectors, device)
        stager.start()
        learner = SpanRecorder()
        while iteration < cfg.max_iterations:
            if cfg.max_seconds and time.perf_counter() - start >= cfg.max_seconds:
                stopped_by = "max_seconds"
                break
            with learner.span("wait_data"):
                staged = next_staged(stager, processes, errors, interrupted)
            if interrupted.is_set():
                stopped_by = "interrupted"
                console.print("[yellow]interrupted: stopping after a final checkpoint[/]")
                break
            batch, metas = staged
            if sync:
                # Collectors of a sync run all use the version the learner published last.
                assert all(meta["version"] == iteration for meta in metas), [m["version"] for m in metas]
            with learner.span("update"):
                metrics = algo.update(batch)
                weights.publish(algo.actor.state_dict(), version=iteration + 1)
            lag = float(iteration - batch["policy_version"].float().mean().item())
            for meta in metas:
                episode_returns.extend(meta["episode_returns"])
                episode_lengths.extend(meta["episode_lengths"])
                timeline.add(iteration, f"collector {meta['collector']}", meta["spans"])
                timeline.add(iteration, "stager", meta.get("transfer_spans", []))
                collector_states[meta["collector"]] = meta["state"]
            timeline.add(iteration, "learner", learner.take())
            row = _log(writer, iteration, first_iteration, cfg, metrics, metas, lag, episode_returns,
                       episode_lengths, timeline, time.perf_counter() - start)
            history.append(row)
            iteration += 1
            if iteration % cfg.checkpoint_every == 0 or iteration == cfg.max_iterations:
                _checkpoint(run_dir, iteration, algo, collector_states, sync)
    finally:
        wall = time.perf_counter() - start  # the run's own time, before the shutdown below
        signal.signal(signal.SIGINT, previous_handler)
        if stager is not None:
            stager.stop()
        stop.set()
        join_collectors(processes, (lambda: _drain_slot(ring)) if ring is not None else None)
        for resource in (ring, weights, writer):
            if resource is not None:
                resource.close()
    if stopped_by != "max_iterations" and iteration % cfg.checkpoint_every:
        _checkpoint(run_dir, iteration, algo, collector_states, sync)
    finish(run_dir, cfg, history, timeline, wall, stopped_by, len(history) * cfg.horizon * cfg.envs)
    return run_dir


def next_staged(stager, processes, errors, interrupted, check=None):
    """The stager's next batch, or None once interrupted; polls so a failed collector (or
    whatever `check` raises for) stops the wait within FAILURE_POLL_S."""
    staged = None
    while staged is None and not interrupted.is_set():
        check_collectors(processes, errors)
        if check is not None:
            check()
        staged = stager.next(timeout=FAILURE_POLL_S)
    return staged


def check_collectors(processes, errors) -> None:
    """Raise, with the collector's traceback or exit code, as soon as one has failed."""
    try:
        index, trace = errors.get_nowait()
        raise RuntimeError(f"collector {index} failed:\n{trace}")
    except queue.Empty:
        pass
    for index, process in enumerate(processes):
        if process.exitcode is not None:
            # Its traceback, if it wrote one, may arrive a moment after it exits.
            try:
                failed, trace = errors.get(timeout=0.5)
                raise RuntimeError(f"collector {failed} failed:\n{trace}")
            except queue.Empty:
                raise RuntimeError(f"collector {index} died with exit code {process.exitcode}") from None


def _drain_slot(ring: RolloutRing) -> None:
    taken = ring.take(timeout=0.1)
    if taken is not None:
        ring.release(taken[0])


def join_collectors(processes, drain_one=None, timeout: float = 5.0) -> None:
    """Let the collectors exit while a thread calls `drain_one()` (which reads, with a short
    timeout, one message they may still send: a collector exits only once its queue has
    flushed into the pipe, and a rollout's message can be megabytes), then terminate any
    still running after `timeout` seconds."""
    draining = threading.Event()

    def drain() -> None:
        while not draining.is_set():
            drain_one()

    if drain_one is not None:
        reader = threading.Thread(target=drain, name="hetlab-drain", daemon=True)
        reader.start()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
    draining.set()


def _checkpoint(run_dir: Path, iteration: int, algo, collector_states: list, sync: bool) -> None:
    # The collectors' states match the learner's at a sync run's iteration boundaries (also
    # when it stops early); an async run resumes from fresh episodes instead.
    exact = sync and all(state is not None for state in collector_states)
    save_checkpoint(run_dir, iteration, {
        "iteration": iteration,
        "algo": algo.state_dict(),
        "collectors": collector_states if exact else [None] * len(collector_states),
    })


def mean(values) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def _log(writer, iteration, first_iteration, cfg, metrics, metas, lag, episode_returns, episode_lengths, timeline,
         wall) -> dict:
    steps = (iteration + 1) * cfg.horizon * cfg.envs  # over the whole run, resumed sessions included
    row = {
        "iteration": iteration,
        "env_steps": steps,
        "wall_seconds": wall,
        "env_steps_per_s": (iteration + 1 - first_iteration) * cfg.horizon * cfg.envs / wall,  # this session
        "mean_reward": mean(episode_returns),
        "episode_length": mean(episode_lengths),
        "policy_lag": lag,
        "learner_utilisation": timeline.fraction("learner", ("update",)),
        "collector_utilisation": mean(
            [timeline.fraction(f"collector {i}", ("env_step", "inference", "write")) for i in range(cfg.collectors)]
        ),
        **{f"loss/{k}": v for k, v in metrics.items()},
    }
    terms = {name: mean([m["reward_terms"][name] for m in metas]) for name in metas[0]["reward_terms"]}
    log_row(writer, row, terms)
    return row


def log_row(writer, row: dict, reward_terms: dict[str, float]) -> None:
    """An iteration's row to TensorBoard (against env steps) and one line to the console."""
    steps = row["env_steps"]
    for name, value in reward_terms.items():
        writer.add_scalar(f"reward_terms/{name}", value, steps)
    for key, value in row.items():
        if key != "iteration":
            writer.add_scalar(key if "/" in key else f"train/{key}", value, steps)
    console.print(
        f"it {row['iteration']:5d} | {row['env_steps_per_s']:7,.0f} steps/s | reward {row['mean_reward']:8.3f} | "
        f"ep len {row['episode_length']:6.1f} | lag {row['policy_lag']:4.1f} | "
        f"learner {row['learner_utilisation']:4.0%} | collectors {row['collector_utilisation']:4.0%}",
        highlight=False, soft_wrap=True,
    )


def finish(run_dir: Path, cfg: TrainConfig, history: list[dict], timeline: Timeline, wall: float,
           stopped_by: str, session_steps: int) -> None:
    """summary.json, history.json, the Chrome trace and the plots; `session_steps`: env steps
    collected in this session (a resumed run's earlier sessions excluded)."""
    rewards = [row["mean_reward"] for row in history if row["mean_reward"] == row["mean_reward"]]
    summary = {
        "task": cfg.task,
        "algo": cfg.algo,
        "mode": cfg.resolved_mode,
        "stopped_by": stopped_by,
        "iterations": len(history),
        "env_steps": session_steps,
        "wall_seconds": wall,
        "env_steps_per_s": session_steps / wall if wall else 0.0,
        "mean_reward_first": rewards[0] if rewards else None,
        "mean_reward_last": rewards[-1] if rewards else None,
        "policy_lag_mean": mean([row["policy_lag"] for row in history]),
        "learner_idle_fraction": timeline.fraction("learner", ("wait_data",)),
        "time_breakdown_s": timeline.summary(),
    }
    if history and "updates" in history[-1]:  # off-policy
        summary |= {"updates": history[-1]["updates"], "updates_per_s": history[-1]["updates_per_s"]}
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    write_text_atomic(run_dir / "history.json", json.dumps(history))
    timeline.write_chrome_trace(run_dir / "trace.json")
    if history:
        timeline.plot(run_dir / "time_breakdown.png", f"{cfg.task} {cfg.algo} ({cfg.resolved_mode})")
        _plot_reward(run_dir / "reward.png", history, f"{cfg.task} {cfg.algo}")
    _print_summary(summary)


def _plot_reward(path: Path, history: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetlab.files import atomic_path

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([row["wall_seconds"] / 60 for row in history], [row["mean_reward"] for row in history])
    ax.set_xlabel("wall-clock minutes")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    for key in ("stopped_by", "iterations", "env_steps", "wall_seconds", "env_steps_per_s", "mean_reward_first",
                "mean_reward_last", "policy_lag_mean", "learner_idle_fraction"):
        value = summary[key]
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)
