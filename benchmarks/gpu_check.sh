#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one unattended run from a fresh clone (about 8 minutes
# on one GPU and 16 cores). Run it first whenever such a machine is at hand:
#
#   benchmarks/gpu_check.sh [OUT_DIR]        # default runs/gpu_check
#
# It sets up .venv with a CUDA build of torch (TORCH=... overrides the pip arguments, as for
# `make`), the extras the checks use (MuJoCo Warp, NVML, ONNX Runtime's CUDA provider), then:
#   1. the CUDA-only tests: staging (pinned buffers, side streams), peak memory, device probing,
#      and the Warp backend's contract tests stepping on the GPU;
#   2. `hetlab bench sim --sim all` on Go1 at 1k/4k/16k envs: mujoco.batch on every core against
#      MuJoCo Warp on the GPU (and MotrixSim), side by side;
#   3. PPO end to end, CPU collectors + GPU learner, sync vs async against each stage alone
#      (benchmarks/runtime_throughput.py; the design asks async ≥ 0.9 × the slower stage);
#   4. FastSAC and FlashSAC updates/s, inference in the collectors vs on the learner;
#   5. Phase B on a small dataset: learner-only vs L4 offloaded INT8 on ONNX Runtime's CUDA
#      provider, with NVML board power: samples/s, energy per sample, peak memory.
# Each check has its own time limit; one that fails or times out is reported as such and the
# rest still run. Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md (the table), and exits
# non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MUJOCO_GL=egl

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); these checks need one" >&2
  exit 2
fi
nvidia-smi -L | tee "$OUT/gpus.txt"

make setup TORCH="${TORCH:-torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128}" || exit 1
PY=.venv/bin/python
$PY -m pip install -q -e '.[dev,warp,gpu-power]' || exit 1
# ONNX Runtime's CUDA provider comes with the onnxruntime-gpu build, in place of the CPU one.
$PY -m pip uninstall -q -y onnxruntime && $PY -m pip install -q onnxruntime-gpu || exit 1
HETLAB=.venv/bin/hetlab

declare -A STATUS
check() {  # check NAME SECONDS COMMAND...: runs it with a limit, logs to OUT/NAME.log, records the outcome
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  STATUS[$name]="rc=$rc, $((SECONDS - start))s"
  [[ $rc == 0 ]] || echo "   failed (rc=$rc): see $OUT/$name.log"
}

check cuda_tests 120 $PY -m pytest -q -n0 -rs tests/runtime/test_staging.py tests/measure/test_memory.py \
  tests/test_devices.py tests/sim/test_contract.py -k "cuda or warp or memory or staging or device"
for envs in 1024 4096 16384; do
  check "bench_sim_$envs" 60 $HETLAB bench sim --sim all --task go1-joystick-flat --envs $envs --seconds 12 --json
done
check ppo_runtime 150 $PY benchmarks/runtime_throughput.py --envs 4096 --runs 1 --seconds 25
check off_policy 120 $PY benchmarks/off_policy_throughput.py --algos fastsac flashsac --placement-algos fastsac flashsac \
  --runs 1 --seconds 25
check phase_b 150 bash -c "
  set -e
  $HETLAB aloha record --out $OUT/aloha --episodes 2 --height 64 --width 96 --steps 60 --no-successful-only --render-quality fast
  $HETLAB aloha train --dataset $OUT/aloha --preset tiny --steps 20 --train-episodes 0-1 --runs-dir $OUT/runs
  phase_a=\$(ls -d $OUT/runs/aloha-ar-actor/*/ | head -1)
  episodes='--train-episodes 0-1 --calibration-episodes 0-1'
  $HETLAB aloha train --phase B --from \$phase_a --condition learner --steps 300 \$episodes --out $OUT/phase_b_learner
  $HETLAB aloha train --phase B --from \$phase_a --condition L4 --offload-device cuda --steps 300 \$episodes \
    --out $OUT/phase_b_L4"

STATUS_JSON=$(for name in "${!STATUS[@]}"; do printf '%s\t%s\n' "$name" "${STATUS[$name]}"; done)
STATUS_JSON="$STATUS_JSON" $PY - "$OUT" <<'EOF'
import json, os, sys
from pathlib import Path

out = Path(sys.argv[1])
status = dict(line.split("\t") for line in os.environ["STATUS_JSON"].splitlines() if line)
report, rows = {"status": status}, []
for envs in (1024, 4096, 16384):
    log = out / f"bench_sim_{envs}.log"
    try:
        result = json.loads(log.read_text())
    except (OSError, ValueError):
        continue
    report[f"bench_sim_{envs}"] = result
    for r in result["results"]:
        rows.append(f"| bench sim go1, {envs} envs | {r['sim']} ({r['threads']} threads) | "
                    f"{r['physics_steps_per_s']:,.0f} substeps/s, {r['env_steps_per_s']:,.0f} env steps/s, "
                    f"task_efficiency {r['task_efficiency']:.2f} |")
    for name, reason in result["unavailable"].items():
        rows.append(f"| bench sim go1, {envs} envs | {name} | not run: {reason} |")
for condition in ("learner", "L4"):
    path = out / f"phase_b_{condition}" / "summary.json"
    if path.is_file():
        s = json.loads(path.read_text())
        report[f"phase_b_{condition}"] = s
        energy = s["energy_per_sample"]
        rows.append(f"| Phase B, {condition} | | {s['samples_per_s']:.1f} samples/s, energy/sample {energy}, "
                    f"peak memory {s['peak_memory']} |")
for name in ("ppo_runtime", "off_policy"):
    log = out / f"{name}.log"
    if log.is_file():
        table = [line for line in log.read_text().splitlines() if line.startswith("|")]
        report[name] = table
        rows += table
for name, outcome in sorted(status.items()):
    rows.append(f"| check {name} | | {outcome} |")
(out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
(out / "gpu_check.md").write_text("| check | backend | result |\n|---|---|---|\n" + "\n".join(rows) + "\n")
print((out / "gpu_check.md").read_text())
EOF
for outcome in "${STATUS[@]}"; do [[ $outcome == rc=0,* ]] || exit 1; done
