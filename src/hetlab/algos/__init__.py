"""Algorithm registry: names → algorithm classes.

An algorithm is one file holding a class with `name`, `Config` (its options: a frozen
dataclass, which becomes the `--<name>.*` options of `hetlab train`), `off_policy` (which
training loop feeds it), `actor`, `update(batch) -> metrics`, `state_dict()` and
`load_state_dict()`, and `cpu_defaults`: the values it takes on a CPU learner for options left at
their defaults, run-wide (`envs`) or its own (`<name>.batch_size`; see hetlab.train.device_defaults).
Adding one is that file and its entry below.
"""

from hetlab.algos.appo import APPO
from hetlab.algos.fastsac import FastSAC
from hetlab.algos.flashsac import FlashSAC
from hetlab.algos.ppo import PPO
from hetlab.algos.sac import SAC
from hetlab.algos.td3 import TD3

ALGOS = {algo.name: algo for algo in (PPO, APPO, SAC, TD3, FastSAC, FlashSAC)}
