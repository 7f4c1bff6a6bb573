"""The Phase-B study report, from small made-up run files whose every number is known.

Three conditions (learner, L2, cache) × two training seeds. The CPU package's power is
measured in the learner and L2 runs and not in the cache runs; the GPU's never is. Every run
was made with the same settings, unless a test changes one run's files.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from hetlab.errors import UserError
from hetlab.imitation.study_report import write_study_report
from hetlab.measure.stats import paired_difference_interval
from hetlab.policies.ar_actor import ARActor, ARActorConfig, parameter_split

TINY = {"d_model": 32, "heads": 2, "feedforward": 64, "expert_feedforward": 64, "backbone_width": 8, "chunk": 10}
CONDITIONS = ["learner", "L2", "cache"]
SEEDS = [2000, 2001]
EVAL_SEEDS = "2000,2001,2002"  # a comma list, so the evaluation folder is 2000_2001_2002
STEPS, BATCH = 100, 8
SAMPLES_PER_S = {"learner": (10.0, 12.0), "L2": (20.0, 22.0), "cache": (110.0, 132.0)}
SUCCESSES = {"learner": (12, 15), "L2": (9, 0), "cache": (30, 21)}
EPISODES = 300
CPU_JOULES = {"learner": (2150.0, 2000.0), "L2": (1600.0, 1700.0)}  # the cache runs' CPU power is not measured
CACHE = {"key": {"phase_a_step": 1}, "frames": 16000, "layers": 4, "tokens": 21, "d_model": 512, "dtype": "fp16",
         "build_s": 300.0, "bytes": 1_400_000_000, "built_now": True}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QUANTISE = {"method": "percentile", "percentile": 99.999, "op_types": ["Conv", "MatMul"], "per_channel": True,
            "symmetric_activations": False, "overflow_fix": "off"}
MAX_STEPS, REPLAN_EVERY = 400, 10


def wilson(successes: int, trials: int) -> tuple[float, float]:
    """The Wilson score 95 % interval, written out here to check the report's."""
    z = 1.96
    p = successes / trials
    centre = (p + z**2 / (2 * trials)) / (1 + z**2 / trials)
    half = z / (1 + z**2 / trials) * math.sqrt(p * (1 - p) / trials + z**2 / (4 * trials**2))
    return centre - half, centre + half


def power(condition: str, index: int, measured: bool) -> list[dict]:
    gpu = {"device": "gpu0", "method": None, "readings": 0, "mean_watts": None, "joules": None,
           "not_measured": "NVML did not start"}
    if not measured:
        cpu = {"device": "cpu package 0", "method": "RAPL energy counter", "readings": 0, "mean_watts": None,
               "joules": None, "not_measured": "energy_uj is readable by root only"}
        return [cpu, gpu]
    joules = CPU_JOULES[condition][index]
    cpu = {"device": "cpu package 0", "method": "RAPL energy counter", "readings": 61,
           "mean_watts": joules / 60.0, "joules": joules, "not_measured": None}
    return [cpu, gpu]


def summary(condition: str, index: int, seed: int, cpu_measured: bool) -> dict:
    samples = STEPS * BATCH
    wall = samples / SAMPLES_PER_S[condition][index]
    producer = {"load": 10.0}
    if condition == "L2":
        producer["inference"] = 30.0
    encoder = {"learner": {"backend": "torch", "precision": "fp32", "device": "learner", "boundary": 0},
               "L2": {"backend": "onnxruntime", "provider": "CPUExecutionProvider", "precision": "int8", "boundary": 2},
               "cache": {"backend": "feature cache", "precision": "fp16", "built_with": "torch fp32 on the learner"}}
    rows = power(condition, index, cpu_measured)
    per_device = {row["device"]: row["joules"] / samples for row in rows if row["joules"] is not None}
    return {
        "condition": condition, "seed": seed, "steps": STEPS, "samples": samples, "stopped_by": "steps",
        "wall_s": wall, "samples_per_s": SAMPLES_PER_S[condition][index], "first_loss": 0.9, "last_loss": 0.4,
        "breakdown_s": {"producer": producer,
                        "learner": {"wait_data": 5.0, "transfer": 0.1, "encode": 30.0, "update": 40.0}},
        "encoder": encoder[condition],
        "power": rows,
        "energy_per_sample": {"per_device": per_device, "combined": sum(per_device.values()) if per_device else None,
                              "missing": [row["device"] for row in rows if row["joules"] is None]},
        "peak_memory": {"bytes": (512 + 256 * index) * 2**20, "what": "peak RSS of the process (CPU)"},
        "cache": CACHE if condition == "cache" else None,
    }


def results(condition: str, index: int) -> dict:
    successes = SUCCESSES[condition][index]
    return {"run": "made up", "seeds": EVAL_SEEDS, "replan_every": REPLAN_EVERY, "max_steps": MAX_STEPS,
            "episodes": EPISODES, "successes": successes, "success_rate": successes / EPISODES,
            "wilson95": list(wilson(successes, EPISODES)),
            # Environment seeds 3000 on: each run succeeds on its first `successes` of them, so two runs agree on
            # the first min(successes) and differ on the next |difference|.
            "per_seed": [{"seed": 3000 + i, "success": i < successes} for i in range(EPISODES)]}


def config(phase_a, condition: str, seed: int) -> dict:
    """A run's config.json: the model and the Phase-B settings it was trained with."""
    return {"kind": "aloha-ar-actor", "phase": "B", "model": TINY, "image_size": [48, 64],
            "phase_b": {"from_run": str(phase_a), "condition": condition, "seed": seed, "steps": STEPS,
                        "batch": BATCH, "lr": 1e-4, "lr_decay": 0.25, "train_episodes": "0-39", "device": "auto", "offload_device": "cpu",
                        "offload_precision": "int8", "quantise": QUANTISE, "calibration_episodes": "0-7",
                        "cache_dtype": "fp16"}}


# As `fidelity()` returns it (asdict of offload.fidelity.Fidelity), for an AVX2 CPU without the overflow fix.
FIDELITY = {"cosines": {"2": 0.9981, 4: 0.9962}, "quantise": {"method": "percentile", "overflow_fix": "off"},
            "int8_kernels": {"target": "onnxruntime CPUExecutionProvider", "saturating": True, "reason": "no VNNI or AMX",
                             "cpu": "AMD EPYC 7763", "arch": "x86_64", "cpu_flags": ["avx2"]},
            "choice": "overflow fix off for onnxruntime CPUExecutionProvider on AMD EPYC 7763 (x86_64, int8 flags: "
                      "avx2): no VNNI or AMX",
            "below_goal": "below the 0.9975 goal on this CPU at L4 0.99620: no VNNI or AMX; quantise with the "
                          "overflow fix (--quantise.overflow-fix on, or auto)"}


def write_study(tmp_path, cpu_measured: bool = True, fidelity=None) -> tuple:
    torch.set_num_threads(1)
    phase_a = tmp_path / "phase-a"
    out = tmp_path / "study"
    runs = []
    for condition in CONDITIONS:
        for index, seed in enumerate(SEEDS):
            run_dir = out / f"{condition}-s{seed}"
            eval_dir = run_dir / "eval" / EVAL_SEEDS.replace(",", "_")
            eval_dir.mkdir(parents=True)
            measured = cpu_measured and condition != "cache"
            (run_dir / "config.json").write_text(json.dumps(config(phase_a, condition, seed)))
            (run_dir / "summary.json").write_text(json.dumps(summary(condition, index, seed, measured)))
            (eval_dir / "results.json").write_text(json.dumps(results(condition, index)))
            runs.append({"condition": condition, "seed": seed, "run": str(run_dir), "eval": str(eval_dir)})
    return out, {"runs": runs, "fidelity": fidelity}


def rewrite(path, **changes) -> None:
    """Change some of a run file's entries."""
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def section(report: str, title: str) -> str:
    return report.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def rows_of(text: str, condition: str) -> list[list[str]]:
    """The cells of every table row in `text` that starts with `condition`."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {condition} |")]


@pytest.fixture(scope="module")
def study_out(tmp_path_factory):
    """The study folder, with the report written once for all the tests that only read it."""
    out, study = write_study(tmp_path_factory.mktemp("study"), fidelity=FIDELITY)
    assert write_study_report(out, study) == out / "report.md"
    return out


@pytest.fixture
def report(study_out) -> str:
    return (study_out / "report.md").read_text()


def test_tables_come_in_the_study_order(report):
    titles = ["# Phase B study", "## Runs", "## Model", "## Conditions", "## Time", "## Power and energy",
              "## Peak memory", "## Task success", "## Fidelity", "## Feature cache"]
    positions = [report.index(title) for title in titles]
    assert positions == sorted(positions)
    intro = report.split("## Model")[0]
    assert "learner, L2, cache" in intro and "2000, 2001" in intro and f"{STEPS} steps" in intro
    assert EVAL_SEEDS in intro and f"{EPISODES} episodes" in intro and "`cpu`" in intro


def test_model_split_counts_the_phase_a_model(report):
    split = parameter_split(ARActor(ARActorConfig(**TINY)))
    table = section(report, "Model")
    assert f"| total | {split['total'] / 1e6:.2f} | 100.0 % |" in table
    share = 100 * split["encoder"] / split["total"]
    assert f"| Transformer encoder layers (4) | {split['encoder'] / 1e6:.2f} | {share:.1f} % |" in table


def test_conditions_say_where_the_encoder_runs_and_what_is_sent(report):
    table = section(report, "Conditions")
    assert rows_of(table, "learner") == [["learner", "learner (torch)", "fp32", "0", "—"]]
    assert rows_of(table, "L2") == [["L2", "CPUExecutionProvider (onnxruntime)", "int8", "2", "3"]]
    assert rows_of(table, "cache")[0][2:] == ["fp16", "—", "—"]


def test_time_per_step_and_speed_up_over_learner_only(report):
    table = section(report, "Time")
    learner, l2 = rows_of(table, "learner")[0], rows_of(table, "L2")[0]
    # samples/s, wall s, offload forward, data load, transfer, learner wait, encode, update, speed-up
    assert learner[1] == "11.0" and learner[3] == "—" and learner[4] == "100.0" and learner[8] == "400.0"
    assert learner[9] == "1.00×"
    assert l2[3] == "300.0" and l2[9] == f"{21.0 / 11.0:.2f}×"
    wall = (STEPS * BATCH / 20.0 + STEPS * BATCH / 22.0) / 2
    assert l2[2] == f"{wall:.1f}"


def test_energy_is_reported_only_where_measured(report):
    text = section(report, "Power and energy")
    learner_cpu = next(row for row in rows_of(text, "learner") if row[1] == "cpu package 0")
    joules = CPU_JOULES["learner"]
    assert learner_cpu[3:] == [f"{sum(joules) / 2 / 60.0:.1f}", f"{sum(joules) / 2:.1f}",
                               f"{sum(joules) / 2 / (STEPS * BATCH):.4g}"]
    for row in rows_of(text, "cache")[:2]:  # both devices: no watts, joules or J/sample made up
        assert row[3].startswith("not measured (") and row[4:] == ["—", "—"]
    assert "energy_uj is readable by root only" in text
    combined = {row[1] for row in rows_of(text, "cache") if len(row) == 4}
    assert combined == {"not measured"}
    learner_combined = next(row for row in rows_of(text, "learner") if len(row) == 4)
    assert learner_combined[1:] == [f"{sum(joules) / 2 / (STEPS * BATCH):.4g}", "cpu package 0", "gpu0"]


def test_peak_memory_in_mebibytes_with_its_label(report):
    assert rows_of(section(report, "Peak memory"), "L2") == [["L2", "640", "peak RSS of the process (CPU)"]]


def test_success_is_pooled_over_seeds_with_its_own_interval(report):
    rows = rows_of(section(report, "Task success"), "learner")
    pooled = next(row for row in rows if row[1] == "pooled")
    low, high = wilson(27, 2 * EPISODES)
    assert pooled[2:] == ["27/600", f"{27 / 600:.3f}", f"[{low:.3f}, {high:.3f}]"]
    first = next(row for row in rows if row[1] == "2000")
    assert first[2] == "12/300"
    # None of 300 episodes succeeded: the interval starts at 0.
    l2_second = next(row for row in rows_of(section(report, "Task success"), "L2") if row[1] == "2001")
    assert l2_second[4].startswith("[0.000,")


def test_the_learning_rate_and_its_decay_are_stated(report):
    schedule = "0.0001, falling to 0 over the last 25 % of the steps"
    assert f"learning rate {schedule}" in report.split("## Runs")[0]
    assert all(schedule in row for row in rows_of(section(report, "Runs"), "L2"))


def test_each_condition_is_compared_with_learner_only_episode_by_episode(report):
    differences = section(report, "Task success").split("### Differences, paired by episode")[1]
    # L2 against learner: seed 2000 both on 9, learner alone on 3; seed 2001 (L2 0, learner 15) learner alone on 15.
    l2 = rows_of(differences, "L2")
    low, high = paired_difference_interval(9, 0, 18, 600 - 27)
    assert l2 == [["L2", "learner", "600", "9", "0", "18", "-3.0", f"[{100 * low:+.1f}, {100 * high:+.1f}]"]]
    assert high < 0  # 18 discordant pairs, all one way: the interval excludes 0
    cache = rows_of(differences, "cache")
    assert cache[0][:7] == ["cache", "learner", "600", "27", "24", "0", "+4.0"]
    assert not rows_of(differences, "learner")


def test_fidelity_against_the_goal_whatever_the_key_type(report):
    table = section(report, "Fidelity")
    assert "| 2 | 0.99810 | yes |" in table and "| 4 | 0.99620 | no |" in table


def test_fidelity_names_the_quantisation_choice_the_cpu_and_the_miss(report):
    text = section(report, "Fidelity")
    assert f"Quantised with {FIDELITY['choice']}." in text
    assert f"**Fidelity {FIDELITY['below_goal']}.**" in text


def test_feature_cache_size_build_time_and_speed_up(report):
    text = section(report, "Feature cache")
    assert f"{CACHE['bytes'] / 2**20:.0f} MiB" in text and "300.0 s" in text and "fp16" in text
    assert f"{121.0 / 11.0:.1f}× the learner-only samples/s, which meets" in text


def test_figures_are_pngs_written_atomically(study_out, report):
    for name in ("time_breakdown.png", "energy_per_sample.png", "peak_memory.png", "success_rate.png"):
        assert f"]({name})" in report
        assert (study_out / name).read_bytes().startswith(PNG_SIGNATURE)
    assert not list(study_out.glob(".*tmp*"))


def test_nothing_measured_says_so_instead_of_drawing_bars(tmp_path):
    out, study = write_study(tmp_path, cpu_measured=False)
    report = write_study_report(out, study).read_text()
    text = section(report, "Power and energy")
    assert "not measured on this machine" in text
    assert " W" not in text.replace("mean W", "")
    assert (out / "energy_per_sample.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "not measured in this study" in section(report, "Fidelity")


def test_a_missing_run_file_is_named(tmp_path):
    out, study = write_study(tmp_path)
    missing = out / "L2-s2001" / "summary.json"
    missing.unlink()
    with pytest.raises(UserError, match=re.escape(str(missing))):
        write_study_report(out, study)


def test_a_partly_measured_device_and_an_early_stop_are_flagged(tmp_path):
    out, study = write_study(tmp_path)
    unmeasured = out / "learner-s2001" / "summary.json"
    unmeasured.write_text(json.dumps(summary("learner", 1, 2001, cpu_measured=False)))
    stopped = out / "L2-s2000" / "summary.json"
    stopped.write_text(json.dumps({**json.loads(stopped.read_text()), "steps": 60, "stopped_by": "max_seconds"}))
    report = write_study_report(out, study).read_text()
    assert "L2 seed 2000 stopped after 60 steps (max_seconds)" in report.split("## Model")[0]
    text = section(report, "Power and energy")
    cpu = next(row for row in rows_of(text, "learner") if row[1] == "cpu package 0")
    assert cpu[2:] == ["RAPL energy counter (1 of 2 seeds)", f"{2150.0 / 60.0:.1f}", "2150.0",
                       f"{2150.0 / (STEPS * BATCH):.4g}"]
    combined = next(row for row in rows_of(text, "learner") if len(row) == 4)
    assert combined[1:] == ["not measured", "—", "cpu package 0 (not every seed), gpu0"]


def cells(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The first table in `text`: {(condition, training seed): {column: cell}}."""
    lines = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in text.splitlines() if line.startswith("|")]
    header, rows = lines[0], lines[2:]
    return {(row[0], row[1]): dict(zip(header, row)) for row in rows}


def test_each_run_is_reported_with_its_own_settings_and_differences_are_flagged(tmp_path):
    out, study = write_study(tmp_path)
    rewrite(out / "L2-s2001" / "eval" / EVAL_SEEDS.replace(",", "_") / "results.json", max_steps=200)
    made = out / "L2-s2001" / "summary.json"
    encoder = json.loads(made.read_text())["encoder"]
    rewrite(made, encoder={**encoder, "quantise": {**QUANTISE, "overflow_fix": "on"}})  # as the backend made it
    report = write_study_report(out, study).read_text()

    intro = report.split("## Runs")[0]
    assert f"for {STEPS} steps each" in intro and "at most 400 steps or 200 steps each" in intro
    assert "**The runs differ in their settings**" in intro
    others = "learner-s2000, learner-s2001, L2-s2000, cache-s2000, cache-s2001"
    assert f"evaluation episode length 400 steps ({others}), 200 steps (L2-s2001)" in intro
    quantised = "percentile 99.999 / Conv+MatMul / per channel / overflow fix"
    assert f"quantisation {quantised} off (L2-s2000), {quantised} on (L2-s2001)" in intro
    assert "steps 100" not in intro  # settings all runs share are not flagged

    runs = cells(section(report, "Runs"))
    assert runs["L2", "2001"]["evaluation episode length"] == "**200 steps**"
    assert runs["L2", "2001"]["quantisation"] == f"**{quantised} on**"
    assert runs["L2", "2000"]["quantisation"] == f"**{quantised} off**"
    assert runs["learner", "2000"]["evaluation episode length"] == "**400 steps**"
    assert runs["learner", "2000"]["steps"] == str(STEPS) and runs["L2", "2001"]["offload device"] == "`cpu`"
    assert runs["learner", "2000"]["offload device"] == runs["cache", "2000"]["quantisation"] == "—"
    assert runs["cache", "2001"]["cache dtype"] == "fp16"
    assert runs["learner", "2001"]["replanning"] == f"every {REPLAN_EVERY} actions"


def test_a_report_of_runs_that_agree_flags_nothing(report):
    assert "differ in their settings" not in report and "**" not in section(report, "Runs")


def test_a_summary_without_a_field_the_report_reads_is_named_in_one_line(tmp_path):
    out, study = write_study(tmp_path)
    summary_path = out / "cache-s2000" / "summary.json"
    summary_path.write_text(json.dumps({k: v for k, v in json.loads(summary_path.read_text()).items()
                                        if k != "samples_per_s"}))
    with pytest.raises(UserError, match=re.escape(f"{summary_path} does not hold what a PhaseBSummary records "
                                                  "(KeyError('samples_per_s'))")):
        write_study_report(out, study)
