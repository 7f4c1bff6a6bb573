"""Every algorithm's options: the `Config` of each algorithm class, and the `--<algo>.*` options of
`hetlab train`.

They live apart from the algorithms, which import torch, so that the command line builds its help
(and a config file is read) without it. The defaults come from the sources each algorithm's module
names; each config checks its own values when made.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetlab.errors import UserError


def check_common_config(cfg, algo: str) -> None:
    """The fields every off-policy config has, which the runtime relies on."""
    problems = []
    if cfg.batch_size < 1:
        problems.append(f"batch_size must be ≥ 1 (got {cfg.batch_size})")
    if not 0.0 < cfg.gamma <= 1.0:
        problems.append(f"gamma must be in (0, 1] (got {cfg.gamma})")
    if cfg.n_step < 1:
        problems.append(f"n_step must be ≥ 1 (got {cfg.n_step})")
    if cfg.updates_per_step <= 0:
        problems.append(f"updates_per_step must be > 0 (got {cfg.updates_per_step})")
    if cfg.learning_starts < 0:
        problems.append(f"learning_starts must be ≥ 0 (got {cfg.learning_starts})")
    if not 0.0 < cfg.tau <= 1.0:
        problems.append(f"tau must be in (0, 1] (got {cfg.tau})")
    if cfg.policy_frequency < 1:
        problems.append(f"policy_frequency must be ≥ 1 (got {cfg.policy_frequency})")
    if problems:
        raise UserError(f"invalid {algo} config: " + "; ".join(problems))


@dataclass(frozen=True)
class PPOConfig:
    actor_hidden: tuple[int, ...] = (512, 256, 128)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (512, 256, 128)  # hidden-layer widths of the critic MLP
    init_noise_std: float = 1.0  # the Gaussian policy's action std at the start
    normalize_obs: bool = True  # normalise observations by their running mean and std
    gamma: float = 0.99  # discount factor
    lam: float = 0.95  # GAE λ
    clip_param: float = 0.2  # for the policy ratio and for the value change
    use_clipped_value_loss: bool = True  # clip each update's change of the value estimate, as the policy ratio is
    value_loss_coef: float = 1.0  # weight of the value loss
    entropy_coef: float = 0.01  # weight of the entropy bonus
    learning_rate: float = 1e-3  # Adam; the starting point when the schedule is adaptive
    desired_kl: float | None = 0.01  # adapt the learning rate to this KL per minibatch; None: fixed rate
    min_learning_rate: float = 1e-5  # lower bound of the adaptive learning rate
    max_learning_rate: float = 1e-2  # upper bound of the adaptive learning rate
    max_grad_norm: float = 1.0  # gradient-norm clipping
    num_learning_epochs: int = 5  # passes over each batch of rollouts
    num_mini_batches: int = 4  # minibatches each batch of rollouts is split into
    # bfloat16 autocast of the epochs' forward passes, on a learner that runs bf16 natively (a GPU, or a
    # CPU with AVX512_BF16 or AMX); the returns and advantages stay fp32
    bf16: bool = False
    # torch.compile (inductor) of each minibatch's forward passes and losses; the first update pays for
    # the compilation (about 45 s on a 2-core CPU)
    compile: bool = False
    # Train on each sample's mirror image too (a left-right symmetric task's: hetlab.tasks.symmetry), so
    # every minibatch holds twice the samples; the epochs cost about twice as much
    symmetry: bool = False

    def __post_init__(self):
        # Configs read back from JSON carry lists; keep the dataclass hashable.
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        if self.num_learning_epochs < 1 or self.num_mini_batches < 1:
            raise UserError("PPO needs at least one learning epoch and one minibatch")


@dataclass(frozen=True)
class APPOConfig:
    actor_hidden: tuple[int, ...] = (512, 256, 128)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (512, 256, 128)  # hidden-layer widths of the critic MLP
    init_noise_std: float = 1.0  # the Gaussian policy's action std at the start
    normalize_obs: bool = True  # normalise observations by their running mean and std
    gamma: float = 0.99  # discount factor
    rho_bar: float = 1.0  # truncation of the importance weights in the TD errors and advantages
    c_bar: float = 1.0  # truncation of the importance weights in the trace
    clip_param: float = 0.2  # on π_θ/π_target
    target_update_interval: int = 1  # updates between refreshes of the target network
    normalize_advantages: bool = True  # divided by their batch std, so the entropy coefficient means what it does in PPO
    value_loss_coef: float = 1.0  # weight of the value loss
    entropy_coef: float = 0.01  # weight of the entropy bonus
    # Adam. Fixed by default: on rollouts several versions old, the KL schedule's rates of up
    # to 1e-2 moved the policy faster than the behaviour data could follow (cartpole collapsed
    # after solving it, at a lag of 4), while 3e-4 learns it as fast and stays there.
    learning_rate: float = 3e-4
    desired_kl: float | None = None  # adapt the learning rate to the KL from the target policy; None: fixed
    min_learning_rate: float = 1e-5  # lower bound of the adaptive learning rate
    max_learning_rate: float = 1e-2  # upper bound of the adaptive learning rate
    max_grad_norm: float = 1.0  # gradient-norm clipping
    num_learning_epochs: int = 5  # passes over each batch of rollouts
    num_mini_batches: int = 4  # minibatches each batch of rollouts is split into

    def __post_init__(self):
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        if self.num_learning_epochs < 1 or self.num_mini_batches < 1 or self.target_update_interval < 1:
            raise UserError("APPO needs at least one learning epoch, one minibatch and a target update interval ≥ 1")


@dataclass(frozen=True)
class SACConfig:
    actor_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the critic MLP
    normalize_obs: bool = True  # normalise observations by their running mean and std
    batch_size: int = 256  # transitions sampled per update
    gamma: float = 0.99  # discount factor
    n_step: int = 1  # steps summed in the n-step return
    updates_per_step: float = 1.0  # gradient updates per vectorised env step
    learning_starts: int = 100  # env steps per env of uniform-random actions before updates start
    tau: float = 0.005  # Polyak factor of the target networks
    actor_learning_rate: float = 3e-4  # Adam learning rate of the actor
    critic_learning_rate: float = 3e-4  # Adam learning rate of the critics
    alpha_learning_rate: float = 3e-4  # Adam learning rate of the entropy temperature
    init_alpha: float = 1.0  # entropy temperature at the start
    target_entropy: float | None = None  # None: −(action size), the paper's heuristic
    log_std_min: float = -5.0  # lower bound of the actor's log std
    log_std_max: float = 2.0  # upper bound of the actor's log std
    policy_frequency: int = 1  # critic updates per actor and temperature update
    target_update_interval: int = 1  # critic updates per target update
    compile: bool = False  # torch.compile the update (pays off on GPUs)
    bf16: bool = False  # bfloat16 autocast in the update (on devices that have it)

    def __post_init__(self):
        # Configs read back from JSON carry lists; keep the dataclass hashable.
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        check_common_config(self, "SAC")
        if not self.actor_hidden or not self.critic_hidden:
            raise UserError("invalid SAC config: actor_hidden and critic_hidden need at least one layer")
        if self.init_alpha <= 0 or self.log_std_min >= self.log_std_max or self.target_update_interval < 1:
            raise UserError("invalid SAC config: init_alpha must be > 0, log_std_min < log_std_max, "
                            "target_update_interval ≥ 1")


@dataclass(frozen=True)
class TD3Config:
    actor_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the critic MLP
    normalize_obs: bool = True  # normalise observations by their running mean and std
    batch_size: int = 256  # transitions sampled per update
    gamma: float = 0.99  # discount factor
    n_step: int = 1  # steps summed in the n-step return
    updates_per_step: float = 1.0  # gradient updates per vectorised env step
    learning_starts: int = 100  # env steps per env of uniform-random actions before updates start
    tau: float = 0.005  # Polyak factor of the target networks
    actor_learning_rate: float = 3e-4  # Adam learning rate of the actor
    critic_learning_rate: float = 3e-4  # Adam learning rate of the critics
    policy_noise: float = 0.2  # std of the target policy smoothing noise
    noise_clip: float = 0.5  # bound of the target-policy smoothing noise
    exploration_noise: float = 0.1  # std of the behaviour policy's noise
    policy_frequency: int = 2  # critic updates per actor and target update
    compile: bool = False  # torch.compile the update (pays off on GPUs)
    bf16: bool = False  # bfloat16 autocast in the update (on devices that have it)

    def __post_init__(self):
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        check_common_config(self, "TD3")
        if not self.actor_hidden or not self.critic_hidden:
            raise UserError("invalid TD3 config: actor_hidden and critic_hidden need at least one layer")
        if min(self.policy_noise, self.noise_clip, self.exploration_noise) < 0:
            raise UserError("invalid TD3 config: policy_noise, noise_clip and exploration_noise must be ≥ 0")


@dataclass(frozen=True)
class FastSACConfig:
    actor_hidden: tuple[int, ...] = (512, 256, 128)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (768, 384, 192)  # hidden-layer widths of the critic MLP
    layer_norm: bool = True  # LayerNorm after each critic layer
    num_q_networks: int = 2  # Q networks in the critic ensemble
    num_atoms: int = 101  # atoms of the distributional critic's support
    v_min: float = -20.0  # lower end of the distributional critic's support
    v_max: float = 20.0  # upper end of the distributional critic's support
    normalize_obs: bool = True  # normalise observations by their running mean and std
    batch_size: int = 8192  # transitions sampled per update
    gamma: float = 0.97  # discount factor
    n_step: int = 1  # steps summed in the n-step return
    updates_per_step: float = 8.0  # gradient updates per vectorised env step
    learning_starts: int = 10  # env steps per env of uniform-random actions before updates start
    tau: float = 0.125  # Polyak factor of the target networks
    actor_learning_rate: float = 3e-4  # Adam learning rate of the actor
    critic_learning_rate: float = 3e-4  # Adam learning rate of the critics
    alpha_learning_rate: float = 3e-4  # Adam learning rate of the entropy temperature
    adam_betas: tuple[float, float] = (0.9, 0.95)  # Adam's β1 and β2
    weight_decay: float = 1e-3  # AdamW, actor and critic
    max_grad_norm: float = 0.0  # 0: no clipping
    init_alpha: float = 1e-3  # entropy temperature at the start
    target_entropy_ratio: float = 0.0  # target entropy = −ratio · action size
    log_std_min: float = -5.0  # lower bound of the actor's log std
    log_std_max: float = 0.0  # upper bound of the actor's log std
    policy_frequency: int = 4  # critic updates per actor update
    compile: bool = False  # torch.compile the update (pays off on GPUs)
    bf16: bool = False  # bfloat16 autocast in the update (on devices that have it)

    def __post_init__(self):
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        object.__setattr__(self, "adam_betas", tuple(self.adam_betas))
        check_common_config(self, "FastSAC")
        if not self.actor_hidden or not self.critic_hidden:
            raise UserError("invalid FastSAC config: actor_hidden and critic_hidden need at least one layer")
        if self.num_atoms < 2 or self.v_min >= self.v_max or self.num_q_networks < 1:
            raise UserError("invalid FastSAC config: need num_atoms ≥ 2, v_min < v_max and num_q_networks ≥ 1")
        if self.init_alpha <= 0 or self.log_std_min >= self.log_std_max:
            raise UserError("invalid FastSAC config: init_alpha must be > 0 and log_std_min < log_std_max")


@dataclass(frozen=True)
class FlashSACConfig:
    actor_blocks: int = 2  # residual blocks of the actor
    actor_hidden: int = 128  # width of the actor's blocks
    critic_blocks: int = 2  # residual blocks of the critic
    critic_hidden: int = 256  # width of the critic's blocks
    expansion: int = 4  # width of a block's inner layer, in multiples of `hidden`
    num_q_networks: int = 2  # Q networks in the critic ensemble
    num_atoms: int = 101  # atoms of the distributional critic's support
    return_max: float = 5.0  # G_max: the critic's support is [−G_max, G_max]
    normalize_reward: bool = True  # scale rewards by a running bound on the return
    normalize_obs: bool = False  # the embedder's BatchNorm already normalises the inputs
    batch_size: int = 2048  # transitions sampled per update
    gamma: float = 0.99  # discount factor
    n_step: int = 3  # steps summed in the n-step return
    updates_per_step: float = 2.0  # gradient updates per vectorised env step
    learning_starts: int = 10  # env steps per env of uniform-random actions before updates start
    tau: float = 0.01  # Polyak factor of the target networks
    learning_rate: float = 3e-4  # Adam, for actor, critic and temperature
    init_temperature: float = 0.01  # entropy temperature at the start
    target_entropy_std: float = 0.15  # H̄ = the entropy of N(0, std²) per action dimension
    log_std_min: float = -10.0  # lower bound of the actor's log std
    log_std_max: float = 2.0  # upper bound of the actor's log std
    policy_frequency: int = 2  # updates per actor and temperature step
    compile: bool = False  # torch.compile the update (pays off on GPUs)
    bf16: bool = False  # bfloat16 autocast in the update (on devices that have it)

    def __post_init__(self):
        check_common_config(self, "FlashSAC")
        if min(self.actor_blocks, self.critic_blocks) < 0 or min(self.actor_hidden, self.critic_hidden, self.expansion) < 1:
            raise UserError("invalid FlashSAC config: blocks must be ≥ 0, hidden sizes and expansion ≥ 1")
        if self.num_atoms < 2 or self.return_max <= 0 or self.num_q_networks < 1:
            raise UserError("invalid FlashSAC config: need num_atoms ≥ 2, return_max > 0 and num_q_networks ≥ 1")
        if self.normalize_reward and self.gamma >= 1.0:
            raise UserError("invalid FlashSAC config: reward normalisation bounds returns by |r|/(1 − γ); "
                            "use gamma < 1 or normalize_reward=False")
        if self.init_temperature <= 0 or self.target_entropy_std <= 0 or self.log_std_min >= self.log_std_max:
            raise UserError("invalid FlashSAC config: init_temperature and target_entropy_std must be > 0, "
                            "log_std_min < log_std_max")
