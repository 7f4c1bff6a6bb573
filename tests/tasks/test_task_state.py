"""A task restored from its state_dict continues bit-identically."""

import numpy as np
import pytest

from hetlab.errors import UserError
from hetlab.tasks import TASKS, make_task


@pytest.mark.parametrize("name", sorted(TASKS))
def test_restored_task_continues_exactly(name):
    original = make_task(name, num_envs=16, seed=1)
    original.reset()
    actions = np.random.default_rng(0).uniform(-1, 1, (120, 16, original.action_size)).astype(np.float32)
    for t in range(40):
        original.step(actions[t])
    state = original.state_dict()
    restored = make_task(name, num_envs=16, seed=1)
    obs = restored.load_state_dict(state)
    np.testing.assert_array_equal(obs["policy"], original._obs["policy"])
    resets = 0
    for t in range(40, 120):
        a = original.step(actions[t])
        b = restored.step(actions[t])
        for group in a[0]:
            np.testing.assert_array_equal(a[0][group], b[0][group])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
        resets += int(a[2].sum() + a[3].sum())
    assert resets > 0  # the comparison covered auto-resets, which draw from the restored generator


def test_state_of_another_size_is_rejected():
    small = make_task("cartpole-balance", num_envs=4)
    small.reset()
    big = make_task("cartpole-balance", num_envs=8)
    with pytest.raises(UserError, match="does not fit"):
        big.sim.set_state(small.state_dict()["sim"])
