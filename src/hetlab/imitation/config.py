"""The options of the imitation half's commands that take them whole: `hetlab aloha eval` (EvalConfig),
`hetlab offload study` (StudyConfig) and `hetlab offload tune` (OffloadTuneConfig), and Phase B's conditions.

Apart from the jobs that use them (evaluate.py, study.py, offload_tune.py, phase_b.py), which import torch, so
that the command line builds its help without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import tyro

from hetlab.aloha_config import EPISODE_STEPS
from hetlab.offload.config import QuantiseConfig

# Where Phase B's visual encoder runs: all on the learner, its prefix up to layer k offloaded (Lk), or
# read from a feature cache.
CONDITIONS = ("learner", "L1", "L2", "L3", "L4", "cache")
CACHE_DTYPES = ("fp16", "int8")  # how the cache condition stores the encoder's outputs
# How the action expert generates a chunk (hetlab.policies.ar_actor): one action per pass, each fed
# back as history, or all in one pass with every history input masked.
Decode = Literal["autoregressive", "parallel"]


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]  # a trained AR-Actor run (phase A or B)
    seeds: str = "2000-2049"  # environment seeds: A-B, N, or a list such as 0-3,7 (recordings start at 0)
    # Allow seeds the run's training episodes were recorded from (a memorisation check); the report
    # then does not call them held out.
    on_training_seeds: bool = False
    workers: int = 0  # episode processes; 0 = one per core
    videos: int = 3  # mp4s of the first K seeds
    replan_every: int = 0  # steps between generated chunks; 0 = the whole chunk (with --temporal-ensemble: 1, as ACT)
    # ACT's temporal ensembling: each step's action is the mean of every running chunk's action for
    # it, chunk i (0 = the oldest) weighted exp(−m·i); ACT's m is 0.01. None: the newest chunk alone.
    temporal_ensemble: float | None = None
    # autoregressive: each action fed back as the next one's history; parallel: the chunk in one pass
    # with every history input masked (ACT's decoding; for runs trained with max_history_mask 1).
    decode: Decode = "autoregressive"
    max_steps: int = EPISODE_STEPS  # steps per episode: the task's 400, or fewer for a quick look
    checkpoint: int | None = None  # the step of a kept checkpoint (RUN/checkpoints); default the newest
    out: Path | None = None  # results directory; default RUN/eval/<seeds> (<seeds>-step<N> with --checkpoint)


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    from_run: Annotated[Path, tyro.conf.arg(name="from")]  # the Phase-A run
    conditions: str = ",".join(CONDITIONS)  # comma-separated: learner, L1..L4 (encoder offloaded up to layer k), cache
    seeds: str = "2000,2001,2002"  # training seeds
    steps: int = 30_000  # Phase-B steps per condition and seed
    lr: float | None = None  # Phase B's learning rate; unset: the Phase-A run's
    lr_decay: float | None = None  # last share of the steps with a linearly falling rate; unset: the Phase-A run's
    eval_seeds: str = "2000-2049"  # environment seeds, held out from every training episode
    eval_workers: int = 0  # 0 = one per core
    eval_max_steps: int = EPISODE_STEPS  # steps per evaluation episode (the task's 400)
    eval_replan_every: int = 0  # actions executed per generated chunk; 0 = the whole chunk
    videos: int = 0  # evaluation videos per condition and seed
    fidelity: bool = True  # INT8-vs-FP32 cosine per offloaded boundary, in the report
    train_episodes: str = "0-39"  # episodes Phase B trains on
    calibration_episodes: str = "0-7"  # the INT8 prefixes' calibration frames come from these
    heldout_episodes: str = "40-49"  # fidelity is measured on these
    offload_device: str = "cpu"  # cpu, cuda, openvino, ort:<ExecutionProvider> (see `hetlab offload devices`)
    # how the cache condition stores features, comma-separated: fp16, int8 (per-token scales); one run each
    cache_dtypes: str = "fp16"
    quantise: QuantiseConfig = field(default_factory=QuantiseConfig)  # how the offloaded prefixes are quantised to INT8
    power_interval: float = 1.0  # seconds between power samples
    power_command: str | None = None  # prints an extra device's power (e.g. an NPU vendor tool)
    power_pattern: str = r"([0-9.]+)\s*W"  # regex; its first group is the watts
    power_device: str = "offload device"  # the name --power-command's readings appear under
    out: Path | None = None  # default <from_run>/study


MIN_TUNE_SECONDS = 5.0  # a condition's run needs its first logged rows (every 10 steps) within this


@dataclass(frozen=True, kw_only=True)
class OffloadTuneConfig:
    from_run: Annotated[Path, tyro.conf.arg(name="from")]  # the Phase-A run whose encoder Phase B freezes
    seconds: float = 20.0  # training time per condition, after its offload backend is made
    conditions: str = ",".join(CONDITIONS)  # comma-separated, as `offload study --conditions`
    offload_devices: str = "auto"  # comma-separated (`hetlab offload devices`); auto: every usable one
    steps: int = 30_000  # the Phase-B run the choice is for: the cache's build is spread over its samples
    batch: int = 8  # Phase B's batch
    train_episodes: str = "0-39"  # the episodes Phase B will train on (the cache holds their frames)
    calibration_episodes: str = "0-7"  # the INT8 prefixes' calibration frames come from these
    cache_dtype: str = "fp16"  # how the cache condition stores features: fp16 or int8
    cache_episodes: str = "0"  # where the cache is not built: the episodes a sample cache is built from
    out: Path | None = None  # default <from_run>/offload/tune.json
    json: bool = False  # print the result as JSON
