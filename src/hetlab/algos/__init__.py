"""Algorithm registry: names → algorithm classes."""

from hetlab.algos.appo import APPO
from hetlab.algos.fastsac import FastSAC
from hetlab.algos.flashsac import FlashSAC
from hetlab.algos.ppo import PPO
from hetlab.algos.sac import SAC
from hetlab.algos.td3 import TD3

ALGOS = {"ppo": PPO, "appo": APPO, "sac": SAC, "td3": TD3, "fastsac": FastSAC, "flashsac": FlashSAC}
