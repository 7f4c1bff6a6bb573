"""`hetlab export`: a run's deterministic policy as ONNX, checked against the torch actor.

The graph is the actor's `forward` — observation normaliser, MLP, mean action — with input
"obs" (float32 [batch, policy obs]) and output "actions" ([batch, actions]), the batch size
left free. It is exported with torch's default, torch.export-based exporter (`dynamo=True`):
the TorchScript exporter (`dynamo=False`) still works in torch 2.13 but warns that it will be
removed, and the dynamo path only adds `onnxscript`, which the optional extra installs anyway.
Weights are stored inside the file (`external_data=False`), so it is one file that can be
renamed into place and copied alone.

Before the file replaces `<run_dir>/policy.onnx` (or `out`), ONNX Runtime must reproduce the
torch actor within `TOLERANCE` on observations from the task itself and on random ones drawn
around them (in range: far-out inputs only measure float32 rounding of huge outputs). The file's
metadata (`hetlab.*` properties) names the task and its settings (the action scale among them),
the sizes, the checkpoint and the measured parity, so the file explains itself.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import hetlab
from hetlab.deploy.policy import load_policy
from hetlab.files import atomic_path
from hetlab.onnx_export import quiet_exporter, require_onnx_runtime
from hetlab.tasks import make_config, make_task

TOLERANCE = 1e-5  # max abs difference between ONNX Runtime's and torch's actions
PARITY_ENVS, PARITY_STEPS = 32, 8  # real observations: (steps + 1) × envs
PARITY_RANDOM = 256  # random observations


@dataclass(frozen=True)
class Exported:
    path: Path
    max_error: float  # max |ONNX Runtime − torch| over the parity observations' actions
    real_observations: int
    random_observations: int
    metadata: dict[str, str]  # the file's metadata properties


def export_onnx(run_dir: Path | str, out: Path | str | None = None, checkpoint: int | str | None = None) -> Exported:
    """Export the run's policy (newest checkpoint, or iteration `checkpoint`'s) to ONNX, verify it with
    ONNX Runtime, and describe it."""
    ort = require_onnx_runtime()
    import onnx  # installed with onnxscript, which the dynamo exporter needs

    policy = load_policy(run_dir, checkpoint)
    out = Path(out) if out is not None else Path(run_dir) / "policy.onnx"
    obs = _parity_observations(policy)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp, quiet_exporter():
        torch.onnx.export(
            policy.actor, (obs[:2],), tmp, dynamo=True, external_data=False, verbose=False,
            input_names=["obs"], output_names=["actions"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
        error = _check_parity(ort, tmp, policy.actor, obs)
        task_config = make_config(policy.task, num_envs=1, sim=policy.sim, threads=1, seed=policy.seed,
                                  **policy.task_options)
        metadata = {"hetlab.task": policy.task, "hetlab.sim": policy.sim, "hetlab.obs": f"policy [{policy.obs_size}]",
                    "hetlab.actions": f"[{policy.action_size}] in [-1, 1], as the task scales them",
                    "hetlab.task_config": json.dumps(dataclasses.asdict(task_config), default=str),
                    "hetlab.checkpoint": str(policy.checkpoint), "hetlab.version": hetlab.__version__,
                    "hetlab.parity_max_abs_error": f"{error:.3g}"}
        model = onnx.load(str(tmp))
        onnx.helper.set_model_props(model, metadata)
        onnx.save(model, str(tmp))
    return Exported(out, error, len(obs) - PARITY_RANDOM, PARITY_RANDOM, metadata)


def _parity_observations(policy) -> torch.Tensor:
    """Real observations from a short rollout of the policy, then as many random ones drawn
    from their per-column mean and spread."""
    task = make_task(policy.task, num_envs=PARITY_ENVS, sim=policy.sim, threads=1, seed=policy.seed,
                     **policy.task_options)
    obs = [task.reset()["policy"]]
    with torch.no_grad():
        for _ in range(PARITY_STEPS):
            actions = policy.actor(torch.from_numpy(obs[-1])).numpy()
            obs.append(task.step(actions)[0]["policy"])
    real = torch.from_numpy(np.concatenate(obs))
    generator = torch.Generator().manual_seed(policy.seed)
    noise = torch.randn(PARITY_RANDOM, real.shape[1], generator=generator)
    return torch.cat([real, real.mean(0) + real.std(0) * noise])


def _check_parity(ort, path: Path, actor: torch.nn.Module, obs: torch.Tensor) -> float:
    """The max abs difference of ONNX Runtime's actions from torch's; RuntimeError above TOLERANCE."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx_actions,) = session.run(["actions"], {"obs": obs.numpy()})
    with torch.no_grad():
        torch_actions = actor(obs).numpy()
    error = float(np.abs(onnx_actions - torch_actions).max())
    if not error <= TOLERANCE:
        raise RuntimeError(f"the exported policy differs from the torch actor by {error:.3g} > {TOLERANCE:g}")
    return error
