//! Agentry: agentic reinforcement learning experiments, compiled from a small language.
//!
//! An experiment is a `.arl` file declaring the tasks an agent trains on, the curriculum, the RL
//! algorithm and the rollout pool. [`experiment!`] reads and checks it at build time and expands
//! it into a type implementing [`Experiment`]; [`main`] runs that type with the command-line
//! options every recipe shares:
//!
//! ```ignore
//! agentry::experiment!("experiments/quickstart.arl");
//!
//! fn main() -> agentry::Result<()> {
//!     agentry::main(Quickstart)
//! }
//! ```
//!
//! This crate is a facade: the language lives in [`dsl`] (`agentry-dsl`), the macro in
//! `agentry-macros`, environments in [`env`](mod@env) (`agentry-env`) and everything that trains in
//! `agentry-runtime`, whose modules are re-exported here.

pub use agentry_dsl as dsl;
pub use agentry_macros::experiment;
pub use agentry_runtime::*;
pub use agentry_serve as serve;

pub mod openai;

/// The error type of [`main`] and the CLI: any error, with its chain of causes.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

use std::path::PathBuf;

use clap::Parser;

/// Options every recipe accepts: `cargo run --release --example NAME -- [OPTIONS]`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RunArgs {
    /// Device to run on: auto, flex, wgpu, vulkan or cuda (overrides the file's `device`).
    #[arg(long, value_parser = parse_device)]
    pub device: Option<spec::Device>,
    /// RL steps (overrides `train.steps`).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Root directory of run directories.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Hide the progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Go on with a stopped run: its run directory (the latest checkpoint) or one checkpoint
    /// file in it. The run continues in that directory from the step after the checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    /// Start a new run from the end of a warm-up an earlier run trained and checkpointed
    /// (`train.checkpoint_every` set): its run directory, or a folder of runs searched for the
    /// one whose warm-up this run would train identically. RL settings may differ.
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    pub warmup_from: Option<PathBuf>,
    /// Run only this configuration of the sweep (`base`, `ablate.PATH=VALUE`,
    /// `specialist.TASK`); repeat for several. Default: all of them.
    #[arg(long = "config", value_name = "LABEL")]
    pub configs: Vec<String>,
    /// Run only this seed of the sweep. Default: all of them.
    #[arg(long)]
    pub seed: Option<u64>,
    /// CPU threads of flex's kernels (rayon's pool). Default: `RAYON_NUM_THREADS`, else one
    /// per core. Runs are the same for any count.
    #[arg(long)]
    pub threads: Option<std::num::NonZeroUsize>,
    /// Train across this many nodes (processes or machines), `train.data_parallel` replicas on
    /// each: every node runs the same command with its own --node-rank. Default: one node.
    #[arg(
        long,
        env = "AGENTRY_NODES",
        value_name = "N",
        requires = "orchestrator"
    )]
    pub nodes: Option<u32>,
    /// This node's rank, 0..N: rank 0 runs the experiments (rollouts, evaluations, the run
    /// directory); the others only train with it.
    #[arg(long, env = "AGENTRY_NODE_RANK", value_name = "R", requires = "nodes")]
    pub node_rank: Option<u32>,
    /// The orchestrator every node registers with (`agentry orchestrator`): ws://HOST:PORT.
    #[arg(
        long,
        env = "AGENTRY_ORCHESTRATOR",
        value_name = "URL",
        requires = "nodes"
    )]
    pub orchestrator: Option<String>,
    /// Where the other nodes reach this one, ws://HOST:PORT; it serves its tensors on that
    /// port. Default: ws://127.0.0.1:(29500 + rank), for nodes on one machine.
    #[arg(
        long,
        env = "AGENTRY_NODE_ADDRESS",
        value_name = "URL",
        requires = "nodes"
    )]
    pub node_address: Option<String>,
    /// Seconds rank 0 waits for the other nodes at any one point (joining, an update's sum)
    /// before the step fails.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub node_timeout: u64,
}

impl RunArgs {
    /// The runtime's options, with remote tasks connected over HTTP
    /// ([`serve::HttpRemoteTasks`]), as `agentry run` and every recipe do.
    pub fn options(&self) -> RunOptions {
        RunOptions {
            device: self.device,
            steps: self.steps,
            out: self.out.clone(),
            quiet: self.quiet,
            resume: self.resume.clone(),
            warmup_from: self.warmup_from.clone(),
            shared_warmups: None,
            remote_tasks: Some(std::sync::Arc::new(serve::HttpRemoteTasks)),
            nodes: None,
        }
    }

    /// Where this process is among the nodes the command line names; `None` for one node.
    /// Unchecked: [`train::Nodes::new`] and [`train::follow`] check it.
    pub fn node_config(&self) -> Option<train::NodeConfig> {
        let nodes = self.nodes?;
        let rank = self.node_rank.unwrap_or(0);
        Some(train::NodeConfig {
            nodes,
            rank,
            orchestrator: self.orchestrator.clone().unwrap_or_default(),
            address: self
                .node_address
                .clone()
                .unwrap_or_else(|| format!("ws://127.0.0.1:{}", 29500 + rank)),
            timeout: std::time::Duration::from_secs(self.node_timeout),
        })
    }

    /// Runs `specs`' sweeps as `run` does, unless this is a node of a multi-node run other
    /// than rank 0, which only trains with rank 0 ([`train::follow`]) and returns `None`.
    /// Rank 0's options come back with the nodes it leads.
    pub fn leading(&self, specs: &[spec::Experiment]) -> Result<Option<RunOptions>> {
        let mut options = self.options();
        match self.node_config() {
            Some(config) if config.rank > 0 => {
                train::follow(&config, specs, self.device)?;
                Ok(None)
            }
            Some(config) => {
                let nodes = train::Nodes::new(config).map_err(anyhow::Error::msg)?;
                nodes.join(specs, self.device)?;
                options.nodes = Some(std::sync::Arc::new(nodes));
                Ok(Some(options))
            }
            None => Ok(Some(options)),
        }
    }

    /// Sizes the CPU thread pool as `--threads` asks; call before any work.
    pub fn init_threads(&self) -> Result<()> {
        if let Some(threads) = self.threads {
            device::set_cpu_threads(threads.get())?;
        }
        Ok(())
    }

    /// The runs of the sweep to run.
    pub fn selection(&self) -> sweep::Selection {
        sweep::Selection {
            configs: self.configs.clone(),
            seed: self.seed,
        }
    }
}

fn parse_device(name: &str) -> Result<spec::Device, String> {
    device::parse(name).map_err(|e| e.to_string())
}

#[derive(Parser)]
#[command(about = "Runs this experiment.")]
struct ExampleArgs {
    #[command(flatten)]
    run: RunArgs,
}

/// Runs `experiment`'s sweep (every configuration and seed, or those `--config` and `--seed`
/// select) with the options on the command line, printing progress, where each run went and,
/// for a file with a sweep, the comparison table.
pub fn main(experiment: impl Experiment) -> Result<()> {
    let args = ExampleArgs::parse();
    args.run.init_threads()?;
    if let Some(options) = args.run.leading(&[experiment.spec().into_inner()])? {
        sweep::run(&experiment, &options, &args.run.selection())?;
    }
    Ok(())
}

/// The generated Rust of an experiment file, pretty-printed as `agentry expand` shows it.
pub fn expand_pretty(source: &str, path: &str) -> Result<String, dsl::diagnostics::Diagnostics> {
    let tokens = dsl::expand_source(source, path)?;
    let file = syn::parse_file(&tokens.to_string())
        .expect("agentry-dsl generates syntactically valid Rust");
    Ok(prettyplease::unparse(&file))
}
