//! A `remote = "URL"` task of an experiment file resolves to a `RemoteTask` of the controller
//! through the HTTP client the `agentry` crate supplies; a controller that is not there, or no
//! client at all, is an error before any work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry::env::Split;
use agentry::serve::{ControllerConfig, HttpRemoteTasks, WorkerConfig};

fn spec(url: &str) -> agentry::spec::Experiment {
    checked(url).into_inner()
}

fn checked(url: &str) -> agentry::dsl::Checked<agentry::spec::Experiment> {
    let source = format!(
        "experiment remote {{
    model policy {{ arch = transformer }}
    task kg {{ remote = \"{url}\", name = \"kg-test\" }}
    algorithm grpo {{ group_size = 4 }}
    train {{ steps = 10, batch = 8 }}
}}"
    );
    agentry::dsl::check(&source).unwrap_or_else(|d| panic!("{}", d.render("r.arl", &source)))
}

/// A loopback address nothing listens on.
fn closed_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}/api")
}

#[test]
fn a_remote_task_plays_through_the_controller() {
    let loopback = "127.0.0.1:0".parse().unwrap();
    let controller = agentry::serve::controller::serve(ControllerConfig::new(loopback)).unwrap();
    let mut config = WorkerConfig::new("kg-test", loopback);
    config.controller = Some(controller.url());
    config.heartbeat_every = Duration::from_millis(100);
    let (kg, _) = agentry::serve::worker::builtin("kg").unwrap();
    let _worker = agentry::serve::worker::serve(Arc::clone(&kg), config).unwrap();

    let spec = spec(&controller.url());
    let deadline = Instant::now() + Duration::from_secs(20);
    let generators = loop {
        match agentry::tasks::resolve(&|_| None, Some(&HttpRemoteTasks), &spec) {
            Ok(generators) => break generators,
            Err(e) if Instant::now() > deadline => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert!(generators[0].version().starts_with("remote:kg-test@"));
    let mut env = generators[0].instance(Split::Train, 1, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let reset = loop {
        let reset = env.reset();
        if !reset.tools.is_empty() || Instant::now() > deadline {
            break reset;
        }
        // The worker registered but is not routed to yet: try a fresh episode.
        env = generators[0].instance(Split::Train, 1, 0);
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!reset.tools.is_empty(), "{}", reset.instruction);
    assert_eq!(env.oracle(), None, "a remote task has no oracle");
}

#[test]
fn a_missing_controller_is_an_error_before_any_work() {
    let spec = spec(&closed_url());
    let Err(e) = agentry::tasks::resolve(&|_| None, Some(&HttpRemoteTasks), &spec) else {
        panic!("resolved a task with no controller");
    };
    assert_eq!(e.task, "kg", "{e}");
    let message = e.to_string();
    assert!(message.contains("remote task `kg-test`"), "{message}");
    assert!(message.contains("cannot reach the controller"), "{message}");
}

#[test]
fn without_an_http_client_a_remote_task_is_an_error_that_says_how_to_supply_one() {
    let Err(e) = agentry::tasks::resolve(&|_| None, None, &spec(&closed_url())) else {
        panic!("resolved a remote task with no client");
    };
    assert_eq!(e.task, "kg", "{e}");
    let message = e.to_string();
    assert!(message.contains("remote task `kg-test`"), "{message}");
    assert!(message.contains("need an HTTP client"), "{message}");
    assert!(message.contains("RunOptions::remote_tasks"), "{message}");
}

/// What every recipe runs with (`agentry::main`): remote tasks are connected over HTTP, so a
/// missing controller is the client's error, before any work.
#[test]
fn the_recipes_options_connect_remote_tasks_over_http() {
    let out = std::env::temp_dir().join(format!("agentry-remote-options-{}", std::process::id()));
    let args = agentry::RunArgs {
        out: out.clone(),
        quiet: true,
        ..agentry::RunArgs::default()
    };
    let experiment = agentry::Interpreted(checked(&closed_url()));
    let Err(e) = agentry::run(&experiment, &args.options()) else {
        panic!("ran with no controller");
    };
    let message = e.to_string();
    assert!(message.contains("cannot reach the controller"), "{message}");
    assert!(
        !out.exists(),
        "a run directory was made before the tasks were connected"
    );
}
