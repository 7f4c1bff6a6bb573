"""`hetlab tune`: measure this machine's stages and pick how a run spreads over its cores.

What it picks leaves the algorithm and its data unchanged: how many collector processes step the
run's envs (each its share), the physics threads each gets, and the learner's torch threads. The
envs, the algorithm and its options, the mode and the precision stay the run's own (a recipe's
among them). Each collector seeds its envs and its exploration noise from the run's seed and its
index, so another collector count draws other random streams: the same algorithm on the same batch
sizes, not the same trajectory bit for bit. What async collection and bf16 would give is predicted
and reported, for the user to choose, since each changes what the run learns.

1. The machine: its cores, CPU, ISA and learner device (they and the run's shape key the cache).
2. The stages, each alone in this process: a collector's step (the task with the actor's
   inference) at each envs-per-collector and threads-per-collector of a candidate; the learner's
   update on a batch of the run's shape at each torch-thread count, in the run's own precision and,
   where the learner has it natively and the run does not use it, bf16.
3. The model: a sync iteration takes the rollout (horizon × envs at the collectors' summed rate),
   then the update; async takes the slower of the two, the cores split between them.
4. The check: the best predicted setting and the hand defaults (the next best where they are the
   same) each train end to end for a few seconds (`hetlab train` in a subprocess); the faster
   measured one is chosen and written as TOML that `--config` takes.
5. The scaling model (scaling.py), fitted to the stages and the checks, for `--explain`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch

from hetlab.cpu_isa import host_cpu
from hetlab.devices import LearnerDevice, cpu_count, thread_budget
from hetlab.errors import UserError
from hetlab.figures import FIGURES_ENV
from hetlab.files import write_text_atomic
from hetlab.run_history import read_history
from hetlab.train.scaling import ScalingModel, fit_scaling

DEFAULT_SECONDS = 90.0  # of probing, `hetlab train --tune`'s on first use
MIN_SECONDS = 20.0  # below this the end-to-end checks see too few iterations to compare
# What sets a run's speed besides the tuned options: with the machine and the versions, the cache key.
SHAPE_OPTIONS = ("task", "motion", "sim_dt", "sim", "envs", "horizon", "ring_slots", "algo")
ALGO_SHAPE_OPTIONS = ("actor_hidden", "critic_hidden", "num_learning_epochs", "num_mini_batches", "bf16",
                      "normalize_obs")
TUNED_OPTIONS = ("collectors", "threads", "torch_threads")


@dataclass(frozen=True)
class Setting:
    """How a run spreads over the cores: the options `hetlab tune` writes."""

    collectors: int
    physics_threads: int  # per collector
    torch_threads: int

    @property
    def options(self) -> dict[str, int]:
        """As `hetlab train` options (`threads` counts the physics threads of all collectors)."""
        return {"collectors": self.collectors, "threads": self.collectors * self.physics_threads,
                "torch_threads": self.torch_threads}

    def __str__(self) -> str:
        return (f"{self.collectors} collector{'s' * (self.collectors > 1)} × {self.physics_threads} physics "
                f"thread{'s' * (self.physics_threads > 1)}, {self.torch_threads} torch")


@dataclass(frozen=True)
class StageRates:
    """What the probes measured: a collector's env-steps/s by (envs per collector, physics threads),
    and the learner's seconds per update by (torch threads, precision: "own" is the run's, "bf16")."""

    collector: dict[tuple[int, int], float]
    update_seconds: dict[tuple[int, str], float]


def candidates(envs: int, cores: int, mode: str, accelerator: bool) -> list[Setting]:
    """Every setting worth predicting: collector counts that split `envs` evenly, physics and torch
    threads, each count a power of two or all that is left, within the cores. Sync: the learner has
    the cores while the collectors wait, though small networks may update faster on fewer threads;
    a learner on an accelerator only launches kernels, on one thread. Async on a CPU learner:
    physics and torch threads share the cores."""
    settings = []
    for collectors in _counts(cores):
        if envs % collectors:
            continue
        for threads in _counts(cores // collectors):
            if accelerator:
                settings.append(Setting(collectors, threads, 1))
            elif mode == "sync":
                settings += [Setting(collectors, threads, torch_threads) for torch_threads in _counts(cores)]
            elif cores > collectors * threads:
                settings += [Setting(collectors, threads, torch_threads)
                             for torch_threads in _counts(cores - collectors * threads)]
    return settings


def _counts(limit: int) -> list[int]:
    """1, 2, 4, … up to `limit`, and `limit` itself."""
    return sorted({*(2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit), limit})


def predicted_rate(setting: Setting, rates: StageRates, envs: int, horizon: int, mode: str,
                   precision: str = "own") -> float:
    """Env-steps/s the model predicts for `setting`: the collectors' rates summed, and the update."""
    collect = setting.collectors * rates.collector[(envs // setting.collectors, setting.physics_threads)]
    update = rates.update_seconds[(setting.torch_threads, precision)]
    samples = envs * horizon
    if mode == "sync":
        return samples / (samples / collect + update)
    return min(collect, samples / update)


def hand_defaults(device: LearnerDevice, mode: str) -> Setting:
    """What `hetlab train` does without tuning: one collector, the thread budget's split."""
    budget = thread_budget(device, overlap=mode != "sync")
    return Setting(1, budget.physics, budget.torch)


def probe_collector(cfg, envs: int, threads: int, seconds: float) -> float:
    """Env-steps/s of one collector stepping `envs` envs of the run's task on `threads` physics
    threads, with the run's actor choosing its actions as a collector does."""
    from hetlab.tasks import make_task

    torch.set_num_threads(threads)  # as a collector process sets it
    task = make_task(cfg.task, **cfg.task_kwargs(envs, threads, cfg.seed))
    actor = cfg.build_algorithm(torch.device("cpu")).actor
    obs = task.reset()
    steps, start = 0, time.perf_counter()
    while steps < 3 * envs or time.perf_counter() - start < seconds:
        with torch.no_grad():
            actions = actor.act(torch.from_numpy(obs["policy"]))[0]
        obs, *_ = task.step(actions.numpy())
        steps += envs
    return steps / (time.perf_counter() - start)


def probe_update(cfg, device: LearnerDevice, torch_threads: int, precision: str, seconds: float) -> float:
    """Median seconds of one update of the run's algorithm, in the run's own precision or bf16, on a
    batch of the run's shape (random values: the update's cost does not depend on them)."""
    config = cfg
    if precision == "bf16":
        config = dataclasses.replace(cfg, algos=dataclasses.replace(
            cfg.algos, **{cfg.algo: dataclasses.replace(cfg.algo_config, bf16=True)}))
    torch.set_num_threads(torch_threads)
    algo = config.build_algorithm(torch.device(device.torch_device))
    layout = dataclasses.replace(cfg.rollout_layout(), num_envs=cfg.envs)
    generator = torch.Generator().manual_seed(0)
    batch = {name: (torch.randn(field.shape, generator=generator) if field.dtype.kind == "f"
                    else torch.zeros(field.shape or (cfg.envs,), dtype=torch.int64))
             for name, field in layout.fields.items()}
    batch.update(terminated=torch.zeros_like(batch["terminated"]), truncated=torch.zeros_like(batch["truncated"]))
    batch = {name: value.to(device.torch_device) for name, value in batch.items()}
    algo.update(batch)  # first-call allocations out of the timing
    times, start = [], time.perf_counter()
    while len(times) < 2 or time.perf_counter() - start < seconds:
        began = time.perf_counter()
        algo.update(batch)  # its metrics are floats: the device has finished when it returns
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure_end_to_end(cfg, device: LearnerDevice, setting: Setting, seconds: float, workdir: Path) -> float:
    """Env-steps/s of `hetlab train` with `setting` for `seconds`, in a subprocess: the median of its
    iterations' rates after the first two (the collectors' start and first-call costs). The check
    logs nowhere but its own TensorBoard files and stops only at its time budget."""
    from hetlab.train.launch import saved_config

    config = dataclasses.replace(cfg, **setting.options, tune=False, logger="tensorboard", run_name="", tags=(),
                                 group="", target_return=None)
    runs = workdir / f"{setting.collectors}-{setting.physics_threads}-{setting.torch_threads}"
    runs.mkdir()
    config_file = runs / "config.json"
    config_file.write_text(json.dumps(saved_config(config, device.torch_device, {}), indent=2))
    command = [sys.executable, "-m", "hetlab.cli", "train", "--config", str(config_file), "--runs-dir", str(runs),
               "--max-seconds", f"{seconds:.1f}", "--max-iterations", "1000000", "--eval-every", "0",
               "--video-every", "0", "--no-until-solved", "--checkpoint-every", "1000000", "--keep-checkpoints", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, FIGURES_ENV: "0"})
    if done.returncode:
        raise RuntimeError(f"hetlab train with {setting} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    rows = read_history(Path(done.stdout.splitlines()[0]))
    steady = rows[2:] if len(rows) > 3 else rows[1:]
    if not steady:
        raise UserError(f"hetlab tune: {setting} finished {len(rows)} iteration(s) in {seconds:.0f} s, too few to "
                        "measure; give more --seconds")
    return statistics.median(row["iteration_env_steps_per_s"] for row in steady)


@dataclass(frozen=True)
class TuneResult:
    chosen: Setting
    defaults: Setting
    predicted: dict[Setting, float]  # every candidate
    measured: dict[Setting, float]  # those checked end to end
    mode: str
    # What the run's own choices leave out: the best predicted rate with async collection and with
    # bf16, where the learner has it (each changes what the run learns).
    alternatives: dict[str, float]
    machine: dict[str, object]
    seconds: float  # the probing took
    scaling: ScalingModel  # the stages and checks extrapolated to other core counts

    def toml(self, cfg) -> str:
        lines = [f"# hetlab tune: {cfg.task}, {cfg.algo}, {cfg.envs} envs, {self.mode}, on {self.machine['cpu']} "
                 f"({self.machine['cores']} cores, learner {self.machine['learner']})",
                 f"# measured {self.measured[self.chosen]:,.0f} env-steps/s (hand defaults: "
                 f"{self.measured[self.defaults]:,.0f}); predicted {self.predicted[self.chosen]:,.0f}"]
        lines += [f"{name} = {value}" for name, value in self.chosen.options.items()]
        return "\n".join(lines) + "\n"


def machine_description(device: LearnerDevice) -> dict[str, object]:
    cpu = host_cpu()
    return {"cpu": cpu.model, "arch": cpu.arch, "isa": sorted(cpu.flags), "cores": cpu_count(),
            "learner": device.name, "learner_kind": device.kind}


def cache_path(cfg, device: LearnerDevice) -> Path:
    """Where the tuned setting of a run of `cfg`'s shape on this machine is kept: tune/ under
    $HETLAB_CACHE, else $XDG_CACHE_HOME/hetlab, else ~/.cache/hetlab."""
    import mujoco

    import hetlab

    shape = {name: getattr(cfg, name) for name in SHAPE_OPTIONS}
    shape |= {"mode": cfg.resolved_mode, **{name: getattr(cfg.algo_config, name, None) for name in ALGO_SHAPE_OPTIONS}}
    versions = {"hetlab": hetlab.__version__, "torch": torch.__version__, "mujoco": mujoco.__version__}
    key = json.dumps({"machine": machine_description(device), "versions": versions, "run": shape}, sort_keys=True,
                     default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = os.environ.get("HETLAB_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hetlab"
    return Path(root) / "tune" / f"{cfg.task}-{cfg.algo}-{digest}.toml"


def check_tunable(cfg) -> None:
    """UserError, before any probing, for a run this tuning cannot measure."""
    if cfg.is_off_policy:
        raise UserError(f"hetlab tune measures on-policy runs (ppo, appo); tuning --algo {cfg.algo} is not "
                        "available: set --collectors, --threads and --torch-threads by hand")
    if getattr(cfg.algo_config, "compile", False):  # each probe's new algorithm would compile anew
        raise UserError(f"--{cfg.algo}.compile: hetlab tune times eager updates; tuning a compiled run is not "
                        "available: tune without it, then set --collectors, --threads and --torch-threads by hand")
    if cfg.ray is not None:
        raise UserError("hetlab tune measures this machine's cores; a --ray run's collectors are elsewhere")
    if cfg.sim != "mujoco":  # MotrixSim sizes one thread pool per process: probes in one process cannot vary it
        raise UserError(f"hetlab tune measures MuJoCo's physics threads; tuning --sim {cfg.sim} is not available: "
                        "set --collectors, --threads and --torch-threads by hand")


def tune(cfg, device: LearnerDevice, seconds: float, progress=print) -> TuneResult:
    """Measure, predict, check and choose for the resolved run config `cfg` (see the module docstring)."""
    if seconds < MIN_SECONDS:
        raise UserError(f"--seconds {seconds:g}: tuning needs at least {MIN_SECONDS:g} s to compare settings end "
                        "to end; give more")
    check_tunable(cfg)
    start = time.perf_counter()
    mode, cores = cfg.resolved_mode, cpu_count()
    settings = candidates(cfg.envs, cores, mode, device.is_accelerator)
    alternative_mode = "async" if mode == "sync" else "sync"
    others = candidates(cfg.envs, cores, alternative_mode, device.is_accelerator)
    defaults = hand_defaults(device, mode)
    bf16_possible = device.bf16 and not getattr(cfg.algo_config, "bf16", True)  # the algorithm has it, off
    precisions = ("own", "bf16") if bf16_possible else ("own",)
    collector_keys = sorted({(cfg.envs // s.collectors, s.physics_threads) for s in settings + others + [defaults]})
    update_keys = sorted({(s.torch_threads, p) for s in settings + others + [defaults] for p in precisions})
    probe_budget = 0.4 * seconds / (len(collector_keys) + len(update_keys))
    threads_before = torch.get_num_threads()
    try:
        collector = {}
        for envs, threads in collector_keys:
            collector[(envs, threads)] = probe_collector(cfg, envs, threads, probe_budget)
            progress(f"collector, {envs} envs on {threads} physics thread(s): {collector[(envs, threads)]:,.0f} env-steps/s")
        update_seconds = {}
        for threads, precision in update_keys:
            update_seconds[(threads, precision)] = probe_update(cfg, device, threads, precision, probe_budget)
            progress(f"update, {threads} torch thread(s), {precision} precision: {1000 * update_seconds[(threads, precision)]:,.0f} ms")
    finally:
        torch.set_num_threads(threads_before)
    rates = StageRates(collector, update_seconds)
    predicted = {s: predicted_rate(s, rates, cfg.envs, cfg.horizon, mode) for s in settings + [defaults]}
    ranked = sorted(settings, key=predicted.get, reverse=True)
    checked = [defaults] + [s for s in ranked if s != defaults][:1]
    measured = {}
    with tempfile.TemporaryDirectory(prefix="hetlab-tune-") as workdir:
        # Each check's process spends seconds importing before its --max-seconds starts, and starting
        # its collectors within it.
        share = (seconds - (time.perf_counter() - start)) / len(checked)
        for setting in checked:
            measured[setting] = measure_end_to_end(cfg, device, setting, max(5.0, 0.6 * share), Path(workdir))
            progress(f"end to end, {setting}: {measured[setting]:,.0f} env-steps/s")
    alternatives = {}
    if others:  # async needs a core for each side
        alternatives[f"--mode {alternative_mode}"] = max(
            predicted_rate(s, rates, cfg.envs, cfg.horizon, alternative_mode) for s in others)
    if "bf16" in precisions:
        alternatives[f"--{cfg.algo}.bf16"] = max(predicted_rate(s, rates, cfg.envs, cfg.horizon, mode, "bf16")
                                                 for s in settings + [defaults])
    return TuneResult(chosen=max(measured, key=measured.get), defaults=defaults, predicted=predicted,
                      measured=measured, mode=mode, alternatives=alternatives,
                      machine=machine_description(device), seconds=time.perf_counter() - start,
                      scaling=fit_scaling(collector, update_seconds, predicted, measured, cfg.envs, cfg.horizon))


def write_tuned(path: Path, result: TuneResult, cfg) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, result.toml(cfg))


def read_tuned(path: Path) -> dict[str, int]:
    """The options a tuned TOML sets."""
    return {name: value for name, value in tomllib.loads(path.read_text()).items() if name in TUNED_OPTIONS}


def with_tuned_setting(cfg, device: LearnerDevice, progress=print):
    """(`cfg` with the tuned setting, {option: value} it set, the file it came from): the cached one
    for this machine and the run's shape, else tuned now (DEFAULT_SECONDS) and cached. The setting
    replaces what a --config file gave for those options; the command line gives none of them
    beside --tune (train refuses that)."""
    path = cache_path(cfg, device)
    check_tunable(cfg)
    if path.is_file():
        progress(f"tuned setting for this machine and run: {path} (`hetlab tune` measures it again)")
    else:
        progress(f"tuning the run's collectors and threads for this machine (~{DEFAULT_SECONDS:.0f} s, once; "
                 f"cached in {path})")
        write_tuned(path, tune(cfg, device, DEFAULT_SECONDS, progress), cfg)
    options = read_tuned(path)
    return dataclasses.replace(cfg, **options), options, path


def run_to_tune(task: str, algo: str, envs: int, device_request: str):
    """(resolved config, learner device) of `hetlab train --task TASK [--algo A] [--envs N]` here:
    the recipe's and the CPU-sized values where those are not given, as the run would take them."""
    from hetlab.devices import pick_device
    from hetlab.train.config import TrainConfig, validate
    from hetlab.train.launch import resolved

    given = {"task": task, **({"algo": algo} if algo else {}), **({"envs": envs} if envs else {})}
    device = pick_device(device_request)
    cfg = resolved(TrainConfig(**given, device=device_request), dict.fromkeys(given, "command line"), device, None)[0]
    validate(cfg)
    return cfg, device
