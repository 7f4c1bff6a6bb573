"""The RL half's commands beside `hetlab train`: info, tasks, tune, eval, export, play, and `hetlab bench sim`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import tyro

from hetlab.cli.output import console, err_console, print_json
from hetlab.cli.parsing import Group
from hetlab.errors import UserError
from hetlab.sim.bench_config import SimBenchConfig

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class InfoConfig:
    device: str = "auto"  # learner device: auto, cuda, xpu, mps or cpu
    threads: int = 0  # physics threads to budget for; 0 = every core
    ray: str | None = None  # also show a Ray cluster's nodes and resources: local, auto or host:port
    json: bool = False  # print the result as JSON


def info(cfg: Annotated[InfoConfig, tyro.conf.arg(name="")] = InfoConfig()) -> None:
    """Learner device and its capabilities, CPU thread budget, versions, installed extras and (--ray) a Ray cluster."""
    import platform

    import mujoco
    import numpy as np
    import torch
    from rich.table import Table

    import hetlab
    from hetlab.devices import DEVICE_CHOICES, pick_device, thread_budget
    from hetlab.extras import installed_extras

    device = pick_device(cfg.device)
    budget = thread_budget(device, cfg.threads)
    report = {
        "device": device.torch_device,
        "device_kind": device.kind,
        "device_name": device.name,
        "pinned_memory": device.pinned_memory,
        "async_copy": device.async_copy,
        "bf16": device.bf16,
        "cpu_count": budget.cores,
        "physics_threads": budget.physics,
        "torch_threads": budget.torch,
        "versions": {
            "hetlab": hetlab.__version__,
            "python": platform.python_version(),
            "mujoco": mujoco.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "extras": installed_extras(),
        "device_choices": list(DEVICE_CHOICES),
    }
    if cfg.ray is not None:
        from hetlab.runtime.ray.cluster import RayCluster  # the `ray` extra: imported only when asked for

        cluster = RayCluster(cfg.ray)
        try:
            report["ray_nodes"] = cluster.nodes()
        finally:
            cluster.close()
    if cfg.json:
        print_json(report)
        return
    table = Table(title="hetlab info", show_header=False)
    table.add_row("learner device", f"{device.torch_device} ({device.kind}: {device.name})")
    table.add_row("capabilities", ", ".join(f"{k}={'yes' if getattr(device, k) else 'no'}" for k in ("pinned_memory", "async_copy", "bf16")))
    table.add_row("CPU cores", str(budget.cores))
    table.add_row("thread budget", f"physics {budget.physics}, torch {budget.torch}")
    table.add_row("versions", ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    table.add_row("extras", ", ".join(f"{k} {'installed' if ok else 'missing'}" for k, ok in report["extras"].items()))
    console().print(table)
    if "ray_nodes" in report:
        nodes = Table(title=f"Ray cluster at {cfg.ray}")
        for column in ("node", "address", "CPUs", "GPUs", "memory (GiB)", "learner"):
            nodes.add_column(column)
        for node in report["ray_nodes"]:
            nodes.add_row(node["node"][:12], node["address"], f"{node['cpus']:g}", f"{node['gpus']:g}",
                          f"{node['memory_gib']:g}", "here" if node["learner"] else "")
        console().print(nodes)


@dataclass(frozen=True)
class TasksConfig:
    json: bool = False  # print the result as JSON
    # also list each task's reward terms: weight, parameters, and whether its penalty curriculum weighs them
    rewards: bool = False


def tasks(cfg: Annotated[TasksConfig, tyro.conf.arg(name="")] = TasksConfig()) -> None:
    """The registered tasks: sizes, what "solved" means, and the recipe `hetlab train --task T` follows."""

    from rich.table import Table

    from hetlab.tasks import TASKS
    from hetlab.train.config import cli_option
    from hetlab.train.recipes import RECIPES

    rows = [
        {
            "name": name,
            "obs": dict(cls.obs_sizes),
            "actions": cls.action_size,
            "control_hz": round(1.0 / cls.control_dt, 3),
            "episode_seconds": cls.episode_seconds,
            "symmetric": cls.mirror() is not None,  # --ppo.symmetry applies
            "solved": [str(criterion) for criterion in cls.solved],
            "recipe": dataclasses.asdict(RECIPES[name]) if name in RECIPES else None,
            "rewards": {term_name: {"weight": term.weight, "params": dict(term.params), "penalty": term.penalty}
                        for term_name, term in cls.rewards.items()},
        }
        for name, cls in sorted(TASKS.items())
    ]
    if cfg.json:
        print_json(rows)
        return
    table = Table(title="hetlab tasks")
    table.add_column("task", no_wrap=True)
    for column in ("policy obs", "critic obs", "actions", "control Hz", "episode s", "mirror (--ppo.symmetry)"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["name"], str(row["obs"]["policy"]), str(row["obs"]["critic"]), str(row["actions"]),
            f"{row['control_hz']:g}", f"{row['episode_seconds']:g}", "yes" if row["symmetric"] else "no",
        )
    console().print(table)
    recipes = Table(title="solved when (`hetlab eval`), and the recipe `hetlab train --task T` follows without --algo")
    for column in ("task", "solved when", "recipe (CPU learner)", "time to solved"):
        recipes.add_column(column)
    for row in rows:
        recipe = row["recipe"]
        options = "ppo, the algorithm's defaults" if recipe is None else " ".join(
            [recipe["algo"], *(cli_option(k, v) for k, v in {**recipe["options"], **recipe["cpu"]}.items()),
             *(f"{cli_option(k, v)} (where the CPU has native bf16)" for k, v in recipe["native_bf16"].items())])
        recipes.add_row(row["name"], ", ".join(row["solved"]) or "not defined", options,
                        (recipe and recipe["time_to_solve"]) or "not solved yet")
    console().print(recipes)
    if cfg.rewards:
        for row in rows:
            terms = Table(title=f"{row['name']}: reward terms (`hetlab train --reward-weights NAME WEIGHT` and "
                                "`--reward-params NAME.PARAMETER VALUE` override them)")
            for column, justify in (("term", "left"), ("weight", "right"), ("parameters", "left"),
                                    ("penalty curriculum", "left")):
                terms.add_column(column, justify=justify)
            for term_name, term in row["rewards"].items():
                terms.add_row(term_name, f"{term['weight']:g}",
                              ", ".join(f"{key} {value:g}" for key, value in term["params"].items()),
                              "weighs it" if term["penalty"] else "")
            console().print(terms)


@dataclass(frozen=True)
class ExportConfig:
    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]  # written by `hetlab train`
    out: Path | None = None  # default: RUN_DIR/policy.onnx
    # an iteration of a kept checkpoint (RUN_DIR/checkpoints), best (the best evaluation, --eval-every) or latest
    checkpoint: str = "latest"


def export(cfg: Annotated[ExportConfig, tyro.conf.arg(name="")]) -> None:
    """Export a run's policy to ONNX (input "obs", output "actions"), verified with ONNX Runtime."""
    from hetlab.deploy.export import TOLERANCE, export_onnx

    exported = export_onnx(cfg.run_dir, cfg.out, cfg.checkpoint)
    print(exported.path)
    console().print(f"checked with ONNX Runtime on {exported.real_observations} observations from the task and "
                    f"{exported.random_observations} around them: max |Δ action| = {exported.max_error:.2g} "
                    f"(tolerance {TOLERANCE:g}); metadata: {', '.join(exported.metadata)}", highlight=False,
                    soft_wrap=True)


@dataclass(frozen=True)
class TuneConfig:
    task: str = "go1-joystick-flat"  # the run to tune: `hetlab train --task T`, with its recipe where it has one
    algo: str = ""  # "" = the task's recipe's, else ppo (on-policy algorithms only)
    envs: int = 0  # 0 = the run's (the recipe's or the CPU-sized default)
    device: str = "auto"  # learner device, as `hetlab train --device`
    seconds: float = 90.0  # of probing: the stages alone, then two settings end to end
    # the TOML `hetlab train --config` takes; it is also cached, where `hetlab train --tune` finds it
    out: Path | None = None
    json: bool = False  # print the result as JSON
    # also print the predicted env-steps/s on other core counts, with a CPU and an accelerator learner
    explain: bool = False
    # with --explain: an accelerator learner's seconds per update, in ms, as measured there; 0 = the bound for any
    accelerator_update_ms: float = 0.0


def tune(cfg: Annotated[TuneConfig, tyro.conf.arg(name="")] = TuneConfig()) -> None:
    """Measure this machine's stages and pick a run's collectors, physics and torch threads (writes TOML for --config)."""
    from rich.table import Table

    from hetlab.train.scaling import CORE_COUNTS, scaling_table
    from hetlab.train.tune import cache_path, run_to_tune, tune as measure, write_tuned

    if cfg.accelerator_update_ms < 0:
        raise UserError(f"--accelerator-update-ms must be ≥ 0 (0 = a learner that costs nothing), got "
                        f"{cfg.accelerator_update_ms:g}")
    run_cfg, device = run_to_tune(cfg.task, cfg.algo, cfg.envs, cfg.device)
    say = (lambda line: None) if cfg.json else (lambda line: console().print(line, highlight=False, soft_wrap=True))
    say(f"tuning {run_cfg.task}, {run_cfg.algo}, {run_cfg.envs} envs, {run_cfg.resolved_mode}, learner {device.name}")
    result = measure(run_cfg, device, cfg.seconds, say)
    files = [cache_path(run_cfg, device)] + ([cfg.out] if cfg.out else [])
    for file in files:
        write_tuned(file, result, run_cfg)
    accelerator_update_s = cfg.accelerator_update_ms / 1000
    scaling = scaling_table(result.scaling, sorted({*CORE_COUNTS, result.machine["cores"]}), accelerator_update_s) \
        if cfg.explain else None
    if cfg.json:
        print_json({"chosen": result.chosen.options, "defaults": result.defaults.options,
                    "predicted": [{**s.options, "env_steps_per_s": v} for s, v in result.predicted.items()],
                    "measured": [{**s.options, "env_steps_per_s": v} for s, v in result.measured.items()],
                    "alternatives": result.alternatives, "machine": result.machine, "seconds": result.seconds,
                    "files": [str(file) for file in files]}
                   | ({"scaling": {"model": dataclasses.asdict(result.scaling), "predicted": scaling,
                                   "ceilings": result.scaling.ceilings(accelerator_update_s)}} if scaling else {}))
        return
    table = Table(title=f"{run_cfg.task}: env-steps/s")
    for column in ("collectors", "physics threads each", "torch threads", "predicted", "measured", ""):
        table.add_column(column, justify="right")
    for setting, rate in sorted(result.predicted.items(), key=lambda item: -item[1]):
        measured = result.measured.get(setting)
        notes = ["chosen"] * (setting == result.chosen) + ["hand defaults"] * (setting == result.defaults)
        table.add_row(str(setting.collectors), str(setting.physics_threads), str(setting.torch_threads), f"{rate:,.0f}",
                      "" if measured is None else f"{measured:,.0f}", ", ".join(notes))
    console().print(table)
    gain = result.measured[result.chosen] / result.measured[result.defaults]
    say(f"chosen: {result.chosen}, {gain:.2f}× the hand defaults measured end to end ({result.seconds:.0f} s of probing)")
    for option, rate in result.alternatives.items():
        say(f"{option} would give about {rate:,.0f} env-steps/s (predicted), and changes what the run learns: "
            "give it yourself if you want it")
    say("written: " + ", ".join(str(file) for file in files) + "; `hetlab train --tune` or --config FILE uses it")
    if scaling:
        _print_scaling(result.scaling, scaling, accelerator_update_s)


def _print_scaling(model, rows: list[dict], accelerator_update_s: float) -> None:
    from rich.table import Table

    learner = f"{1e3 * accelerator_update_s:g} ms an update" if accelerator_update_s else "free (the bound)"
    table = Table(title=f"predicted env-steps/s on N cores (accelerator learner: {learner})")
    for column in ("cores", "CPU learner, sync", "CPU learner, async", "accelerator, sync", "accelerator, async"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["cores"]), *("—" if row[key] is None else f"{row[key]:,.0f}"
                                           for key in ("cpu_sync", "cpu_async", "accelerator_sync", "accelerator_async")))
    console().print(table)
    console().print(f"model: a collector step costs {1e3 * model.step_fixed_s:.2f} ms + {1e6 * model.step_per_env_s:.1f} µs "
                    f"per env on one thread; an update {1e3 * model.update_serial_s:.0f} ms + "
                    f"{1e3 * model.update_parallel_s:.0f} ms / torch threads; {1e3 * model.handover_s:.0f} ms per "
                    "iteration beyond the stages", highlight=False, soft_wrap=True)
    for what, rate in model.ceilings(accelerator_update_s).items():
        console().print(f"ceiling, {what}: {rate:,.0f} env-steps/s", highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class EvalConfig:
    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]  # written by `hetlab train`
    # an iteration of a kept checkpoint (RUN_DIR/checkpoints), best (the best evaluation, --eval-every) or latest
    checkpoint: str = "latest"
    episodes: int = 128  # one per env, all starting together
    seed: int | None = None  # the evaluation's seed; default: the run's own (as --eval-every uses)
    video: int = 0  # film the first K episodes to RUN_DIR/eval/<iteration>-<seed>-episode_<i>.mp4 (the `video` extra)
    # physics step to evaluate at, in seconds; default: the run's own; 0: the task's own (a policy trained at a
    # coarser step is worth having if it passes at the task's own)
    sim_dt: float | None = None
    # NAME=VALUE …: task options over the run's, e.g. pushes=false or push_speed=1.5,2 (g1-walk-flat);
    # an unknown NAME is refused with the list of the task's options
    task_option: tuple[str, ...] = ()
    json: bool = False  # print the result as JSON


def eval(cfg: Annotated[EvalConfig, tyro.conf.arg(name="")]) -> None:  # noqa: A001 - the command's name
    """Judge a run's deterministic policy by its task's "solved" criteria over many episodes (writes RUN_DIR/eval/)."""
    from rich.table import Table

    from hetlab.deploy.evaluate import evaluate_run

    report = evaluate_run(cfg.run_dir, cfg.checkpoint, cfg.episodes, cfg.seed, cfg.video, cfg.sim_dt, cfg.task_option)
    if cfg.json:
        print_json(report)
        return
    low, high = report["survival_interval"]
    console().print(f"{report['task']}: checkpoint {report['iteration']}, {report['episodes']} episodes from seed "
                    f"{report['seed']}, physics step {report['sim_dt']:g} s"
                    + "".join(f", {name}={value}" for name, value in report["task_options"].items()),
                    highlight=False, soft_wrap=True)
    table = Table()
    for column, justify in (("criterion", "left"), ("value", "right"), ("", "left")):
        table.add_column(column, justify=justify)
    for judged in report["criteria"]:
        table.add_row(judged["criterion"], f"{judged['value']:.3f}",
                      "[green]pass[/]" if judged["passed"] else "[red]fail[/]")
    for name, value in report["metrics"].items():
        if name not in {judged["metric"] for judged in report["criteria"]}:
            table.add_row(name, f"{value:.3f}", "")
    console().print(table)
    verdict = ("[bold green]solved[/]" if report["solved"] else "[bold red]not solved[/]") \
        if report["solved"] is not None else f"{report['task']} defines no \"solved\" criteria"
    console().print(f"{verdict}; {report['survived']} of {report['episodes']} episodes survived "
                    f"(95 % Wilson interval {low:.1%}–{high:.1%}); {report['file']}", highlight=False, soft_wrap=True)
    for video in report["videos"]:
        console().print(f"video: {video}", highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class PlayConfig:
    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]  # written by `hetlab train`
    video: Path | None = None  # default: RUN_DIR/play.mp4
    seconds: float = 10.0  # length of the episode recorded
    width: int = 640  # video width in pixels (even)
    height: int = 480  # video height in pixels (even)
    seed: int | None = None  # default: the run's seed
    # an iteration of a kept checkpoint (RUN_DIR/checkpoints), best (the best evaluation, --eval-every) or latest
    checkpoint: str = "latest"
    json: bool = False  # print the result as JSON


def play(cfg: Annotated[PlayConfig, tyro.conf.arg(name="")]) -> None:
    """Record an mp4 of a run's policy acting deterministically in one env (headless GL)."""
    from rich.table import Table

    from hetlab.deploy.play import play as record

    result = record(cfg.run_dir, cfg.video or cfg.run_dir / "play.mp4", cfg.seconds, cfg.width, cfg.height, cfg.seed,
                    cfg.checkpoint)
    if cfg.json:
        print_json(result)
        return
    console().print(f"{result['video']}: {result['frames']} frames at {result['fps']:g} fps", highlight=False,
                    soft_wrap=True)
    table = Table()
    for column in ("episode", "return", "length", "ended"):
        table.add_column(column, justify="right")
    for index, episode in enumerate(result["episodes"]):
        table.add_row(str(index), f"{episode['return']:.3f}", str(episode["length"]), episode["ended"])
    console().print(table)


def bench_sim(cfg: Annotated[SimBenchConfig, tyro.conf.arg(name="")] = SimBenchConfig()) -> None:
    """Physics substeps/s vs task env-steps/s, the task_efficiency between them, and the physics share of the task loop."""
    from rich.progress import Progress
    from rich.table import Table

    from hetlab.tasks import make_config
    from hetlab.tasks.throughput import run_sim_bench

    # Bad input fails before any work; with --sim all, a backend that cannot run the task is named in the result.
    make_config(cfg.task, num_envs=cfg.envs, sim="mujoco" if cfg.sim == "all" else cfg.sim, threads=cfg.threads)
    with Progress(console=err_console(), transient=True) as progress:
        result = run_sim_bench(cfg, progress)
    if cfg.json:
        print_json(result)
        return
    if cfg.sim != "all":
        console().print(_sim_bench_table(result))
        return
    results = result["results"]
    threads = ", ".join(sorted({str(r["threads"]) for r in results}))
    table = Table(title=f"bench sim --sim all: {result['task']}, {result['envs']} envs, {threads} threads "
                        f"(medians of {cfg.rounds} interleaved rounds)")
    table.add_column("metric")
    for r in results:
        table.add_column(r["sim"], justify="right")
    for label, key, form in _SIM_BENCH_ROWS:
        table.add_row(label, *(format(r[key], form) for r in results))
    console().print(table)
    for name, reason in result["unavailable"].items():
        console().print(f"{name}: not measured, {reason}")


_SIM_BENCH_ROWS = [("physics substeps/s", "physics_steps_per_s", ",.0f"), ("env steps/s", "env_steps_per_s", ",.0f"),
                   ("task_efficiency", "task_efficiency", ".3f"), ("physics share of the task loop", "physics_share", ".3f")]


def _sim_bench_table(result: dict) -> Table:
    from rich.table import Table

    table = Table(title=f"bench sim: {result['task']} on {result['sim']}, {result['envs']} envs, "
                        f"{result['threads']} threads")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column(f"per round ({result['rounds']})", justify="right")
    for label, key, form in _SIM_BENCH_ROWS:
        table.add_row(label, format(result[key], form), " ".join(format(v, form) for v in result["per_round"][key]))
    return table


bench = Group("Benchmarks: `hetlab bench sim`.", {"sim": bench_sim})
