"""Algorithm registry: names → options (`ALGO_CONFIGS`) and → algorithm classes (`ALGOS`).

An algorithm is one file holding a class that meets `hetlab.algos.contract.Algorithm` (an
on-policy one, `OnPolicyAlgorithm`): its name, its options (`Config`, a frozen dataclass in
configs.py, which becomes the `--<name>.*` options of `hetlab train`), which loop feeds it, its
CPU defaults (see hetlab.train.device_defaults), `actor`, `update`, `state_dict` and
`load_state_dict`. Adding one is that file, its options in configs.py and its entries below.

The classes import torch and are imported when first asked for (`algorithm_class`, `ALGOS`);
the options are not, so that the command line builds its help without torch.
"""

from __future__ import annotations

from importlib import import_module

from hetlab.algos.configs import APPOConfig, FastSACConfig, FlashSACConfig, PPOConfig, SACConfig, TD3Config
from hetlab.algos.contract import Algorithm

ALGO_CONFIGS = {"ppo": PPOConfig, "appo": APPOConfig, "sac": SACConfig, "td3": TD3Config, "fastsac": FastSACConfig,
                "flashsac": FlashSACConfig}
# name → the class in hetlab.algos.<name>
_CLASS_NAMES = {"ppo": "PPO", "appo": "APPO", "sac": "SAC", "td3": "TD3", "fastsac": "FastSAC", "flashsac": "FlashSAC"}


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name` (a key of ALGO_CONFIGS)."""
    return getattr(import_module(f"hetlab.algos.{name}"), _CLASS_NAMES[name])


def __getattr__(attribute: str):
    # ALGOS (name → class) imports every algorithm, so it is made on first use rather than with the package.
    if attribute == "ALGOS":
        globals()["ALGOS"] = algos = {name: algorithm_class(name) for name in ALGO_CONFIGS}
        return algos
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
