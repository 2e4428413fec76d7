//! `agentry serve` under concurrent load: throughput and latency of the OpenAI chat-completions
//! server over loopback, against the same load through the in-process serving engine, measured
//! in one run on one model.
//!
//! ```text
//! cargo run --release --example bench_serve                     # the tiny model (seconds)
//! cargo run --release --example bench_serve -- --quick          # a smoke run (CI)
//! cargo run --release --example bench_serve -- --clients 16 --requests 128 --max-batch 16
//! bash scripts/fetch_smollm2.sh && cargo run --release --example bench_serve -- \
//!     --model smollm2 --clients 8 --requests 32 --max-tokens 32
//! ```
//!
//! The workload is `--requests` different one-message conversations (a user message each, of
//! varied lengths), answered greedily (temperature 0) with the same `--max-tokens`, by a
//! bounded load generator: `--clients` threads, each sending its share of the requests one at
//! a time (send, read the whole reply, send the next), so at most that many are under way. Two
//! [`Engine`]s of the same policy (`--max-batch` replies decoded together) answer it:
//!
//! - **in-process**: the clients call [`Engine::submit`] and read its events from a channel;
//! - **HTTP**: the other engine behind [`agentry::openai::serve`] (what `agentry serve` runs)
//!   on 127.0.0.1, port 0; each client holds a keep-alive connection (`ureq`) and sends
//!   `stream: true` requests with `stream_options.include_usage`, reading the server-sent
//!   events line by line.
//!
//! Each path first answers one untimed request per client (4 tokens each), so neither pays for
//! first-touch allocations or for opening connections. Then the whole load runs `--rounds`
//! times on each, the paths taking turns (in-process, HTTP, in-process, ...), so a change in
//! the machine's load falls on both. Greedy replies do not depend on timing, so every round of
//! both paths must produce the same texts and token counts, request by request (the run fails
//! otherwise).
//!
//! Measured per path, over all its rounds: requests per second and completion tokens per
//! second over the summed wall time of the rounds (and each round's requests per second);
//! per request, the time to first token (TTFT: from sending the request to receiving the
//! first non-empty piece of reply text: a `Delta` event with text in process, a chunk whose
//! `delta.content` is not empty over HTTP) and the total latency (to the `Finished` event, to
//! `data: [DONE]`), as percentiles by nearest rank (with fewer than 100 requests in all, p99
//! is the slowest one). Then the serving overhead: in-process requests per second over HTTP
//! requests per second, minus one (issue 19's target: at most 10%).
//!
//! Models: `tiny` (the default: a randomly initialised 4-layer policy, d_model 128, 4 heads,
//! SwiGLU 512, tied embeddings, 512 positions, over a word-level tokenizer trained on the
//! workload's text; `--quick` shrinks it to 2 layers of d_model 32) and `smollm2`
//! (SmolLM2-135M-Instruct from its GGUF file, `target/models/` under the workspace root where
//! `scripts/fetch_smollm2.sh` puts it, or `--gguf PATH`, loaded by
//! [`agentry::serving::load_served`] as `agentry serve` loads it). The engine runs on flex, on
//! rayon's pool (`RAYON_NUM_THREADS`; the header prints it). The clients and the HTTP server's
//! threads share the same cores: compare ratios from one run, as absolute speeds drift on a
//! shared machine (the header prints the load average).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentry::model::{Policy, PolicyConfig};
use agentry::openai::EngineModel;
use agentry::serve::openai::{OpenAiConfig, base_url};
use agentry::serving::{ChatEvent, ChatJob, ChatMessage, Engine, EngineOptions, load_served};
use agentry::text::{ChatFormat, Tokenizer};
use anyhow::{Context, anyhow, bail, ensure};
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use clap::Parser;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

type B = Flex;

/// Where `scripts/fetch_smollm2.sh` puts the model, under the workspace root.
const SMOLLM2: &str = "target/models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser, Debug)]
#[command(about = "Throughput and latency of `agentry serve` against the in-process engine.")]
struct Args {
    /// A tiny model and a few requests that finish in seconds (a smoke test for CI, not a
    /// measurement); the greedy texts of both paths must agree.
    #[arg(long)]
    quick: bool,
    /// The model: `tiny` (random weights, word-level tokenizer) or `smollm2` (the GGUF file).
    #[arg(long, value_parser = ["tiny", "smollm2"], default_value = "tiny")]
    model: String,
    /// The GGUF file of `--model smollm2` (default: where scripts/fetch_smollm2.sh puts it).
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Concurrent clients, each sending one request at a time (default 8; 3 with `--quick`).
    #[arg(long)]
    clients: Option<usize>,
    /// Requests in all, shared out among the clients (default 64; 9 with `--quick`).
    #[arg(long)]
    requests: Option<usize>,
    /// Most tokens per reply (default 64; 8 with `--quick`).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Most replies the engine decodes together.
    #[arg(long, default_value_t = EngineOptions::default().max_batch)]
    max_batch: usize,
    /// Rounds of the whole load per path, the paths taking turns (default 3; 1 with
    /// `--quick`).
    #[arg(long)]
    rounds: Option<usize>,
}

/// The sizes of one run.
#[derive(Clone, Copy, Debug)]
struct Load {
    clients: usize,
    requests: usize,
    max_tokens: usize,
    max_batch: usize,
    rounds: usize,
}

impl Load {
    fn of(args: &Args) -> Self {
        let (clients, requests, max_tokens) = if args.quick { (3, 9, 8) } else { (8, 64, 64) };
        Load {
            clients: args.clients.unwrap_or(clients).max(1),
            requests: args.requests.unwrap_or(requests).max(1),
            max_tokens: args.max_tokens.unwrap_or(max_tokens).max(1),
            max_batch: args.max_batch.max(1),
            rounds: args.rounds.unwrap_or(if args.quick { 1 } else { 3 }).max(1),
        }
    }
}

fn main() -> agentry::Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.model = "tiny".to_string();
    }
    let load = Load::of(&args);
    let messages = conversations(load.requests, if args.quick { 12 } else { 40 });
    let (policy, chat, name, shape) = model(&args, &messages)?;
    let threads = rayon::current_num_threads();
    println!(
        "bench_serve{} --model {}: {shape}; flex backend, {threads} CPU thread{}; {} clients, \
         {} requests, max tokens {}, max batch {}, greedy, {} round{}; load average {}",
        if args.quick { " --quick" } else { "" },
        args.model,
        if threads == 1 { "" } else { "s" },
        load.clients,
        load.requests,
        load.max_tokens,
        load.max_batch,
        load.rounds,
        if load.rounds == 1 { "" } else { "s" },
        load_average(),
    );
    println!(
        "TTFT: from sending a request to receiving the first non-empty reply text (a Delta \
         event with text; a chunk with non-empty delta.content); latency: to the last event \
         (Finished; data: [DONE]); percentiles by nearest rank over every round's requests"
    );
    let options = EngineOptions {
        max_batch: load.max_batch,
        // Room for every client's request: no request is refused as busy.
        queue: load.clients.max(EngineOptions::default().queue),
        seed: 0,
    };

    // Two engines of the same policy: one called in process, one behind the server. The idle
    // one waits for work without using a core.
    let engine = Engine::start(policy.clone(), chat.clone(), options);
    let server = agentry::openai::serve(
        OpenAiConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        EngineModel::new(Engine::start(policy, chat, options), &name),
    )?;
    let url = format!("{}/chat/completions", base_url(&server));
    let agents: Vec<ureq::Agent> = (0..load.clients)
        .map(|_| {
            ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(3600))
                .build()
        })
        .collect();
    let local = |i: usize, max_tokens: usize| in_process(&engine, job(&messages[i], max_tokens));
    let http = |i: usize, max_tokens: usize| {
        over_http(
            &agents[i % load.clients],
            &url,
            &name,
            &messages[i],
            max_tokens,
        )
    };
    warm_up(&load, |i| local(i, 4))?;
    warm_up(&load, |i| http(i, 4))?;
    // The paths take turns, round after round, so a change in the machine's load between
    // rounds falls on both.
    let (mut local_rounds, mut http_rounds) = (Vec::new(), Vec::new());
    for _ in 0..load.rounds {
        local_rounds.push(run_clients(&load, |i| local(i, load.max_tokens))?);
        http_rounds.push(run_clients(&load, |i| http(i, load.max_tokens))?);
    }
    drop(server);
    drop(engine);

    println!("\n(a) in-process: Engine::submit, events from a channel");
    let local_rate = report(&local_rounds);
    println!(
        "\n(b) HTTP: agentry::openai::serve on 127.0.0.1, stream: true, one keep-alive \
         connection per client (ureq)"
    );
    let http_rate = report(&http_rounds);

    // Every round of either path must give the first in-process round's answers.
    let reference = &local_rounds[0].outcomes;
    let differ: Vec<(&str, usize, &Outcome)> = local_rounds
        .iter()
        .map(|m| ("in-process", m))
        .chain(http_rounds.iter().map(|m| ("HTTP", m)))
        .flat_map(|(path, m)| {
            m.outcomes
                .iter()
                .enumerate()
                .map(move |(i, o)| (path, i, o))
        })
        .filter(|(_, i, o)| {
            o.text != reference[*i].text || o.completion_tokens != reference[*i].completion_tokens
        })
        .collect();
    println!(
        "\nserving overhead: in-process requests/s / HTTP requests/s - 1 = {:+.1}%{}",
        (local_rate / http_rate - 1.0) * 100.0,
        if args.quick { "" } else { " (target <= 10%)" }
    );
    let answers = 2 * load.rounds * load.requests;
    println!(
        "same greedy texts and token counts both ways: {} ({} of {answers} answers equal the \
         first in-process round's)",
        differ.is_empty(),
        answers - differ.len(),
    );
    for (path, i, o) in differ.iter().take(3) {
        println!(
            "  request {i}: in-process {:?} ({} tokens), {path} {:?} ({} tokens)",
            reference[*i].text, reference[*i].completion_tokens, o.text, o.completion_tokens
        );
    }
    ensure!(
        differ.is_empty(),
        "{} of {answers} answers differ from the first in-process round's",
        differ.len(),
    );
    Ok(())
}

/// The policy to serve, its chat format, its name and a description of its shape.
fn model(
    args: &Args,
    messages: &[String],
) -> agentry::Result<(Policy<B>, ChatFormat, String, String)> {
    if args.model == "smollm2" {
        let path = args
            .gguf
            .clone()
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(SMOLLM2));
        ensure!(
            path.is_file(),
            "{} is missing: fetch it with `bash scripts/fetch_smollm2.sh` (or pass --gguf)",
            path.display()
        );
        let served = load_served(&path, None)?;
        let shape = format!("{} (GGUF), {}", path.display(), describe(&served.policy));
        return Ok((served.policy, served.chat, served.name, shape));
    }
    // A word-level tokenizer trained on the workload and the chat format's own text, as the
    // serving engine's tests make one.
    let mut corpus = ChatFormat::corpus_text(
        &agentry::env::Reset {
            instruction: String::new(),
            tools: Vec::new(),
        },
        &[],
    );
    corpus.extend(messages.iter().cloned());
    let chat = ChatFormat::new(Tokenizer::train(corpus.iter().map(String::as_str), 1024));
    let config = if args.quick {
        PolicyConfig {
            vocab: chat.tokenizer().vocab_size(),
            layers: 2,
            d_model: 32,
            heads: 2,
            kv_heads: 2,
            ffn: 64,
            context: 256,
            tie_embeddings: true,
        }
    } else {
        PolicyConfig {
            vocab: chat.tokenizer().vocab_size(),
            layers: 4,
            d_model: 128,
            heads: 4,
            kv_heads: 4,
            ffn: 512,
            context: 512,
            tie_embeddings: true,
        }
    };
    let device = Default::default();
    B::seed(&device, 0);
    let policy: Policy<B> = config.init(&device);
    let shape = format!("random weights, {}", describe(&policy));
    Ok((policy, chat, "tiny".to_string(), shape))
}

/// A policy's shape, in words.
fn describe(policy: &Policy<B>) -> String {
    let weights: usize = burn::module::Module::num_params(policy);
    format!(
        "{} layers, {:.2} M parameters, context {}",
        policy.blocks.len(),
        weights as f64 / 1e6,
        policy.context
    )
}

/// `count` different user messages, of 1 to `most` topics each.
fn conversations(count: usize, most: usize) -> Vec<String> {
    const TOPICS: &[&str] = &[
        "rivers",
        "bread",
        "bicycles",
        "the moon",
        "libraries",
        "winter",
        "bees",
        "trains",
        "music",
        "clocks",
        "gardens",
        "the sea",
        "maps",
        "tea",
        "bridges",
        "mountains",
        "paper",
        "birds",
        "glass",
        "rain",
        "chess",
        "salt",
        "lanterns",
        "forests",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    (0..count)
        .map(|i| {
            let n = rng.random_range(1..=most.max(1));
            let topics: Vec<&str> = (0..n)
                .map(|_| *TOPICS.choose(&mut rng).expect("topics"))
                .collect();
            format!(
                "Request {i}: write a few sentences about {}.",
                topics.join(", ")
            )
        })
        .collect()
}

/// A greedy one-message conversation.
fn job(message: &str, max_tokens: usize) -> ChatJob {
    ChatJob {
        messages: vec![ChatMessage::User(message.to_string())],
        tools: Vec::new(),
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        seed: None,
        n: 1,
        top_logprobs: None,
        forced_call: None,
    }
}

/// What one request got, and when.
#[derive(Clone, Debug, Default)]
struct Outcome {
    text: String,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Time to the first non-empty text; `None` for an empty reply.
    ttft: Option<Duration>,
    total: Duration,
}

/// One request through the engine's API, waiting for its last event.
fn in_process(engine: &Engine, job: ChatJob) -> agentry::Result<Outcome> {
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    engine
        .submit(job, Box::new(move |event| tx.send(event).is_ok()))
        .map_err(|refused| anyhow!("the engine refused a request: {refused:?}"))?;
    let mut outcome = Outcome::default();
    loop {
        let event = rx
            .recv()
            .context("the engine stopped before it finished a request")?;
        match event {
            ChatEvent::Delta { text, .. } => {
                if !text.is_empty() {
                    outcome.ttft.get_or_insert_with(|| started.elapsed());
                    outcome.text.push_str(&text);
                }
            }
            ChatEvent::Done { .. } => {}
            ChatEvent::Finished {
                prompt_tokens,
                completion_tokens,
            } => {
                outcome.total = started.elapsed();
                outcome.prompt_tokens = prompt_tokens;
                outcome.completion_tokens = completion_tokens;
                return Ok(outcome);
            }
        }
    }
}

/// One streamed request over HTTP, reading the events until `data: [DONE]`.
fn over_http(
    agent: &ureq::Agent,
    url: &str,
    model: &str,
    message: &str,
    max_tokens: usize,
) -> agentry::Result<Outcome> {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let response = agent
        .post(url)
        .send_json(body)
        .map_err(|e| anyhow!("POST {url}: {e}"))?;
    let mut outcome = Outcome::default();
    let mut done = false;
    // Read to the end of the body, so the connection goes back to the agent for the next one.
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.context("reading the event stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            outcome.total = started.elapsed();
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).context("a chunk that is not JSON")?;
        if let Some(error) = chunk.get("error") {
            bail!("the server failed a request: {error}");
        }
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str()
            && !text.is_empty()
        {
            outcome.ttft.get_or_insert_with(|| started.elapsed());
            outcome.text.push_str(text);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            let count = |key: &str| usage[key].as_u64().unwrap_or(0) as usize;
            outcome.prompt_tokens = count("prompt_tokens");
            outcome.completion_tokens = count("completion_tokens");
        }
    }
    ensure!(done, "the event stream ended without data: [DONE]");
    Ok(outcome)
}

/// One path's outcomes, by request, and the wall time of the whole load.
struct Measured {
    outcomes: Vec<Outcome>,
    wall: Duration,
}

/// Runs every request: client `c` sends requests `c`, `c + clients`, ... one at a time.
fn run_clients(
    load: &Load,
    request: impl Fn(usize) -> agentry::Result<Outcome> + Sync,
) -> agentry::Result<Measured> {
    let started = Instant::now();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; load.requests];
    let answered = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..load.clients.min(load.requests))
            .map(|c| {
                let request = &request;
                scope.spawn(move || {
                    (c..load.requests)
                        .step_by(load.clients)
                        .map(|i| Ok((i, request(i)?)))
                        .collect::<agentry::Result<Vec<_>>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("a client thread panicked"))
            .collect::<agentry::Result<Vec<_>>>()
    })?;
    let wall = started.elapsed();
    for (i, outcome) in answered.into_iter().flatten() {
        outcomes[i] = Some(outcome);
    }
    Ok(Measured {
        outcomes: outcomes
            .into_iter()
            .map(|o| o.expect("every request answered"))
            .collect(),
        wall,
    })
}

/// One untimed request per client (its first), all at once.
fn warm_up(
    load: &Load,
    request: impl Fn(usize) -> agentry::Result<Outcome> + Sync,
) -> agentry::Result<()> {
    let first = Load {
        requests: load.clients.min(load.requests),
        ..*load
    };
    run_clients(&first, request).map(|_| ())
}

/// Prints a path's numbers over its rounds, and each round's requests per second; returns
/// the requests per second over all rounds.
fn report(rounds: &[Measured]) -> f64 {
    let seconds: f64 = rounds.iter().map(|m| m.wall.as_secs_f64()).sum();
    let outcomes: Vec<&Outcome> = rounds.iter().flat_map(|m| &m.outcomes).collect();
    let requests = outcomes.len();
    let completion: usize = outcomes.iter().map(|o| o.completion_tokens).sum();
    let prompts: Vec<usize> = outcomes.iter().map(|o| o.prompt_tokens).collect();
    let mut ttft: Vec<Duration> = outcomes.iter().filter_map(|o| o.ttft).collect();
    let mut total: Vec<Duration> = outcomes.iter().map(|o| o.total).collect();
    ttft.sort();
    total.sort();
    let ms = |d: Option<Duration>| {
        d.map_or("-".to_string(), |d| {
            format!("{:.1} ms", d.as_secs_f64() * 1e3)
        })
    };
    println!(
        "  {requests} requests in {seconds:.2} s: {:.2} requests/s, {:.1} completion tokens/s \
         ({completion} tokens; prompts of {} to {} tokens)",
        requests as f64 / seconds,
        completion as f64 / seconds,
        prompts.iter().min().unwrap_or(&0),
        prompts.iter().max().unwrap_or(&0),
    );
    if rounds.len() > 1 {
        let each: Vec<String> = rounds
            .iter()
            .map(|m| format!("{:.2}", m.outcomes.len() as f64 / m.wall.as_secs_f64()))
            .collect();
        println!("  requests/s by round: {}", each.join(", "));
    }
    println!(
        "  TTFT p50 {}, p99 {}{}; latency p50 {}, p99 {}",
        ms(percentile(&ttft, 0.50)),
        ms(percentile(&ttft, 0.99)),
        if ttft.len() < requests {
            format!(" (of the {} replies with text)", ttft.len())
        } else {
            String::new()
        },
        ms(percentile(&total, 0.50)),
        ms(percentile(&total, 0.99)),
    );
    requests as f64 / seconds
}

/// The `q` quantile of sorted `values` by nearest rank.
fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

/// The 1-, 5- and 15-minute load averages, or why they are unknown.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_string())
}
