"""Algorithm registry: names → algorithm classes."""

from hetlab.algos.appo import APPO
from hetlab.algos.ppo import PPO

ALGOS = {"ppo": PPO, "appo": APPO}
