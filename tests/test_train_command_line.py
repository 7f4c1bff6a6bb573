"""`hetlab train`'s command line: one algorithm's options at a time, and config files under it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tyro

from hetlab.algos import ALGOS
from hetlab.cli import main
from hetlab.errors import UserError
from hetlab.train.command_line import as_train_config, command_type
from hetlab.train.config import TrainConfig, cli_option, config_from_options, option_value
from hetlab.train.recipes import RECIPES

HETLAB = str(Path(sys.executable).with_name("hetlab"))


def parse(*args: str) -> TrainConfig:
    command, defaults = command_type(list(args))
    return as_train_config(tyro.cli(command, args=list(args), default=defaults))


def test_help_lists_only_the_chosen_algorithm_s_options(capsys):
    result = subprocess.run([HETLAB, "train", "--algo", "sac", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--sac.batch-size" in result.stdout and "--off-policy.replay-capacity" in result.stdout
    for other in set(ALGOS) - {"sac"}:
        assert f"--{other}." not in result.stdout, other
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    default = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "--ppo.actor-hidden" in default and "--sac." not in default  # PPO, the default algorithm


def test_an_option_of_another_algorithm_is_refused_in_one_line(tmp_path, refusal):
    with pytest.raises(UserError, match="--ppo.gamma is an option of --algo ppo, and this run trains sac"):
        parse("--algo", "sac", "--ppo.gamma", "0.9")
    line = refusal("train", "--runs-dir", tmp_path, "--sac.batch-size=64")
    assert "--sac.batch-size is an option of --algo sac, and this run trains ppo" in line
    assert not any(tmp_path.iterdir())


def test_the_chosen_algorithm_s_options_reach_the_config():
    cfg = parse("--algo", "td3", "--td3.tau", "0.02", "--envs", "64")
    assert cfg.algo == "td3" and cfg.algos.td3.tau == 0.02 and cfg.envs == 64
    assert cfg.algos.sac == ALGOS["sac"].Config()  # the groups not chosen keep their defaults


def test_a_toml_config_is_the_starting_point_and_the_command_line_overrides_it(tmp_path):
    path = tmp_path / "go1.toml"
    path.write_text('algo = "sac"\ntask = "cartpole-balance"\nenvs = 64\nhorizon = 10\n'
                    '[algos.sac]\nbatch_size = 128\ngamma = 0.97\n[off_policy]\nreplay_capacity = 50000\n')
    cfg = parse("--config", str(path), "--sac.gamma", "0.95", "--horizon", "12")
    assert (cfg.algo, cfg.task, cfg.envs, cfg.horizon) == ("sac", "cartpole-balance", 64, 12)
    assert (cfg.algos.sac.batch_size, cfg.algos.sac.gamma) == (128, 0.95)
    assert cfg.off_policy.replay_capacity == 50000 and cfg.config == str(path)
    # The file's algorithm decides which options exist.
    with pytest.raises(UserError, match="--ppo.gamma is an option of --algo ppo, and this run trains sac"):
        parse("--config", str(path), "--ppo.gamma", "0.9")
    # The Python API takes the same file.
    api = config_from_options({"config": str(path), "sac": {"gamma": 0.95}, "horizon": 12})
    assert api == cfg


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("envs = ", ".toml", "is not valid TOML"),
        ("{", ".json", "is not valid JSON"),
        ("[1, 2]", ".json", "holds a JSON list, not options by name"),
        ("no_such_option = 3", ".toml", "does not hold the options of `hetlab train`"),
        ("envs: 3", ".yaml", "--config takes a .json file (a run's config.json) or a .toml one"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path, text, suffix, message):
    path = tmp_path / f"options{suffix}"
    path.write_text(text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse("--config", str(path))
    with pytest.raises(UserError, match="cannot read it"):
        parse("--config", str(tmp_path / "missing.toml"))


def test_a_run_s_config_json_starts_a_new_run_with_the_same_options(tmp_path, hetlab_here):
    first = ["--task", "cartpole-balance", "--envs", "16", "--horizon", "8", "--max-iterations", "1",
             "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32", "--ppo.gamma", "0.97"]
    runs = tmp_path / "runs"
    done = hetlab_here("train", "--runs-dir", runs, *first)
    assert done.returncode == 0, done.stderr
    run_a = Path(done.stdout.splitlines()[0])
    done = hetlab_here("train", "--config", run_a / "config.json", "--seed", "3")
    assert done.returncode == 0, done.stderr
    run_b = Path(done.stdout.splitlines()[0])
    assert run_b.parent == run_a.parent and run_b != run_a  # the file's --runs-dir, a new run
    a, b = (json.loads((run / "config.json").read_text()) for run in (run_a, run_b))
    assert b.pop("seed") == 3 and b.pop("config") == str(run_a / "config.json")
    assert a.pop("seed") == 0 and a.pop("config") is None
    sources_a, sources_b = a.pop("option_sources"), b.pop("option_sources")
    assert a == b and a["algos"]["ppo"]["gamma"] == 0.97
    # Run A took the task's recipe for what its command line left out; run B has it all from the file.
    assert sources_a["ppo.gamma"] == "command line" and sources_a["eval_every"] == "recipe"
    assert sources_b["seed"] == sources_b["config"] == "command line"
    assert sources_b["ppo.gamma"] == sources_b["eval_every"] == "config file"


@pytest.mark.parametrize("task", sorted(RECIPES))
def test_a_recipe_as_printed_parses_back_to_its_values(task):
    """The options a run prints for its recipe (and `hetlab tasks` lists) are a command line that gives
    the same values: a bool is a flag, a tuple its items."""
    recipe = RECIPES[task]
    options = {**recipe.options, **recipe.cpu, **recipe.native_bf16}
    args = ["--task", task, "--algo", recipe.algo]
    for name, value in options.items():
        args += shlex.split(cli_option(name, value))
    cfg = parse(*args)
    for name, value in options.items():
        assert option_value(cfg, name) == value, name
    assert cli_option("ppo.symmetry", False) == "--ppo.no-symmetry" and parse("--ppo.no-symmetry").algos.ppo.symmetry is False
    assert cli_option("until_solved", True) == "--until-solved"
