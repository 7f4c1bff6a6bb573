"""`hetlab train`: from a config to a running loop.

Resolve the config — a resumed run's own, with the options a resumed run may change that the
launch gives; a new run's: the options given (command line, --config file or `train_policy`), then
the task's recipe (without --algo) and the algorithm's CPU-sized defaults on a CPU learner for the
options not given — validate it, split the CPU threads, create the run directory with the resolved
config.json (and where each value came from), and hand the run to its algorithm's loop.
Everything a user can get wrong fails here, before the run directory exists.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import torch

from hetlab.checkpoint import checkpoint_dir, read_checkpoint
from hetlab.devices import LearnerDevice, apply_thread_budget, pick_device, thread_budget
from hetlab.dir_lock import exclusive_writer
from hetlab.errors import UserError
from hetlab.figures import figures_wanted
from hetlab.files import write_text_atomic
from hetlab.run_history import read_history, write_history
from hetlab.run_meta import META_FILE, record_launch
from hetlab.runtime.pool import CollectorPool, ProcessPool
from hetlab.train.config import (OPTION_SOURCES, TrainConfig, cli_name, cli_option, load_run_config, option_path,
                                 option_value, options_set, read_option_sources, validate, with_option, with_ray_pool_sizes,
                                 with_run_defaults)
from hetlab.train.device_defaults import scale_defaults, scaled_line
from hetlab.train.recipes import RECIPES
from hetlab.train.loggers import require_logger
from hetlab.train.off_policy import train_off_policy
from hetlab.train.on_policy import train_on_policy
from hetlab.train.tune import TUNED_OPTIONS, with_tuned_setting
from hetlab.train.video import check_rendering

# What a resumed run may take from the launch: its budgets, cadences, where it runs and where a run
# resumed from an older checkpoint goes. Everything else is the run's own; a launch that gives
# another value is refused.
RESUMABLE_OPTIONS = ("max_iterations", "max_seconds", "target_return", "until_solved", "device", "threads",
                     "torch_threads",
                     "checkpoint_every", "keep_checkpoints", "eval_every", "eval_envs", "video_every", "resume",
                     "runs_dir", "ray", "ray_pool.max_restarts")
# Of those, the ones that say where this launch runs take its values, given or not; the others keep
# the run's own unless given (a resume with no budget keeps the run's budget).
LAUNCH_OPTIONS = ("device", "threads", "torch_threads", "resume", "runs_dir", "ray")
# Of those, the ones that set a run's speed: a resume that changes them without being told says so.
THREAD_OPTIONS = ("threads", "torch_threads")


def train(cfg: TrainConfig, given: Mapping[str, str] | None = None) -> Path:
    """Run training; returns the run directory. `given`: the options the caller set, by name
    (`envs`, `ppo.gamma`, `off_policy.lead`, `ray_pool.collectors`), each with where it was set
    (command line, config file, python); None: the options `cfg` sets away from their defaults, and
    its algorithm (a TrainConfig names one: no recipe chooses it)."""
    given = dict(given) if given is not None else dict.fromkeys({"algo", *options_set(cfg)}, "python")
    with ExitStack() as held:
        return _train(cfg, given, held)


def _train(cfg: TrainConfig, given: dict[str, str], held: ExitStack) -> Path:
    """`train` holding, in `held`, the lock of the run directory it writes."""
    resume_state, branch_of, launch = None, None, cfg
    if cfg.resume and cfg.tune:
        raise UserError("--tune picks the collectors of a new run, and a resumed run keeps its own; give --threads "
                        "or --torch-threads to change where it runs")
    chosen_by_hand = [name for name in TUNED_OPTIONS if given.get(name) in ("command line", "python")]
    if cfg.tune and chosen_by_hand:
        raise UserError(f"--tune chooses {', '.join('--' + cli_name(name) for name in TUNED_OPTIONS)} itself; "
                        f"drop {', '.join('--' + cli_name(name) for name in chosen_by_hand)} or drop --tune")
    if cfg.resume:
        run_dir = Path(cfg.resume)
        chosen = checkpoint_dir(run_dir, cfg.checkpoint)
        if chosen == checkpoint_dir(run_dir):  # the run goes on: from now on this launch is its one writer
            held.enter_context(exclusive_writer(run_dir, "run"))
            chosen = checkpoint_dir(run_dir, cfg.checkpoint)  # as it is now that nobody else writes it
        else:  # a new run starts from an older checkpoint, which a run still training keeps
            branch_of = (run_dir, chosen)
        resume_state = read_checkpoint(run_dir, chosen)
        # Which checkpoint to start from is this launch's choice; the run goes on from its newest.
        launch = dataclasses.replace(cfg, checkpoint="latest")
    elif cfg.checkpoint != "latest":
        raise UserError(f"--checkpoint {cfg.checkpoint} picks the checkpoint --resume continues from; "
                        "give --resume RUN_DIR too")
    device = pick_device(cfg.device)
    cfg, sources, from_recipe, scaled = resolved(launch, given, device, Path(cfg.resume) if resume_state else None)
    validate(cfg)
    threads_changed = resumed_threads_line(load_run_config(Path(cfg.resume)), cfg, given) if resume_state else ""
    if getattr(cfg.algo_config, "bf16", False) and not device.bf16:
        raise UserError(f"--{cfg.algo}.bf16: the learner ({device.name}) has no native bfloat16 (a CPU needs "
                        "AVX512_BF16 or AMX); train without it")
    def budget_of(cfg: TrainConfig):
        return thread_budget(device, cfg.threads, overlap=cfg.resolved_mode != "sync", torch_threads=cfg.torch_threads)

    budget = budget_of(cfg)  # too many threads is refused here, before any tuning
    figures_wanted()  # a bad HETLAB_FIGURES fails here, before the run starts, not at its end
    require_logger(cfg.logger)
    if cfg.video_every:
        check_rendering()
    tuned = {}
    if cfg.tune and resume_state is None:  # last: every one-line refusal comes before the probing
        # Its progress goes to stderr: stdout's first line is the run directory.
        cfg, tuned, tuned_file = with_tuned_setting(cfg, device,
                                                    progress=lambda line: print(line, file=sys.stderr, flush=True))
        sources |= dict.fromkeys(tuned, "tune")
        validate(cfg)
        budget = budget_of(cfg)
    if resume_state is not None and resume_state["iteration"] >= cfg.max_iterations:
        done = resume_state["iteration"]
        raise UserError(f"{run_dir} has already trained {done} iterations; pass --max-iterations above {done} "
                        "to train it further")
    pool = open_pool(cfg)
    try:
        if resume_state is None or branch_of:
            run_dir = Path(cfg.runs_dir) / f"{cfg.task}-{cfg.algo}" / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            run_dir.mkdir(parents=True)
            held.enter_context(exclusive_writer(run_dir, "run"))
        if branch_of:
            branch_run(*branch_of, run_dir, resume_state["iteration"])
        # A resume writes it again: the budgets and options it may change are the run's from now on.
        write_text_atomic(run_dir / "config.json",
                          json.dumps(saved_config(cfg, device.torch_device, sources), indent=2))
        record_launch(run_dir, device.torch_device, device.name)
        print(run_dir, flush=True)  # first line: where everything goes
        if from_recipe:
            print(recipe_line(cfg.task, from_recipe), flush=True)
        if scaled:
            print(scaled_line(scaled), flush=True)
        if threads_changed:
            print(threads_changed, flush=True)
        if tuned:
            options = " ".join(cli_option(option, value) for option, value in tuned.items())
            print(f"tuned for this machine: {options} ({tuned_file})", flush=True)

        apply_thread_budget(budget)
        physics_threads = max(1, budget.physics // cfg.collectors)
        algo = cfg.build_algorithm(torch.device(device.torch_device))
        loop = train_off_policy if cfg.is_off_policy else train_on_policy
        loop(cfg, run_dir, device, algo, resume_state, physics_threads, pool)
    finally:
        pool.close()
    return run_dir


def branch_run(source: Path, checkpoint: Path, run_dir: Path, iteration: int) -> None:
    """Start `run_dir` as `source` was at the checkpoint of `iteration`: that checkpoint, the
    history up to it, and meta.json's launches; `source` itself is left as it is."""
    shutil.copytree(checkpoint, run_dir / "checkpoints" / checkpoint.name)
    write_text_atomic(run_dir / "checkpoint.json", json.dumps({"latest": checkpoint.name}))
    write_history(run_dir, [row for row in read_history(source) if row["iteration"] < iteration])
    launches = json.loads((source / META_FILE).read_text())["launches"] if (source / META_FILE).is_file() else []
    branched = {"branched_from": {"run": str(source.resolve()), "iteration": iteration}}
    write_text_atomic(run_dir / META_FILE, json.dumps({"launches": launches, **branched}, indent=2))


def saved_config(cfg: TrainConfig, torch_device: str, sources: Mapping[str, str]) -> dict:
    """config.json: the resolved options (the device picked, not "auto") and only the chosen
    algorithm's group (a resumed run's other groups take their defaults, which it never reads),
    and `option_sources`: where each value not left at its default came from."""
    saved = dataclasses.asdict(dataclasses.replace(cfg, device=torch_device.split(":")[0]))
    saved["algos"] = {cfg.algo: saved["algos"][cfg.algo]}
    saved[OPTION_SOURCES] = dict(sorted(sources.items()))
    return saved


def open_pool(cfg: TrainConfig) -> CollectorPool:
    """Local collector processes, or (--ray) a connection to the cluster that will run them,
    checked to have a CPU for each."""
    if cfg.ray is None:
        return ProcessPool()
    from hetlab.runtime.ray.cluster import RayCluster  # the `ray` extra: imported only when asked for

    cluster = RayCluster(cfg.ray)
    try:
        cluster.check_capacity(cfg.collectors)
        from hetlab.runtime.ray.pool import RayPool
    except BaseException:
        cluster.close()
        raise
    return RayPool(cluster, cfg.ray_pool.max_restarts)


def resolved(launch: TrainConfig, given: dict[str, str], device: LearnerDevice,
             resumed: Path | None) -> tuple[TrainConfig, dict[str, str], dict, dict]:
    """The run's config in one step, with where each value came from ({option: source}, for
    config.json), the recipe's values and the CPU defaults it took. A new run: the defaults, under
    the algorithm's CPU-sized ones on a CPU learner, under the task's recipe, under the options given
    (`given`: command line, --config file or python). A resumed run (`resumed`): its own saved values,
    resolved for the device it started on, with the budgets and options a resume may change."""
    from_recipe, scaled = {}, {}
    if resumed is not None:
        cfg = resumed_config(load_run_config(resumed), with_ray_pool_sizes(launch, launch), given)
        sources = read_option_sources(resumed) | {name: f"{origin} (resume)" for name, origin in given.items()}
    cfg = with_run_defaults(launch if resumed is None else cfg)
    if cfg.motion:  # absolute, so that play and export find the clip from anywhere
        cfg = dataclasses.replace(cfg, motion=str(Path(cfg.motion).expanduser().resolve()))
    if resumed is None:
        sources = dict(given)
        cfg, from_recipe = with_recipe(cfg, given, device)
        sources |= dict.fromkeys(from_recipe, "recipe")
        cfg, scaled = scale_defaults(cfg, device, fixed=set(given) | set(from_recipe))
        sources |= dict.fromkeys(scaled, "cpu default")
    return with_ray_pool_sizes(cfg, launch), sources, from_recipe, scaled  # explicit sizes win over scaled ones


def resumed_config(saved: TrainConfig, launch: TrainConfig, given: Mapping[str, str]) -> TrainConfig:
    """The saved config with the launch's LAUNCH_OPTIONS and the RESUMABLE_OPTIONS it gives;
    UserError if it gives any other option a value the run does not have."""
    for option in given:
        value, own = option_value(launch, option), option_value(saved, option)
        if option not in RESUMABLE_OPTIONS and value != own:
            raise UserError(f"--resume continues {launch.resume} with its own options, but --{cli_name(option)} "
                            f"asks for {value!r} where the run has {own!r}; start a new run to change it")
    for option in RESUMABLE_OPTIONS:
        if option in LAUNCH_OPTIONS or option in given:
            saved = with_option(saved, option_path(option), option_value(launch, option))
    return saved


def resumed_threads_line(saved: TrainConfig, cfg: TrainConfig, given: Mapping[str, str]) -> str:
    """The line a resume prints when it runs on other thread counts than the run had without being
    given them (a launch's own are its default, 0 = every core): config.json takes this launch's, and
    a run measured side by side with another would silently oversubscribe the cores."""
    changed = [option for option in THREAD_OPTIONS
               if option not in given and option_value(cfg, option) != option_value(saved, option)]
    if not changed:
        return ""
    now = " ".join(cli_option(option, option_value(cfg, option)) for option in changed)
    had = " ".join(cli_option(option, option_value(saved, option)) for option in changed)
    return f"resumed with {now} (this launch's default; 0 = every core) where the run had {had}: give {had} to keep the run's"


def with_recipe(cfg: TrainConfig, given: Mapping[str, str], device: LearnerDevice) -> tuple[TrainConfig, dict]:
    """(cfg with its task's recipe for the options not given, {option: value} it set); a run that
    names its algorithm, or a task without a recipe, takes none."""
    recipe = RECIPES.get(cfg.task)
    if recipe is None or "algo" in given:
        return cfg, {}
    cfg = dataclasses.replace(cfg, algo=recipe.algo)
    applied = {option: value for option, value in recipe.for_device(device).items() if option not in given}
    for option, value in applied.items():
        cfg = with_option(cfg, option_path(option), value)
    return cfg, {"algo": recipe.algo, **applied}


def recipe_line(task: str, applied: dict) -> str:
    """The line a run prints at its start when it follows its task's recipe."""
    options = " ".join(cli_option(option, value) for option, value in applied.items())
    return (f"{task}'s recipe: {options} (give an option to change it, or --algo to train without the recipe; "
            "`hetlab tasks` lists the recipes)")
