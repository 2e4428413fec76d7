//! Synchronous against asynchronous rollout, with and without partial rollouts, on episodes
//! whose lengths have a long tail.
//!
//! ```text
//! cargo run --release --example bench_pipeline [-- --steps 30] [--env-ms 100] [--engines 4]
//!     [--max-staleness 4] [--remote] [--data-parallel N] [--quick]
//! ```
//!
//! Every run trains the same small policy with the same seed and number of steps on `wait`, a
//! task whose episodes last from 1 to 16 turns (most are short, a few long). A synchronous step
//! waits for its longest episode; the asynchronous pipeline keeps a batch of episodes under way
//! and trains on groups as they finish, each episode taking up newly published weights never
//! (`interrupt = never`), at its next turn (`turn`) or at its next token (`token`). `--env-ms`
//! makes every environment step take that long (AgentBench's steps take seconds: a tool call, a
//! web page, a database), which the controller's threads wait out without using a core.
//! `--engines N` gives the asynchronous runs N rollout workers, each keeping a batch of
//! episodes under way (a synchronous step plays one batch, whatever its engines), and
//! `--max-staleness` their bound. Printed: trajectories trained on per second of RL, the
//! trainer's idle fraction, an update's seconds (on shared cores the workers' generation slows
//! it), the fraction of trained tokens an older policy sampled, and each async run's ratio to
//! sync. Target (issue 21): async with partial rollouts at least 2× sync, with the trainer idle
//! under 10%.
//!
//! `--remote` serves the task from an AgentRL-compatible worker behind a controller, both on
//! loopback in this process, as AgentBench's environments are deployed: every step is then an
//! HTTP call, on top of `--env-ms`. A remote task has no oracle, so the warm-up's
//! demonstrations come from an in-process twin (`wait_demo`, the curriculum's first stage);
//! every RL step after the first plays on the worker.
//!
//! `--data-parallel N` adds a synchronous run whose updates are shared by `N` trainer replicas
//! (`train { data_parallel = N }`) and prints what an update costs there against one trainer:
//! on the CPU the replicas run at once, each on its share of the threads (on this bench's tiny
//! policy mostly the price of splitting the batch and summing the gradients).

use std::path::{Path, PathBuf};

use agentry::env::{Environment, Reset, Split, Status, Step, TaskGenerator, ToolCall, ToolSchema};
use agentry::{Experiment, RunOptions};

/// The bench's task: call `wait()` until the episode's length is reached; each step takes
/// `latency`.
#[derive(Default)]
struct Wait {
    latency: std::time::Duration,
}

/// Episode lengths: 1 + 15·u⁴ for u spread over [0, 1) by the instance index: half the
/// episodes last one or two turns, one in eight lasts ten or more.
fn length(index: u64) -> u32 {
    let u = (index.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
    1 + (15.0 * u.powi(4)) as u32
}

impl TaskGenerator for Wait {
    fn version(&self) -> &str {
        "wait-1"
    }

    fn instance(&self, _: Split, _: u8, index: u64) -> Box<dyn Environment> {
        Box::new(WaitEpisode {
            left: length(index),
            latency: self.latency,
        })
    }
}

#[derive(Clone)]
struct WaitEpisode {
    left: u32,
    latency: std::time::Duration,
}

impl Environment for WaitEpisode {
    fn reset(&mut self) -> Reset {
        Reset {
            instruction: "wait until told".into(),
            tools: vec![ToolSchema::new("wait", "wait one turn", vec![])],
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        std::thread::sleep(self.latency);
        if call.name != "wait" || self.left == 0 {
            return Step {
                observation: "Error: call wait()".into(),
                reward: 0.0,
                status: Status::InvalidAction,
            };
        }
        self.left -= 1;
        let (observation, reward, status) = if self.left == 0 {
            ("done", 1.0, Status::Completed)
        } else {
            ("keep waiting", 0.0, Status::Running)
        };
        Step {
            observation: observation.into(),
            reward,
            status,
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        (self.left > 0).then(|| ToolCall::new("wait", []))
    }

    fn success(&self) -> bool {
        self.left == 0
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

/// The experiment with its `wait` task.
struct Bench(
    agentry::dsl::Checked<agentry::spec::Experiment>,
    std::time::Duration,
);

impl Experiment for Bench {
    fn spec(&self) -> agentry::dsl::Checked<agentry::spec::Experiment> {
        self.0.clone()
    }

    fn user_task(&self, name: &str) -> Option<Box<dyn TaskGenerator>> {
        matches!(name, "wait" | "wait_demo")
            .then(|| Box::new(Wait { latency: self.1 }) as Box<dyn TaskGenerator>)
    }
}

/// One configuration the bench runs.
struct Setup {
    mode: &'static str,
    /// `pool.interrupt`, in async mode.
    interrupt: Option<&'static str>,
    replicas: usize,
}

impl Setup {
    fn label(&self) -> String {
        let mut label = self.mode.to_string();
        if let Some(interrupt) = self.interrupt {
            label += &format!(", interrupt = {interrupt}");
        }
        if self.replicas > 1 {
            label += &format!(", {} replicas", self.replicas);
        }
        label
    }
}

/// What every run of the bench shares.
struct Shared {
    steps: u64,
    batch: usize,
    /// Asynchronous rollout workers, each keeping `batch` episodes under way.
    engines: usize,
    max_staleness: u64,
    /// The controller's API base, when the task is served over HTTP (`--remote`).
    remote: Option<String>,
}

fn source(setup: &Setup, shared: &Shared) -> String {
    let Shared {
        steps,
        batch,
        engines,
        max_staleness,
        ref remote,
    } = *shared;
    let Setup {
        mode,
        interrupt,
        replicas,
    } = setup;
    let interrupt = interrupt.map_or(String::new(), |i| format!(", interrupt = {i}"));
    // One engine computes what any number computes in sync mode (all hold the same weights).
    let engines = if *mode == "sync" { 1 } else { engines };
    let name = setup
        .label()
        .replace(", interrupt = ", "_")
        .replace(", ", "_")
        .replace(' ', "_");
    // Every episode under way may wait on its environment at once: the environment is not
    // where the bench should queue.
    let env_workers = batch * engines;
    let tasks = match remote {
        None => "task wait { env = crate::Wait, max_turns = 16 }".to_string(),
        Some(url) => format!(
            "task wait {{ remote = \"{url}\", max_turns = 16 }}
    task wait_demo {{ env = crate::Wait, max_turns = 16 }}
    curriculum {{
        stage demonstrations {{ until = 1, tasks = [wait_demo] }}
        stage remote {{ tasks = [wait] }}
    }}"
        ),
    };
    format!(
        r#"
experiment bench_pipeline_{name} {{
    seed = 3
    device = flex
    model policy {{ arch = transformer {{ layers = 2, d_model = 64, heads = 4, context = 256 }} }}
    {tasks}
    // The KL penalty on the reward keeps every update non-trivial (all episodes succeed).
    algorithm grpo {{ group_size = 2, kl = k1(0.05, as = reward) }}
    pool {{ engines = {engines}, max_staleness = {max_staleness}, mode = {mode}{interrupt}, env_workers = {env_workers} }}
    train {{
        steps = {steps}, batch = {batch}, lr = 1e-3, max_new_tokens = 8
        warmup = sft {{ steps = 40, lr = 1e-2, demonstrations = 16, batch = 8 }}
        data_parallel = {replicas}
    }}
    eval {{ episodes = 4 }}
}}
"#
    )
}

/// What a run measured over its RL steps.
struct Measured {
    trajectories_per_second: f64,
    trainer_idle: f64,
    mean_turns: f64,
    update_seconds: f64,
    /// Agent tokens trained on that an older policy than the fresh one sampled.
    stale_tokens: f64,
}

fn measure(run_dir: &Path, batch: usize) -> agentry::Result<Measured> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl"))?;
    let (mut wall, mut waiting, mut steps, mut turns, mut updating) = (0.0, 0.0, 0usize, 0.0, 0.0);
    let mut stale = 0.0;
    for line in text.lines() {
        let record: serde_json::Value = serde_json::from_str(line)?;
        if record["phase"] != "rl" {
            continue;
        }
        let rollout = record["rollout_seconds"].as_f64().unwrap_or(0.0);
        let update = record["update_seconds"].as_f64().unwrap_or(0.0);
        // In a synchronous step the trainer waits for the whole rollout; in an asynchronous
        // one, `rollout_seconds` is the time it waited for finished episodes.
        wall += rollout + update;
        waiting += rollout;
        updating += update;
        stale += record["stale_tokens"].as_f64().unwrap_or(0.0);
        steps += 1;
        // `wait`, or with `--remote` its in-process twin on the first step.
        let (mut played, mut taken) = (0.0, 0.0);
        for task in record["tasks"]
            .as_object()
            .into_iter()
            .flat_map(|t| t.values())
        {
            let episodes = task["episodes"].as_f64().unwrap_or(0.0);
            played += episodes;
            taken += episodes * task["mean_turns"].as_f64().unwrap_or(0.0);
        }
        turns += taken / played.max(1.0);
    }
    Ok(Measured {
        trajectories_per_second: (steps * batch) as f64 / wall.max(1e-9),
        trainer_idle: waiting / wall.max(1e-9),
        mean_turns: turns / steps.max(1) as f64,
        update_seconds: updating / steps.max(1) as f64,
        stale_tokens: stale / steps.max(1) as f64,
    })
}

/// A controller and a worker serving `Wait` (each step `latency`) with room for `sessions`
/// episodes at once, on loopback; they serve until dropped.
fn serve_remotely(
    latency: std::time::Duration,
    sessions: usize,
) -> agentry::Result<(agentry::serve::Server, agentry::serve::Server)> {
    use agentry::serve::{controller, worker};
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let controller = controller::serve(controller::ControllerConfig::new(loopback))?;
    let mut config = worker::WorkerConfig::new("wait", loopback);
    config.controller = Some(controller.url());
    config.concurrency = sessions;
    // Steps wait out their latency: every session's may be waited out at once.
    config.env_threads = sessions;
    config.split = agentry::env::Split::Train;
    config.instances = 1000;
    config.max_turns = 16;
    let worker = worker::serve(std::sync::Arc::new(Wait { latency }), config)?;
    Ok((controller, worker))
}

/// A flag's value: a number of at least `min`, or the error `usage`.
fn number<T: std::str::FromStr + PartialOrd>(
    value: Option<String>,
    min: T,
    usage: &str,
) -> agentry::Result<T> {
    value
        .and_then(|n| n.parse().ok())
        .filter(|n| *n >= min)
        .ok_or_else(|| anyhow::anyhow!("{usage}"))
}

fn main() -> agentry::Result<()> {
    let (mut steps, mut batch, mut env_ms) = (30u64, 16usize, 0u64);
    let (mut engines, mut max_staleness) = (1usize, 2u64);
    let (mut replicas, mut remote) = (None, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--steps" => steps = number(args.next(), 1, "--steps needs a positive integer")?,
            "--env-ms" => {
                env_ms = number(args.next(), 0, "--env-ms needs a number of milliseconds")?;
            }
            "--data-parallel" => {
                replicas = Some(number(
                    args.next(),
                    2,
                    "--data-parallel needs a number of replicas above 1",
                )?);
            }
            "--engines" => {
                engines = number(args.next(), 1, "--engines needs a positive integer")?;
            }
            "--max-staleness" => {
                max_staleness = number(args.next(), 0, "--max-staleness needs a number of steps")?;
            }
            "--quick" => (steps, batch) = (4, 8),
            "--remote" => remote = true,
            other => anyhow::bail!(
                "unknown argument `{other}`; usage: bench_pipeline [--steps N] [--env-ms MS] \
                 [--engines N] [--max-staleness S] [--remote] [--data-parallel N] [--quick]"
            ),
        }
    }
    let latency = std::time::Duration::from_millis(env_ms);
    // With `--remote`, the task's worker and its controller, serving until the bench ends.
    let servers = remote
        .then(|| serve_remotely(latency, batch * engines))
        .transpose()?;
    let out: PathBuf = std::env::temp_dir().join("agentry-bench-pipeline");
    let _ = std::fs::remove_dir_all(&out);
    println!(
        "{steps} RL steps of {batch} episodes (lengths 1-16 turns, long tail, {env_ms} ms a \
         step{}); async: {engines} engine(s), max_staleness {max_staleness}\n\
         | mode | trajectories/s | mean turns | trainer idle | update s/step | stale tokens |\n\
         |---|---:|---:|---:|---:|---:|",
        if remote {
            ", over HTTP: worker and controller on loopback"
        } else {
            ""
        }
    );
    let async_run = |interrupt| Setup {
        mode: "async",
        interrupt: Some(interrupt),
        replicas: 1,
    };
    let mut setups = vec![
        Setup {
            mode: "sync",
            interrupt: None,
            replicas: 1,
        },
        async_run("never"),
        async_run("turn"),
        async_run("token"),
    ];
    setups.extend(replicas.map(|replicas| Setup {
        mode: "sync",
        interrupt: None,
        replicas,
    }));
    let shared = Shared {
        steps,
        batch,
        engines,
        max_staleness,
        remote: servers.as_ref().map(|(controller, _)| controller.url()),
    };
    let mut measured = Vec::new();
    for setup in &setups {
        let source = source(setup, &shared);
        let spec = agentry::dsl::check(&source)
            .map_err(|d| anyhow::anyhow!("{}", d.render("bench_pipeline", &source)))?;
        let options = RunOptions {
            out: out.clone(),
            quiet: true,
            remote_tasks: Some(std::sync::Arc::new(agentry::serve::HttpRemoteTasks)),
            ..RunOptions::default()
        };
        let summary = agentry::run(&Bench(spec, latency), &options)?;
        let run = measure(&summary.run_dir, batch)?;
        println!(
            "| {} | {:.1} | {:.2} | {:.1}% | {:.3} | {:.1}% |",
            setup.label(),
            run.trajectories_per_second,
            run.mean_turns,
            run.trainer_idle * 100.0,
            run.update_seconds,
            run.stale_tokens * 100.0,
        );
        measured.push(run);
    }
    let sync = measured[0].trajectories_per_second.max(1e-9);
    for (setup, run) in setups.iter().zip(&measured).skip(1).take(3) {
        println!(
            "{} / sync: {:.2}×",
            setup.label(),
            run.trajectories_per_second / sync
        );
    }
    println!("(target: async with partial rollouts >= 2× sync, trainer idle under 10%)");
    if let (Some(replicas), Some(shared)) = (replicas, measured.get(4)) {
        println!(
            "an update on {replicas} replicas (taking turns on these cores) / on one trainer: \
             {:.2}× the time ({:.3} s against {:.3} s a step)",
            shared.update_seconds / measured[0].update_seconds.max(1e-9),
            shared.update_seconds,
            measured[0].update_seconds
        );
    }
    Ok(())
}
