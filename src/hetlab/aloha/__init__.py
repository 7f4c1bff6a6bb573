"""The ALOHA cube-transfer world: a gymnasium env (env.py) and a scripted IK expert (expert.py).

Importing the package registers the env as gymnasium id `hetlab/AlohaTransferCube-v0`:

    env = gymnasium.make("hetlab/AlohaTransferCube-v0", cameras=("top",))
"""

from gymnasium.envs.registration import register, registry

ENV_ID = "hetlab/AlohaTransferCube-v0"

if ENV_ID not in registry:  # a second import (e.g. in a spawned worker that re-imports) must not warn
    register(id=ENV_ID, entry_point="hetlab.aloha.env:AlohaTransferCube")
