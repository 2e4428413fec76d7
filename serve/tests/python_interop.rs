//! Interop with AgentRL's real Python worker (agentrl-worker 0.4.0): a number-guessing task
//! (`tests/python/guess_task.py`) served by `python -m agentrl.worker`, played through our
//! controller. Needs `AGENTRL_PYTHON` (a Python with agentrl-worker installed; CI makes one);
//! without it the test says so loudly and passes.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentry_env::{Environment, Status, ToolCall};
use agentry_serve::protocol::TaskIndex;
use agentry_serve::{ControllerClient, ControllerConfig, RemoteTask};
use common::*;
use serde_json::json;

/// The Python worker process, killed when the test ends (however it ends).
struct PythonWorker {
    child: Child,
    log: PathBuf,
}

impl PythonWorker {
    /// Starts AgentRL's `guess` worker on a free loopback port, registering with the
    /// controller at `controller`; returns it and the address it serves at.
    fn start(python: &str, controller: &str) -> (PythonWorker, String) {
        let port = free_port();
        let address = format!("http://127.0.0.1:{port}/api");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python");
        let log = std::env::temp_dir().join(format!("agentry-python-worker-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(python)
            .args(["-m", "agentrl.worker", "guess", "--config", "guess.yaml"])
            .args(["--controller", controller, "--self", &address])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .current_dir(&dir)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python}: {e}"));
        (PythonWorker { child, log }, address)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PythonWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn agentrl_python_workers_serve_through_our_controller() {
    let Ok(python) = std::env::var("AGENTRL_PYTHON") else {
        eprintln!(
            "\n*** SKIPPED python_interop: set AGENTRL_PYTHON to a Python with \
             agentrl-worker==0.4.0 installed (CI does) ***\n"
        );
        return;
    };
    // Python heartbeats every 8 s: keep the Go controller's 11 s liveness window.
    let mut config = ControllerConfig::new(loopback());
    config.http_threads = 2;
    let controller = agentry_serve::controller::serve(config).unwrap();

    let (worker, address) = PythonWorker::start(&python, &controller.url());

    // The first heartbeat may come before the worker listens (protocol §6): poll.
    let alive = std::panic::catch_unwind(|| wait_for_worker(&controller, "guess", &address));
    assert!(
        alive.is_ok(),
        "the Python worker never became ALIVE; its log:\n{}",
        worker.log()
    );

    // Indices keep their JSON types.
    let remote = RemoteTask::connect(&controller.url(), "guess").unwrap();
    let mut expected: Vec<TaskIndex> = (0..10).map(TaskIndex::Int).collect();
    expected.push(TaskIndex::Str("ten".into()));
    assert_eq!(remote.indices(), expected);

    // Full episodes by binary search, including the string index.
    for index in [
        TaskIndex::Int(0),
        TaskIndex::Int(7),
        TaskIndex::Str("ten".into()),
    ] {
        let mut env = remote.episode(index.clone());
        let reset = env.reset();
        assert!(
            reset.instruction.contains("Guess my number"),
            "{}",
            reset.instruction
        );
        assert_eq!(reset.tools[0].name, "guess");
        let (mut low, mut high) = (0i64, 99i64);
        let mut last = None;
        for _ in 0..8 {
            let mid = (low + high) / 2;
            let step = env.step(&ToolCall::new("guess", [("number", json!(mid))]));
            match step.observation.as_str() {
                "higher" => low = mid + 1,
                "lower" => high = mid - 1,
                _ => {}
            }
            let done = step.done();
            last = Some(step);
            if done {
                break;
            }
        }
        let last = last.unwrap();
        assert_eq!(last.observation, "correct", "index {index}");
        assert_eq!((last.status, last.reward), (Status::Completed, 1.0));
        assert!(env.success(), "metrics.success is read");
    }
    assert_eq!(remote.stats().aborted(), 0);

    // A bad message is the Python worker's 500; the session survives it.
    let api = controller.url();
    let a = post(
        &format!("{api}/start_sample"),
        None,
        json!({"name": "guess", "index": 1}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let id = a.session.unwrap();
    let a = post(
        &format!("{api}/interact"),
        Some(id),
        json!({"messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(
        (a.status, a.body),
        (500, json!({"message": "failed to interact with session"}))
    );
    let guess = call_message("call_1", "guess", json!({"number": 0}));
    let a = post(
        &format!("{api}/interact"),
        Some(id),
        json!({"messages": [guess]}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["status"], "running");
    assert_eq!(
        a.body["messages"],
        json!([{"role": "tool", "content": "higher", "tool_call_id": "call_1"}])
    );

    // Cancel: the Python worker's cancel_notice finishes the session.
    let client = ControllerClient::new(&api);
    client.cancel(id).unwrap();
    wait_until(
        "the Python worker's cancel notice",
        Duration::from_secs(10),
        || client.list_sessions().unwrap() == json!({}),
    );
    let status = get(&format!("{address}/worker_status")).unwrap().1;
    assert_eq!(
        status,
        json!({"concurrency": 4, "current": 0}),
        "log:\n{}",
        worker.log()
    );
    // The worker accepts our heartbeat answers (exactly 200, `application/json`), or it would
    // log a failure.
    assert!(
        !worker.log().contains("Heartbeat failed"),
        "log:\n{}",
        worker.log()
    );
}

/// AgentRL's Python worker sends no token: a controller with one refuses its heartbeats, and
/// it never registers (book: deploy/http, interop).
#[test]
fn a_controller_with_a_token_refuses_agentrl_python_workers() {
    let Ok(python) = std::env::var("AGENTRL_PYTHON") else {
        eprintln!("\n*** SKIPPED python_interop (token): set AGENTRL_PYTHON ***\n");
        return;
    };
    let mut config = ControllerConfig::new(loopback());
    config.http_threads = 2;
    config.token = Some(agentry_serve::Token::new("py-s3cret").unwrap());
    let controller = agentry_serve::controller::serve(config).unwrap();

    let (worker, _) = PythonWorker::start(&python, &controller.url());

    // Its first heartbeat is sent at startup; wait for the refusal in its log.
    let refused = std::panic::catch_unwind(|| {
        wait_until("a refused heartbeat", Duration::from_secs(30), || {
            worker.log().contains("Heartbeat failed")
        })
    });
    assert!(refused.is_ok(), "log:\n{}", worker.log());
    assert!(
        worker.log().contains("missing bearer token"),
        "log:\n{}",
        worker.log()
    );
    let client = ControllerClient::new(&controller.url())
        .with_token(Some(agentry_serve::Token::new("py-s3cret").unwrap()));
    assert_eq!(client.list_workers().unwrap(), json!({}));
}
