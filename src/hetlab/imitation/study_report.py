"""The Phase-B study's report: report.md with its tables and figures, rebuilt from the runs' files.

Every number comes from a run's config.json, its summary.json, its evaluation's results.json, the
study's own record (which runs, fidelity) or the model configuration the runs were trained with;
nothing is estimated. What each run was made with (steps, offload device, quantisation as made,
evaluation length, replanning...) is read from its own files, never from the command that asked for
the report: the introduction states it, the Runs table lists it per run, and settings on which the
runs differ are flagged in both. A device whose power was not measured is reported as "not
measured" with its reason, never as zero. Conditions are averaged over training seeds; task success
is also pooled over them.
"""

from __future__ import annotations

import platform
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean as mean

from hetlab.measure.stats import paired_difference_interval, wilson_interval
from hetlab.devices import pick_device
from hetlab.errors import UserError
from hetlab.files import atomic_path, write_text_atomic
from hetlab.imitation.run_files import ARActorRun, EvaluationResults, PhaseBSummary, read_results, read_run, read_summary
from hetlab.policies.ar_actor import ARActor, parameter_split

FIDELITY_GOAL = 0.9975  # INT8-vs-FP32 cosine of an offloaded boundary's output
CACHE_SPEEDUP_GOAL = 10.0  # feature-cache samples/s over learner-only

# (role, stage in breakdown_s, name in the report); the producer's stages run one batch ahead in a
# background thread, so they overlap the learner's, whose four stages add up to its time per step.
PRODUCER = "producer"
TIME_STAGES = (
    (PRODUCER, "inference", "offload forward"),
    (PRODUCER, "load", "data load"),
    ("learner", "transfer", "transfer"),
    ("learner", "wait_data", "learner wait"),
    ("learner", "encode", "learner encode"),
    ("learner", "update", "learner update"),
)

# What the report says each run was made with, in the order it says it (made_with).
SETTINGS = ("Phase-A run", "steps", "batch", "learning rate", "training episodes", "offload device", "offload precision", "quantisation",
            "calibration episodes", "cache dtype", "evaluation seeds", "evaluation episode length", "replanning")

CONDITION_SETTINGS = ("cache dtype",)  # a condition of its own for each value (cache, cache-int8)

TIME_FIGURE = "time_breakdown.png"
ENERGY_FIGURE = "energy_per_sample.png"
MEMORY_FIGURE = "peak_memory.png"
SUCCESS_FIGURE = "success_rate.png"


@dataclass(frozen=True)
class Run:
    """One condition trained with one seed, and its evaluation, as their files have them."""

    condition: str
    seed: int
    config: ARActorRun  # its config.json
    summary: PhaseBSummary
    results: EvaluationResults

    @property
    def name(self) -> str:
        return f"{self.condition}-s{self.seed}"


def is_cache(condition: str) -> bool:
    """The feature-cache condition: `cache` (FP16 storage), or `cache-<dtype>` for another storage."""
    return condition == "cache" or condition.startswith("cache-")


def load_runs(study: dict) -> dict[str, list[Run]]:
    """{condition: its runs in the study's order} from the study's record of run and evaluation
    directories; refuses to report on a study with any run's files missing."""
    paths = {(entry["condition"], entry["seed"]): (Path(entry["run"]) / "config.json",
                                                   Path(entry["run"]) / "summary.json",
                                                   Path(entry["eval"]) / "results.json")
             for entry in study["runs"]}
    missing = [str(path) for files in paths.values() for path in files if not path.is_file()]
    if missing:
        raise UserError(f"the study report needs every condition's training summary and evaluation; missing: "
                        f"{', '.join(missing)}; run `hetlab offload study` again to finish them")
    runs: dict[str, list[Run]] = {}
    for (condition, seed), files in paths.items():
        config, summary, results = files
        runs.setdefault(condition, []).append(Run(condition, seed, read_run(config.parent), read_summary(summary),
                                                  read_results(results)))
    return runs


def write_study_report(out: Path, study: dict) -> Path:
    """Writes <out>/report.md and its figures for `study` = {"runs": [{"condition", "seed", "run": its
    directory, "eval": its evaluation's directory}, ...], "fidelity": fidelity() as a dict or None};
    returns the report's path."""
    out = Path(out)
    runs = load_runs(study)
    sections = [
        introduction(runs),
        runs_section(runs),
        model_split(ARActor(next(iter(runs.values()))[0].config.model)),
        conditions_table(runs),
        time_section(runs, out / TIME_FIGURE),
        energy_section(runs, out / ENERGY_FIGURE),
        memory_section(runs, out / MEMORY_FIGURE),
        success_section(runs, out / SUCCESS_FIGURE),
        fidelity_section(study["fidelity"]),
        cache_section(runs),
    ]
    report = out / "report.md"
    write_text_atomic(report, "\n\n".join(sections) + "\n")
    return report


# --- what each run was made with --------------------------------------------------------------


def made_with(run: Run) -> dict[str, str]:
    """{setting as the report names it: its value} for the settings this run has, from its own files."""
    phase_b, results = run.config.options, run.results
    settings = {"Phase-A run": f"`{phase_b['from_run']}`", "steps": str(phase_b["steps"]),
                "batch": str(phase_b["batch"]), "training episodes": phase_b["train_episodes"]}
    decay = phase_b.get("lr_decay", 0.0)  # runs from before the option trained at a constant rate
    settings["learning rate"] = f"{phase_b['lr']:g}" + (f", falling to 0 over the last {100 * decay:g} % of the steps"
                                                        if decay else "")
    if run.condition.startswith("L"):
        settings["offload device"] = f"`{phase_b['offload_device']}`"
        settings["offload precision"] = phase_b["offload_precision"]
        if phase_b["offload_precision"] == "int8":
            # As the backend made it (its overflow fix decided), else as asked.
            settings["quantisation"] = quantisation(run.summary.encoder.get("quantise", phase_b["quantise"]))
            settings["calibration episodes"] = phase_b["calibration_episodes"]
    if is_cache(run.condition):
        settings["cache dtype"] = phase_b["cache_dtype"]
    settings["evaluation seeds"] = results.seeds
    settings["evaluation episode length"] = f"{results.max_steps} steps"
    settings["replanning"] = f"every {results.replan_every} actions"
    return settings


def quantisation(quantise: dict) -> str:
    """A QuantiseConfig (as a dict) in words."""
    method = quantise["method"] + (f" {quantise['percentile']:g}" if quantise["method"] == "percentile" else "")
    parts = [method, "+".join(quantise["op_types"]) if quantise["op_types"] else "all operators",
             "per channel" if quantise["per_channel"] else "per tensor"]
    if quantise["symmetric_activations"]:
        parts.append("symmetric activations")
    return " / ".join([*parts, f"overflow fix {quantise['overflow_fix']}"])


def settings_of(runs: dict[str, list[Run]]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, list[str]]]]:
    """({run name: made_with(run)}, {setting the runs differ on: {value: names of the runs with it}});
    settings that name the condition (a cache's dtype) are not differences."""
    settings = {run.name: made_with(run) for condition_runs in runs.values() for run in condition_runs}
    values: dict[str, dict[str, list[str]]] = {}
    for name, run_settings in settings.items():
        for setting, value in run_settings.items():
            if setting not in CONDITION_SETTINGS:
                values.setdefault(setting, {}).setdefault(value, []).append(name)
    return settings, {setting: by_value for setting, by_value in values.items() if len(by_value) > 1}


# --- sections ---------------------------------------------------------------------------------


def introduction(runs: dict[str, list[Run]]) -> str:
    settings, differing = settings_of(runs)

    def stated(setting: str) -> str:
        """The setting's value, or its values where the runs differ."""
        return " or ".join(dict.fromkeys(s[setting] for s in settings.values() if setting in s))

    seeds = list(dict.fromkeys(run.seed for condition_runs in runs.values() for run in condition_runs))
    episodes = sorted({run.results.episodes for condition_runs in runs.values() for run in condition_runs})
    text = (f"# Phase B study: the frozen visual encoder, offloaded\n\n"
            f"A new action expert was trained on the frozen visual encoder of the Phase-A run {stated('Phase-A run')} "
            f"under {len(runs)} conditions ({', '.join(runs)}), with training seeds {', '.join(map(str, seeds))}, "
            f"for {stated('steps')} steps each (batch {stated('batch')}, learning rate {stated('learning rate')}, "
            "training episodes "
            f"{stated('training episodes')}), and every run was evaluated closed-loop on environment seeds "
            f"{stated('evaluation seeds')} ({' or '.join(map(str, episodes))} episodes per run, at most "
            f"{stated('evaluation episode length')} each, replanning {stated('replanning')}).")
    if any(condition.startswith("L") for condition in runs):
        text += f" Offloaded encoder prefixes ran on {stated('offload device')} in {stated('offload precision')}"
        if stated("quantisation"):
            text += (f", quantised with {stated('quantisation')} and calibrated on episodes "
                     f"{stated('calibration episodes')}")
        text += "."
    if any(map(is_cache, runs)):
        text += f" The feature cache stored {stated('cache dtype')}."
    # The runs do not record their machine; the study trains and reports on the same one, so name this one.
    text += (f" Machine (where this report was written): {platform.platform()}, {pick_device('cpu').name}. "
             "Times, energy and memory are means over the training seeds; the Runs table lists what each run was "
             "made with, from its own files.")
    stopped = [f"{condition} seed {run.seed} stopped after {run.summary.steps} steps ({run.summary.stopped_by})"
               for condition, condition_runs in runs.items() for run in condition_runs
               if run.summary.steps != run.config.options["steps"]]
    if stopped:
        text += " Not every run reached its steps: " + "; ".join(stopped) + "."
    if differing:
        listed = (f"{setting} " + ", ".join(f"{value} ({', '.join(names)})" for value, names in by_value.items())
                  for setting, by_value in differing.items())
        text += ("\n\n**The runs differ in their settings**, so their numbers do not compare like for like: "
                 + "; ".join(listed) + ".")
    return text


def runs_section(runs: dict[str, list[Run]]) -> str:
    settings, differing = settings_of(runs)
    columns = [setting for setting in SETTINGS if any(setting in run_settings for run_settings in settings.values())]
    rows = [[run.condition, str(run.seed),
             *(_flagged(settings[run.name].get(setting, "—"), setting in differing) for setting in columns)]
            for condition_runs in runs.values() for run in condition_runs]
    note = "Each run's settings as its config.json, summary.json and results.json have them"
    note += "; **bold**: a setting the runs differ on." if differing else "."
    return ("## Runs\n\n" + table(["condition", "training seed", *columns], rows)
            + f"\n\n{note} \"—\": the condition has no such setting.")


def _flagged(cell: str, differs: bool) -> str:
    return f"**{cell}**" if differs and cell != "—" else cell


def model_split(model: ARActor) -> str:
    split = parameter_split(model)
    names = {"backbone": "ResNet18 backbone", "projection": "image + state projection",
             "encoder": f"Transformer encoder layers ({model.cfg.encoder_layers})", "action_expert": "action expert",
             "total": "total"}
    rows = [[names[part], f"{count / 1e6:.2f}", f"{100 * count / split['total']:.1f} %"]
            for part, count in split.items()]
    return "## Model\n\n" + table(["part", "M params", "share"], rows)


def conditions_table(runs: dict[str, list[Run]]) -> str:
    rows = []
    for condition, condition_runs in runs.items():
        encoder = condition_runs[0].summary.encoder
        boundary = encoder.get("boundary")
        rows.append([condition, encoder_place(encoder), encoder["precision"],
                     "—" if boundary is None else str(boundary),
                     str(boundary + 1) if boundary else "—"])
    return ("## Conditions\n\n"
            + table(["condition", "encoder runs on", "precision", "boundary k", "arrays sent to the learner"],
                    rows))


def encoder_place(encoder: dict) -> str:
    if "built_with" in encoder:
        return f"{encoder['backend']}, built with {encoder['built_with']}"
    where = encoder.get("provider", encoder.get("device"))
    return encoder["backend"] if where is None else f"{where} ({encoder['backend']})"


def time_section(runs: dict[str, list[Run]], figure: Path) -> str:
    throughput = {c: mean(run.summary.samples_per_s for run in rs) for c, rs in runs.items()}
    wall_s = {c: mean(run.summary.wall_s for run in rs) for c, rs in runs.items()}
    per_step = {c: stage_ms_per_step(rs) for c, rs in runs.items()}
    wall_ms = {c: mean(1000 * run.summary.wall_s / run.summary.steps for run in rs) for c, rs in runs.items()}
    rows = []
    for condition in runs:
        speedup = f"{throughput[condition] / throughput['learner']:.2f}×" if "learner" in runs else "—"
        rows.append([condition, f"{throughput[condition]:.1f}", f"{wall_s[condition]:.1f}",
                     *(f"{per_step[condition][name]:.1f}" if name in per_step[condition] else "—"
                       for _, _, name in TIME_STAGES),
                     speedup])
    plot_time(per_step, wall_ms, figure)
    header = ["condition", "samples/s", "wall s", *(f"{name} ms/step" for _, _, name in TIME_STAGES),
              "samples/s vs learner"]
    return ("## Time\n\n" + table(header, rows) + "\n\n"
            "Offload forward and data load run in the producer thread one batch ahead, overlapping the learner; "
            "the learner's wait, transfer, encode and update add up to its time per step. "
            "\"—\": the condition has no such stage.\n\n"
            f"![time per step]({figure.name})")


def stage_ms_per_step(condition_runs: list[Run]) -> dict[str, float]:
    """{stage name: ms per step, mean over seeds} for the stages the condition recorded."""
    stages = {}
    for role, stage, name in TIME_STAGES:
        recorded = [1000 * run.summary.breakdown_s[role][stage] / run.summary.steps for run in condition_runs
                    if stage in run.summary.breakdown_s.get(role, {})]
        if recorded:
            stages[name] = mean(recorded)
    return stages


def energy_section(runs: dict[str, list[Run]], figure: Path) -> str:
    device_rows, combined_rows, stacks = [], [], {}
    for condition, condition_runs in runs.items():
        per_device, left_out = {}, []
        for device in devices(condition_runs):
            reports = [row for run in condition_runs for row in run.summary.power if row["device"] == device]
            measured = [(row, run) for run in condition_runs for row in run.summary.power
                        if row["device"] == device and row["joules"] is not None]
            if not measured:
                reasons = "; ".join(sorted({row["not_measured"] for row in reports}))
                device_rows.append([condition, device, "—", f"not measured ({reasons})", "—", "—"])
                left_out.append(device)
                continue
            seeds_note = ("" if len(measured) == len(condition_runs)
                          else f" ({len(measured)} of {len(condition_runs)} seeds)")
            joules_per_sample = mean(run.summary.energy_per_sample["per_device"][device] for _, run in measured)
            device_rows.append([condition, device, measured[0][0]["method"] + seeds_note,
                                f"{mean(row['mean_watts'] for row, _ in measured):.1f}",
                                f"{mean(row['joules'] for row, _ in measured):.1f}", f"{joules_per_sample:.4g}"])
            if seeds_note:
                left_out.append(f"{device} (not every seed)")
            else:
                per_device[device] = joules_per_sample
        stacks[condition] = per_device
        combined = f"{sum(per_device.values()):.4g}" if per_device else "not measured"
        combined_rows.append([condition, combined, ", ".join(per_device) or "—", ", ".join(left_out) or "—"])
    measured_anywhere = any(stacks.values())
    plot_energy(stacks, figure)
    note = ("The combined energy per sample sums the devices measured in every seed; the devices left out "
            "were not measured, so it is a lower bound." if measured_anywhere else
            "No device's power was measured on this machine, so there is no energy per sample; "
            f"{figure.name} says \"not measured on this machine\" instead of drawing bars.")
    return ("## Power and energy\n\n" + table(["condition", "device", "method", "mean W", "J", "J/sample"], device_rows)
            + "\n\n" + table(["condition", "combined J/sample", "over", "left out"], combined_rows)
            + f"\n\n{note}\n\n![energy per sample]({figure.name})")


def devices(condition_runs: list[Run]) -> list[str]:
    """Every device in the condition's power reports, in the order they were first reported."""
    return list(dict.fromkeys(row["device"] for run in condition_runs for row in run.summary.power))


def memory_section(runs: dict[str, list[Run]], figure: Path) -> str:
    mebibytes = {c: mean(run.summary.peak_memory["bytes"] / 2**20 for run in rs) for c, rs in runs.items()}
    what = {c: ", ".join(dict.fromkeys(run.summary.peak_memory["what"] for run in rs)) for c, rs in runs.items()}
    plot_memory(mebibytes, what, figure)
    rows = [[condition, f"{mebibytes[condition]:.0f}", what[condition]] for condition in runs]
    return ("## Peak memory\n\n" + table(["condition", "MiB", "what"], rows)
            + f"\n\n![peak memory]({figure.name})")


def success_section(runs: dict[str, list[Run]], figure: Path) -> str:
    rows, pooled = [], {}
    for condition, condition_runs in runs.items():
        for run in condition_runs:
            r = run.results
            rows.append([condition, str(run.seed), f"{r.successes}/{r.episodes}", f"{r.success_rate:.3f}",
                         interval(r.wilson95)])
        successes = sum(run.results.successes for run in condition_runs)
        episodes = sum(run.results.episodes for run in condition_runs)
        pooled[condition] = (successes / episodes, wilson_interval(successes, episodes))
        rows.append([condition, "pooled", f"{successes}/{episodes}", f"{successes / episodes:.3f}",
                     interval(pooled[condition][1])])
    plot_success(pooled, {c: [run.results.success_rate for run in rs] for c, rs in runs.items()}, figure)
    return ("## Task success\n\n"
            + table(["condition", "training seed", "successes/episodes", "rate", "Wilson 95 %"], rows)
            + f"\n\n![success rate]({figure.name})" + differences_section(runs))


def comparisons(conditions) -> list[tuple[str, str]]:
    """(condition, reference): every other condition against learner-only (the FP32 encoder in the
    learner), and a cache stored otherwise against the FP16 one."""
    pairs = [(condition, "learner") for condition in conditions if condition != "learner" and "learner" in conditions]
    return pairs + [(condition, "cache") for condition in conditions if condition.startswith("cache-") and "cache" in conditions]


def outcomes(condition_runs: list[Run]) -> dict[tuple[int, int], bool]:
    """{(training seed, environment seed): success} of a condition's evaluations."""
    return {(run.seed, episode["seed"]): episode["success"] for run in condition_runs
            for episode in run.results.per_seed}


def differences_section(runs: dict[str, list[Run]]) -> str:
    rows = []
    for condition, reference in comparisons(list(runs)):
        ours, theirs = outcomes(runs[condition]), outcomes(runs[reference])
        pairs = ours.keys() & theirs.keys()
        if not pairs:
            rows.append([condition, reference, "0", *["—"] * 5])
            continue
        both = sum(ours[p] and theirs[p] for p in pairs)
        only_ours = sum(ours[p] and not theirs[p] for p in pairs)
        only_theirs = sum(theirs[p] and not ours[p] for p in pairs)
        neither = len(pairs) - both - only_ours - only_theirs
        difference = (only_ours - only_theirs) / len(pairs)
        rows.append([condition, reference, str(len(pairs)), str(both), str(only_ours), str(only_theirs),
                     f"{100 * difference:+.1f}",
                     interval_points(paired_difference_interval(both, only_ours, only_theirs, neither))])
    if not rows:
        return ""
    return ("\n\n### Differences, paired by episode\n\n"
            "Each condition against its reference on the same (training seed, environment seed) pairs: within a "
            "training seed every condition starts from the same expert and sees the same batches, so a pair differs "
            "only in how the encoder ran. The 95 % interval is Newcombe's for paired proportions (method 10); one "
            "that holds 0 means this study cannot tell the two apart, and its ends bound the difference it could "
            "have missed.\n\n"
            + table(["condition", "against", "pairs", "both succeed", "only condition", "only reference",
                     "difference (points)", "95 % interval (points)"], rows))


def fidelity_section(fidelity: dict | None) -> str:
    if not fidelity:
        return "## Fidelity\n\nThe INT8-vs-FP32 fidelity of the offloaded encoder was not measured in this study."
    rows = [[str(k), f"{cosine:.5f}", "yes" if cosine >= FIDELITY_GOAL else "no"]
            for k, cosine in sorted((int(k), cosine) for k, cosine in fidelity["cosines"].items())]
    return ("## Fidelity\n\nCosine similarity between the INT8 and the FP32 encoder's outputs at each offloaded "
            "boundary k.\n\n" + table(["boundary k", "cosine", f"meets ≥ {FIDELITY_GOAL}"], rows)
            + f"\n\nQuantised with {fidelity['choice']}."
            + (f" **Fidelity {fidelity['below_goal']}.**" if fidelity["below_goal"] else ""))


def cache_section(runs: dict[str, list[Run]]) -> str:
    caches = [condition for condition in runs if is_cache(condition)]
    if not caches:
        return "## Feature cache\n\nThe feature-cache condition was not run in this study."
    return "## Feature cache\n\n" + "\n\n".join(cache_paragraph(condition, runs) for condition in caches)


def cache_paragraph(condition: str, runs: dict[str, list[Run]]) -> str:
    cache_runs = runs[condition]
    cache = next(run.summary.cache for run in cache_runs if run.summary.cache)
    text = (f"{condition}: the cache holds {cache['frames']} frames × {cache['layers']} layers × "
            f"{cache['tokens']} tokens × {cache['d_model']} channels as {cache['dtype']}: "
            f"{cache['bytes'] / 2**20:.0f} MiB, built in {cache['build_s']:.1f} s.")
    if "learner" not in runs:
        return text + " Its speed-up is not computed: the learner-only condition was not run."
    learner = mean(run.summary.samples_per_s for run in runs["learner"])
    speedup = mean(run.summary.samples_per_s for run in cache_runs) / learner
    # The build is done once, before training, so the cache runs' wall time leaves it out.
    with_build = (sum(run.summary.samples for run in cache_runs)
                  / (sum(run.summary.wall_s for run in cache_runs) + cache["build_s"]) / learner)
    verdict = "meets" if speedup >= CACHE_SPEEDUP_GOAL else "falls short of"
    return (text + f" Training from it runs at {speedup:.1f}× the learner-only samples/s, which {verdict} the "
            f"≥ {CACHE_SPEEDUP_GOAL:g}× goal; with its build time counted once against the training of the "
            f"{len(cache_runs)} run(s) that read it, {with_build:.1f}×.")


# --- figures ----------------------------------------------------------------------------------


@contextmanager
def figure_at(path: Path, size: tuple[float, float]):
    """Matplotlib axes whose figure is saved atomically to `path` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)


def plot_time(per_step: dict[str, dict[str, float]], wall_ms: dict[str, float], path: Path) -> None:
    conditions = list(per_step)
    with figure_at(path, (8, 0.5 * len(conditions) + 2.2)) as ax:
        left = [0.0] * len(conditions)
        for role, _, name in TIME_STAGES:
            widths = [per_step[c].get(name, 0.0) for c in conditions]
            ax.barh(conditions, widths, left=left, label=name, hatch="//" if role == PRODUCER else None)
            left = [a + b for a, b in zip(left, widths)]
        ax.plot([wall_ms[c] for c in conditions], conditions, "k|", markersize=18, label="wall time per step")
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (mean over seeds); hatched: producer thread, overlapping the learner")
        ax.set_title("Phase B: where the time goes")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize="small")


def plot_energy(stacks: dict[str, dict[str, float]], path: Path) -> None:
    conditions = list(stacks)
    with figure_at(path, (7, 4)) as ax:
        ax.set_title("Phase B: energy per training sample")
        if not any(stacks.values()):
            ax.text(0.5, 0.5, "not measured on this machine\n(no power meter gave readings)",
                    ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            return
        bottom = [0.0] * len(conditions)
        for device in dict.fromkeys(d for per_device in stacks.values() for d in per_device):
            heights = [stacks[c].get(device, 0.0) for c in conditions]
            ax.bar(conditions, heights, bottom=bottom, label=device)
            bottom = [a + b for a, b in zip(bottom, heights)]
        for x, condition in enumerate(conditions):
            if not stacks[condition]:
                ax.text(x, 0, "not\nmeasured", ha="center", va="bottom", fontsize="small")
        ax.set_ylabel("J per sample (measured devices only)")
        ax.legend(fontsize="small")


def plot_memory(mebibytes: dict[str, float], what: dict[str, str], path: Path) -> None:
    conditions = list(mebibytes)
    with figure_at(path, (7, 0.5 * len(conditions) + 1.8)) as ax:
        ax.barh(conditions, [mebibytes[c] for c in conditions])
        ax.invert_yaxis()
        ax.set_xlabel(f"MiB: {'; '.join(dict.fromkeys(what.values()))}", fontsize="small")
        ax.set_title("Phase B: peak memory")


def plot_success(pooled: dict[str, tuple[float, tuple[float, float]]], per_seed: dict[str, list[float]],
                 path: Path) -> None:
    conditions = list(pooled)
    rates = [pooled[c][0] for c in conditions]
    errors = [[rate - pooled[c][1][0] for c, rate in zip(conditions, rates)],
              [pooled[c][1][1] - rate for c, rate in zip(conditions, rates)]]
    with figure_at(path, (7, 4)) as ax:
        ax.bar(conditions, rates, yerr=errors, capsize=4, color="tab:blue", alpha=0.6, label="pooled (Wilson 95 %)")
        for x, condition in enumerate(conditions):
            ax.plot([x] * len(per_seed[condition]), per_seed[condition], "k.",
                    label="per training seed" if x == 0 else None)
        ax.set_ylim(0, min(1.0, 1.15 * max(pooled[c][1][1] for c in conditions)))
        ax.set_ylabel("success rate")
        ax.set_title("Phase B: closed-loop task success")
        ax.legend(fontsize="small")


# --- formatting -------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a "|" inside a cell is escaped so it cannot split the cell."""
    def line(cells):
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def interval(bounds) -> str:
    low, high = bounds
    return f"[{low:.3f}, {high:.3f}]"


def interval_points(bounds) -> str:
    """A difference of rates as percentage points."""
    low, high = bounds
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"
