"""`hetlab eval`: a run's policy judged by its task's "solved" criteria.

The deterministic policy of a checkpoint plays one episode in each of `episodes` envs of the run's
own task and physics backend (train/evaluation.py: exact observations, commands, goals and clip
starts drawn as in training, from the evaluation seed), and each criterion is reported with its
value and whether it passes, with the Wilson interval of the share of episodes that survived.
The result goes to RUN/eval/<iteration>-<seed>.json and, with `videos`, the first episodes are
filmed to RUN/eval/<iteration>-<seed>-episode_<i>.mp4. Task options given as NAME=VALUE replace the
run's (tasks/option_text.py): how a walking policy does without pushes, or with harder ones.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from hetlab.checkpoint import checkpoint_iteration
from hetlab.deploy.policy import load_policy
from hetlab.devices import cpu_count
from hetlab.errors import UserError
from hetlab.files import write_text_atomic
from hetlab.tasks import make_config, task_class
from hetlab.tasks.criteria import judge
from hetlab.tasks.option_text import parse_task_options
from hetlab.train.evaluation import EVAL_SEED, PolicyEvaluation
from hetlab.train.video import EnvFilm, check_rendering

VIDEO_WIDTH, VIDEO_HEIGHT = 480, 360


def evaluate_run(run_dir: Path | str, checkpoint: str = "latest", episodes: int = 128, seed: int | None = None,
                 videos: int = 0, sim_dt: float | None = None, task_options: Sequence[str] = ()) -> dict:
    """Evaluate the run's policy at `checkpoint` (an iteration, best or latest) over `episodes`
    episodes from evaluation seed `seed` (default: the run's, as --eval-every uses), at physics step
    `sim_dt` (None: the run's; 0: the task's own), with the task options `task_options` (NAME=VALUE)
    over the run's; returns the report that RUN/eval/<iteration>-<seed>[-dt<sim_dt>][-NAME=VALUE…].json holds."""
    run_dir = Path(run_dir)
    if episodes < 1:
        raise UserError(f"--episodes must be at least 1, got {episodes}")
    if not 0 <= videos <= episodes:
        raise UserError(f"--video takes 0 to --episodes ({episodes}) episodes to film, got {videos}")
    if seed is not None and seed < 0:
        raise UserError(f"--seed must be ≥ 0, got {seed}")
    policy = load_policy(run_dir, checkpoint)  # refuses an AR-Actor run, a run without checkpoints, an unkept one
    if videos:
        check_rendering("--video")
    seed = policy.seed if seed is None else seed
    overrides = parse_task_options(task_class(policy.task), task_options)
    options = {**policy.task_options, **overrides}
    if sim_dt is not None and sim_dt != options.get("sim_dt", 0.0):
        options = {**options, "sim_dt": sim_dt} if sim_dt else {k: v for k, v in options.items() if k != "sim_dt"}
    else:
        sim_dt = None  # the run's own step
    if options != policy.task_options:
        make_config(policy.task, **options)  # a step or a value the task refuses is refused before any work
    iteration = checkpoint_iteration(policy.checkpoint)
    stem = run_dir / "eval" / (f"{iteration}-{seed}" + ("" if sim_dt is None else f"-dt{sim_dt:g}")
                               + "".join("-" + re.sub(r"[^\w.,=+-]", "_", item) for item in task_options))
    stem.parent.mkdir(exist_ok=True)
    start = time.perf_counter()
    evaluation = PolicyEvaluation(policy.task, policy.sim, episodes, seed, torch.device("cpu"), options,
                                  threads=min(cpu_count(), max(1, episodes // 64)))
    films = [f"{stem}-episode_{i}.mp4" for i in range(videos)]
    with ExitStack() as filming:
        open_films = [filming.enter_context(EnvFilm(evaluation.task, i, path, VIDEO_WIDTH, VIDEO_HEIGHT))
                      for i, path in enumerate(films)]
        filmed = np.ones(videos, bool)
        for film in open_films:
            film.add()  # the start state

        def film_running(running: np.ndarray) -> None:
            filmed[:] &= running[:videos]
            for film in (f for f, on in zip(open_films, filmed) if on):
                film.add()

        result = evaluation.episodes(policy.actor, film_running if videos else None)
    means = result.means()
    criteria = task_class(policy.task).solved
    survival_low, survival_high = result.survival_interval()
    report = {
        "run": str(run_dir), "task": policy.task, "sim": policy.sim, "checkpoint": str(policy.checkpoint),
        "iteration": iteration, "seed": seed, "evaluation_seed": seed + EVAL_SEED, "episodes": episodes,
        "sim_dt": evaluation.task.sim.timestep, "trained_sim_dt": policy.task_options.get("sim_dt") or None,
        "task_options": overrides,
        "metrics": means,
        "survived": int(result.survived.sum()), "survival_interval": [survival_low, survival_high],
        "criteria": judge(criteria, means),
        "solved": all(c.passes(means[c.metric]) for c in criteria) if criteria else None,
        "videos": films, "seconds": time.perf_counter() - start,
    }
    write_text_atomic(f"{stem}.json", json.dumps(report, indent=2))
    report["file"] = f"{stem}.json"
    return report
