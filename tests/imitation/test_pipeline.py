"""The imitation pipeline end to end at CI size: the scripted expert records one episode, Phase A
(the tiny preset) trains on it, and the policy, evaluated in closed loop on the seed the episode
was recorded from, reaches the cube. A mismatch between recording and evaluation in the state or
the actions (their order or normalisation) fails it: with the arms' states swapped no
checkpoint reaches the cube. The image does not decide it (a policy fitted to one episode reaches
the cube with the camera upside down); tests/policies/test_ar_actor.py checks that the policy
acts on what the image shows."""

from __future__ import annotations

from hetlab.aloha.record import RecordConfig, record
from hetlab.imitation.evaluate import ChunkPolicy, eval_env, load_eval_policy, run_episode
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PhaseAConfig
from hetlab.imitation.run_files import read_run

JUDGED_STEPS = (700, 800, 900, 1000)


def test_a_policy_trained_on_one_episode_replays_it_in_closed_loop(tmp_path):
    dataset = tmp_path / "one-episode"
    record(RecordConfig(out=dataset, episodes=1, height=64, width=96, workers=1))
    run = train_phase_a(PhaseAConfig(dataset=dataset, preset="tiny", train_episodes="0", steps=JUDGED_STEPS[-1],
                                     loader_workers=0, keep_checkpoints=0, runs_dir=tmp_path / "runs"))
    # What an evaluation worker runs (hetlab.imitation.evaluate), in this process: four worker
    # starts would add ~7 s.
    env = eval_env(read_run(run))
    rewards = {step: run_episode(env, ChunkPolicy(load_eval_policy(run, step), replan_every=0), seed=0)["max_reward"]
               for step in JUDGED_STEPS}
    # Reward > 0: the right gripper went to the cube and touched it. Whether one checkpoint of a
    # policy fitted to one episode does so swings with the CPU's kernels (a closed loop amplifies
    # last-bit differences), so four are judged. Measured on a 2-core AMD EPYC (Zen 5) at steps
    # 700-1,000: native kernels (AVX-512 VNNI, BF16) 2, 2, 2, 2; capped at AVX2 2, 0, 4, 2;
    # ATen's default kernels 2, 2, 4, 2 (docs/reliability.md). A policy after 50 steps reaches nothing.
    assert sum(reward > 0 for reward in rewards.values()) >= 2, rewards
