//! What HTTP costs per environment step: the same oracle episodes of the five built-in tasks,
//! played in process and through a controller and workers on loopback.
//!
//! ```text
//! cargo run --release -p agentry-serve --example bench_http -- --episodes 50
//! ```
//!
//! Both sides replay the same precomputed oracle calls; time covers generating the instance,
//! `reset` and every `step` (in process: the environment calls alone; over HTTP: client →
//! controller → worker → the same environment calls and back, through the worker's
//! environment thread pool). One episode at a time, so this is latency, not throughput.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agentry_env::{Environment, Split, ToolCall};
use agentry_serve::protocol::TaskIndex;
use agentry_serve::worker::{BUILTIN_TASKS, builtin};
use agentry_serve::{ControllerConfig, RemoteTask, WorkerConfig};

fn main() {
    let mut episodes = 50u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--episodes", Some(n)) if n > 0 => episodes = n,
            _ => {
                eprintln!("usage: bench_http [--episodes N]");
                std::process::exit(2);
            }
        }
    }
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("a socket address");
    let controller =
        agentry_serve::controller::serve(ControllerConfig::new(loopback)).expect("a controller");
    let mut workers = Vec::new();
    for name in BUILTIN_TASKS {
        let (generator, max_turns) = builtin(name).expect("a built-in task");
        let mut config = WorkerConfig::new(name, loopback);
        config.controller = Some(controller.url());
        config.instances = episodes;
        config.max_turns = max_turns;
        config.heartbeat_every = Duration::from_millis(200);
        workers.push(agentry_serve::worker::serve(generator, config).expect("a worker"));
    }

    println!("{episodes} oracle episodes per task; time per call (reset or step), loopback HTTP\n");
    println!(
        "{:<10} {:>7} {:>14} {:>14} {:>9}",
        "task", "calls", "in-process", "over HTTP", "ratio"
    );
    let (mut local_total, mut http_total, mut calls_total) = (Duration::ZERO, Duration::ZERO, 0);
    for name in BUILTIN_TASKS {
        let (generator, _) = builtin(name).expect("a built-in task");
        // The oracle's calls of every episode, computed once, outside the timings.
        let scripts: Vec<Vec<ToolCall>> = (0..episodes)
            .map(|i| {
                let mut env = generator.instance(Split::Test, 1, i);
                env.reset();
                let mut calls = Vec::new();
                while let Some(call) = env.oracle() {
                    let done = env.step(&call).done();
                    calls.push(call);
                    if done {
                        break;
                    }
                }
                calls
            })
            .collect();
        let calls: usize = scripts.iter().map(|s| s.len() + 1).sum();

        let mut local = Duration::ZERO;
        for (i, script) in scripts.iter().enumerate() {
            // The worker generates the instance inside `start_sample`: count it here too.
            let start = Instant::now();
            let mut env = generator.instance(Split::Test, 1, i as u64);
            env.reset();
            for call in script {
                env.step(call);
            }
            local += start.elapsed();
            assert!(
                env.success(),
                "{name} #{i}: the oracle solves it in process"
            );
        }

        let remote = connect(&controller.url(), name);
        let mut http = Duration::ZERO;
        for (i, script) in scripts.iter().enumerate() {
            let mut env = remote.episode(TaskIndex::Int(i as i64));
            let start = Instant::now();
            env.reset();
            for call in script {
                env.step(call);
            }
            http += start.elapsed();
            assert!(env.success(), "{name} #{i}: the oracle solves it over HTTP");
        }
        println!(
            "{name:<10} {calls:>7} {:>11.1} µs {:>11.1} µs {:>8.1}x",
            micros(local, calls),
            micros(http, calls),
            http.as_secs_f64() / local.as_secs_f64()
        );
        local_total += local;
        http_total += http;
        calls_total += calls;
    }
    println!(
        "{:<10} {calls_total:>7} {:>11.1} µs {:>11.1} µs {:>8.1}x",
        "all",
        micros(local_total, calls_total),
        micros(http_total, calls_total),
        http_total.as_secs_f64() / local_total.as_secs_f64()
    );
    println!(
        "\nHTTP adds {:.1} µs per call (client → controller → worker and back).",
        micros(http_total.saturating_sub(local_total), calls_total)
    );
}

/// Waits for the task's worker to register, then connects.
fn connect(controller: &str, name: &str) -> RemoteTask {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match RemoteTask::connect(controller, name) {
            Ok(task) if task.episode(TaskIndex::Int(0)).reset().tools.is_empty() => {}
            Ok(task) => return task,
            Err(e) if Instant::now() > deadline => panic!("{name}: {e}"),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn micros(total: Duration, calls: usize) -> f64 {
    total.as_secs_f64() * 1e6 / calls as f64
}
