//! `agentry`: check, expand and run experiment files (their sweeps); compare runs; report
//! on a run; replay recorded episodes; deploy environments over HTTP (`controller`, `worker`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use agentry::{Interpreted, RunArgs};
use agentry_serve::worker::BUILTIN_TASKS;
use clap::builder::PossibleValuesParser;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "agentry",
    version,
    about = "Agentic RL experiments from .arl files."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check experiment files; print every error and exit 1 if any.
    Check {
        /// The `.arl` files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the Rust code an experiment file compiles to.
    Expand {
        /// The `.arl` file.
        file: PathBuf,
    },
    /// Run experiment files without compiling them (they must name no Rust types): every
    /// configuration and seed of each file's sweep, or those --config and --seed select. Every
    /// file is checked before any runs; runs whose warm-ups would be identical, in one file or
    /// across them, train it once.
    Run {
        /// The `.arl` files, run in order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Replay a recorded episode: step its instance again with the recorded replies, re-score
    /// (and, for greedy episodes, regenerate) them with the recorded policy version's weights
    /// when the run kept them, print the transcript and a verdict; exit 1 on any difference.
    Replay {
        /// The episode: `RUN_DIR/episodes/FILE.jsonl:N`, line N from 1.
        trajectory: String,
        /// Device for the policy checks: auto, flex, wgpu, vulkan or cuda (default flex).
        #[arg(long, value_parser = parse_device)]
        device: Option<agentry::spec::Device>,
    },
    /// Export a run's trained policy: a LoRA run's adapters as PEFT writes them (`--peft DIR`,
    /// for `PeftModel.from_pretrained` on the base model), or the policy with any adapters
    /// merged as a Hugging Face checkpoint (`--merged DIR`: config.json, model.safetensors,
    /// tokenizer.json).
    Export {
        /// The run directory, runs/<experiment>/<run-id>.
        run_dir: PathBuf,
        /// Write the adapters in PEFT's layout into this folder.
        #[arg(
            long,
            value_name = "DIR",
            conflicts_with = "merged",
            required_unless_present = "merged"
        )]
        peft: Option<PathBuf>,
        /// Write the merged policy as a Hugging Face checkpoint into this folder.
        #[arg(long, value_name = "DIR")]
        merged: Option<PathBuf>,
        /// The RL step whose checkpoint to export (default: the finished run's final weights).
        #[arg(long)]
        step: Option<u64>,
    },
    /// Write (again) the report of a run directory: report.md and plots/, from its
    /// metrics.jsonl, experiment.json and summary.json.
    Report {
        /// The run directory, runs/<experiment>/<run-id>.
        run_dir: PathBuf,
    },
    /// Compare finished runs: mean success over seeds with its 95% interval, per task and
    /// overall, one row per (experiment, configuration). Prints a markdown table.
    Compare {
        /// Run directories, or directories holding them (searched recursively), e.g.
        /// `runs/NAME`.
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// Which final evaluation to compare.
        #[arg(long, value_enum, default_value_t = DecodingArg::Greedy)]
        decoding: DecodingArg,
        /// Instead, every configuration minus this one, seed by seed (a configuration of the
        /// runs: `base`, or `EXPERIMENT/LABEL`); its own first row is its gain over its
        /// warm-up. Mean differences with 95% Student-t intervals.
        #[arg(long, value_name = "BASE")]
        paired: Option<String>,
        /// Also draw learning curves into this directory: per task and overall, one line per
        /// configuration, the mean over seeds at each evaluation with its 95% t band
        /// (`curves-TASK.png` and `.svg`).
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
        /// Also write the table to this file.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Run the orchestrator the nodes of a multi-node run register with (`agentry run
    /// --nodes N --node-rank R --orchestrator ws://HOST:PORT`): it tells each node where the
    /// others are; the tensors go between the nodes directly. Runs until stopped.
    Orchestrator {
        /// Port to listen on (every interface).
        #[arg(long, short, default_value_t = 29400)]
        port: u16,
    },
    /// Run an AgentRL-compatible controller: workers register with it by heartbeat, trainers
    /// and evaluators start and play sessions through it (`/api/start_sample`, ...).
    ///
    /// It listens on loopback unless told otherwise. Anyone who can reach the port can start
    /// sessions, mark workers stale and cancel sessions, unless a token is set.
    Controller {
        /// Address to listen on. The default (127.0.0.1) is reachable from this machine only;
        /// `--host 0.0.0.0` listens on every interface (then set a token).
        #[arg(long, default_value = DEFAULT_HOST)]
        host: IpAddr,
        /// Port to listen on.
        #[arg(long, short, default_value_t = 5020)]
        port: u16,
        #[command(flatten)]
        token: TokenArg,
    },
    /// Serve a policy over the OpenAI chat-completions API (`/v1/chat/completions`,
    /// `/v1/models`, `/health`): a run directory's trained policy, a Hugging Face checkpoint
    /// folder or a GGUF file. Concurrent requests are decoded together (continuous batching);
    /// conversations are rendered and tool calls read as in training.
    Serve {
        /// A run directory (runs/<experiment>/<run-id>), a Hugging Face checkpoint folder or a
        /// GGUF file.
        model: PathBuf,
        /// For a run directory: the RL step whose checkpoint to serve (default: the final
        /// weights).
        #[arg(long)]
        step: Option<u64>,
        /// The model name clients use (default: the run's EXPERIMENT/RUN-ID, the folder's or
        /// file's name).
        #[arg(long)]
        name: Option<String>,
        /// Address to listen on. The default (127.0.0.1) is reachable from this machine only;
        /// `--host 0.0.0.0` listens on every interface (then set a token).
        #[arg(long, default_value = DEFAULT_HOST)]
        host: IpAddr,
        /// Port to listen on.
        #[arg(long, short, default_value_t = 8000)]
        port: u16,
        #[command(flatten)]
        token: TokenArg,
        /// Most replies decoded together.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
        max_batch: u32,
        /// Most requests waiting for room in the batch; more are answered 429.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
        queue: u32,
        /// Seed of the replies of requests that name none (same seed, same replies for the
        /// same arrivals).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Evaluate a model behind any OpenAI-compatible endpoint (vLLM, llama.cpp's server,
    /// `agentry serve`...) on an experiment's evaluation episodes: its tasks' tools are sent as
    /// `tools`, each call is executed by the environment, and the run directory is an
    /// evaluation-only run's (metrics, report, intervals, replayable episodes), for `agentry
    /// compare`. Without FILE: the five built-in tasks, 32 held-out episodes each.
    Eval(EndpointArgs),
    /// Serve a built-in task's instances as an AgentRL task worker, heartbeating to a
    /// controller. Index `i` is instance `i` of `--split` at `--difficulty`.
    Worker {
        /// The task to serve.
        #[arg(long, value_parser = PossibleValuesParser::new(BUILTIN_TASKS))]
        task: String,
        /// The controller's API base.
        #[arg(long, short = 'C', default_value = "http://localhost:5020/api")]
        controller: String,
        /// The URL advertised to the controller (must end in `/api` and reach this worker;
        /// default: loopback on `--port`).
        #[arg(long = "self", short = 's')]
        advertise: Option<String>,
        /// Address to listen on. The default (127.0.0.1) is reachable from this machine only;
        /// `--host 0.0.0.0` listens on every interface, as a controller on another machine
        /// needs (then set a token).
        #[arg(long, default_value = DEFAULT_HOST)]
        host: IpAddr,
        /// Port to listen on.
        #[arg(long, short, default_value_t = 5021)]
        port: u16,
        #[command(flatten)]
        token: TokenArg,
        /// Most sessions at once.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
        concurrency: u32,
        /// The task name clients ask for (default: the task).
        #[arg(long)]
        name: Option<String>,
        /// The split instances come from.
        #[arg(long, value_enum, default_value_t = SplitArg::Test)]
        split: SplitArg,
        /// The difficulty of every instance.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
        difficulty: u8,
        /// How many instances to offer (indices 0..N).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        instances: u64,
        /// The turn limit of an episode (default: the task's, as in AgentBench-FC).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_turns: Option<u32>,
    },
}

/// Where `controller` and `worker` listen unless `--host` says otherwise: loopback only.
const DEFAULT_HOST: &str = "127.0.0.1";

/// `--token`, shared by `controller` and `worker`.
#[derive(clap::Args)]
struct TokenArg {
    /// A shared bearer token: every request without `Authorization: Bearer TOKEN` is refused
    /// (401) and changes nothing. It is also sent on this process's own calls (a worker's
    /// heartbeats, the controller's calls to workers), so give the controller and its workers
    /// the same one. Prefer the environment variable AGENTRY_TOKEN: a command line is visible
    /// to other users (`ps`). AgentRL's Python workers send no token, so they can only join a
    /// controller without one.
    #[arg(
        long,
        env = "AGENTRY_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
}

impl TokenArg {
    /// The token, checked; the error never repeats the secret.
    fn token(&self) -> Result<Option<agentry_serve::Token>, String> {
        self.token
            .as_deref()
            .map(agentry_serve::Token::new)
            .transpose()
            .map_err(|e| format!("error: --token / AGENTRY_TOKEN: {e}"))
    }
}

/// `--decoding`.
#[derive(Clone, Copy, ValueEnum)]
enum DecodingArg {
    Greedy,
    Sampled,
}

/// `--split`.
#[derive(Clone, Copy, ValueEnum)]
enum SplitArg {
    Train,
    Test,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check { files } => {
            let mut failed = false;
            for file in &files {
                match read(file).and_then(|source| {
                    agentry::dsl::check(&source)
                        .map(|_| ())
                        .map_err(|d| d.render(&display(file), &source))
                }) {
                    Ok(()) => println!("{}: ok", display(file)),
                    Err(message) => {
                        eprintln!("{message}");
                        failed = true;
                    }
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Expand { file } => {
            let result = read(&file).and_then(|source| {
                agentry::expand_pretty(&source, &display(&file))
                    .map_err(|d| d.render(&display(&file), &source))
            });
            finish(result.map(|code| print!("{code}")))
        }
        Command::Run { files, run } => finish(run_files(&files, &run)),
        Command::Replay { trajectory, device } => {
            match agentry::replay::replay(
                &trajectory,
                device,
                Some(&agentry::serve::HttpRemoteTasks),
            ) {
                Ok(replay) => {
                    println!("{}", replay.header);
                    print!("{}", replay.transcript);
                    for line in &replay.checks {
                        println!("{line}");
                    }
                    println!("{}", replay.verdict());
                    if replay.identical() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => finish(Err(format!("error: {e}"))),
            }
        }
        Command::Export {
            run_dir,
            peft,
            merged,
            step,
        } => {
            let (format, out) = match (peft, merged) {
                (Some(dir), _) => (agentry::export::Format::Peft, dir),
                (None, Some(dir)) => (agentry::export::Format::Merged, dir),
                (None, None) => unreachable!("clap requires --peft or --merged"),
            };
            finish(
                agentry::export::export(&run_dir, step, format, &out)
                    .map(|()| println!("wrote {}", display(&out)))
                    .map_err(|e| format!("error: {e}")),
            )
        }
        Command::Report { run_dir } => finish(
            agentry::report::write(&run_dir)
                .map(|path| println!("wrote {}", display(&path)))
                .map_err(|e| format!("error: {e}")),
        ),
        Command::Compare {
            runs,
            decoding,
            paired,
            plot,
            out,
        } => {
            let decoding = match decoding {
                DecodingArg::Greedy => agentry::compare::Decoding::Greedy,
                DecodingArg::Sampled => agentry::compare::Decoding::Sampled,
            };
            let table = match &paired {
                Some(base) => agentry::compare::paired(&runs, base, decoding).map(|p| p.markdown()),
                None => agentry::compare::compare(&runs, decoding).map(|c| c.markdown()),
            };
            let result = table
                .map_err(|e| format!("error: {e}"))
                .and_then(|table| {
                    print!("{table}");
                    match &out {
                        Some(path) => std::fs::write(path, &table)
                            .map_err(|e| format!("error: cannot write `{}`: {e}", display(path))),
                        None => Ok(()),
                    }
                })
                .and_then(|()| match &plot {
                    Some(dir) => agentry::compare::plot(&runs, decoding, dir)
                        .map(|written| {
                            for png in written {
                                println!("wrote {}", display(&png));
                            }
                        })
                        .map_err(|e| format!("error: {e}")),
                    None => Ok(()),
                });
            finish(result)
        }
        Command::Orchestrator { port } => finish(
            agentry::train::serve_orchestrator(port, || {
                eprintln!("orchestrator listening on ws://0.0.0.0:{port}");
            })
            .map_err(|e| format!("error: {e}")),
        ),
        Command::Controller { host, port, token } => {
            let mut config = agentry_serve::ControllerConfig::new(SocketAddr::new(host, port));
            config.token = match token.token() {
                Ok(token) => token,
                Err(e) => return finish(Err(e)),
            };
            let guarded = if config.token.is_some() {
                "a token is required"
            } else {
                "no token: anyone who can reach it can use it"
            };
            match agentry_serve::controller::serve(config) {
                Ok(server) => {
                    eprintln!(
                        "agentry controller: listening on {} ({guarded})",
                        server.addr()
                    );
                    server.run_forever()
                }
                Err(e) => finish(Err(format!("error: {e}"))),
            }
        }
        Command::Eval(args) => finish(evaluate_endpoint(args)),
        Command::Serve {
            model,
            step,
            name,
            host,
            port,
            token,
            max_batch,
            queue,
            seed,
        } => {
            let token = match token.token() {
                Ok(token) => token,
                Err(e) => return finish(Err(e)),
            };
            let served = match agentry::serving::load_served(&model, step) {
                Ok(served) => served,
                Err(e) => return finish(Err(format!("error: {e}"))),
            };
            let name = name.unwrap_or(served.name);
            let options = agentry::serving::EngineOptions {
                max_batch: max_batch as usize,
                queue: queue as usize,
                seed,
            };
            let engine = agentry::serving::Engine::start(served.policy, served.chat, options);
            let mut config = agentry_serve::openai::OpenAiConfig::new(SocketAddr::new(host, port));
            let guarded = if token.is_some() {
                "a token is required"
            } else {
                "no token: anyone who can reach it can use it"
            };
            config.token = token;
            match agentry::openai::serve(config, agentry::openai::EngineModel::new(engine, &name)) {
                Ok(server) => {
                    eprintln!(
                        "agentry serve: `{name}` at {} ({guarded})",
                        agentry_serve::openai::base_url(&server)
                    );
                    server.run_forever()
                }
                Err(e) => finish(Err(format!("error: {e}"))),
            }
        }
        Command::Worker {
            task,
            controller,
            advertise,
            host,
            port,
            token,
            concurrency,
            name,
            split,
            difficulty,
            instances,
            max_turns,
        } => {
            let (generator, task_turns) = match agentry_serve::worker::builtin(&task) {
                Ok(found) => found,
                Err(e) => return finish(Err(format!("error: {e}"))),
            };
            let mut config = agentry_serve::WorkerConfig::new(
                name.as_deref().unwrap_or(&task),
                SocketAddr::new(host, port),
            );
            config.controller = Some(controller);
            config.advertise = advertise;
            config.token = match token.token() {
                Ok(token) => token,
                Err(e) => return finish(Err(e)),
            };
            config.concurrency = concurrency as usize;
            config.split = match split {
                SplitArg::Train => agentry::env::Split::Train,
                SplitArg::Test => agentry::env::Split::Test,
            };
            config.difficulty = difficulty;
            config.instances = instances;
            config.max_turns = max_turns.unwrap_or(task_turns);
            let summary = format!(
                "agentry worker: task {} ({} instances), heartbeating to {}",
                config.name,
                config.instances,
                config.controller.as_deref().unwrap_or_default()
            );
            match agentry_serve::worker::serve(generator, config) {
                Ok(server) => {
                    eprintln!("{summary}; listening on {}", server.addr());
                    server.run_forever()
                }
                Err(e) => finish(Err(format!("error: {e}"))),
            }
        }
    }
}

/// Checks every file, then runs their sweeps in order, sharing warm-ups across them.
fn run_files(files: &[PathBuf], run: &RunArgs) -> Result<(), String> {
    if files.len() > 1 && run.resume.is_some() {
        return Err("error: --resume continues one run: give only the file it belongs to".into());
    }
    run.init_threads().map_err(|e| format!("error: {e}"))?;
    let options = run.options();
    // Every file, with the command line's overrides, is checked before any run starts.
    let specs = files
        .iter()
        .map(|file| {
            read(file).and_then(|source| {
                let spec =
                    agentry::dsl::check(&source).map_err(|d| d.render(&display(file), &source))?;
                options
                    .overridden(spec)
                    .map_err(|e| format!("error: {}: {e}", display(file)))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let experiments: Vec<_> = specs.iter().map(|spec| spec.clone().into_inner()).collect();
    let Some(mut options) = run
        .leading(&experiments)
        .map_err(|e| format!("error: {e:#}"))?
    else {
        return Ok(());
    };
    if files.len() > 1 && run.warmup_from.is_none() {
        let mut runs = Vec::new();
        for spec in &specs {
            runs.extend(
                agentry::sweep::select(spec, &run.selection())
                    .map_err(|e| format!("error: {e}"))?,
            );
        }
        let warmups = agentry::shared_warmup::SharedWarmups::for_runs(
            &options.out,
            runs.iter().map(|r| &*r.experiment),
        )
        .map_err(|e| format!("error: {e}"))?;
        options.shared_warmups = warmups.map(std::sync::Arc::new);
    }
    if files.len() > 1 {
        for spec in &specs {
            agentry::sweep::check_warmup_from(
                &Interpreted(spec.clone()),
                &options,
                &run.selection(),
            )
            .map_err(|e| format!("error: {e}"))?;
        }
    }
    for spec in specs {
        agentry::sweep::run(&Interpreted(spec), &options, &run.selection())
            .map_err(|e| format!("error: {e}"))?;
    }
    Ok(())
}

/// `agentry eval`'s arguments.
#[derive(clap::Args)]
struct EndpointArgs {
    /// The experiment whose tasks, `eval` and decoding settings to use.
    file: Option<PathBuf>,
    /// The endpoint's API base, e.g. http://127.0.0.1:8000/v1.
    #[arg(long)]
    endpoint: String,
    /// The model name to request.
    #[arg(long)]
    model: String,
    /// The environment variable holding the API key (sent as a bearer token).
    #[arg(long, value_name = "VAR")]
    api_key_env: Option<String>,
    /// How a reply without `tool_calls` is read as a call: compact (Agentry's form, which
    /// also reads a bare JSON call) or hermes (`<tool_call>` tags).
    #[arg(long, value_enum, default_value_t = CallFormatArg::Compact)]
    call_format: CallFormatArg,
    /// Episodes played at once (concurrent requests).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Seconds one request may take before it is retried.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Retries of a request that timed out, failed with a 5xx or came back malformed.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Root directory of run directories.
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    /// Hide the progress lines.
    #[arg(long)]
    quiet: bool,
}

/// The experiment `agentry eval` uses without a file: the five built-in tasks as the AgentRL
/// recipe declares them, 32 held-out episodes each, greedy.
const FIVE_TASKS: &str = r#"
experiment endpoint_eval {
    seed = 1
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, context = 4096 } }
    task os { env = os, max_turns = 6, difficulty = 1 }
    task db { env = db, max_turns = 6, difficulty = 1 }
    task kg { env = kg, max_turns = 6, difficulty = 1 }
    task webshop { env = webshop, max_turns = 6, difficulty = 1 }
    task alfworld { env = alfworld, max_turns = 8, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train { steps = 0, max_new_tokens = 256, temperature = 0.7 }
    eval { split = test, episodes = 32, decoding = greedy }
}
"#;

fn evaluate_endpoint(args: EndpointArgs) -> Result<(), String> {
    let (name, source) = match &args.file {
        Some(file) => (display(file), read(file)?),
        None => (
            "(the five built-in tasks)".to_string(),
            FIVE_TASKS.to_string(),
        ),
    };
    let spec = agentry::dsl::check(&source).map_err(|d| d.render(&name, &source))?;
    let api_key = match &args.api_key_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            format!("error: --api-key-env {var}: the environment variable {var} is not set")
        })?),
        None => None,
    };
    let mut config = agentry_serve::openai::EndpointConfig::new(&args.endpoint, &args.model);
    config.api_key = api_key;
    config.timeout = std::time::Duration::from_secs(args.timeout.max(1));
    config.retries = args.retries;
    let endpoint =
        agentry::openai::OpenAiEndpoint::connect(config).map_err(|e| format!("error: {e}"))?;
    let options = agentry::RunOptions {
        out: args.out,
        quiet: args.quiet,
        remote_tasks: Some(std::sync::Arc::new(agentry::serve::HttpRemoteTasks)),
        ..agentry::RunOptions::default()
    };
    let settings = agentry::endpoint::EndpointOptions {
        call_format: match args.call_format {
            CallFormatArg::Compact => agentry::env::ToolCallFormat::Compact,
            CallFormatArg::Hermes => agentry::env::ToolCallFormat::Hermes,
        },
        concurrency: args.concurrency as usize,
    };
    agentry::endpoint::evaluate_endpoint(&Interpreted(spec), &options, &endpoint, &settings)
        .map(drop)
        .map_err(|e| format!("error: {e}"))
}

/// A call form, for `agentry eval --call-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CallFormatArg {
    /// `name(arg="value")`, or a bare JSON call.
    Compact,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
    Hermes,
}

fn parse_device(name: &str) -> Result<agentry::spec::Device, String> {
    agentry::device::parse(name).map_err(|e| e.to_string())
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file)
        .map_err(|e| format!("error: cannot read `{}`: {e}", display(file)))
}

fn display(file: &Path) -> String {
    file.display().to_string()
}

fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Command {
        match Cli::try_parse_from(std::iter::once("agentry").chain(args.iter().copied())) {
            Ok(cli) => cli.command,
            Err(e) => panic!("{e}"),
        }
    }

    /// `agentry eval` without a file plays the five built-in tasks, with the recipe's turn
    /// budgets.
    #[test]
    fn the_default_endpoint_evaluation_is_the_five_tasks() {
        let spec = agentry::dsl::check(FIVE_TASKS).expect("the built-in experiment checks");
        let tasks: Vec<(&str, u32)> = spec
            .tasks
            .iter()
            .map(|t| (t.name.as_str(), t.max_turns))
            .collect();
        assert_eq!(
            tasks,
            [
                ("os", 6),
                ("db", 6),
                ("kg", 6),
                ("webshop", 6),
                ("alfworld", 8)
            ]
        );
        assert_eq!(spec.eval.episodes, 32);
        assert_eq!(spec.train.max_new_tokens, 256);
        match parse(&["eval", "--endpoint", "http://h/v1", "--model", "m"]) {
            Command::Eval(args) => {
                assert_eq!(args.file, None);
                assert_eq!(args.call_format, CallFormatArg::Compact);
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn controller_and_worker_listen_on_loopback_unless_told_otherwise() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        match parse(&["controller"]) {
            Command::Controller { host, .. } => assert_eq!(host, loopback),
            _ => unreachable!(),
        }
        match parse(&["worker", "--task", "kg"]) {
            Command::Worker { host, .. } => assert_eq!(host, loopback),
            _ => unreachable!(),
        }
        match parse(&["controller", "--host", "0.0.0.0"]) {
            Command::Controller { host, .. } => assert!(host.is_unspecified()),
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_token_is_checked_without_repeating_it() {
        let token = |secret: &str| TokenArg {
            token: Some(secret.to_string()),
        };
        assert!(TokenArg { token: None }.token().unwrap().is_none());
        assert!(token("s3cret").token().unwrap().is_some());
        let error = token("my secret").token().unwrap_err();
        assert!(!error.contains("my secret"), "{error}");
        assert!(token("").token().is_err());
    }
}
