"""`hetlab train`'s options, their validation before any work starts, a run's saved config, and
config files in its layout (`--config`).

The algorithm options come from the algorithm registry: one `--<algo>.*` option group per
registered algorithm (its own `Config`, gathered in `AlgoConfigs`), and `--algo` choosing
among them. Everything that can be wrong with a config is found by `validate`, before a run
directory exists.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import tyro

from hetlab.algos import ALGO_CONFIGS, algorithm_class
from hetlab.algos.contract import Algorithm
from hetlab.errors import UserError
from hetlab.run_config import read_rl_run_config
from hetlab.sim import SIMS
from hetlab.train.loggers import TrackerOptions

# Only what the command line needs is imported here, so that `hetlab train --help` runs without
# torch, numpy or MuJoCo; the methods that need the tasks or the runtime import them when called.
if TYPE_CHECKING:
    import torch

    from hetlab.devices import LearnerDevice
    from hetlab.runtime.replay import ReplayLayout
    from hetlab.runtime.rollout_ring import RolloutLayout


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
class RayPoolConfig:
    """The collector actors of --ray."""

    collectors: int = 0  # collector actors, one CPU each; 0: --collectors
    envs_per_collector: int = 0  # 0: --envs split over the collectors
    max_restarts: int = 3  # lost collectors replaced in all; once they are used up the run stops with a checkpoint


AlgoConfigs = dataclasses.make_dataclass(
    "AlgoConfigs", [(name, config, field(default_factory=config)) for name, config in ALGO_CONFIGS.items()],
    frozen=True,
)
AlgoConfigs.__module__ = __name__  # where pickle finds it
AlgoConfigs.__doc__ = "Every registered algorithm's options; `--algo` chooses the one a run uses."


@dataclass(frozen=True)
class TrainConfig:
    """Train a policy with PPO or APPO (on-policy) or SAC, TD3, FastSAC or FlashSAC (off-policy) on a hetlab task."""

    algo: Literal[tuple(ALGO_CONFIGS)] = "ppo"  # learning algorithm; its options are the --<algo>.* group
    task: str = "go1-joystick-flat"  # task to train (`hetlab tasks` lists them)
    motion: str = ""  # g1-track-motion: the reference clip (.npz) to follow; "" = the task's own
    # physics step in seconds; it must divide the control step and keep the task's keyframe standing; 0 = the task's own
    sim_dt: float = 0.0
    # the task's reward terms' weights, over its own: e.g. --reward-weights alive 0.5 (`hetlab tasks --rewards` lists them)
    reward_weights: dict[str, float] = field(default_factory=dict)
    # the reward terms' parameters over the task's own: e.g. --reward-params tracking_lin_vel.sigma 0.5
    reward_params: dict[str, float] = field(default_factory=dict)
    envs: int = 1024  # in total, split evenly over the collectors
    collectors: int = 1  # collector processes
    sim: Literal[tuple(SIMS)] = "mujoco"  # physics backend
    mode: Literal["sync", "async", "auto"] = "auto"  # auto: the algorithm's (PPO sync, APPO and off-policy async)
    device: str = "auto"  # learner device: auto, cuda, xpu, mps or cpu
    # On a CPU learner, options left at their defaults take the algorithm's CPU-sized values (its
    # `cpu_defaults`, named at the start of the run; an option given its default value counts as left
    # at it; see hetlab.train.device_defaults); off: the accelerator-sized defaults everywhere.
    scale_defaults: bool = True
    threads: int = 0  # physics threads in total, split over the collectors; 0 = the thread budget's
    torch_threads: int = 0  # the learner's torch threads; 0 = the thread budget's
    # collectors, physics and torch threads from `hetlab tune` for this machine and run (measured on first use,
    # then cached), over a --config file's; --collectors, --threads or --torch-threads beside it is refused
    tune: bool = False
    horizon: int = 24  # env steps per rollout (off-policy: per iteration)
    ring_slots: int = 0  # rollout slots in shared memory; 0 = one per collector (sync), two (async)
    max_iterations: int = 1000  # iterations to train; a resumed run counts its earlier ones
    max_seconds: float = 0.0  # wall-clock budget; 0 = none
    # stop once the mean return of the last 100 episodes reaches this; None = never
    target_return: float | None = None
    # stop, with a checkpoint, once a deterministic evaluation (--eval-every) passes the task's "solved"
    # criteria (`hetlab tasks` lists them); a run at a coarser --sim-dt must pass them at the task's own step too
    until_solved: bool = False
    seed: int = 0  # seeds the networks, the envs and the exploration noise
    checkpoint_every: int = 50  # iterations
    # These four, left unset, take RUN_DEFAULTS in a new run and the run's own values in a resumed one.
    keep_checkpoints: int | None = None  # newest checkpoints kept (2); 0 = every one
    eval_every: int | None = None  # iterations between deterministic evaluations (eval/* in the logs); 0 = none (0)
    eval_envs: int | None = None  # envs of the evaluation, one episode each (16)
    # iterations between videos of the policy acting deterministically, rendered headless in a side process
    # (the `video` extra) into RUN_DIR/videos/iteration_<N>.mp4 and sent to the loggers; 0 = none (0)
    video_every: int | None = None
    # where the curves, options and videos go besides TensorBoard (always written): wandb (the `wandb` extra;
    # WANDB_MODE=offline keeps it in RUN_DIR/wandb) or mlflow (the `mlflow` extra; MLFLOW_TRACKING_URI,
    # else RUNS_DIR/mlflow.db); a resumed run continues its wandb or mlflow run
    logger: Literal["tensorboard", "wandb", "mlflow"] = "tensorboard"
    run_name: str = ""  # the run's name in wandb or mlflow; "" = <task>-<algo>/<timestamp>, as the run directory
    tags: tuple[str, ...] = ()  # tags of the run in wandb or mlflow
    group: str = ""  # wandb: the run's group; mlflow: its experiment ("" = <task>-<algo>)
    runs_dir: str = "runs"  # run directories are made under RUNS_DIR/<task>-<algo>/
    resume: str | None = None  # a run directory to continue; its saved config is used
    # with --resume: the checkpoint to continue from (latest, best or a kept iteration); one older than
    # the newest continues in a new run directory, so the run it branches from keeps its whole record
    checkpoint: str = "latest"
    # a file of options to start from: a run's config.json, or TOML in its layout (options by name,
    # [algos.<algo>], [off_policy], [ray_pool]); options given beside it override its values
    config: str | None = None
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)  # SAC, TD3, FastSAC and FlashSAC only
    # Collectors as actors of a Ray cluster (the `ray` extra): local (one started here), auto (the
    # cluster `ray start` made this machine part of) or its address host:port. The learner stays here.
    ray: str | None = None
    ray_pool: Annotated[RayPoolConfig, tyro.conf.arg(name="ray")] = field(default_factory=RayPoolConfig)
    # No prefix of its own: the options stay --ppo.*, --sac.*, ...
    algos: Annotated[AlgoConfigs, tyro.conf.arg(name="")] = field(default_factory=AlgoConfigs)

    @property
    def algorithm(self) -> type[Algorithm]:
        return algorithm_class(self.algo)

    @property
    def algo_config(self):
        return getattr(self.algos, self.algo)

    @property
    def is_off_policy(self) -> bool:
        return self.algorithm.off_policy

    @property
    def resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        return "async" if self.is_off_policy else self.algorithm.default_mode

    def resolved_inference(self, device: LearnerDevice) -> str:
        if self.ray is not None:  # collectors elsewhere cannot reach the learner's inference ring
            return "collector"
        if self.off_policy.inference != "auto":
            return self.off_policy.inference
        return "learner" if device.is_accelerator else "collector"

    @property
    def resolved_ring_slots(self) -> int:
        if self.ring_slots:
            return self.ring_slots
        return self.collectors if self.resolved_mode == "sync" else 2 * self.collectors

    @property
    def tracker(self) -> TrackerOptions:
        return TrackerOptions(logger=self.logger, run_name=self.run_name, tags=self.tags, group=self.group)

    @property
    def task_options(self) -> dict[str, object]:
        """The task's own options the run sets (each task refuses the ones it does not have)."""
        return {name: value for name, value in
                (("motion", self.motion), ("sim_dt", self.sim_dt), ("reward_weights", self.reward_weights),
                 ("reward_params", self.reward_params)) if value}

    def task_kwargs(self, num_envs: int, threads: int, seed: int, **overrides) -> dict[str, object]:
        """`make_task`'s options for `num_envs` envs of the run's task: its backend and own options."""
        return {"num_envs": num_envs, "sim": self.sim, "threads": threads, "seed": seed, **self.task_options, **overrides}

    @property
    def envs_per_collector(self) -> int:
        return self.envs // self.collectors

    @property
    def updates_per_iteration(self) -> int:
        """Off-policy: the updates that `horizon` env steps pay for."""
        return max(1, round(self.horizon * self.algo_config.updates_per_step))

    def build_algorithm(self, device: torch.device) -> Algorithm:
        """The run's algorithm, freshly initialised from its seed."""
        from hetlab.tasks import task_class

        task = task_class(self.task)
        # Only PPO trains on mirror images (--ppo.symmetry), and only it is handed the task's mirrors.
        mirror = {"mirror": task.mirror()} if getattr(self.algo_config, "symmetry", False) else {}
        return self.algorithm(task.obs_sizes, task.action_size, self.algo_config, device, seed=self.seed, **mirror)

    def rollout_layout(self) -> RolloutLayout:
        from hetlab.runtime.rollout_ring import RolloutLayout
        from hetlab.tasks import task_class

        task = task_class(self.task)
        return RolloutLayout(self.horizon, self.envs_per_collector, dict(task.obs_sizes), task.action_size)

    def replay_layout(self) -> ReplayLayout:
        from hetlab.runtime.ray import RELAY_DEPTH
        from hetlab.runtime.replay import ReplayLayout
        from hetlab.tasks import task_class

        task = task_class(self.task)
        return ReplayLayout(self.off_policy.replay_capacity // self.envs, self.collectors, self.envs_per_collector,
                            dict(task.obs_sizes), task.action_size, relay_depth=RELAY_DEPTH if self.ray else 0)


RUN_DEFAULTS = {"keep_checkpoints": 2, "eval_every": 0, "eval_envs": 16, "video_every": 0}


def with_run_defaults(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with RUN_DEFAULTS for the options left unset."""
    return dataclasses.replace(cfg, **{name: value for name, value in RUN_DEFAULTS.items() if getattr(cfg, name) is None})


# config.json's table of where each option's value came from (not an option itself).
OPTION_SOURCES = "option_sources"


def option_path(name: str) -> tuple[str, ...]:
    """The field path of an option's name in TrainConfig: `ppo.gamma` → algos.ppo.gamma, `off_policy.lead`."""
    head, *rest = name.split(".")
    return ("algos", head, *rest) if head in ALGO_CONFIGS else (head, *rest)


def option_value(config, name: str):
    """The value of the option called `name` in a TrainConfig; ValueError if there is none."""
    for field_name in option_path(name):
        if not dataclasses.is_dataclass(config) or field_name not in {f.name for f in dataclasses.fields(config)}:
            raise ValueError(f"{name!r} is not a `hetlab train` option")
        config = getattr(config, field_name)
    return config


def cli_name(name: str) -> str:
    """An option's name as the command line spells it, without the dashes in front: ray_pool.collectors → ray.collectors."""
    head, dot, rest = name.partition(".")
    return ("ray" if head == "ray_pool" and dot else head).replace("_", "-") + dot + rest.replace("_", "-")


def cli_option(name: str, value) -> str:
    """An option and its value as the command line takes them: --envs 512, --ppo.actor-hidden 256 128,
    --reward-weights alive 0.5, and a flag for a bool: --ppo.symmetry, --ppo.no-symmetry."""
    if isinstance(value, bool):
        head, dot, flag = cli_name(name).rpartition(".")
        return f"--{head}{dot}{flag if value else 'no-' + flag}"
    if isinstance(value, dict):
        value = tuple(f"{key} {item}" for key, item in value.items())
    shown = " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    return f"--{cli_name(name)} {shown}"


def option_names(options: dict) -> set[str]:
    """The names of the options a dict of them sets: a config file's layout (algorithms under
    "algos") or `train_policy`'s (each algorithm's dict under its name); off_policy and ray_pool as
    dicts in both."""
    names = set()
    for key, value in options.items():
        if key == "algos" and isinstance(value, dict):
            names |= {f"{algo}.{name}" for algo, group in value.items() for name in group}
        elif isinstance(value, dict) and (key in ALGO_CONFIGS or key in ("off_policy", "ray_pool")):
            names |= {f"{key}.{name}" for name in value}
        elif key != OPTION_SOURCES:
            names.add(key)
    return names


def options_set(cfg: TrainConfig) -> set[str]:
    """The options `cfg` sets away from their defaults, by name."""
    return {name for name, value, default in _options(cfg, TrainConfig(), "") if value != default}


def every_option() -> set[str]:
    """Every option of `hetlab train`, by name."""
    return {name for name, _, _ in _options(TrainConfig(), TrainConfig(), "")}


def _options(config, default, prefix: str):
    """(name, value, default value) of every option of `config`."""
    for option in dataclasses.fields(config):
        value, unset = getattr(config, option.name), getattr(default, option.name)
        if dataclasses.is_dataclass(value):
            # The algorithms' groups have no prefix of their own on the command line (--ppo.*).
            yield from _options(value, unset, "" if option.name == "algos" else f"{prefix}{option.name}.")
        else:
            yield f"{prefix}{option.name}", value, unset


def given_in_options(options: dict) -> dict[str, str]:
    """The options `train_policy(**options)` sets, by name: "python" for its keywords, "config
    file" for those only its `config` file sets."""
    in_file = option_names(read_config_data(Path(options["config"]))) if options.get("config") else set()
    return dict.fromkeys(in_file, "config file") | dict.fromkeys(option_names(options), "python")


def read_option_sources(run_dir: Path) -> dict[str, str]:
    """Where the values of a run's config.json came from; {} for runs from before it was recorded."""
    sources = read_rl_run_config(run_dir).get(OPTION_SOURCES, {})
    return dict(sources) if isinstance(sources, dict) else {}


def with_option(config, path: tuple[str, ...], value):
    """`config` (a frozen dataclass) with the option at `path` (field names, outermost first) set to `value`."""
    name, *rest = path
    return dataclasses.replace(config, **{name: with_option(getattr(config, name), tuple(rest), value) if rest else value})


def with_ray_pool_sizes(cfg: TrainConfig, given: TrainConfig) -> TrainConfig:
    """`cfg` with the collector count and envs that --ray.collectors and --ray.envs-per-collector
    ask for; UserError if they are given without --ray or disagree with --collectors / --envs
    (as given on the command line, `given`)."""
    sizes = cfg.ray_pool
    if given.ray is None and given.ray_pool != RayPoolConfig():
        raise UserError("--ray.* options need --ray (local, auto or a cluster address)")
    if cfg.ray is None:  # a local run, or a Ray run resumed locally with the sizes it has
        return cfg
    if sizes.collectors < 0 or sizes.envs_per_collector < 0 or sizes.max_restarts < 0:
        raise UserError("--ray.collectors, --ray.envs-per-collector and --ray.max-restarts must be ≥ 0")
    collectors = sizes.collectors or cfg.collectors
    if sizes.collectors and given.collectors not in (TrainConfig.collectors, collectors):
        raise UserError(f"--collectors {given.collectors} and --ray.collectors {collectors} disagree; give one")
    envs = collectors * sizes.envs_per_collector if sizes.envs_per_collector else cfg.envs
    if sizes.envs_per_collector and given.envs not in (TrainConfig.envs, envs):
        raise UserError(f"--envs {given.envs} disagrees with --ray.collectors × --ray.envs-per-collector = {envs}; give one")
    return dataclasses.replace(cfg, collectors=collectors, envs=envs)


def validate(cfg: TrainConfig) -> None:
    """UserError for anything in a resolved config (launch.resolved) that would fail later: before a
    run directory or process exists."""
    from hetlab.tasks import make_config

    for name in ("collectors", "horizon", "max_iterations", "checkpoint_every"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.eval_every < 0 or cfg.eval_envs < 1:
        raise UserError(f"--eval-every must be ≥ 0 (0 = no evaluation) and --eval-envs ≥ 1, got {cfg.eval_every} "
                        f"and {cfg.eval_envs}")
    if cfg.keep_checkpoints < 0:
        raise UserError(f"--keep-checkpoints must be ≥ 0 (0 keeps every one), got {cfg.keep_checkpoints}")
    if cfg.video_every < 0:
        raise UserError(f"--video-every must be ≥ 0 (0 = no videos), got {cfg.video_every}")
    if cfg.max_seconds < 0:
        raise UserError(f"--max-seconds must be ≥ 0 (0 = no limit), got {cfg.max_seconds}")
    if cfg.until_solved:
        from hetlab.tasks import task_class

        if not task_class(cfg.task).solved:
            raise UserError(f"--until-solved: {cfg.task} has no \"solved\" criteria to stop at; use --target-return "
                            "or a budget instead")
        if not cfg.eval_every:
            raise UserError("--until-solved stops when an evaluation passes the task's criteria: give --eval-every N "
                            "(and --eval-envs, 128 or more for a result worth quoting)")
    if cfg.seed < 0:  # numpy's seed sequences take non-negative integers only
        raise UserError(f"--seed must be ≥ 0, got {cfg.seed}")
    if cfg.envs % cfg.collectors:
        raise UserError(f"--envs {cfg.envs} must split evenly over --collectors {cfg.collectors}")
    make_config(cfg.task, **cfg.task_kwargs(cfg.envs_per_collector, cfg.threads, cfg.seed))
    if cfg.is_off_policy:
        _validate_off_policy(cfg)
        return
    if getattr(cfg.algo_config, "symmetry", False):
        from hetlab.tasks import task_class

        if task_class(cfg.task).mirror() is None:
            raise UserError(f"--{cfg.algo}.symmetry: {cfg.task} is not the same in a mirror (it declares no mirrors); "
                            "drop the option")
    minibatches = cfg.algo_config.num_mini_batches
    if (cfg.horizon * cfg.envs) % minibatches:
        raise UserError(
            f"horizon × envs = {cfg.horizon * cfg.envs} samples do not split into {minibatches} minibatches; "
            "change --envs, --horizon or the minibatch count"
        )
    if cfg.ring_slots and cfg.ring_slots < cfg.collectors:
        raise UserError(f"--ring-slots {cfg.ring_slots} must be at least --collectors {cfg.collectors}")
    cfg.rollout_layout().requirement(cfg.resolved_ring_slots).check()


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
    if cfg.ray is not None and cfg.off_policy.inference == "learner":
        raise UserError("--off-policy.inference learner serves collectors on the learner's machine only; with --ray "
                        "each collector runs its own copy of the policy: use collector or auto")
    if cfg.off_policy.weight_sync_every < 0:
        raise UserError("--off-policy.weight-sync-every must be ≥ 0")
    layout = cfg.replay_layout()
    if algo.learning_starts < 1 or algo.learning_starts + cfg.off_policy.lead >= layout.rows - layout.guard_rows:
        raise UserError(
            f"learning_starts must be at least 1 and, with the lead, below the {layout.rows - layout.guard_rows} "
            "steps per env the replay buffer keeps; raise --off-policy.replay-capacity or lower learning_starts"
        )
    layout.requirement.check()


def config_from_options(options: dict) -> TrainConfig:
    """A TrainConfig from keyword options (the Python API): the command line's names with
    underscores, an algorithm's options as a dict under its name, `off_policy` and `ray_pool` as
    dicts too; `config` (a file, as --config) gives the values the others override. UserError
    naming an option that does not exist."""
    options = dict(options)
    base = read_config_file(Path(options["config"])) if options.get("config") else TrainConfig()
    groups = {name: options.pop(name) for name in ALGO_CONFIGS if name in options}
    try:
        for name in ("off_policy", "ray_pool"):
            if isinstance(options.get(name), dict):
                options[name] = dataclasses.replace(getattr(base, name), **options[name])
        algos = AlgoConfigs(**{name: dataclasses.replace(getattr(base.algos, name), **groups.get(name, {}))
                               for name in ALGO_CONFIGS})
        return dataclasses.replace(base, **options, algos=algos)
    except TypeError as e:  # an unknown keyword: Python's message names it
        raise UserError(f"{e}; the options are `hetlab train --help`'s, with underscores") from e


_FIX_CONFIG_FILE = "fix it, or pass a run's config.json"


def read_config_file(path: Path) -> TrainConfig:
    """The options of a config file (.json: a run's config.json; .toml: the same layout)."""
    return config_from_saved(read_config_data(path), path, _FIX_CONFIG_FILE)


def read_config_data(path: Path) -> dict:
    """A config file's options as it lays them out, without `resume`: a file describes a run to
    start, and which run to continue, if any, is the command line's choice."""
    fix = _FIX_CONFIG_FILE
    if path.suffix not in (".json", ".toml"):
        raise UserError(f"--config takes a .json file (a run's config.json) or a .toml one, got {path}")
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"--config {path}: cannot read it ({e.strerror})") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except ValueError as e:  # JSONDecodeError and TOMLDecodeError both are
        raise UserError(f"--config {path} is not valid {path.suffix[1:].upper()} ({e}); {fix}") from e
    if not isinstance(data, dict):
        raise UserError(f"--config {path} holds a JSON {type(data).__name__}, not options by name; {fix}")
    data.pop("resume", None)
    return data


def load_run_config(run_dir: Path) -> TrainConfig:
    """The resolved config a run directory was trained with."""
    return config_from_saved(read_rl_run_config(run_dir), Path(run_dir) / "config.json",
                             "restore it, or start a new run")


def config_from_saved(data: dict, source: Path, fix: str) -> TrainConfig:
    """A TrainConfig from config.json's layout (options by name; an algorithm's under "algos", its
    name; "off_policy" and "ray_pool" as tables); UserError naming `source` and saying `fix`."""
    data = dict(data)
    data.pop(OPTION_SOURCES, None)
    try:
        saved = data.pop("algos", {})
        # Runs from before an algorithm existed lack its section.
        data["algos"] = AlgoConfigs(**{name: ALGO_CONFIGS[name](**options) for name, options in saved.items()})
        data["off_policy"] = OffPolicyConfig(**data.get("off_policy", {}))
        data["ray_pool"] = RayPoolConfig(**data.get("ray_pool", {}))  # runs from before Ray lack it
        data["tags"] = tuple(data.get("tags", ()))  # JSON's list, as the command line gives it
        return TrainConfig(**data)
    except (TypeError, KeyError, AttributeError) as e:
        raise UserError(f"{source} does not hold the options of `hetlab train` ({e}); {fix}") from e
