"""An RL run's record, shared by the on- and off-policy loops, on the run layer (run_layer.py).

`RunRecord` is what a loop writes into: per iteration a row to the loggers (TensorBoard, and
the tracker --logger names: see loggers.py) and a console line, the policy videos of
--video-every as they come, at every checkpoint history.json, and at the end summary.json, the
Chrome trace and the plots. A resumed launch continues the record of the earlier ones — rows,
wall-clock time, time breakdown, trace — and a run that a stop signal ended names the command
that resumes it (`resume_command`).
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections import defaultdict, deque
from pathlib import Path

from rich.console import Console

from hetlab.errors import UserError
from hetlab.figures import figures_wanted
from hetlab.files import atomic_path
from hetlab.measure.timeline import Timeline
from hetlab.train.loggers import PolicyVideo, TrackedRun, flat_options
from hetlab.train.run_layer import TrainingRun, row_scalars

console = Console()


def mean(values) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


class EpisodeWindow:
    """The last 100 finished training episodes: return, length, and the task's own episode
    metrics (`Task._episode_metrics`, e.g. goals reached), from the collectors' messages."""

    def __init__(self, size: int = 100):
        self.returns: deque[float] = deque(maxlen=size)
        self.lengths: deque[float] = deque(maxlen=size)
        self.metrics: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=size))

    def add(self, meta: dict) -> None:
        self.returns.extend(meta["episode_returns"])
        self.lengths.extend(meta["episode_lengths"])
        for name, values in meta["episode_metrics"].items():
            self.metrics[name].extend(values)

    def row(self) -> dict[str, float]:
        """The log row's episode columns; task metrics as `episode/<name>`."""
        return {"mean_return": mean(self.returns), "episode_length": mean(self.lengths),
                **{f"episode/{name}": mean(values) for name, values in self.metrics.items()}}


def hyperparameters(cfg) -> dict[str, int | float | str | bool]:
    """The run's options as the loggers take them: the top-level ones and the chosen algorithm's
    (`ppo.gamma`)."""
    top = {name: value for name, value in flat_options(cfg).items() if "." not in name}
    return top | flat_options(cfg.algo_config, f"{cfg.algo}.")


def reached(target_return: float | None, episode_columns: dict[str, float]) -> bool:
    """Whether the mean return of the last 100 episodes reached `--target-return` (never before
    an episode has ended)."""
    return target_return is not None and episode_columns["mean_return"] >= target_return


def resume_command(cfg, run_dir: Path) -> str:
    """The command that continues the run from its newest checkpoint. A resume keeps the run's own
    options and budgets; where it runs is that launch's choice, but a run on a Ray cluster goes on
    using one."""
    return shlex.join(["hetlab", "train", "--resume", str(run_dir), *(["--ray", cfg.ray] if cfg.ray else [])])


class RunRecord(TrainingRun):
    """An RL run's record on the run layer (run_layer.py), continued from its earlier launches when
    resuming at `first_iteration`: its console line, reward terms and videos, the time breakdown
    and trace of every launch, and summary.json's `sessions` (one entry per launch of `hetlab train`)."""

    def __init__(self, run_dir: Path, cfg, first_iteration: int = 0):
        super().__init__(TrackedRun(cfg.tracker, run_dir, Path(cfg.runs_dir), hyperparameters(cfg),
                                    metrics=("train/mean_return", "eval/return")),
                         resume_command(cfg, run_dir), first_step=first_iteration, last_step=cfg.max_iterations,
                         checkpoint_every=cfg.checkpoint_every, max_seconds=cfg.max_seconds,
                         row_steps=lambda row: row["iteration"] + 1, clock="wall_seconds")
        self.cfg = cfg
        # Rows of runs from before the column was named for what it is (a return) say mean_reward.
        self.history = [{("mean_return" if key == "mean_reward" else key): value for key, value in row.items()}
                        for row in self.history]
        previous = _read_json(run_dir / "summary.json", {}) if first_iteration else {}
        self.sessions: list[dict] = previous.get("sessions", [])
        self.timeline = Timeline()
        if first_iteration:
            self.timeline.continue_from(previous.get("time_breakdown_s", {}), previous.get("iterations", 0),
                                        _read_json(run_dir / "trace.json", {}).get("traceEvents", []))
        self.figures = figures_wanted()

    def log(self, row: dict, reward_terms: dict[str, float]) -> None:
        """An iteration's row (its wall_seconds counted within this launch; env_steps_per_s the
        launch's average) to the loggers (against env steps), the console and the history, with
        the iteration's own rate beside the average."""
        launch = self.session_rows
        since = (launch[-1]["env_steps"], launch[-1]["wall_seconds"] - self.wall_offset) if launch else None
        own_rate = (row["env_steps"] - since[0]) / (row["wall_seconds"] - since[1]) if since else row["env_steps_per_s"]
        row = {**row, "wall_seconds": self.wall_offset + row["wall_seconds"], "iteration_env_steps_per_s": own_rate}
        scalars = {f"reward_terms/{name}": value for name, value in reward_terms.items()}
        scalars |= row_scalars(row, leave_out=("iteration",))
        console.print(
            f"it {row['iteration']:5d} | {own_rate:7,.0f} steps/s (avg {row['env_steps_per_s']:7,.0f}) | "
            f"return {row['mean_return']:8.3f} | "
            f"ep len {row['episode_length']:6.1f} | lag {row['policy_lag']:4.1f} | "
            f"learner {row['learner_utilisation']:4.0%} | collectors {row['collector_utilisation']:4.0%}"
            + "".join(f" | {key.removeprefix('episode/')} {value:.2f}" for key, value in row.items()
                      if key.startswith("episode/"))
            + (f" | eval return {row['eval/return']:8.3f}" if "eval/return" in row else ""),
            highlight=False, soft_wrap=True,
        )
        super().log(row, scalars, row["env_steps"])

    def log_video(self, video: PolicyVideo) -> None:
        for logger in self.loggers:
            logger.video(video)
        console.print(f"video of iteration {video.iteration}: {video.path}", highlight=False, soft_wrap=True)

    def finish(self, wall: float, stopped_by: str, session_steps: int) -> dict:
        """summary.json (the whole run, and each launch), history.json, the Chrome trace and the
        figures (unless HETLAB_FIGURES=0); `session_steps`: env steps collected in this launch."""
        cfg, history = self.cfg, self.history
        session = {
            "first_iteration": self.first_step,
            "iterations": len(self.session_rows),
            "env_steps": session_steps,
            "wall_seconds": wall,
            "env_steps_per_s": session_steps / wall if wall else 0.0,
            "stopped_by": stopped_by,
        }
        self.sessions.append(session)
        returns = [row["mean_return"] for row in history if row["mean_return"] == row["mean_return"]]
        summary = {
            "task": cfg.task,
            "algo": cfg.algo,
            "mode": cfg.resolved_mode,
            "stopped_by": stopped_by,
            "iterations": len(history),
            "env_steps": history[-1]["env_steps"] if history else 0,
            "wall_seconds": self.wall_offset + wall,
            "env_steps_per_s": session["env_steps_per_s"],  # this launch's: earlier ones may have run elsewhere
            "mean_return_first": returns[0] if returns else None,
            "mean_return_last": returns[-1] if returns else None,
            **_episode_metrics_first_last(history),
            "policy_lag_mean": mean([row["policy_lag"] for row in history]),
            "learner_idle_fraction": self.timeline.fraction("learner", ("wait_data",)),
            "time_breakdown_s": self.timeline.summary(),
            "sessions": self.sessions,
        }
        if history and "updates" in history[-1]:  # off-policy
            summary |= {"updates": history[-1]["updates"], "updates_per_s": history[-1]["updates_per_s"]}
        super().finish(summary)
        self.timeline.write_chrome_trace(self.run_dir / "trace.json")
        if history and self.figures:
            self.timeline.plot(self.run_dir / "time_breakdown.png", f"{cfg.task} {cfg.algo} ({cfg.resolved_mode})")
            _plot_reward(self.run_dir / "reward.png", history, f"{cfg.task} {cfg.algo}")
        _print_summary(summary, self.run_dir, self.figures)
        return summary


def _episode_metrics_first_last(history: list[dict]) -> dict[str, float]:
    """The task's own episode metrics (e.g. episode/goals): first and last logged value of each."""
    ends = {}
    for key in sorted({key for row in history for key in row if key.startswith("episode/")}):
        values = [row[key] for row in history if key in row and row[key] == row[key]]  # NaN: no episode yet
        if values:
            ends |= {f"{key}_first": values[0], f"{key}_last": values[-1]}
    return ends


def _read_json(path: Path, missing):
    if not path.is_file():
        return missing
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path} is corrupt ({e}); move it away to resume without the record it holds") from e


def _plot_reward(path: Path, history: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Against env steps (what sample efficiency is judged by) and wall time (what it cost here);
    # the deterministic evaluation's return where the run made one (--eval-every).
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    evaluated = [row for row in history if "eval/return" in row]
    for ax, x, label in ((axes[0], "env_steps", "env steps"), (axes[1], "wall_seconds", "wall-clock minutes")):
        scale = 1 / 60 if x == "wall_seconds" else 1
        ax.plot([row[x] * scale for row in history], [row["mean_return"] for row in history],
                label="training episodes (mean return of the last 100)")
        if evaluated:
            ax.plot([row[x] * scale for row in evaluated], [row["eval/return"] for row in evaluated], "o-",
                    label="deterministic evaluation")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def _print_summary(summary: dict, run_dir: Path, figures: bool) -> None:
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    for key in ("stopped_by", "iterations", "env_steps", "wall_seconds", "env_steps_per_s", "mean_return_first",
                "mean_return_last", "policy_lag_mean", "learner_idle_fraction"):
        value = summary[key]
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    drawn = "reward.png, time_breakdown.png, " if figures else ""
    console.print(f"in {run_dir}: {drawn}summary.json, history.json, trace.json "
                  f"(Perfetto); curves: tensorboard --logdir {run_dir / 'tensorboard'}", highlight=False, soft_wrap=True)
