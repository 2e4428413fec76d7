//! A `remote = "URL"` task of an experiment file resolves to a `RemoteTask` of the controller,
//! and a controller that is not there is an error before any work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry::RunError;
use agentry::env::Split;
use agentry::serve::{ControllerConfig, WorkerConfig};

fn spec(url: &str) -> agentry::spec::Experiment {
    let source = format!(
        "experiment remote {{
    model policy {{ arch = transformer }}
    task kg {{ remote = \"{url}\", name = \"kg-test\" }}
    algorithm grpo {{ group_size = 4 }}
    train {{ steps = 10, batch = 8 }}
}}"
    );
    agentry::dsl::check(&source)
        .unwrap_or_else(|d| panic!("{}", d.render("r.arl", &source)))
        .into_inner()
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
        match agentry::tasks::resolve(&|_| None, &spec) {
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spec = spec(&format!("http://127.0.0.1:{port}/api"));
    let Err(e) = agentry::tasks::resolve(&|_| None, &spec) else {
        panic!("resolved a task with no controller");
    };
    assert!(matches!(e, RunError::Task { .. }), "{e}");
    let message = e.to_string();
    assert!(message.contains("remote task `kg-test`"), "{message}");
    assert!(message.contains("cannot reach the controller"), "{message}");
}
