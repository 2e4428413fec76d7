//! Faults: a worker killed mid-episode, a worker that is full, and 1,000 concurrent sessions.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentry_env::{Environment, Status, ToolCall};
use agentry_serve::protocol::TaskIndex;
use agentry_serve::{ControllerClient, RemoteTask};
use common::*;
use serde_json::json;

#[test]
fn a_worker_killed_mid_episode_aborts_the_episode_and_leaves_routing() {
    let controller = controller();
    let worker = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 4),
    )
    .unwrap();
    let address = worker.url();
    wait_for_worker(&controller, "countdown", &address);
    let remote = RemoteTask::connect(&controller.url(), "countdown").unwrap();
    let mut env = remote.episode(TaskIndex::Int(2));
    env.reset();
    let tick = ToolCall::new("tick", []);
    assert_eq!(env.step(&tick).status, Status::Running);
    let id = env.session_id().unwrap();

    worker.kill();
    let step = env.step(&tick);
    assert_eq!(step.status, Status::TaskError);
    assert!(
        step.observation.contains("failed to interact"),
        "{}",
        step.observation
    );
    assert_eq!(remote.stats().aborted(), 1);
    assert!(!env.success());
    // Later steps keep saying why, without touching the network.
    assert_eq!(env.step(&tick).status, Status::TaskError);

    // The client's cancel finished the session (the worker's cancel failing), and the dead
    // worker gets no new sessions.
    let client = ControllerClient::new(&controller.url());
    wait_until(
        "the aborted session to be finished",
        Duration::from_secs(10),
        || {
            client
                .list_sessions()
                .unwrap()
                .get(id.to_string())
                .is_none()
        },
    );
    let err = client
        .start_sample("countdown", &TaskIndex::Int(0))
        .unwrap_err();
    assert_eq!(
        err,
        agentry_serve::ClientError::Http {
            status: 400,
            message: "no workers available for task countdown".into()
        }
    );
    let mut fresh = remote.episode(TaskIndex::Int(0));
    let reset = fresh.reset();
    assert!(reset.tools.is_empty());
    assert!(
        reset.instruction.contains("no workers available"),
        "{}",
        reset.instruction
    );
    assert_eq!(fresh.step(&tick).status, Status::TaskError);
    assert_eq!(remote.stats().aborted(), 2);

    // A new worker takes over.
    let worker = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 4),
    )
    .unwrap();
    wait_for_worker(&controller, "countdown", &worker.url());
    let mut env = remote.episode(TaskIndex::Int(0));
    env.reset();
    assert_eq!(env.step(&tick).status, Status::Completed);
    assert!(env.success());
}

#[test]
fn a_full_worker_is_not_routed_to_and_a_second_one_takes_the_load() {
    let controller = controller();
    let one = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 1),
    )
    .unwrap();
    wait_for_worker(&controller, "countdown", &one.url());
    let client = ControllerClient::new(&controller.url());
    let first = client
        .start_sample("countdown", &TaskIndex::Int(0))
        .unwrap();
    let busy = client
        .start_sample("countdown", &TaskIndex::Int(0))
        .unwrap_err();
    assert!(
        matches!(busy, agentry_serve::ClientError::Http { status: 400, .. }),
        "{busy}"
    );
    let two = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 3),
    )
    .unwrap();
    wait_for_worker(&controller, "countdown", &two.url());
    let second = client
        .start_sample("countdown", &TaskIndex::Int(0))
        .unwrap();
    let sessions = client.list_sessions().unwrap();
    assert_eq!(sessions[first.session_id.to_string()]["worker_id"], 1);
    assert_eq!(sessions[second.session_id.to_string()]["worker_id"], 2);
}

#[test]
fn a_thousand_concurrent_sessions_complete() {
    const SESSIONS: usize = 1000;
    const CLIENTS: usize = 32;
    let controller = controller();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let mut config = worker_config("countdown", Some(&controller), 250);
            config.env_threads = 1;
            agentry_serve::worker::serve(countdown(), config).unwrap()
        })
        .collect();
    for worker in &workers {
        wait_for_worker(&controller, "countdown", &worker.url());
    }
    let remote = RemoteTask::connect(&controller.url(), "countdown").unwrap();

    // Open every session first, so all 1,000 are live at once...
    let next = AtomicUsize::new(0);
    let envs: Vec<agentry_serve::RemoteEnv> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while next.fetch_add(1, Ordering::Relaxed) < SESSIONS {
                        let i = mine.len() as i64;
                        let mut env = remote.episode(TaskIndex::Int(i % 20));
                        let reset = env.reset();
                        assert!(!reset.tools.is_empty(), "{}", reset.instruction);
                        mine.push(env);
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(envs.len(), SESSIONS);
    let client = ControllerClient::new(&controller.url());
    assert_eq!(
        client.list_sessions().unwrap().as_object().unwrap().len(),
        SESSIONS
    );
    let live: u64 = workers
        .iter()
        .map(|w| {
            get(&format!("{}/worker_status", w.url())).unwrap().1["current"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(live, SESSIONS as u64);

    // ...then play them all to the end, concurrently.
    let queue = Arc::new(std::sync::Mutex::new(envs));
    let solved = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                loop {
                    let Some(mut env) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let tick = ToolCall::new("tick", []);
                    for _ in 0..3 {
                        if env.step(&tick).done() {
                            break;
                        }
                    }
                    if env.success() {
                        solved.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(solved.load(Ordering::Relaxed), SESSIONS);
    assert_eq!(remote.stats().aborted(), 0);
    assert_eq!(client.list_sessions().unwrap(), json!({}));
}
