//! The checked experiment: plain data, produced by the checker and consumed by the runtime.
//!
//! Every value here has already passed the checker, so the runtime may rely on the invariants
//! written on each field (ranges, cross-field rules) without checking them again. Defaults are
//! the ones a file gets when it leaves a key out; they are written once, at the end of this
//! module (`impl Default` and associated `DEFAULT_*` constants), the checker fills every
//! unspecified key from there, and the book's language reference documents the same values.

use serde::{Deserialize, Serialize};

/// One experiment: everything a run needs, resolved and validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Experiment {
    /// The identifier after `experiment`; also the run directory's name.
    pub name: String,
    /// The root of all randomness in a run.
    pub seed: u64,
    /// Where tensors live; a command-line `--device` overrides it.
    pub device: Device,
    /// How exactly flex's large matrix products are computed (PyTorch's
    /// `torch.set_float32_matmul_precision`).
    #[serde(default)]
    pub matmul_precision: MatmulPrecision,
    /// The policy.
    pub model: Model,
    /// The tasks, in file order; at least one, names unique.
    pub tasks: Vec<Task>,
    /// Stages over training steps; empty means one stage with every task at its own settings.
    pub curriculum: Vec<Stage>,
    /// The RL algorithm and its loss.
    pub algorithm: Algorithm,
    /// The rollout engine pool.
    pub pool: Pool,
    /// The training loop.
    pub train: Train,
    /// Periodic evaluation on held-out instances.
    pub eval: Eval,
    /// Seeds and ablations that expand into several runs; `None` for a single run.
    pub sweep: Option<Sweep>,
}

/// Where tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// CUDA if compiled in, else wgpu if compiled in, else flex.
    #[default]
    Auto,
    /// burn's CPU backend.
    Flex,
    /// wgpu (any adapter; the CPU adapter under lavapipe).
    Wgpu,
    /// wgpu restricted to Vulkan.
    Vulkan,
    /// CUDA.
    Cuda,
}

/// `matmul_precision`: how exactly flex's large matrix products are computed, as PyTorch's
/// `torch.set_float32_matmul_precision` levels of the same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MatmulPrecision {
    /// f32 products: the same bits on every machine with the same vector width.
    #[default]
    Highest,
    /// Operands rounded to bf16 and summed in f32, on Intel's AMX tiles where the CPU has them
    /// (f32 elsewhere); a decode step's few rows and attention stay in f32.
    Medium,
}

/// The policy model block: `model NAME { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// The identifier after `model`.
    pub name: String,
    /// The network.
    pub arch: Arch,
    /// Whether and how the policy has a value head (PPO needs one).
    pub value_head: ValueHead,
    /// Which weights training changes: all of them, or low-rank adapters over a frozen base.
    #[serde(default)]
    pub finetune: Finetune,
}

/// `finetune = full | lora { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Finetune {
    /// Every weight is trained. The default.
    #[default]
    Full,
    /// Low-rank adapters (LoRA) on chosen linear layers; the base weights stay frozen, so the
    /// optimizer's state and the checkpoints cover the adapters alone.
    Lora(Lora),
}

/// `finetune = lora { rank, alpha, dropout, targets }`: each targeted layer `W` computes
/// `W x + (alpha / rank) · B A dropout(x)`, with `A` drawn as PEFT draws it and `B` zero, so
/// training starts from the base model exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lora {
    /// Rank of each adapter, >= 1. Default 16.
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank`, > 0. Default 32.
    pub alpha: f64,
    /// Dropout on the adapters' input during training, in `[0, 1)`. Default 0.
    pub dropout: f64,
    /// The linear layers of every block that get an adapter, without repeats. Default all
    /// seven.
    pub targets: Vec<LoraTarget>,
}

impl Lora {
    /// `rank` when left out.
    pub const DEFAULT_RANK: usize = 16;
    /// `alpha` when left out.
    pub const DEFAULT_ALPHA: f64 = 32.0;
    /// `dropout` when left out.
    pub const DEFAULT_DROPOUT: f64 = 0.0;

    /// The factor the adapters' product is scaled by, `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

impl Default for Lora {
    /// `finetune = lora` with every key left out.
    fn default() -> Self {
        Lora {
            rank: Self::DEFAULT_RANK,
            alpha: Self::DEFAULT_ALPHA,
            dropout: Self::DEFAULT_DROPOUT,
            targets: LoraTarget::ALL.to_vec(),
        }
    }
}

/// A linear layer of a decoder block that LoRA can adapt; named as in the language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// The query projection.
    Q,
    /// The key projection.
    K,
    /// The value projection.
    V,
    /// The attention output projection.
    O,
    /// The SwiGLU gate projection.
    Gate,
    /// The SwiGLU up projection.
    Up,
    /// The feed-forward down projection.
    Down,
}

impl LoraTarget {
    /// Every target, in block order.
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The name the language writes.
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::O => "o",
            LoraTarget::Gate => "gate",
            LoraTarget::Up => "up",
            LoraTarget::Down => "down",
        }
    }
}

/// The network of a policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// A decoder-only transformer trained from scratch.
    Transformer(TransformerArch),
    /// A Hugging Face Qwen2 checkpoint directory.
    Qwen2 {
        /// Directory holding `config.json`, `tokenizer.json` and safetensors.
        weights: String,
    },
    /// A Hugging Face Llama checkpoint directory.
    Llama {
        /// Directory holding `config.json`, `tokenizer.json` and safetensors.
        weights: String,
    },
    /// A llama.cpp GGUF file of a Llama or Qwen2 model: weights (quantized or not),
    /// hyperparameters, tokenizer and chat template in one file.
    Gguf {
        /// The `.gguf` file.
        file: String,
    },
}

/// `arch = transformer { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerArch {
    /// Decoder blocks, >= 1. Default 2.
    pub layers: usize,
    /// Residual width, >= 8 and a multiple of `heads`. Default 128.
    pub d_model: usize,
    /// Attention heads, >= 1. Default 4.
    pub heads: usize,
    /// Key/value heads for grouped-query attention; divides `heads`. Default `heads`.
    pub kv_heads: usize,
    /// Feed-forward width. Default `4 * d_model`.
    pub ffn: usize,
    /// Maximum tokens in one trajectory, >= 16. Default 512.
    pub context: usize,
    /// Whether the output layer reuses the token embedding. Default true: a tied head can
    /// name tokens it has only read (entity names in a question), which small models need.
    pub tie_embeddings: bool,
    /// Most tokens in the word-level vocabulary each run trains on its tasks' text, >= 512.
    /// Default 2048. A word outside it is spelled in bytes, which a small policy copies badly.
    #[serde(default = "TransformerArch::default_vocab")]
    pub vocab: usize,
}

/// `value_head = none | shared | separate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ValueHead {
    /// No critic (GRPO, RLOO, REINFORCE++). The default.
    #[default]
    None,
    /// A value head on the policy's trunk.
    Shared,
    /// A separate critic network of the same architecture.
    Separate,
}

/// `task NAME { env = ..., ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The identifier after `task`; unique in the file.
    pub name: String,
    /// Which environment serves the task.
    pub env: EnvRef,
    /// Sampling weight, > 0. Default 1.
    pub weight: f64,
    /// Turn limit of an episode, >= 1. Default: the environment's own (OS 8, DB 15, KG 15,
    /// ALFWorld 20, WebShop 20; 20 for a user's type).
    pub max_turns: u32,
    /// Inclusive difficulty levels to draw instances from, within 1..=3. Default `1 .. 3`.
    pub difficulty: Difficulty,
    /// The split training episodes and warm-up demonstrations of this task come from.
    /// Default train; `test` is for deliberate overfitting checks (evaluation picks its own
    /// split in `eval`).
    pub split: Split,
}

/// An inclusive range of difficulty levels, `1 <= min <= max <= 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difficulty {
    /// Lowest level drawn.
    pub min: u8,
    /// Highest level drawn.
    pub max: u8,
}

/// The environment of a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvRef {
    /// One of Agentry's own tasks.
    Builtin(BuiltinEnv),
    /// A user's Rust type, by path (`crate::envs::Maze`); rustc checks that it exists and
    /// implements the environment contract.
    Path(String),
    /// A task served by workers behind an AgentRL-compatible controller
    /// (`remote = "http://host:5020/api", name = "kg"`). It has no oracle, so it cannot give
    /// warm-up or SFT demonstrations; the workers decide its split and difficulty.
    Remote {
        /// The controller's API base (`http://` or `https://`, ending in `/api`).
        url: String,
        /// The task name on the controller. Default: the task's own name.
        name: String,
    },
}

/// The built-in tasks (DESIGN §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinEnv {
    /// Household text world.
    Alfworld,
    /// SQL over SQLite.
    Db,
    /// Knowledge-graph question answering.
    Kg,
    /// Sandboxed shell.
    Os,
    /// Web shopping.
    Webshop,
}

impl BuiltinEnv {
    /// Every built-in, in the order the book lists them.
    pub const ALL: [BuiltinEnv; 5] = [
        BuiltinEnv::Alfworld,
        BuiltinEnv::Db,
        BuiltinEnv::Kg,
        BuiltinEnv::Os,
        BuiltinEnv::Webshop,
    ];

    /// The identifier used in `.arl` files.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinEnv::Alfworld => "alfworld",
            BuiltinEnv::Db => "db",
            BuiltinEnv::Kg => "kg",
            BuiltinEnv::Os => "os",
            BuiltinEnv::Webshop => "webshop",
        }
    }

    /// The turn limit AgentBench-FC uses for this task.
    pub fn default_max_turns(self) -> u32 {
        match self {
            BuiltinEnv::Os => 8,
            BuiltinEnv::Db | BuiltinEnv::Kg => 15,
            BuiltinEnv::Alfworld | BuiltinEnv::Webshop => 20,
        }
    }
}

/// `stage NAME { ... }` inside `curriculum`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// The identifier after `stage`; unique in the curriculum.
    pub name: String,
    /// The stage covers steps `[previous until, until)`; `None` only for the last stage,
    /// which runs to the end. Strictly increasing across stages.
    pub until: Option<u64>,
    /// Turn budget of every episode in the stage; `None` keeps each task's `max_turns`.
    pub max_turns: Option<u32>,
    /// Tasks sampled in the stage (declared names); empty means every task.
    pub tasks: Vec<String>,
    /// Difficulty override for every task in the stage.
    pub difficulty: Option<Difficulty>,
}

/// `algorithm KIND { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Algorithm {
    /// The advantage estimator.
    pub kind: AlgorithmKind,
    /// Trajectories per prompt; >= 2 for the grouped estimators ([`AlgorithmKind::is_grouped`]).
    /// Default 8 for those, 1 for PPO and REINFORCE++.
    pub group_size: usize,
    /// PPO ratio clip `[1 - low, 1 + high]`; `clip = 0.2` sets both. Default 0.2 .. 0.2.
    pub clip: Clip,
    /// Dual clip constant c > 1 for negative advantages; `None` disables it.
    pub dual_clip: Option<f64>,
    /// KL to the frozen reference policy.
    pub kl: Kl,
    /// Entropy bonus coefficient, >= 0. Default 0.
    pub entropy: f64,
    /// How advantages are normalized. Default `group` for GRPO, `batch` otherwise.
    pub advantage_norm: AdvantageNorm,
    /// How token losses are reduced. Default `token_mean` (`seq_mean_token_sum` for Dr. GRPO).
    pub aggregation: Aggregation,
    /// The weight α of the SFT term in RL + α·SFT. Default constant 0.
    pub sft: Schedule,
    /// Where the SFT term's demonstrations come from. Default the oracle's.
    pub sft_from: SftSource,
    /// Truncated importance sampling: the cap `C >= 1` on the per-token weight
    /// `min(π_old / π_behaviour, C)` that corrects for tokens sampled by another policy than
    /// the one the update starts from. `None` (the default) takes the ratio against the
    /// behaviour log-probabilities directly.
    pub is_cap: Option<f64>,
    /// Trajectory filtering before the update. Default none.
    pub filter: Filter,
    /// Weight of negative (below-baseline) advantages after normalization, in [0, 1]. 1, the
    /// default, is the estimator as published; 0 only reinforces better-than-baseline samples.
    pub negative_weight: f64,
    /// Which tokens a reward is credited to. Default outcome.
    pub credit: Credit,
    /// Discount, in (0, 1]: across turns with `credit = turn`, across agent tokens in PPO's
    /// GAE. Default 1.
    pub gamma: f64,
    /// GAE λ (PPO), in [0, 1]. Default 0.95.
    pub lambda: f64,
    /// Optimizer passes over each batch, >= 1. Default 1.
    pub epochs: usize,
    /// Global gradient-norm clip, > 0; `None` disables it. Default 1.0.
    pub grad_clip: Option<f64>,
    /// PPO's value clip ε_v, > 0: the new value is kept within ε_v of the rollout's value in
    /// the clipped value loss. Default 0.2. PPO only.
    pub value_clip: f64,
    /// Weight of the value loss added to the policy loss with a shared trunk, >= 0. Default 1.
    /// PPO only, and not with a separate critic (it has its own optimizer).
    pub value_coef: f64,
}

/// The advantage estimators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmKind {
    /// Group-relative: `(r - mean_g) / (std_g + 1e-6)`.
    Grpo,
    /// Dr. GRPO: `r - mean_g`, without the division by the group's std (which over-weights
    /// groups whose rewards barely differ).
    DrGrpo,
    /// Leave-one-out baseline within the group.
    Rloo,
    /// Batch-whitened discounted returns.
    ReinforcePp,
    /// REINFORCE++ with the group mean as baseline: `r - mean_g`, then whitened over the batch.
    ReinforcePpBaseline,
    /// Clipped policy gradient with a critic and GAE.
    Ppo,
}

impl AlgorithmKind {
    /// The identifier used in `.arl` files.
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmKind::Grpo => "grpo",
            AlgorithmKind::DrGrpo => "dr_grpo",
            AlgorithmKind::Rloo => "rloo",
            AlgorithmKind::ReinforcePp => "reinforce_pp",
            AlgorithmKind::ReinforcePpBaseline => "reinforce_pp_baseline",
            AlgorithmKind::Ppo => "ppo",
        }
    }

    /// Whether the estimator compares the members of a group (so needs `group_size >= 2`).
    pub fn is_grouped(self) -> bool {
        matches!(
            self,
            AlgorithmKind::Grpo
                | AlgorithmKind::DrGrpo
                | AlgorithmKind::Rloo
                | AlgorithmKind::ReinforcePpBaseline
        )
    }

    /// Whether the estimator whitens its token advantages over the batch itself.
    pub fn whitens(self) -> bool {
        matches!(
            self,
            AlgorithmKind::ReinforcePp | AlgorithmKind::ReinforcePpBaseline | AlgorithmKind::Ppo
        )
    }
}

/// Decoupled clip range: ratios are kept in `[1 - low, 1 + high]`; `0 < low <= high`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Clip {
    /// Lower clip ε.
    pub low: f64,
    /// Upper clip ε (clip-higher when above `low`).
    pub high: f64,
}

/// `kl = none | k1(c) | k2(c) | low_var_kl(c) | abs(c)`, optionally `as = reward`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kl {
    /// The estimator; `None` disables the KL term.
    pub estimator: Option<KlEstimator>,
    /// Coefficient, >= 0.
    pub coef: f64,
    /// Whether the KL is a loss term or a reward penalty.
    pub placement: KlPlacement,
}

/// KL estimators (Schulman's k1, k2, k3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logp - ref`.
    K1,
    /// `0.5 * (logp - ref)^2`.
    K2,
    /// `exp(ref - logp) - (ref - logp) - 1`, clamped to [-10, 10] (`low_var_kl`).
    K3,
    /// `|logp - ref|`.
    Abs,
}

/// Where the KL term goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// Added to the loss. The default.
    #[default]
    Loss,
    /// Subtracted from the reward.
    Reward,
}

/// Advantage normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageNorm {
    /// None beyond what the estimator does.
    None,
    /// Within each group.
    Group,
    /// Over the agent tokens of the whole batch.
    Batch,
    /// Over the agent tokens of each task in the batch (AgentRL).
    PerTask,
}

/// Loss aggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// One mean over every agent token of the batch.
    TokenMean,
    /// Sum over a sequence's tokens, mean over sequences.
    SeqMeanTokenSum,
    /// Mean over a sequence's tokens, mean over sequences.
    SeqMeanTokenMean,
}

/// A scalar that changes over training steps (the α of RL + α·SFT).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    /// `constant(a)` or a bare number.
    Constant(f64),
    /// `linear(a -> b, over = n)`: from a at step 0 to b at step n, then b.
    Linear {
        /// Value at step 0.
        from: f64,
        /// Value from step `over` on.
        to: f64,
        /// Steps of the ramp, >= 1.
        over: u64,
    },
    /// `cosine(a -> b, over = n)`: half-cosine from a to b over n steps, then b.
    Cosine {
        /// Value at step 0.
        from: f64,
        /// Value from step `over` on.
        to: f64,
        /// Steps of the ramp, >= 1.
        over: u64,
    },
    /// `step(a -> b, at = n)`: a before step n, b from step n on.
    Step {
        /// Value before `at`.
        from: f64,
        /// Value from `at` on.
        to: f64,
        /// The step where the value switches.
        at: u64,
    },
}

/// A schedule, or a bare number as experiments recorded before the key took schedules.
fn number_or_schedule<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Recorded {
        Number(f64),
        Schedule(Schedule),
    }
    Ok(match Recorded::deserialize(d)? {
        Recorded::Number(v) => Schedule::Constant(v),
        Recorded::Schedule(s) => s,
    })
}

impl Schedule {
    /// The value at training step `step`.
    pub fn at(&self, step: u64) -> f64 {
        match *self {
            Schedule::Constant(v) => v,
            Schedule::Linear { from, to, over } => {
                let t = (step as f64 / over as f64).min(1.0);
                from + (to - from) * t
            }
            Schedule::Cosine { from, to, over } => {
                let t = (step as f64 / over as f64).min(1.0);
                to + (from - to) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            Schedule::Step { from, to, at } => {
                if step < at {
                    from
                } else {
                    to
                }
            }
        }
    }
}

/// Credit assignment: which tokens a reward is credited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// The episode's total reward, credited to every agent token alike.
    Outcome,
    /// Each turn's tokens get the discounted return from that turn on, so a reward credits
    /// the turn that earned it and (discounted by `gamma`) the turns before it, never later
    /// ones. With rewards only at the end and `gamma = 1` this is `outcome`.
    Turn,
    /// `monte_carlo(k = K, turns = a .. b)`: turn credit, where a turn whose starting state is
    /// a snapshot boundary has that state's Monte-Carlo value subtracted: the mean return of
    /// `k` continuations played by the current policy from copies of the environment.
    /// REINFORCE++ only (the estimate is the baseline).
    MonteCarlo {
        /// Continuations per snapshot, >= 1.
        k: usize,
        /// First boundary snapshotted: the state after this many agent turns (0: the start).
        first: u32,
        /// Last boundary snapshotted; `None`: every boundary from `first` on.
        last: Option<u32>,
    },
}

impl Credit {
    /// `monte_carlo` without `turns`: every boundary from the start (first 0, no last).
    pub const DEFAULT_TURNS: (u32, Option<u32>) = (0, None);

    /// The turn boundaries a Monte-Carlo credit snapshots, up to (excluding) `max_turns`.
    pub fn boundaries(&self, max_turns: u32) -> Vec<u32> {
        match *self {
            Credit::MonteCarlo { first, last, .. } => {
                let end = last.map_or(max_turns, |l| l.saturating_add(1).min(max_turns));
                (first..end).collect()
            }
            Credit::Outcome | Credit::Turn => Vec::new(),
        }
    }
}

/// The demonstrations of the SFT term in RL + α·SFT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SftSource {
    /// The oracle's demonstrations of training instances (the warm-up's set).
    Oracle,
    /// `successes(keep = n)`: the run's own most recent `n` solved training episodes
    /// (default 256), so the policy imitates what already works for it.
    Successes {
        /// How many of the latest successes are kept.
        keep: usize,
    },
}

/// Trajectory filtering.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Filter {
    /// Keep everything.
    None,
    /// `reward_std(keep = f)`: keep the fraction `f` in (0, 1] of groups with the largest
    /// reward standard deviation (StarPO-S).
    RewardStd {
        /// Fraction of groups kept.
        keep: f64,
    },
}

/// `pool { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// Rollout engines, >= 1. Default 1.
    pub engines: usize,
    /// Stale engines among them, `< engines`. Default 0.
    pub stale: usize,
    /// Steps between refreshes of the stale engines, >= 1. Default 1.
    pub refresh_every: u64,
    /// Per-turn probability of generating with a stale engine, in [0, 1]; > 0 needs `stale >= 1`.
    pub cross_policy: f64,
    /// Oldest policy version (in steps behind) a trained-on trajectory may contain;
    /// `>= refresh_every` when `cross_policy > 0`. Default 1.
    pub max_staleness: u64,
    /// Whether rollout and training overlap.
    pub mode: PoolMode,
    /// Which devices the rollout engines run on. Default colocated.
    pub placement: Placement,
    /// Asynchronous mode: where an episode under way takes up newly published weights.
    #[serde(default)]
    pub interrupt: Interrupt,
    /// Environment calls (resets, steps) run at once by the controller; `None`: one per CPU
    /// core. Environments that wait (remote workers, slow tools) want more.
    #[serde(default)]
    pub env_workers: Option<usize>,
}

/// Where an asynchronous rollout's episodes under way switch to newly published weights
/// (partial rollouts: an episode may span several versions, each token keeping the version
/// and log-probability it was sampled with).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Interrupt {
    /// Never: an episode plays every turn with the weights it started with.
    Never,
    /// At the next turn: each turn is generated with the newest weights when it starts. The
    /// default.
    #[default]
    Turn,
    /// At the next token: a reply being generated goes on with the new weights from its next
    /// token (its keys and values recomputed under them).
    Token,
}

/// Where the rollout engines run, relative to the trainer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// On the trainer's device. The default.
    #[default]
    Colocated,
    /// On other devices of the run's backend, by index (`[1, 2]`: CUDA devices 1 and 2 when the
    /// trainer runs on CUDA). Rollout worker `i` runs on `devices[i % len]` and copies each new
    /// version of the weights there. Needs `mode = async`; no index twice.
    Disaggregated {
        /// Device indices, at least one.
        devices: Vec<u16>,
    },
}

/// Rollout/training scheduling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// Each step waits for its whole batch. The default.
    #[default]
    Sync,
    /// Rollout workers fill a bounded queue while the trainer trains.
    Async,
}

/// `train { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Train {
    /// RL steps, >= 0 (overridable with `--steps`): `0` trains no RL step, so a run without a
    /// warm-up only evaluates the model as loaded.
    pub steps: u64,
    /// Trajectories per step, >= 1; a multiple of `group_size`. Default 32.
    pub batch: usize,
    /// Learning rate, > 0. Default 3e-4.
    pub lr: f64,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Sampling temperature during rollout, > 0. Default 1.
    pub temperature: f64,
    /// Nucleus sampling mass, in (0, 1]. Default 1.
    pub top_p: f64,
    /// Top-k sampling during rollout: only the `k` most likely tokens may be drawn, >= 1.
    /// Default `None` (the whole vocabulary).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Stop strings: an agent turn also ends once its tokens end with the tokens of one of
    /// these (non-empty, distinct). Default none: turns end at the end token.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Token budget of one agent turn, >= 1. Default 64.
    pub max_new_tokens: usize,
    /// Supervised warm-up on oracle demonstrations before RL; `None` to skip.
    pub warmup: Option<Warmup>,
    /// Steps between checkpoints; `None` writes one at the end only.
    pub checkpoint_every: Option<u64>,
    /// An update whose loss or gradient norm is not finite is skipped (weights and optimizer
    /// state untouched); the run stops with an error once this many updates in a row were
    /// skipped, >= 1 (1: the first one stops it). Default 3.
    #[serde(default = "default_max_nonfinite_skips")]
    pub max_nonfinite_skips: u32,
    /// Whether training keeps only each decoder block's input and recomputes the block's
    /// activations in the backward pass (activation checkpointing): the memory of one block's
    /// activations instead of all of them, for about one more forward pass per update. The
    /// gradients are the same up to summation order. Default false.
    #[serde(default)]
    pub recompute: bool,
    /// Trainer replicas, in [1, 256]: each scores and differentiates its share of every update's
    /// batch, the gradients are summed across replicas (burn's collective all-reduce), and
    /// every replica takes the same optimizer step, so the weights stay identical and equal
    /// (up to summation order) to one trainer's on the whole batch. Default 1.
    #[serde(default = "default_data_parallel")]
    pub data_parallel: usize,
}

fn default_max_nonfinite_skips() -> u32 {
    Train::DEFAULT_MAX_NONFINITE_SKIPS
}

fn default_data_parallel() -> usize {
    Train::DEFAULT_DATA_PARALLEL
}

/// `optimizer = adamw { ... } | adam { ... } | sgd { ... }`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// AdamW with decoupled weight decay. The default (weight_decay 0.01).
    #[serde(rename = "adamw")]
    AdamW {
        /// Decoupled weight decay, >= 0.
        weight_decay: f64,
        /// First-moment decay, in [0, 1). Default 0.9.
        beta1: f64,
        /// Second-moment decay, in [0, 1). Default 0.999.
        beta2: f64,
    },
    /// Adam.
    Adam {
        /// First-moment decay, in [0, 1). Default 0.9.
        beta1: f64,
        /// Second-moment decay, in [0, 1). Default 0.999.
        beta2: f64,
    },
    /// Plain SGD with optional momentum.
    Sgd {
        /// Momentum, in [0, 1). Default 0.
        momentum: f64,
    },
}

/// `warmup = sft { ... }`: behaviour cloning of oracle demonstrations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Warmup {
    /// Optimizer steps, >= 1.
    pub steps: u64,
    /// Learning rate by warm-up step (from 0), every value > 0: a number, or a schedule
    /// (`cosine(3e-3 -> 3e-4, over = 6000)`). Default: the training `lr`, constant.
    #[serde(deserialize_with = "number_or_schedule")]
    pub lr: Schedule,
    /// Oracle episodes generated from the train split, >= 1. Default 256.
    pub demonstrations: usize,
    /// Demonstrations per optimizer step, >= 1. Default 16.
    pub batch: usize,
    /// How many instances of each task's training split (at each difficulty) the
    /// demonstrations come from: indices `0..n`, >= 1. `None`, the default, draws from all of
    /// it. RL draws from all of it either way, so a cap leaves instances that only RL meets.
    /// Left out of the serialized experiment when `None`, so warm-ups recorded before the key
    /// existed still match (`--warmup-from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<u64>,
}

/// `eval { ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eval {
    /// Steps between evaluations; `None` evaluates after warm-up and at the end only.
    pub every: Option<u64>,
    /// Which split to evaluate on. Default test.
    pub split: Split,
    /// Episodes per task, >= 1. Default 64.
    pub episodes: usize,
    /// How episodes are decoded: `greedy`, `sampled` (at the training sampling settings), or
    /// `both` (the default): each is its own evaluation, greedy first.
    pub decoding: EvalDecoding,
}

/// `eval.decoding`: which decodings an evaluation plays its episodes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalDecoding {
    /// Greedy only: the most likely token at every position.
    Greedy,
    /// Sampled only, at the training `temperature`, `top_k` and `top_p`.
    Sampled,
    /// Greedy, then sampled, on the same instances (the default).
    Both,
}

impl EvalDecoding {
    /// The decodings to evaluate with, in order: greedy (the headline number) before sampled.
    pub fn each(self) -> &'static [Decoding] {
        match self {
            EvalDecoding::Greedy => &[Decoding::Greedy],
            EvalDecoding::Sampled => &[Decoding::Sampled],
            EvalDecoding::Both => &[Decoding::Greedy, Decoding::Sampled],
        }
    }
}

/// One decoding of an evaluation.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Decoding {
    /// The most likely token (deterministic); what evaluations before `decoding` existed used.
    #[default]
    Greedy,
    /// Sampled at the training sampling settings.
    Sampled,
}

impl Decoding {
    /// The name used in the language, in `metrics.jsonl` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Decoding::Greedy => "greedy",
            Decoding::Sampled => "sampled",
        }
    }
}

/// Instance splits; train and test instances never overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Instances trained on.
    Train,
    /// Held-out instances.
    Test,
}

/// `sweep { seeds = [...], ablate KEY.PATH = VALUE, specialists = true, base = false }`
/// (`specialists = by_weight` sizes each specialist by its task's weight).
///
/// The configurations it describes are the base experiment (unless `base` is false), one per
/// ablation and one per specialist, in that order; each runs once per seed. Every
/// configuration's label ([`Sweep::base_label`], [`Ablation::label`], [`Specialist::label`])
/// is unique within the sweep and safe as a file name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// Seeds each configuration runs with; empty means the experiment's seed.
    pub seeds: Vec<u64>,
    /// Single-key changes, each a separate configuration besides the base one.
    pub ablations: Vec<Ablation>,
    /// `specialists = true` or `by_weight`: the experiment with each task alone, in
    /// declaration order (with `by_weight`, its warm-up and RL batch already resized); empty
    /// when the key is absent or false.
    #[serde(default)]
    pub specialists: Vec<Specialist>,
    /// `base = false` leaves the base configuration out (another recipe runs it). Default true;
    /// when false, the sweep has at least one ablation or specialist.
    #[serde(default = "default_base")]
    pub base: bool,
}

fn default_base() -> bool {
    Sweep::DEFAULT_BASE
}

impl Sweep {
    /// `base` when left out: the base configuration runs.
    pub const DEFAULT_BASE: bool = true;

    /// The label of the base configuration.
    pub fn base_label() -> &'static str {
        "base"
    }
}

/// `ablate pool.cross_policy = 0`: the experiment with one key changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ablation {
    /// The key path as written, e.g. `pool.cross_policy`.
    pub path: String,
    /// The value as written, e.g. `0`.
    pub value: String,
    /// The whole experiment with the change applied and re-checked.
    pub experiment: Box<Experiment>,
}

impl Ablation {
    /// `ablate.PATH=VALUE`, e.g. `ablate.pool.cross_policy=0`: the configuration's label, a
    /// directory name, so the value keeps only ASCII letters, digits and `.-+_` (spaces are
    /// dropped, anything else becomes `_`: `0.2 .. 0.28` is `0.2..0.28`, `"a/b"` is `_a_b_`).
    pub fn label(&self) -> String {
        let value: String = self
            .value
            .chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-+_".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("ablate.{}={value}", self.path)
    }
}

/// `specialists = true`: the experiment with one task alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Specialist {
    /// The task's name.
    pub task: String,
    /// The whole experiment with only that task (and curriculum stages narrowed to it),
    /// re-checked.
    pub experiment: Box<Experiment>,
}

impl Specialist {
    /// `specialist.TASK`, e.g. `specialist.kg`.
    pub fn label(&self) -> String {
        format!("specialist.{}", self.task)
    }
}

// Defaults: the one place that says what a file gets when it leaves a key out. The checker
// reads them from here; the field docs above and the book describe the same values.

impl Experiment {
    /// `seed` when the file gives none.
    pub const DEFAULT_SEED: u64 = 0;
}

impl Default for Arch {
    /// A model without `arch`: the default transformer.
    fn default() -> Self {
        Arch::Transformer(TransformerArch::default())
    }
}

impl TransformerArch {
    /// `ffn` when a transformer leaves it out: four times the residual width.
    pub fn default_ffn(d_model: usize) -> usize {
        d_model.saturating_mul(4)
    }

    /// `vocab` when a transformer leaves it out (and in experiments recorded before it existed).
    pub fn default_vocab() -> usize {
        2048
    }
}

impl Default for TransformerArch {
    /// A bare `transformer`; `kv_heads` and `ffn` follow `heads` and `d_model` as documented.
    fn default() -> Self {
        let (d_model, heads) = (128, 4);
        TransformerArch {
            layers: 2,
            d_model,
            heads,
            kv_heads: heads,
            ffn: TransformerArch::default_ffn(d_model),
            context: 512,
            tie_embeddings: true,
            vocab: TransformerArch::default_vocab(),
        }
    }
}

impl Task {
    /// `weight` when a task gives none.
    pub const DEFAULT_WEIGHT: f64 = 1.0;
    /// `split` when a task gives none.
    pub const DEFAULT_SPLIT: Split = Split::Train;
}

impl EnvRef {
    /// `max_turns` of a task served by a user's type or a controller, when the file gives none.
    pub const OTHER_MAX_TURNS: u32 = 20;

    /// `max_turns` when the task gives none: a built-in's own, else [`Self::OTHER_MAX_TURNS`].
    pub fn default_max_turns(&self) -> u32 {
        match self {
            EnvRef::Builtin(b) => b.default_max_turns(),
            EnvRef::Path(_) | EnvRef::Remote { .. } => EnvRef::OTHER_MAX_TURNS,
        }
    }
}

impl Default for Difficulty {
    /// Every level.
    fn default() -> Self {
        Difficulty { min: 1, max: 3 }
    }
}

impl Algorithm {
    /// The algorithm `algorithm KIND { }` declares: every key at its default for `kind`.
    pub fn defaults(kind: AlgorithmKind) -> Algorithm {
        Algorithm {
            kind,
            group_size: if kind.is_grouped() { 8 } else { 1 },
            clip: Clip::default(),
            dual_clip: None,
            kl: Kl::NONE,
            entropy: 0.0,
            advantage_norm: match kind {
                AlgorithmKind::Grpo => AdvantageNorm::Group,
                AlgorithmKind::DrGrpo => AdvantageNorm::None,
                _ => AdvantageNorm::Batch,
            },
            aggregation: match kind {
                AlgorithmKind::DrGrpo => Aggregation::SeqMeanTokenSum,
                _ => Aggregation::TokenMean,
            },
            sft: Schedule::Constant(0.0),
            sft_from: SftSource::Oracle,
            is_cap: None,
            filter: Filter::None,
            negative_weight: 1.0,
            credit: Credit::Outcome,
            gamma: 1.0,
            lambda: 0.95,
            epochs: 1,
            grad_clip: Some(1.0),
            value_clip: 0.2,
            value_coef: 1.0,
        }
    }
}

impl Default for Clip {
    fn default() -> Self {
        Clip {
            low: 0.2,
            high: 0.2,
        }
    }
}

impl Kl {
    /// `kl = none`, also the default: no KL term.
    pub const NONE: Kl = Kl {
        estimator: None,
        coef: 0.0,
        placement: KlPlacement::Loss,
    };
}

impl SftSource {
    /// `keep` of `successes` when it is left out.
    pub const DEFAULT_KEEP: usize = 256;
}

impl Pool {
    /// The most environment calls `env_workers` may run at once.
    pub const MAX_ENV_WORKERS: usize = 4096;
}

impl Default for Pool {
    /// A file without `pool { ... }`: one fresh engine, synchronous.
    fn default() -> Self {
        Pool {
            engines: 1,
            stale: 0,
            refresh_every: 1,
            cross_policy: 0.0,
            max_staleness: 1,
            mode: PoolMode::default(),
            placement: Placement::default(),
            interrupt: Interrupt::default(),
            env_workers: None,
        }
    }
}

impl Train {
    /// `batch` when left out.
    pub const DEFAULT_BATCH: usize = 32;
    /// `lr` when left out.
    pub const DEFAULT_LR: f64 = 3e-4;
    /// `temperature` when left out.
    pub const DEFAULT_TEMPERATURE: f64 = 1.0;
    /// `top_p` when left out.
    pub const DEFAULT_TOP_P: f64 = 1.0;
    /// `max_new_tokens` when left out.
    pub const DEFAULT_MAX_NEW_TOKENS: usize = 64;
    /// `max_nonfinite_skips` when left out (also for a `spec.json` written before the key).
    pub const DEFAULT_MAX_NONFINITE_SKIPS: u32 = 3;
    /// `data_parallel` when left out: one trainer.
    pub const DEFAULT_DATA_PARALLEL: usize = 1;
    /// The most trainer replicas `data_parallel` allows.
    pub const MAX_DATA_PARALLEL: usize = 256;
}

impl Optimizer {
    /// AdamW's `weight_decay` when left out.
    pub const DEFAULT_WEIGHT_DECAY: f64 = 0.01;
    /// Adam's and AdamW's `beta1` when left out.
    pub const DEFAULT_BETA1: f64 = 0.9;
    /// Adam's and AdamW's `beta2` when left out.
    pub const DEFAULT_BETA2: f64 = 0.999;
    /// SGD's `momentum` when left out.
    pub const DEFAULT_MOMENTUM: f64 = 0.0;
}

impl Default for Optimizer {
    /// A file without `optimizer`: AdamW at its default settings.
    fn default() -> Self {
        Optimizer::AdamW {
            weight_decay: Optimizer::DEFAULT_WEIGHT_DECAY,
            beta1: Optimizer::DEFAULT_BETA1,
            beta2: Optimizer::DEFAULT_BETA2,
        }
    }
}

impl Warmup {
    /// `demonstrations` when left out.
    pub const DEFAULT_DEMONSTRATIONS: usize = 256;
    /// `batch` when left out.
    pub const DEFAULT_BATCH: usize = 16;
}

impl Default for Eval {
    /// A file without `eval { ... }`.
    fn default() -> Self {
        Eval {
            every: None,
            split: Split::Test,
            episodes: 64,
            decoding: EvalDecoding::Both,
        }
    }
}
