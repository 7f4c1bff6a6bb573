"""What "solved" means per task, judged on scripted policies; `hetlab eval`; recipes and where a
run's values came from; a physics step other than the task's own."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from torch import nn

import hetlab
from hetlab.devices import LearnerDevice
from hetlab.tasks import TASKS, make_task
from hetlab.tasks.cartpole import CartpoleBalance
from hetlab.tasks.criteria import Criterion, judge
from hetlab.tasks.go1_joystick import Go1JoystickFlat
from hetlab.train.config import TrainConfig
from hetlab.train.evaluation import PolicyEvaluation, TrainingEvaluation
from hetlab.train.launch import recipe_line, with_recipe
from hetlab.train.recipes import RECIPES

CPU = torch.device("cpu")


class CartpolePD(nn.Module):
    """Pushes the cart under the pole, and back towards the rail's centre: (gains on sin θ, θ', x, x')."""

    def __init__(self, gains):
        super().__init__()
        self.gains = torch.tensor(gains, dtype=torch.float32)

    def forward(self, obs):
        x, _, sin, x_dot, angle_dot = obs.unbind(1)
        k = self.gains
        return torch.clamp(k[0] * sin + k[1] * angle_dot + k[2] * x + k[3] * x_dot, -1, 1)[:, None]


class Still(nn.Module):
    """Holds every joint at the standing pose, whatever it is asked to do."""

    def __init__(self, actions: int):
        super().__init__()
        self.actions = actions

    def forward(self, obs):
        return torch.zeros(len(obs), self.actions)


def test_every_task_defines_solved_on_metrics_its_evaluation_reports():
    for cls in TASKS.values():
        assert cls.solved, cls.name
        for criterion in cls.solved:
            assert criterion.metric in {"return", "survival", *cls.tracked_terms} or criterion.metric in {
                "body_pos_error", "goals"}, (cls.name, criterion)


def test_a_criterion_passes_on_its_side_of_the_threshold_and_never_on_nan():
    at_least, at_most = Criterion("goals", 1.0), Criterion("body_pos_error", 0.1, at_least=False)
    assert at_least.passes(1.0) and not at_least.passes(0.99) and not at_least.passes(float("nan"))
    assert at_most.passes(0.1) and not at_most.passes(0.11) and not at_most.passes(float("nan"))
    assert str(at_least) == "goals ≥ 1" and str(at_most) == "body_pos_error ≤ 0.1"
    with pytest.raises(KeyError, match="no metric goals"):
        judge((at_least,), {"return": 3.0})


def test_a_pd_controller_solves_cartpole_and_one_that_ignores_the_cart_does_not():
    evaluation = PolicyEvaluation("cartpole-balance", "mujoco", 32, seed=0, device=CPU)
    solved = evaluation.run(CartpolePD([5.0, 1.0, 0.5, 1.0]))
    assert solved["eval/solved"] == 1.0 and solved["eval/return"] >= 475 and solved["eval/survival"] == 1.0
    # Balancing without minding the cart drives it off the rail in some episodes.
    drifting = evaluation.run(CartpolePD([5.0, 1.0, 0.0, 0.0]))
    assert drifting["eval/solved"] == 0.0 and drifting["eval/return"] < 475 and drifting["eval/survival"] < 1.0
    falling = evaluation.run(CartpolePD([-5.0, -1.0, -0.5, -1.0]))  # pushes the wrong way: the pole falls
    assert falling["eval/survival"] == 0.0 and falling["eval/return"] < 50


class ForgetsAfter(nn.Module):
    """`policy` for its first `steps` batches of actions, then no push at all."""

    def __init__(self, policy: nn.Module, steps: int):
        super().__init__()
        self.policy, self.steps = policy, steps

    def forward(self, obs):
        self.steps -= 1
        return self.policy(obs) if self.steps >= 0 else torch.zeros(len(obs), 1)


def test_a_run_at_a_coarser_step_is_solved_only_where_its_policy_also_passes_at_the_tasks_own():
    evaluation = TrainingEvaluation("cartpole-balance", "mujoco", 32, 0, CPU, {"sim_dt": 0.02})
    assert (evaluation.at_run_step.task.sim.timestep, evaluation.at_task_step.task.sim.timestep) == (0.02, 0.01)
    pd = CartpolePD([5.0, 1.0, 0.5, 1.0])
    solved = evaluation.run(pd)
    assert solved["eval/solved"] == solved["eval/task_step/solved"] == 1.0 and solved["eval/task_step/return"] >= 475
    # Passes at the run's step (its 500 steps), then fails at the task's own: not solved.
    forgetting = evaluation.run(ForgetsAfter(pd, steps=500))
    assert forgetting["eval/return"] >= 475 and forgetting["eval/task_step/survival"] == 0.0
    assert forgetting["eval/solved"] == 0.0
    # Failing at the run's step already: not judged again.
    assert "eval/task_step/return" not in evaluation.run(CartpolePD([5.0, 1.0, 0.0, 0.0]))
    # At the task's own step there is nothing to check twice.
    assert TrainingEvaluation("cartpole-balance", "mujoco", 4, 0, CPU, {"sim_dt": 0.01}).at_task_step is None
    assert TrainingEvaluation("cartpole-balance", "mujoco", 4, 0, CPU, {}).at_task_step is None


def test_a_go1_that_stands_still_survives_but_does_not_walk_on_command():
    evaluation = PolicyEvaluation("go1-joystick-flat", "mujoco", 16, seed=0, device=CPU)
    scores = evaluation.episodes(Still(Go1JoystickFlat.action_size)).means()
    results = {r["metric"]: r["passed"] for r in judge(Go1JoystickFlat.solved, scores)}
    assert results["survival"], scores  # standing is safe...
    assert not results["tracking_lin_vel"], scores  # ...but the commanded velocities are not followed
    assert 0 < scores["tracking_lin_vel"] < 0.75 and 0 < scores["tracking_ang_vel"] <= 1


def test_a_tracked_term_is_the_per_step_mean_of_its_unweighted_kernel():
    task = make_task("go1-joystick-flat", num_envs=1, threads=1, seed=3)
    task.reset()
    scale = task.reward_weights["tracking_lin_vel"] * task.reward_scale
    kernels = []
    while True:
        _, _, _, _, info = task.step(np.zeros((1, task.action_size), np.float32))
        kernels.append(info["reward_terms"]["tracking_lin_vel"] / scale)
        if "done_ids" in info:
            break
    assert info["episode_metrics"]["tracking_lin_vel"][0] == pytest.approx(np.mean(kernels), rel=1e-9)
    assert task.tracked_sums[0].tolist() == [0.0, 0.0]  # the next episode starts from zero


def test_a_recipe_fills_what_is_not_given_and_config_json_says_where_each_value_came_from(tmp_path):
    run = hetlab.train_policy(task="cartpole-balance", envs=64, max_iterations=1, runs_dir=str(tmp_path / "runs"))
    config = json.loads((run / "config.json").read_text())
    recipe = RECIPES["cartpole-balance"].options
    assert config["envs"] == 64 and config["option_sources"]["envs"] == "python"  # given: wins over the recipe's
    assert config["horizon"] == recipe["horizon"] and config["option_sources"]["horizon"] == "recipe"
    assert config["algos"]["ppo"]["actor_hidden"] == list(recipe["ppo.actor_hidden"])
    assert config["option_sources"]["algo"] == "recipe" and config["option_sources"]["task"] == "python"


def test_go1_s_recipe_trains_in_bf16_only_on_a_cpu_with_native_bf16():
    cpu = LearnerDevice("cpu", "cpu", "a CPU", pinned_memory=False, async_copy=False, bf16=False)
    for native in (False, True):
        cfg, applied = with_recipe(TrainConfig(task="go1-joystick-flat"), {"task": "command line"},
                                   dataclasses.replace(cpu, bf16=native))
        assert cfg.algos.ppo.bf16 is native and ("ppo.bf16" in applied) is native and applied["envs"] == 512
    given, applied = with_recipe(TrainConfig(task="go1-joystick-flat"), {"ppo.bf16": "command line"},
                                 dataclasses.replace(cpu, bf16=True))
    assert "ppo.bf16" not in applied and given.algos.ppo.bf16 is False  # --ppo.no-bf16 wins
    gpu = LearnerDevice("cuda:0", "cuda", "a GPU", pinned_memory=True, async_copy=True, bf16=True)
    on_gpu, applied = with_recipe(TrainConfig(task="go1-joystick-flat"), {}, gpu)
    assert on_gpu.algos.ppo.bf16 is False and "envs" not in applied  # the CPU's sizes and precision are the CPU's


def test_g1_s_recipe_weighs_linear_tracking_unless_the_command_line_gives_weights():
    cpu = LearnerDevice("cpu", "cpu", "a CPU", pinned_memory=False, async_copy=False, bf16=False)
    cfg, applied = with_recipe(TrainConfig(task="g1-walk-flat"), {"task": "command line"}, cpu)
    assert cfg.reward_weights == {"tracking_lin_vel": 4.0} and cfg.algos.ppo.entropy_coef == 0.003
    assert "--reward-weights tracking_lin_vel 4.0" in recipe_line("g1-walk-flat", applied)
    given, applied = with_recipe(TrainConfig(task="g1-walk-flat", reward_weights={"alive": 0.5}),
                                 {"reward_weights": "command line"}, cpu)
    assert given.reward_weights == {"alive": 0.5} and "reward_weights" not in applied  # the given weights, whole


def test_naming_the_algorithm_trains_without_the_recipe(tmp_path):
    run = hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=64, max_iterations=1,
                              ppo={"actor_hidden": (16,), "critic_hidden": (16,)}, runs_dir=str(tmp_path / "runs"))
    config = json.loads((run / "config.json").read_text())
    assert "recipe" not in config["option_sources"].values()
    assert config["horizon"] != RECIPES["cartpole-balance"].options["horizon"]


def test_a_resume_without_a_budget_keeps_the_runs_budget(tmp_path, refusal):
    # The sequence that once trained a 4-iteration run on towards 1000.
    run = hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=64, max_iterations=4,
                              ppo={"actor_hidden": (16,), "critic_hidden": (16,)}, runs_dir=str(tmp_path / "runs"))
    assert "already trained 4 iterations; pass --max-iterations above 4" in refusal("train", "--resume", run)
    assert json.loads((run / "config.json").read_text())["max_iterations"] == 4
    # An option given at the command line's default value is given: refused where the run differs.
    assert "--envs asks for 1024 where the run has 64" in refusal("train", "--resume", run, "--envs", "1024")
    hetlab.train_policy(resume=str(run), max_iterations=5)
    assert json.loads((run / "summary.json").read_text())["iterations"] == 5
    assert json.loads((run / "config.json").read_text())["max_iterations"] == 5


def test_eval_judges_a_run_writes_its_report_and_films_episodes(tmp_path, capsys):
    from hetlab.cli import main

    run = hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=64, max_iterations=1,
                              ppo={"actor_hidden": (16,), "critic_hidden": (16,)}, runs_dir=str(tmp_path / "runs"))
    capsys.readouterr()
    main(["eval", str(run), "--episodes", "16", "--video", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 16 and report["iteration"] == 1 and report["solved"] is False  # one update: falls
    [criterion] = report["criteria"]
    assert criterion["criterion"] == "return ≥ 475" and not criterion["passed"]
    assert criterion["value"] == report["metrics"]["return"] < 475
    low, high = report["survival_interval"]
    assert 0 <= low <= report["survived"] / 16 <= high <= 1
    assert json.loads((run / "eval" / "1-0.json").read_text())["metrics"] == report["metrics"]
    [video] = report["videos"]
    assert video.endswith("eval/1-0-episode_0.mp4") and (run / "eval" / "1-0-episode_0.mp4").stat().st_size > 0
    # The same policy at a finer physics step, recorded apart.
    main(["eval", str(run), "--episodes", "16", "--sim-dt", "0.005", "--json"])
    finer = json.loads(capsys.readouterr().out)
    assert finer["sim_dt"] == 0.005 and (run / "eval" / "1-0-dt0.005.json").is_file()
    # Under other task options: starts twenty times as far from upright fall sooner, recorded apart.
    main(["eval", str(run), "--episodes", "16", "--task-option", "reset_noise=2", "--json"])
    shaken = json.loads(capsys.readouterr().out)
    assert shaken["task_options"] == {"reset_noise": 2.0} and report["task_options"] == {}
    assert shaken["metrics"]["episode_length"] < report["metrics"]["episode_length"]
    assert (run / "eval" / "1-0-reset_noise=2.json").is_file()


def test_eval_refuses_bad_input_in_one_line(tmp_path, refusal):
    run = hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=64, max_iterations=1,
                              ppo={"actor_hidden": (16,), "critic_hidden": (16,)}, runs_dir=str(tmp_path / "runs"))
    assert "--episodes must be at least 1, got 0" in refusal("eval", run, "--episodes", "0")
    assert "keeps no checkpoint of step 7" in refusal("eval", run, "--checkpoint", "7")
    assert "--video takes 0 to --episodes (4)" in refusal("eval", run, "--episodes", "4", "--video", "5")
    assert "NAME one of randomise, reset_noise (options of cartpole-balance), got 'seed=3'" in refusal(
        "eval", run, "--task-option", "seed=3")
    assert "got 'pushes'" in refusal("eval", run, "--task-option", "pushes")
    assert "'randomise=maybe': randomise takes true or false" in refusal("eval", run, "--task-option", "randomise=maybe")
    assert "reset_noise is given twice" in refusal("eval", run, "--task-option", "reset_noise=1", "reset_noise=2")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((run / "config.json").read_text())
    assert "has no checkpoint.json" in refusal("eval", empty)
    aloha = tmp_path / "aloha"
    aloha.mkdir()
    (aloha / "config.json").write_text(json.dumps({"kind": "aloha-ar-actor", "phase": "A"}))
    assert "evaluate this one with `hetlab aloha eval`" in refusal("eval", aloha)


def test_until_solved_needs_criteria_and_an_evaluation(tmp_path, refusal, monkeypatch):
    runs = tmp_path / "runs"
    assert "give --eval-every N" in refusal("train", "--task", "cartpole-balance", "--algo", "ppo", "--until-solved",
                                            "--runs-dir", runs)
    monkeypatch.setattr(CartpoleBalance, "solved", ())
    assert "has no \"solved\" criteria" in refusal("train", "--task", "cartpole-balance", "--until-solved",
                                                   "--runs-dir", runs)
    assert not runs.exists()


@pytest.mark.parametrize(("task", "sim_dt", "message"), [
    ("go1-joystick-flat", "0.003", "must divide go1-joystick-flat's control step of 0.02 s"),
    ("go1-joystick-flat", "0.02", "is unstable for go1-joystick-flat"),  # the trunk sinks at one substep per action
    ("g1-walk-flat", "0.01", "is unstable for g1-walk-flat"),  # the humanoid's physics diverges
])
def test_a_physics_step_that_does_not_divide_or_is_unstable_is_refused(tmp_path, refusal, task, sim_dt, message):
    assert message in refusal("train", "--task", task, "--sim-dt", sim_dt, "--runs-dir", tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_a_coarser_physics_step_takes_fewer_substeps_per_action():
    own, coarse = (make_task("go1-joystick-flat", num_envs=2, threads=1, sim_dt=dt) for dt in (0.0, 0.01))
    assert (own.substeps, coarse.substeps) == (5, 2) and own.dt == pytest.approx(coarse.dt)
    assert coarse.max_episode_steps == own.max_episode_steps
