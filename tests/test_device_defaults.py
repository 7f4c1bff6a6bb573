"""Defaults scaled to the learner device: a CPU learner gets each algorithm's `cpu_defaults` for the
options left at their defaults, an accelerator today's defaults; the run records and announces them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetlab.algos import ALGOS
from hetlab.devices import LearnerDevice
from hetlab.errors import UserError
from hetlab.train.config import AlgoConfigs, TrainConfig, validate, with_run_defaults
from hetlab.train.device_defaults import scale_defaults, scaled_line
from hetlab.train.launch import train

CPU = LearnerDevice("cpu", "cpu", "test CPU", False, False, False)
GPU = LearnerDevice("cuda:0", "cuda", "test GPU", True, True, True)


def value_of(config, option: str):
    """A `cpu_defaults` key's value in a TrainConfig or its config.json: `envs`, `sac.batch_size`."""
    head, *rest = option.split(".")
    for name in (["algos", head, *rest] if head in ALGOS else [head, *rest]):
        config = config[name] if isinstance(config, dict) else getattr(config, name)
    return config


@pytest.mark.parametrize("algo", list(ALGOS))
def test_a_cpu_learner_gets_the_algorithms_cpu_defaults_and_they_validate(algo):
    cfg, scaled = scale_defaults(TrainConfig(algo=algo, task="cartpole-balance"), CPU)
    cpu_defaults = ALGOS[algo].cpu_defaults
    for option, value in cpu_defaults.items():
        assert value_of(cfg, option) == value, option
    default = TrainConfig(algo=algo, task="cartpole-balance")
    assert scaled == {option: value for option, value in cpu_defaults.items() if value_of(default, option) != value}
    validate(with_run_defaults(cfg))  # minibatch split, replay capacity vs learning starts, memory: all resolved


def test_the_accelerator_sized_defaults_are_scaled_down_on_the_cpu():
    # The case: FastSAC's batch of 8192 at 8 updates per env step left a CPU run without an episode.
    _, scaled = scale_defaults(TrainConfig(algo="fastsac"), CPU)
    assert scaled["fastsac.batch_size"] < 8192 and scaled["fastsac.updates_per_step"] < 8
    assert "flashsac.batch_size" in scale_defaults(TrainConfig(algo="flashsac"), CPU)[1]


def test_an_accelerator_or_no_scale_defaults_keeps_every_default():
    for algo in ALGOS:
        cfg = TrainConfig(algo=algo)
        assert scale_defaults(cfg, GPU) == (cfg, {})
        kept = dataclasses.replace(cfg, scale_defaults=False)
        assert scale_defaults(kept, CPU) == (kept, {})


def test_an_option_given_another_value_is_kept():
    fastsac = ALGOS["fastsac"]
    given = TrainConfig(algo="fastsac", algos=AlgoConfigs(fastsac=fastsac.Config(batch_size=1000)))
    cfg, scaled = scale_defaults(given, CPU)
    assert cfg.algos.fastsac.batch_size == 1000 and "fastsac.batch_size" not in scaled
    assert cfg.algos.fastsac.updates_per_step == fastsac.cpu_defaults["fastsac.updates_per_step"]
    # The other algorithms' groups are not this run's: left as they are.
    assert cfg.algos.flashsac == TrainConfig().algos.flashsac


@pytest.mark.parametrize("option", ["no_such_option", "off_policy.no_such_option", "sac.batch_size"])
def test_cpu_defaults_must_name_options_of_the_run_or_its_own_algorithm(monkeypatch, option):
    monkeypatch.setattr(ALGOS["fastsac"], "cpu_defaults", {option: 1})
    with pytest.raises(ValueError, match=option):
        scale_defaults(TrainConfig(algo="fastsac"), CPU)


def test_the_start_line_names_each_scaled_option_as_given_on_the_command_line():
    line = scaled_line({"envs": 128, "fastsac.actor_hidden": (128, 64), "off_policy.replay_capacity": 100_000})
    assert "\n" not in line and line.startswith("CPU learner:")
    assert "--envs 128 --fastsac.actor-hidden 128 64 --off-policy.replay-capacity 100000" in line
    assert "--no-scale-defaults" in line


def test_validation_runs_on_the_resolved_config(tmp_path, monkeypatch):
    # 1024 envs × horizon 1 split into 1024 minibatches; the CPU's envs do not.
    monkeypatch.setattr(ALGOS["ppo"], "cpu_defaults", {"envs": 512})
    cfg = TrainConfig(algo="ppo", task="cartpole-balance", device="cpu", horizon=1, max_iterations=1,
                      runs_dir=str(tmp_path / "runs"),
                      algos=AlgoConfigs(ppo=ALGOS["ppo"].Config(num_mini_batches=1024, num_learning_epochs=1,
                                                                actor_hidden=(8,), critic_hidden=(8,))))
    validate(with_run_defaults(cfg))
    with pytest.raises(UserError, match="512 samples do not split into 1024 minibatches"):
        train(cfg)
    assert not (tmp_path / "runs").exists()


def test_a_cpu_run_records_and_announces_its_scaled_defaults(tmp_path, hetlab_here):
    result = hetlab_here(
        "train", "--algo", "fastsac", "--task", "cartpole-balance", "--device", "cpu", "--max-iterations", "1",
        "--max-seconds", "60",  # unscaled, FastSAC's first iteration would take many minutes here
        "--horizon", "2", "--fastsac.batch-size", "64", "--runs-dir", tmp_path / "runs")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    run_dir = Path(lines[0])  # still the first line
    assert lines[1].startswith("CPU learner: defaults scaled for it:")
    assert "--fastsac.updates-per-step" in lines[1] and "--fastsac.batch-size" not in lines[1]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["horizon"] == 2 and config["algos"]["fastsac"]["batch_size"] == 64  # given: kept
    for option, value in ALGOS["fastsac"].cpu_defaults.items():
        if option != "fastsac.batch_size":
            assert value_of(config, option) == (list(value) if isinstance(value, tuple) else value), option


def test_a_resumed_run_keeps_its_saved_values_on_a_cpu_learner(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ALGOS["ppo"], "cpu_defaults", {"envs": 512})
    small = ALGOS["ppo"].Config(actor_hidden=(32, 32), critic_hidden=(32, 32))
    run_dir = train(TrainConfig(algo="ppo", task="cartpole-balance", horizon=2, max_iterations=1, scale_defaults=False,
                                runs_dir=str(tmp_path / "runs"), algos=AlgoConfigs(ppo=small)))
    # Recorded as a run started on an accelerator records it: the default 1024 envs, scaling on.
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "scale_defaults": True}))
    capsys.readouterr()
    train(TrainConfig(resume=str(run_dir), max_iterations=2, device="cpu"))
    assert "CPU learner" not in capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["env_steps"] == 2 * 1024 * 2
