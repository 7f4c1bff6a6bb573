"""`hetlab aloha eval`: closed-loop success of a trained AR-Actor over environment seeds.

One spawned worker process per core, each with its own MuJoCo renderer and a one-thread copy
of the policy, takes seeds from a queue; an episode ends at the first success (gym-aloha's
top reward: the left gripper holds the cube in the air) or after 400 steps. Every episode
depends only on its seed, so the results are the same for any number of workers. The policy
generates a chunk of actions from the current image and state every `replan_every` steps (one
action per decoder pass, or all in one pass: see hetlab.policies.ar_actor); it executes the
newest chunk's actions in turn, or, with ACT's temporal ensembling, at each step a weighted mean
of what every chunk still running planned for that step.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from hetlab.aloha.env import AlohaTransferCube
from hetlab.aloha_config import EPISODE_STEPS
from hetlab.checkpoint import checkpoint_dir, checkpoint_iteration
from hetlab.datasets.lerobot import episode_seeds
from hetlab.errors import UserError
from hetlab.files import write_text_atomic
from hetlab.imitation.config import Decode, EvalConfig
from hetlab.imitation.run_files import ARActorRun, load_policy, read_run
from hetlab.imitation.phase_b import load_phase_b_policy
from hetlab.measure.stats import wilson_interval
from hetlab.runtime.workers import WorkerPool
from hetlab.seeds import parse_seeds

VIDEO_FPS = 50


class ChunkPolicy:
    """Acts from a chunk generated every `replan_every` steps (see the module docstring); with
    `temporal_ensemble` m, from the exp(−m·i)-weighted mean of the running chunks' actions."""

    def __init__(self, model, replan_every: int, temporal_ensemble: float | None = None,
                 decode: Decode = "autoregressive"):
        self.model, self.ensemble, chunk = model, temporal_ensemble, model.cfg.chunk
        self.parallel = decode == "parallel"
        self.replan_every = replan_every or (1 if temporal_ensemble is not None else chunk)
        # Without ensembling only the steps up to the next chunk are ever executed.
        self.steps = chunk if temporal_ensemble is not None else self.replan_every
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.chunks: list[tuple[int, np.ndarray]] = []  # (step it was generated at, its actions), oldest first

    def __call__(self, image: np.ndarray, state: np.ndarray) -> np.ndarray:
        if self.step % self.replan_every == 0:
            images = torch.from_numpy(image).permute(2, 0, 1)[None].float().div_(255)
            chunk = self.model.act(images, torch.from_numpy(state).float()[None], steps=self.steps,
                                   parallel=self.parallel)
            self.chunks.append((self.step, chunk[0].numpy()))
        self.chunks = [(start, actions) for start, actions in self.chunks if self.step - start < len(actions)]
        planned = np.stack([actions[self.step - start] for start, actions in self.chunks])
        if self.ensemble is None:
            action = planned[-1]  # the newest chunk's
        else:
            weights = np.exp(-self.ensemble * np.arange(len(planned)))
            action = (weights[:, None] * planned).sum(axis=0) / weights.sum()
        self.step += 1
        return action


def load_eval_policy(run_dir: Path, step: int | None = None):
    """A run's policy as trained (newest checkpoint, or `step`'s): Phase A's whole model, or Phase B's
    encoder path + new expert."""
    if read_run(run_dir).phase == "B":
        return load_phase_b_policy(run_dir, step)
    return load_policy(run_dir, step)[0]


def training_seeds(run: ARActorRun, more_episodes: str | None = None) -> set[int] | None:
    """The environment seeds of the episodes a run (and, for Phase B, its Phase-A run) trained on,
    with `more_episodes` of the same dataset; None when the dataset is gone or does not record them."""
    runs = [run] if run.phase == "A" else [run.phase_a_run(), run]
    lists = [each.train_episodes for each in runs] + [more_episodes or ""]
    return recorded_seeds(runs[0].dataset(), {e for text in lists if text for e in parse_seeds(text, "--train-episodes")})


def recorded_seeds(dataset: Path | None, episodes: set[int]) -> set[int] | None:
    """The environment seeds `episodes` of `dataset` were recorded from; None when the dataset is
    gone or does not record them."""
    if dataset is None or not dataset.is_dir():
        return None
    seeds = set(episode_seeds(dataset, sorted(episodes)).values())
    return None if None in seeds else seeds


def check_seeds_held_out(seeds: list[int], trained_on: set[int] | None, option: str, otherwise: str = "") -> None:
    """UserError if any of `seeds` is one the training episodes were recorded from (`trained_on`)."""
    overlap = sorted(set(seeds) & (trained_on or set()))
    if overlap:
        named = ", ".join(map(str, overlap[:8])) + (f" and {len(overlap) - 8} more" if len(overlap) > 8 else "")
        raise UserError(f"{option} {named}: the training episodes were recorded from these seeds, so they are not "
                        f"held out; evaluate on others (e.g. 2000-2049){otherwise}")


def eval_env(run: ARActorRun) -> AlohaTransferCube:
    """The task as a run's images were made: its image size and render quality."""
    height, width = run.image_size
    return AlohaTransferCube(height=height, width=width, render_quality=run.render_quality)


def run_episode(env, policy, seed: int, max_steps: int = EPISODE_STEPS, video_frames: list | None = None) -> dict:
    observation, _ = env.reset(seed=seed)
    policy.reset()
    total, best, steps, success = 0.0, 0.0, 0, False
    while True:
        image = observation["pixels"]["top"]
        if video_frames is not None:
            video_frames.append(image)
        observation, reward, success, truncated, _ = env.step(policy(image, observation["agent_pos"]))
        total, best, steps = total + reward, max(best, reward), steps + 1
        if success or truncated or steps >= max_steps:
            break
    return {"seed": seed, "success": bool(success), "max_reward": best, "return": total, "steps": steps}


class _EpisodeRunner:
    """An evaluation worker's state: the policy and a renderer, made once, and what to record."""

    def __init__(self, run: Path, step: int, config: ARActorRun, replan_every: int, temporal_ensemble: float | None,
                 decode: Decode, max_steps: int, video_seeds: set[int], video_dir: Path):
        torch.set_num_threads(1)  # one worker per core
        self.policy = ChunkPolicy(load_eval_policy(run, step), replan_every, temporal_ensemble, decode)
        self.env = eval_env(config)
        self.max_steps, self.video_seeds, self.video_dir = max_steps, video_seeds, video_dir

    def run(self, seed: int) -> dict:
        from hetlab.datasets.video import encode_video

        frames = [] if seed in self.video_seeds else None
        result = run_episode(self.env, self.policy, seed, self.max_steps, frames)
        if frames is not None:
            encode_video(np.stack(frames), self.video_dir / f"seed-{seed}.mp4", VIDEO_FPS)
        return result


def evaluate(cfg: EvalConfig, progress=None) -> dict:
    """Evaluate; writes results.json (and videos) and returns it."""
    seeds = parse_seeds(cfg.seeds)
    config = read_run(cfg.run)  # checks the run before any process starts
    if cfg.replan_every < 0 or cfg.replan_every > config.model.chunk:
        raise UserError(f"--replan-every must be in 0..{config.model.chunk} (the chunk), got {cfg.replan_every}")
    if cfg.temporal_ensemble is not None and cfg.temporal_ensemble < 0:
        raise UserError(f"--temporal-ensemble must be ≥ 0 (ACT uses 0.01), got {cfg.temporal_ensemble}")
    if cfg.decode == "parallel" and (masked_share := config.model.max_history_mask) < 1:
        raise UserError(f"--decode parallel masks every history input, which {cfg.run} never saw in training "
                        f"(max_history_mask {masked_share}); use --decode autoregressive")
    if cfg.videos < 0:
        raise UserError(f"--videos must be ≥ 0, got {cfg.videos}")
    if not 1 <= cfg.max_steps <= EPISODE_STEPS:
        raise UserError(f"--max-steps must be in 1..{EPISODE_STEPS} (the task's episode length), got {cfg.max_steps}")
    trained_on = training_seeds(config)
    if not cfg.on_training_seeds:
        check_seeds_held_out(seeds, trained_on, "--seeds", " or pass --on-training-seeds to measure memorisation")
    held_out = None if trained_on is None else not set(seeds) & trained_on
    step = checkpoint_iteration(checkpoint_dir(Path(cfg.run), cfg.checkpoint))
    name = cfg.seeds.replace(",", "_") + (f"-step{step}" if cfg.checkpoint is not None else "")
    out = cfg.out or Path(cfg.run) / "eval" / name
    video_dir = out / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    workers = min(cfg.workers or os.cpu_count() or 1, len(seeds))
    runner = (Path(cfg.run), step, config, cfg.replan_every, cfg.temporal_ensemble, cfg.decode, cfg.max_steps,
              set(seeds[:cfg.videos]), video_dir)
    started = time.perf_counter()
    per_seed: list[dict] = []
    job = progress.add_task("episodes", total=len(seeds)) if progress is not None else None
    with WorkerPool(workers, _EpisodeRunner.run, setup=_EpisodeRunner, setup_args=runner, name="evaluation") as pool:
        for _, result in pool.as_completed(seeds):
            per_seed.append(result)
            if job is not None:
                progress.update(job, advance=1, description=f"{sum(r['success'] for r in per_seed)} successes")
    per_seed.sort(key=lambda r: r["seed"])
    successes = sum(r["success"] for r in per_seed)
    low, high = wilson_interval(successes, len(per_seed))
    replan_every = cfg.replan_every or (1 if cfg.temporal_ensemble is not None else config.model.chunk)
    report = {"run": str(cfg.run), "step": step, "seeds": cfg.seeds, "replan_every": replan_every,
              "temporal_ensemble": cfg.temporal_ensemble, "decode": cfg.decode, "max_steps": cfg.max_steps,
              "held_out": held_out,
              "episodes": len(per_seed), "successes": successes, "success_rate": successes / len(per_seed),
              "wilson95": [low, high], "per_seed": per_seed}
    write_text_atomic(out / "results.json", json.dumps(report, indent=2))
    return {**report, "out": str(out), "wall_s": time.perf_counter() - started, "workers": workers}


def success_columns(run_dir: Path, step: int, seeds: str) -> dict[str, float]:
    """A training row's `eval/` columns (--eval-every): the closed-loop success of the run's checkpoint
    `step` on `seeds`, whose report goes to RUN/eval/<seeds>-step<N>."""
    report = evaluate(EvalConfig(run=run_dir, seeds=seeds, checkpoint=step, videos=0))
    low, high = report["wilson95"]
    return {"eval/success_rate": report["success_rate"], "eval/successes": report["successes"],
            "eval/wilson_low": low, "eval/wilson_high": high}


def check_eval_seeds(seeds: str, trained_on: set[int] | None) -> None:
    """--eval-seeds refused before training: malformed, or naming a training episode's seed."""
    check_seeds_held_out(parse_seeds(seeds, "--eval-seeds"), trained_on, "--eval-seeds")
