"""`hetlab <command>`: one entry point, tyro subcommands over the config dataclasses."""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import mujoco
import numpy as np
import torch
import tyro
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table
from tyro.extras import SubcommandApp

import hetlab
# tyro reads these configs' fields to build the `hetlab aloha` commands.
from hetlab.imitation.evaluate import EvalConfig
from hetlab.aloha.record import RecordConfig
from hetlab.devices import DEVICE_CHOICES, pick_device, thread_budget
from hetlab.errors import UserError
from hetlab.extras import installed_extras
from hetlab.tasks.throughput import SimBenchConfig, run_sim_bench
from hetlab.offload.quantise import QuantiseConfig
from hetlab.imitation.study import StudyConfig
from hetlab.seeds import parse_seeds
from hetlab.tasks import TASKS, make_config

app = SubcommandApp()
bench = SubcommandApp()
aloha = SubcommandApp()
offload = SubcommandApp()
console = Console()
# Progress and tables go to stderr when stdout must hold JSON alone.
err_console = Console(stderr=True)


def _print_json(payload: dict | list) -> None:
    print(json.dumps(payload, indent=2))


@dataclass(frozen=True)
class InfoConfig:
    device: str = "auto"  # learner device: auto, cuda, xpu, mps or cpu
    threads: int = 0  # physics threads to budget for; 0 = every core
    ray: str | None = None  # also show a Ray cluster's nodes and resources: local, auto or host:port
    json: bool = False  # print the result as JSON


@app.command(name="info")
def info(cfg: Annotated[InfoConfig, tyro.conf.arg(name="")] = InfoConfig()) -> None:
    """Learner device and its capabilities, CPU thread budget, versions, installed extras and (--ray) a Ray cluster."""
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
        _print_json(report)
        return
    table = Table(title="hetlab info", show_header=False)
    table.add_row("learner device", f"{device.torch_device} ({device.kind}: {device.name})")
    table.add_row("capabilities", ", ".join(f"{k}={'yes' if getattr(device, k) else 'no'}" for k in ("pinned_memory", "async_copy", "bf16")))
    table.add_row("CPU cores", str(budget.cores))
    table.add_row("thread budget", f"physics {budget.physics}, torch {budget.torch}")
    table.add_row("versions", ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    table.add_row("extras", ", ".join(f"{k} {'installed' if ok else 'missing'}" for k, ok in report["extras"].items()))
    console.print(table)
    if "ray_nodes" in report:
        nodes = Table(title=f"Ray cluster at {cfg.ray}")
        for column in ("node", "address", "CPUs", "GPUs", "memory (GiB)", "learner"):
            nodes.add_column(column)
        for node in report["ray_nodes"]:
            nodes.add_row(node["node"][:12], node["address"], f"{node['cpus']:g}", f"{node['gpus']:g}",
                          f"{node['memory_gib']:g}", "here" if node["learner"] else "")
        console.print(nodes)


@dataclass(frozen=True)
class TasksConfig:
    json: bool = False  # print the result as JSON


@app.command(name="tasks")
def tasks(cfg: Annotated[TasksConfig, tyro.conf.arg(name="")] = TasksConfig()) -> None:
    """The registered tasks with their observation and action sizes."""
    rows = [
        {
            "name": name,
            "obs": dict(cls.obs_sizes),
            "actions": cls.action_size,
            "control_hz": round(1.0 / cls.control_dt, 3),
            "episode_seconds": cls.episode_seconds,
        }
        for name, cls in sorted(TASKS.items())
    ]
    if cfg.json:
        _print_json(rows)
        return
    table = Table(title="hetlab tasks")
    table.add_column("task", no_wrap=True)
    for column in ("policy obs", "critic obs", "actions", "control Hz", "episode s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["name"], str(row["obs"]["policy"]), str(row["obs"]["critic"]), str(row["actions"]),
            f"{row['control_hz']:g}", f"{row['episode_seconds']:g}",
        )
    console.print(table)


@bench.command(name="sim")
def bench_sim(cfg: Annotated[SimBenchConfig, tyro.conf.arg(name="")] = SimBenchConfig()) -> None:
    """Physics substeps/s vs task env-steps/s, the task_efficiency between them, and the physics share of the task loop."""
    # Bad input fails before any work; with --sim all, a backend that cannot run the task is named in the result.
    make_config(cfg.task, num_envs=cfg.envs, sim="mujoco" if cfg.sim == "all" else cfg.sim, threads=cfg.threads)
    with Progress(console=err_console, transient=True) as progress:
        result = run_sim_bench(cfg, progress)
    if cfg.json:
        _print_json(result)
        return
    if cfg.sim != "all":
        console.print(_sim_bench_table(result))
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
    console.print(table)
    for name, reason in result["unavailable"].items():
        console.print(f"{name}: not measured, {reason}")


_SIM_BENCH_ROWS = [("physics substeps/s", "physics_steps_per_s", ",.0f"), ("env steps/s", "env_steps_per_s", ",.0f"),
                   ("task_efficiency", "task_efficiency", ".3f"), ("physics share of the task loop", "physics_share", ".3f")]


def _sim_bench_table(result: dict) -> Table:
    table = Table(title=f"bench sim: {result['task']} on {result['sim']}, {result['envs']} envs, "
                        f"{result['threads']} threads")
    table.add_column("metric")
    table.add_column("median", justify="right")
    table.add_column(f"per round ({result['rounds']})", justify="right")
    for label, key, form in _SIM_BENCH_ROWS:
        table.add_row(label, format(result[key], form), " ".join(format(v, form) for v in result["per_round"][key]))
    return table


def train_command(args: list[str]):
    """`hetlab train` for the command line `args`: only the chosen algorithm's options, defaults from --config."""
    from hetlab.train.command_line import as_train_config, command_type

    command, defaults = command_type(args)

    def train(cfg=defaults) -> None:
        """Train a policy: CPU collectors feed a learner on the best device (prints the run directory first)."""
        from hetlab.train.launch import train as run_training

        run_training(as_train_config(cfg))

    train.__annotations__ = {"cfg": Annotated[command, tyro.conf.arg(name="")], "return": None}
    return train


app.command(train_command([]), name="train")


@dataclass(frozen=True)
class ExportConfig:
    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]  # written by `hetlab train`
    out: Path | None = None  # default: RUN_DIR/policy.onnx
    # an iteration of a kept checkpoint (RUN_DIR/checkpoints), best (the best evaluation, --eval-every) or latest
    checkpoint: str = "latest"


@app.command(name="export")
def export(cfg: Annotated[ExportConfig, tyro.conf.arg(name="")]) -> None:
    """Export a run's policy to ONNX (input "obs", output "actions"), verified with ONNX Runtime."""
    from hetlab.deploy.export import TOLERANCE, export_onnx

    exported = export_onnx(cfg.run_dir, cfg.out, cfg.checkpoint)
    print(exported.path)
    console.print(f"checked with ONNX Runtime on {exported.real_observations} observations from the task and "
                  f"{exported.random_observations} around them: max |Δ action| = {exported.max_error:.2g} "
                  f"(tolerance {TOLERANCE:g}); metadata: {', '.join(exported.metadata)}", highlight=False, soft_wrap=True)


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


@app.command(name="play")
def play(cfg: Annotated[PlayConfig, tyro.conf.arg(name="")]) -> None:
    """Record an mp4 of a run's policy acting deterministically in one env (headless GL)."""
    from hetlab.deploy.play import play as record

    result = record(cfg.run_dir, cfg.video or cfg.run_dir / "play.mp4", cfg.seconds, cfg.width, cfg.height, cfg.seed,
                    cfg.checkpoint)
    if cfg.json:
        _print_json(result)
        return
    console.print(f"{result['video']}: {result['frames']} frames at {result['fps']:g} fps", highlight=False, soft_wrap=True)
    table = Table()
    for column in ("episode", "return", "length", "ended"):
        table.add_column(column, justify="right")
    for index, episode in enumerate(result["episodes"]):
        table.add_row(str(index), f"{episode['return']:.3f}", str(episode["length"]), episode["ended"])
    console.print(table)


@dataclass(frozen=True)
class AlohaExpertConfig:
    seeds: str = "0-99"  # episode seeds: A-B (inclusive), N, or a list such as 0-3,7
    workers: int = 1  # episodes run at once, one process each
    json: bool = False  # print the result as JSON


@aloha.command(name="expert")
def aloha_expert(cfg: Annotated[AlohaExpertConfig, tyro.conf.arg(name="")] = AlohaExpertConfig()) -> None:
    """Run the scripted IK expert on the ALOHA cube transfer and report how often the left arm ends up holding the cube."""
    from hetlab.aloha.expert import run_expert

    seeds = parse_seeds(cfg.seeds)
    with Progress(console=err_console, transient=True) as progress:
        result = run_expert(seeds, cfg.workers, progress)
    if cfg.json:
        _print_json(result)
        return
    console.print(f"expert: {result['successes']}/{result['episodes']} episodes succeeded "
                  f"({100 * result['success_rate']:.1f} %)", highlight=False)
    if result["failed_seeds"]:
        console.print(f"failed seeds: {' '.join(map(str, result['failed_seeds']))}", highlight=False, soft_wrap=True)


@aloha.command(name="record")
def aloha_record(cfg: Annotated[RecordConfig, tyro.conf.arg(name="")]) -> None:
    """Record the scripted expert's episodes as a LeRobot v3.0 dataset (continues an existing one at --out)."""
    from hetlab.aloha.record import record

    result = record(cfg)
    per_episode = f", {result['seconds_per_episode']:.1f} s each" if result["written"] else ""
    console.print(f"{result['out']}: {result['episodes']} episodes ({result['written']} new in "
                  f"{result['seconds']:.0f} s{per_episode})", highlight=False, soft_wrap=True)
    if result["failed_seeds"]:
        console.print(f"skipped seeds the expert failed on: {' '.join(map(str, result['failed_seeds']))}",
                      highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class AlohaParamsConfig:
    preset: Literal["paper", "cpu", "tiny"] = "paper"  # whose model: paper = the study's 51.5 M, cpu = narrowed
    json: bool = False  # print the result as JSON


@aloha.command(name="params")
def aloha_params(cfg: Annotated[AlohaParamsConfig, tyro.conf.arg(name="")] = AlohaParamsConfig()) -> None:
    """Parameter counts of the AR-Actor split as the study's Table I: backbone, projection, encoder, action expert."""
    from hetlab.imitation.phase_a import PRESETS
    from hetlab.policies.ar_actor import ARActor, encoder_grid, parameter_split

    preset = PRESETS[cfg.preset]
    split = parameter_split(ARActor(preset.model))
    if cfg.json:
        _print_json(split)
        return
    rows, cols = encoder_grid(preset.height, preset.width)
    table = Table("part", "parameters", "share", title=f"AR-Actor ({cfg.preset} preset: {preset.height}×{preset.width} "
                  f"images → 1 state + {rows}×{cols} image tokens)")
    labels = {"backbone": "ResNet18 backbone", "projection": "image + state projection",
              "encoder": "Transformer encoder layers", "action_expert": "action expert", "total": "total"}
    for key, label in labels.items():
        table.add_row(label, f"{split[key] / 1e6:.2f} M", f"{100 * split[key] / split['total']:.1f} %")
    console.print(table)


@dataclass(frozen=True, kw_only=True)
class AlohaTrainConfig:
    """Options of both phases; each phase reads its own (unset ones take that phase's default)."""

    phase: Literal["A", "B"] = "A"  # A: the whole policy; B: a new action expert on the frozen encoder
    # Phase A
    dataset: Path | None = None  # LeRobot v3 cube-transfer dataset (`hetlab aloha record`)
    # paper: 480×640, 200k steps (GPU); cpu (the default for a new run): 120×160, ≤ 2 h on 2 cores
    preset: Literal["paper", "cpu", "tiny"] | None = None
    imagenet_weights: Path | None = None  # torchvision resnet18 weights for the backbone
    image_shift: int | None = None  # augmentation: images moved by up to ± this many pixels; default: the preset's
    lr_decay: float | None = None  # last share of the steps with a linearly falling learning rate; default: the preset's
    loader_workers: int = 0  # processes decoding video; 0 = in the training process (~1 ms a frame)
    # newest checkpoints kept; 0 = every one (to evaluate along the way); unset: 2, or a resumed run's own
    keep_checkpoints: int | None = None
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # learner autocast; auto = bf16 on capable GPUs
    compile: Literal["auto", "on", "off"] = "auto"  # torch.compile; auto = on CUDA
    resume: Path | None = None  # a Phase-A run to continue
    # Phase B
    from_run: Annotated[Path | None, tyro.conf.arg(name="from")] = None  # the Phase-A run to freeze
    condition: str = "learner"  # learner | L1..L4 (encoder offloaded up to layer k) | cache
    offload_device: str = "cpu"  # cpu, cuda, openvino, ort:<ExecutionProvider> (see `hetlab offload devices`)
    # precision of the offloaded prefix: int8 (A8W8) or fp32 (a reference)
    offload_precision: Literal["int8", "fp32"] = "int8"
    quantise: QuantiseConfig = QuantiseConfig()
    calibration_episodes: str = "0-7"  # episodes whose frames calibrate the INT8 prefix
    prefetch: int = 2  # batches prepared ahead by the background thread
    # how the cache condition stores features: fp16 or int8 (per-token scales)
    cache_dtype: Literal["fp16", "int8"] = "fp16"
    power_interval: float = 1.0  # seconds between power samples
    power_command: str | None = None  # prints an extra device's power (e.g. an NPU vendor tool)
    power_pattern: str = r"([0-9.]+)\s*W"  # regex; its first group is the watts
    power_device: str = "offload device"  # the name --power-command's readings appear under
    out: Path | None = None  # Phase-B run directory
    # Both
    steps: int | None = None  # default: the preset's (A) or 30,000 (B)
    batch: int = 8  # samples per optimizer step
    lr: float | None = None  # default: the preset's (A) or 1e-5 (B)
    weight_decay: float = 1e-4  # AdamW weight decay
    grad_clip: float = 10.0  # gradient-norm clipping
    train_episodes: str = "0-39"  # 40–49 stay held out for fidelity
    seed: int | None = None  # default 0 (A) or 2000 (B)
    device: str = "auto"  # learner device
    max_seconds: float = 0.0  # stop with a checkpoint after this long; 0 = no limit
    runs_dir: Path = Path("runs")  # run directories are made under RUNS_DIR/aloha-ar-actor/

    def phase_config(self, cls):
        """The options `cls` (PhaseAConfig or PhaseBConfig) has, leaving unset ones to its defaults;
        UserError for an option set that only the other phase has."""
        names = {f.name for f in dataclasses.fields(cls)}
        defaults = AlohaTrainConfig()
        for option in dataclasses.fields(self):
            name = option.name
            if name not in names and name != "phase" and getattr(self, name) != getattr(defaults, name):
                other = "B" if self.phase == "A" else "A"
                flag = "--from" if name == "from_run" else f"--{name.replace('_', '-')}"
                raise UserError(f"{flag} is an option of Phase {other}; drop it or train --phase {other}")
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                      if f.name in names and getattr(self, f.name) is not None})


def _loss_line(run_dir: Path, steps: int, first_loss: float | None, last_loss: float | None) -> str:
    loss = f"loss {first_loss:.4f} → {last_loss:.4f}" if first_loss is not None else "no loss logged yet"
    return f"{run_dir}: step {steps}, {loss}"


@aloha.command(name="train")
def aloha_train(cfg: Annotated[AlohaTrainConfig, tyro.conf.arg(name="")]) -> None:
    """Train the AR-Actor: --phase A (whole policy on a dataset) or --phase B (new action expert on a frozen Phase-A encoder)."""
    if cfg.phase == "A":
        from hetlab.imitation.phase_a import PhaseAConfig, read_history, train_phase_a

        run_dir = train_phase_a(cfg.phase_config(PhaseAConfig))
        history = read_history(run_dir)
        first, last = (history[0], history[-1]) if history else ({"loss": None}, {"step": 0, "loss": None})
        console.print(_loss_line(run_dir, last["step"], first["loss"], last["loss"]), highlight=False, soft_wrap=True)
        return
    from hetlab.imitation.phase_b import PhaseBConfig, train_phase_b

    with Progress(console=err_console) as progress:
        run_dir = train_phase_b(cfg.phase_config(PhaseBConfig), progress)
    summary = json.loads((run_dir / "summary.json").read_text())
    console.print(f"{_loss_line(run_dir, summary['steps'], summary['first_loss'], summary['last_loss'])}, "
                  f"{summary['samples_per_s']:.1f} samples/s", highlight=False, soft_wrap=True)


@aloha.command(name="eval")
def aloha_eval(cfg: Annotated[EvalConfig, tyro.conf.arg(name="")]) -> None:
    """Closed-loop success rate of a trained policy over environment seeds (Wilson 95 % interval)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from hetlab.imitation.evaluate import evaluate

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=err_console)
    with progress:
        report = evaluate(cfg, progress)
    low, high = report["wilson95"]
    seeds = {True: "held-out seeds", False: "seeds of training episodes", None: "seeds (held out: unknown, the "
             "dataset is missing or does not record its seeds)"}[report["held_out"]]
    console.print(f"success {report['successes']}/{report['episodes']} = {100 * report['success_rate']:.1f} % on "
                  f"{seeds}, step {report['step']} "
                  f"(Wilson 95 %: {100 * low:.1f}–{100 * high:.1f} %) in {report['wall_s']:.0f} s with "
                  f"{report['workers']} workers → {report['out']}/results.json", highlight=False, soft_wrap=True)


@dataclass(frozen=True, kw_only=True)
class FidelityConfig:
    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]  # a Phase-A run directory
    boundaries: str = "1,2,3,4"  # split boundaries k (encoder layers offloaded)
    quantise: QuantiseConfig = QuantiseConfig()
    provider: str = "CPUExecutionProvider"  # the ONNX Runtime execution provider the INT8 prefix runs on
    dataset: Path | None = None  # default: the run's Phase-A dataset
    calibration_episodes: str = "0-7"  # episodes whose frames calibrate the INT8 prefix
    heldout_episodes: str = "40-49"  # episodes fidelity is measured on (never calibrated on)
    threads: int | None = None  # ONNX Runtime intra-op threads
    json: bool = False  # print the result as JSON


@offload.command(name="fidelity")
def offload_fidelity(cfg: Annotated[FidelityConfig, tyro.conf.arg(name="")]) -> None:
    """Cosine similarity of the INT8 and FP32 tokens at each split boundary, on held-out frames (goal ≥ 0.9975)."""
    from hetlab.imitation.study import phase_a_fidelity
    from hetlab.offload.fidelity import GOAL

    boundaries = parse_seeds(cfg.boundaries, "--boundaries")
    with Progress(console=err_console, transient=True) as progress:
        result = phase_a_fidelity(cfg.run, boundaries, cfg.dataset, quantise=cfg.quantise, provider=cfg.provider,
                                  calibration_episodes=parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
                                  heldout_episodes=parse_seeds(cfg.heldout_episodes, "--heldout-episodes"),
                                  threads=cfg.threads, progress=progress)
    if cfg.json:
        _print_json(dataclasses.asdict(result))
        return
    table = Table("boundary", "cosine (INT8 vs FP32)", f"goal ≥ {GOAL}", title=f"fidelity, {cfg.quantise.method} calibration")
    for k, cosine in result.cosines.items():
        table.add_row(f"L{k}", f"{cosine:.5f}", "met" if cosine >= GOAL else "[red]missed[/]")
    console.print(table)
    console.print(result.choice, highlight=False, soft_wrap=True)
    if result.below_goal:
        console.print(f"[red]{result.below_goal}[/]", highlight=False, soft_wrap=True)


@offload.command(name="devices")
def offload_devices() -> None:
    """Offload devices (ONNX Runtime execution providers, OpenVINO, torch) and whether each is usable here."""
    from hetlab.offload.backends import available_offload_devices

    table = Table("--offload-device", "status")
    for name, status in available_offload_devices().items():
        table.add_row(name, status)
    console.print(table)


@offload.command(name="study")
def offload_study(cfg: Annotated[StudyConfig, tyro.conf.arg(name="")]) -> None:
    """Phase B under every condition and training seed, evaluated and measured; writes report.md with tables and figures."""
    from hetlab.imitation.study import run_study

    with Progress(console=err_console) as progress:
        report = run_study(cfg, progress)
    console.print(f"study report: {report}", highlight=False, soft_wrap=True)


app.command(bench, name="bench", help="Benchmarks: `hetlab bench sim`.")
app.command(offload, name="offload", help="Phase B's offloaded encoder: fidelity, devices, study.")
app.command(aloha, name="aloha", help="The ALOHA cube-transfer world and its AR-Actor policy: expert, record, params, train, eval.")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print(f"hetlab {hetlab.__version__}")
        return
    try:
        if args[:1] == ["train"]:
            app.command(train_command(args[1:]), name="train")
        app.cli(prog="hetlab", args=argv, description="Train robot policies with each stage on the device that suits it.")
    except UserError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
