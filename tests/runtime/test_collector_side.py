"""The shared regions and their Ray ports meet the collector-side Protocols, with the signatures the
Protocols declare, so a collector runs unchanged beside the learner or on a cluster."""

from __future__ import annotations

import inspect

import pytest
import torch

from hetlab.runtime.collector_side import RolloutSlots, TransitionSink, WeightSource
from hetlab.runtime.replay import ReplayBuffer, ReplayLayout
from hetlab.runtime.rollout_ring import RolloutLayout, RolloutRing
from hetlab.runtime.weights import WeightBroadcast


OBS = {"policy": 5, "critic": 7}


def _methods(protocol) -> dict[str, list[str]]:
    """Each method of the Protocol → its parameter names; properties → []."""
    members = {}
    for name, member in vars(protocol).items():
        if isinstance(member, property):
            members[name] = []
        elif inspect.isfunction(member) and not name.startswith("_"):
            members[name] = list(inspect.signature(member).parameters)
    return members


def _assert_meets(obj, protocol) -> None:
    assert isinstance(obj, protocol), f"{type(obj).__name__} is not a {protocol.__name__}"
    for name, parameters in _methods(protocol).items():
        member = inspect.getattr_static(type(obj), name)
        if not parameters:
            assert isinstance(member, property), (type(obj).__name__, name)
        else:
            assert list(inspect.signature(member).parameters) == parameters, (type(obj).__name__, name)


def test_the_protocols_declare_what_collectors_call():
    assert set(_methods(RolloutSlots)) == {"attach", "close", "acquire", "views", "commit"}
    assert set(_methods(TransitionSink)) == {"attach", "close", "write", "end_episodes", "commit", "learner_updates"}
    assert set(_methods(WeightSource)) == {"attach", "close", "version", "read"}


def test_regions_and_their_ports_meet_the_collector_side_protocols():
    ring_layout = RolloutLayout(horizon=4, num_envs=3, obs_sizes=OBS, action_size=2)
    replay_layout = ReplayLayout(64, 2, 3, OBS, action_size=2, queue_size=4)
    actor = torch.nn.Linear(5, 2)
    with RolloutRing(ring_layout, 2) as ring, ReplayBuffer(replay_layout) as replay, \
            WeightBroadcast(actor.state_dict()) as weights:
        _assert_meets(ring, RolloutSlots)
        _assert_meets(replay, TransitionSink)
        _assert_meets(weights, WeightSource)
        ports = pytest.importorskip("hetlab.runtime.ray.ports", reason="the ray extra is not installed")
        for local in (True, False):  # on the learner's node, and on another
            _assert_meets(ports.make_port("ring", ring, local), RolloutSlots)
            _assert_meets(ports.make_port("replay", replay, local), TransitionSink)
            _assert_meets(ports.make_port("weights", weights, local), WeightSource)


def test_a_port_missing_a_collector_method_is_refused():
    class SlotsWithoutViews:
        def attach(self): ...
        def close(self): ...
        def acquire(self, timeout=None): ...
        def commit(self, slot, meta): ...

    assert not isinstance(SlotsWithoutViews(), RolloutSlots)
