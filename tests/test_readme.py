"""The README's quick start, run as a user would: its commands, in a fresh directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    section = README.read_text().split("## Quick start", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S)[1]


def test_the_quick_start_solves_cartpole_with_its_recipe_then_judges_exports_and_plays_it(tmp_path, figures):
    commands = quick_start()
    assert commands.splitlines()[0].startswith("hetlab train --task cartpole-balance")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = (tmp_path / "runs" / "cartpole-balance-ppo").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    # An episode lasts at most 500 steps of reward ≈ 1; a random policy keeps the pole up ~25. The
    # recipe's evaluation every 10 iterations passed "solved" (a mean return ≥ 475) within the budget.
    assert summary["mean_return_first"] < 50 and summary["stopped_by"] == "solved", summary
    assert summary["iterations"] <= 150 and summary["iterations"] % 10 == 0, summary
    assert summary["mode"] == "sync" and summary["policy_lag_mean"] == 0.0
    assert json.loads((run / "config.json").read_text())["option_sources"]["envs"] == "recipe"
    [report] = (run / "eval").glob("*.json")
    assert json.loads(report.read_text())["solved"] is True  # the last evaluation's 128 episodes, judged again
    assert (run / "eval" / f"{report.stem}-episode_0.mp4").stat().st_size > 0
    assert (run / "reward.png").stat().st_size > 0 and (run / "time_breakdown.png").stat().st_size > 0
    assert (run / "policy.onnx").stat().st_size > 0 and "max |Δ action|" in done.stdout
    assert (run / "play.mp4").stat().st_size > 0
