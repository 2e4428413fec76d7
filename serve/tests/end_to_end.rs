//! Our controller and our workers, end to end: built-in tasks played by their oracles through
//! the controller give the same transcripts as in process, and the controller API answers as
//! the protocol says.

mod common;

use std::time::Duration;

use agentry_env::{Environment, Split};
use agentry_serve::protocol::TaskIndex;
use agentry_serve::{ControllerClient, RemoteTask};
use common::*;
use serde_json::{Value, json};

#[test]
fn oracle_episodes_through_the_controller_match_local_ones() {
    let controller = controller();
    let mut workers = Vec::new();
    for name in agentry_serve::worker::BUILTIN_TASKS {
        let (generator, max_turns) = agentry_serve::worker::builtin(name).unwrap();
        let mut config = worker_config(name, Some(&controller), 4);
        config.max_turns = max_turns;
        let worker = agentry_serve::worker::serve(generator, config).unwrap();
        wait_for_worker(&controller, name, &worker.url());
        workers.push(worker);
    }
    for name in agentry_serve::worker::BUILTIN_TASKS {
        let (generator, _) = agentry_serve::worker::builtin(name).unwrap();
        let remote = RemoteTask::connect(&controller.url(), name).unwrap();
        assert_eq!(remote.indices().len(), 20);
        for index in [0u64, 7, 13] {
            // Workers serve the test split at difficulty 1 by default.
            let mut local = generator.instance(Split::Test, 1, index);
            let mut remote_env = remote.episode(TaskIndex::Int(index as i64));
            let local_reset = local.reset();
            let remote_reset = remote_env.reset();
            assert_eq!(remote_reset, local_reset, "{name} #{index}: reset");
            let mut turns = 0;
            while let Some(call) = local.oracle() {
                let expected = local.step(&call);
                let got = remote_env.step(&call);
                assert_eq!(got, expected, "{name} #{index}: turn {turns}");
                turns += 1;
                if expected.done() {
                    break;
                }
            }
            assert!(local.success(), "{name} #{index}: the oracle solves it");
            assert!(remote_env.success(), "{name} #{index}: success reported");
            assert_eq!(remote_env.session_id(), None, "the session is over");
        }
        assert_eq!(remote.stats().finished(), 3);
        assert_eq!(remote.stats().aborted(), 0);
    }
    // Every session finished: none is left on the controller.
    let client = ControllerClient::new(&controller.url());
    assert_eq!(client.list_sessions().unwrap(), json!({}));
}

#[test]
fn a_fork_replays_the_episode() {
    let controller = controller();
    let (generator, _) = agentry_serve::worker::builtin("kg").unwrap();
    let worker =
        agentry_serve::worker::serve(generator.clone(), worker_config("kg", Some(&controller), 4))
            .unwrap();
    wait_for_worker(&controller, "kg", &worker.url());
    let remote = RemoteTask::connect(&controller.url(), "kg").unwrap();
    let mut local = generator.instance(Split::Test, 1, 3);
    let mut env = remote.episode(TaskIndex::Int(3));
    local.reset();
    env.reset();
    let call = local.oracle().unwrap();
    local.step(&call);
    env.step(&call);
    let mut fork = env.box_clone();
    let mut local_fork = local.box_clone();
    // The original and the fork go on independently, each as the local episode would.
    while let Some(call) = local.oracle() {
        let expected = local.step(&call);
        assert_eq!(env.step(&call), expected);
        assert_eq!(fork.step(&call), local_fork.step(&call));
        if expected.done() {
            break;
        }
    }
    assert!(env.success() && fork.success());
    assert_eq!(remote.stats().started(), 2);
}

#[test]
fn the_controller_api_answers_as_the_protocol_says() {
    let controller = controller();
    let api = controller.url();
    let url = |endpoint: &str| format!("{api}/{endpoint}");
    let worker = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 2),
    )
    .unwrap();
    wait_for_worker(&controller, "countdown", &worker.url());

    assert_eq!(
        get(&url("version")).unwrap(),
        (200, json!({"variant": "nova", "version": 1}))
    );
    let (code, indices) = get(&url("get_indices?name=countdown")).unwrap();
    assert_eq!((code, indices.as_array().unwrap().len()), (200, 20));
    assert_eq!(
        get(&url("get_indices?name=nope")).unwrap(),
        (400, json!({"message": "task nope does not exist"}))
    );

    let (_, workers) = get(&url("list_workers")).unwrap();
    let w = &workers["countdown"]["workers"]["1"];
    assert_eq!(
        (w["id"].clone(), w["capacity"].clone(), w["status"].clone()),
        (json!(1), json!(2), json!("ALIVE"))
    );
    assert_eq!(w["stale"], false);

    // start_sample: the session id header, and only messages and tools.
    let a = post(
        &url("start_sample"),
        None,
        json!({"name": "countdown", "index": 1}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let id = a.session.unwrap();
    let mut keys: Vec<&String> = a.body.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["messages", "tools"]);
    let a2 = post(
        &url("start_sample"),
        None,
        json!({"name": "countdown", "index": 2}),
    );
    assert_eq!(a2.session, Some(id + 1), "ids count up");

    let bad = |body: Value, message: &str| {
        let a = post(&url("start_sample"), None, body);
        assert_eq!((a.status, a.body), (400, json!({"message": message})));
    };
    bad(
        json!({"name": "nope", "index": 0}),
        "task nope does not exist",
    );
    bad(
        json!({"name": "countdown", "index": "0"}),
        "task countdown does not support index \"0\"",
    );
    bad(
        json!({"name": "countdown", "index": -1}),
        "no custom task provided",
    );
    bad(
        json!({"name": "countdown", "index": 0}),
        "no workers available for task countdown",
    );
    let a = post_raw(&url("start_sample"), None, "nonsense");
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "invalid request"}))
    );

    let (_, sessions) = get(&url("list_sessions")).unwrap();
    assert_eq!(sessions[id.to_string()]["name"], "countdown");
    assert_eq!(sessions[id.to_string()]["index"], 1);
    assert_eq!(sessions[id.to_string()]["worker_id"], 1);
    assert!(sessions[id.to_string()]["start"].as_str().unwrap().len() == 19);

    // interact: `metrics`, not `metric`; the session ends with its final status.
    let tick = call_message("call_0", "tick", json!({}));
    let a = post(
        &url("interact"),
        Some(id),
        json!({"messages": [tick.clone()]}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.body,
        json!({"finish": false, "reward": 0.0, "status": "running",
        "messages": [{"role": "tool", "content": "1 to go", "tool_call_id": "call_0"}], "metrics": {}})
    );
    let a = post(
        &url("interact"),
        Some(id),
        json!({"messages": [tick.clone()]}),
    );
    assert_eq!(a.body["finish"], true);
    assert_eq!(a.body["reward"], json!(1.0));
    assert_eq!(a.body["metrics"]["success"], true);
    assert!(a.body.get("metric").is_none());
    let a = post(
        &url("interact"),
        Some(id),
        json!({"messages": [tick.clone()]}),
    );
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "session not found"}))
    );

    // Bad requests get 4xx with a message; a bad message is the worker's 500, and the session
    // survives it.
    let id2 = id + 1;
    let a = post(&url("interact"), None, json!({"messages": [tick.clone()]}));
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "invalid session id"}))
    );
    let a = post_raw(&url("interact"), Some("abc"), "{}");
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "invalid session id"}))
    );
    let a = post(&url("interact"), Some(id2), json!({"messages": null}));
    assert_eq!(a.status, 400);
    let a = post(
        &url("interact"),
        Some(id2),
        json!({"messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(
        (a.status, a.body),
        (500, json!({"message": "failed to interact with session"}))
    );
    let a = post(
        &url("interact"),
        Some(id2),
        json!({"messages": [tick.clone()]}),
    );
    assert_eq!(
        a.body["status"], "running",
        "the session survived a bad message"
    );

    // mark_stale takes a worker out of routing.
    let a = post(
        &url("mark_stale"),
        None,
        json!({"name": "countdown", "worker_id": 1, "stale": true}),
    );
    assert_eq!((a.status, a.body), (200, Value::Null));
    assert_eq!(
        post(
            &url("start_sample"),
            None,
            json!({"name": "countdown", "index": 0})
        )
        .status,
        400
    );
    post(
        &url("mark_stale"),
        None,
        json!({"name": "countdown", "worker_id": 1, "stale": false}),
    );
    let a = post(
        &url("mark_stale"),
        None,
        json!({"name": "countdown", "worker_id": 9, "stale": true}),
    );
    assert_eq!(a.status, 400);

    // cancel: answered at once; the worker's notice finishes the session.
    let a = post(&url("cancel"), Some(id2), json!({}));
    assert_eq!((a.status, a.body), (200, Value::Null));
    wait_until("the cancel notice", Duration::from_secs(5), || {
        get(&url("list_sessions")).unwrap().1 == json!({})
    });
    let a = post(
        &url("interact"),
        Some(id2),
        json!({"messages": [tick.clone()]}),
    );
    assert_eq!(a.status, 400);
    let a = post(&url("cancel"), Some(id2), json!({}));
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "session not found"}))
    );
    assert_eq!(
        get(&format!("{}/worker_status", worker.url())).unwrap().1["current"],
        0
    );

    // cancel_all by task name.
    for index in [0, 1] {
        assert_eq!(
            post(
                &url("start_sample"),
                None,
                json!({"name": "countdown", "index": index})
            )
            .status,
            200
        );
    }
    let a = post_raw(&url("cancel_all?name=countdown"), None, "");
    assert_eq!((a.status, a.body), (200, Value::Null));
    wait_until("cancel_all", Duration::from_secs(5), || {
        get(&url("list_sessions")).unwrap().1 == json!({})
    });
    assert_eq!(
        get(&format!("{}/get_sessions", worker.url())).unwrap().1,
        json!({})
    );
}

#[test]
fn heartbeats_are_validated() {
    let controller = controller();
    let url = format!("{}/receive_heartbeat", controller.url());
    let hb = |body: Value| post(&url, None, body);
    let a = hb(json!({"name": "", "address": "http://x/api", "concurrency": 1, "indices": [0]}));
    assert_eq!(
        (a.status, a.body),
        (
            400,
            json!({"message": "task name and indices cannot be empty"})
        )
    );
    let a = hb(json!({"name": "t", "address": "http://x/api", "concurrency": 1, "indices": []}));
    assert_eq!(a.status, 400);
    let a = hb(json!({"name": "t", "address": "", "concurrency": 1, "indices": [0]}));
    assert_eq!(a.status, 400);
    let a = hb(
        json!({"name": "t", "address": "http://127.0.0.1:9/api", "concurrency": 0, "indices": [0]}),
    );
    assert_eq!(
        (a.status, a.body),
        (
            400,
            json!({"message": "worker capacity must be a positive integer"})
        )
    );
    let a = hb(
        json!({"name": "t", "address": "http://127.0.0.1:9/api", "concurrency": 2, "indices": [0, "1"]}),
    );
    assert_eq!((a.status, a.body.clone()), (200, Value::Null));
    let a = hb(
        json!({"name": "t", "address": "http://127.0.0.1:10/api", "concurrency": 2, "indices": [0, 1]}),
    );
    assert_eq!(
        (a.status, a.body),
        (
            400,
            json!({"message": "task t already exists with different indices"})
        )
    );
    let a = post_raw(&url, None, "[1, 2]");
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "invalid request"}))
    );
    // Nothing listens at that address: the worker is registered, but not routed to.
    let (_, workers) = get(&format!("{}/list_workers", controller.url())).unwrap();
    assert_eq!(workers["t"]["indices"], json!([0, "1"]));
    let a = post(
        &format!("{}/start_sample", controller.url()),
        None,
        json!({"name": "t", "index": 0}),
    );
    assert_eq!(
        (a.status, a.body),
        (400, json!({"message": "no workers available for task t"}))
    );
}

#[test]
fn a_remote_task_splits_its_indices_disjointly() {
    use agentry_env::TaskGenerator;
    let controller = controller();
    let worker = agentry_serve::worker::serve(
        countdown(),
        worker_config("countdown", Some(&controller), 4),
    )
    .unwrap();
    wait_for_worker(&controller, "countdown", &worker.url());
    let remote = RemoteTask::connect(&controller.url(), "countdown").unwrap();
    let (train, test) = (remote.split(Split::Train), remote.split(Split::Test));
    assert_eq!(train.len() + test.len(), 20);
    assert!(!train.is_empty() && !test.is_empty());
    assert!(train.iter().all(|i| !test.contains(i)));
    // Its instances are its indices, at every difficulty: an evaluation longer wraps around.
    for (split, indices) in [(Split::Train, train), (Split::Test, test)] {
        for difficulty in 1..=3 {
            assert_eq!(
                remote.instances(split, difficulty),
                Some(indices.len() as u64)
            );
        }
    }
    // Instance `i` of a split is an index of that split.
    for split in [Split::Train, Split::Test] {
        let mut env = remote.instance(split, 1, 3);
        env.reset();
        let sessions = ControllerClient::new(&controller.url())
            .list_sessions()
            .unwrap();
        let index: TaskIndex = serde_json::from_value(
            sessions.as_object().unwrap().values().next().unwrap()["index"].clone(),
        )
        .unwrap();
        assert!(remote.split(split).contains(&index), "{split:?}: {index}");
        drop(env);
        wait_until("the cancel", Duration::from_secs(5), || {
            ControllerClient::new(&controller.url())
                .list_sessions()
                .unwrap()
                == json!({})
        });
    }

    // A task too small to have both splits gives episodes that fail, saying so.
    let mut config = worker_config("tiny", Some(&controller), 1);
    config.instances = 1;
    let tiny = agentry_serve::worker::serve(countdown(), config).unwrap();
    wait_for_worker(&controller, "tiny", &tiny.url());
    let remote = RemoteTask::connect(&controller.url(), "tiny").unwrap();
    let empty = if remote.split(Split::Test).is_empty() {
        Split::Test
    } else {
        Split::Train
    };
    let mut env = remote.instance(empty, 1, 0);
    let reset = env.reset();
    assert!(
        reset.instruction.contains("has no index in the"),
        "{}",
        reset.instruction
    );
    assert_eq!(remote.stats().aborted(), 1);
}

/// A shared bearer token: without it, nothing changes; with it, everything works.
mod token {
    use super::*;
    use agentry_serve::Token;

    const TOKEN: &str = "s3cret-token";

    fn token() -> Option<Token> {
        Some(Token::new(TOKEN).unwrap())
    }

    fn client_with(controller: &agentry_serve::Server, token: Option<&str>) -> ControllerClient {
        ControllerClient::new(&controller.url()).with_token(token.map(|t| Token::new(t).unwrap()))
    }

    /// A refused call: 401, `WWW-Authenticate: Bearer`, and the controller's error shape.
    #[track_caller]
    fn assert_refused(answer: &Answer) {
        assert_eq!(answer.status, 401, "{}", answer.body);
        assert_eq!(answer.authenticate.as_deref(), Some("Bearer"));
        let body = answer.body.as_object().expect("a JSON object");
        assert_eq!(body.keys().collect::<Vec<_>>(), ["message"], "{body:?}");
    }

    #[test]
    fn controller_and_workers_sharing_a_token_work_end_to_end() {
        let controller = controller_with_token(Some(TOKEN));
        let mut config = worker_config("countdown", Some(&controller), 4);
        config.token = token();
        let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
        // The heartbeat carried the token (or the worker would not be listed), and the
        // controller's sync carried it to the worker (or the worker would not be ALIVE).
        wait_for_worker_with(&controller, TOKEN, "countdown", &worker.url());

        let remote = RemoteTask::with_client(client_with(&controller, Some(TOKEN)), "countdown")
            .expect("the client sends the token");
        let generator = countdown();
        for index in [0u64, 1, 2] {
            let mut local = generator.instance(Split::Test, 1, index);
            let mut env = remote.episode(TaskIndex::Int(index as i64));
            assert_eq!(env.reset(), local.reset());
            while let Some(call) = local.oracle() {
                assert_eq!(env.step(&call), local.step(&call));
            }
            assert!(env.success());
        }
        assert_eq!(
            (remote.stats().finished(), remote.stats().aborted()),
            (3, 0)
        );

        // A cancel goes controller → worker (cancel_with_notice) → controller (cancel_notice):
        // the session is gone only once the worker's notice, with the token, is accepted.
        let client = client_with(&controller, Some(TOKEN));
        let started = client
            .start_sample("countdown", &TaskIndex::Int(5))
            .unwrap();
        client.cancel(started.session_id).unwrap();
        wait_until("the cancel notice", Duration::from_secs(5), || {
            client.list_sessions().unwrap() == json!({})
        });
        let status = call(
            "GET",
            &format!("{}/worker_status", worker.url()),
            Some(TOKEN),
            None,
            None,
        );
        assert_eq!(status.body["current"], 0, "{}", status.body);
    }

    #[test]
    fn without_the_token_the_controller_changes_nothing() {
        let controller = controller_with_token(Some(TOKEN));
        let api = controller.url();
        let url = |endpoint: &str| format!("{api}/{endpoint}");
        let mut config = worker_config("countdown", Some(&controller), 4);
        config.token = token();
        let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
        wait_for_worker_with(&controller, TOKEN, "countdown", &worker.url());
        let client = client_with(&controller, Some(TOKEN));
        let live = client
            .start_sample("countdown", &TaskIndex::Int(2))
            .unwrap();
        let sessions = client.list_sessions().unwrap();
        // The workers as listed, without the time of their last heartbeat.
        let workers_now = || {
            let mut workers = client.list_workers().unwrap();
            for worker in workers["countdown"]["workers"]
                .as_object_mut()
                .unwrap()
                .values_mut()
            {
                worker.as_object_mut().unwrap().remove("last_visit");
            }
            workers
        };
        let workers = workers_now();
        assert_eq!(workers["countdown"]["workers"]["1"]["current"], 1);

        for bad in [
            None,
            Some("wrong-token"),
            Some("s3cret-token2"),
            Some("s3cret-toke"),
        ] {
            // Reads are refused too.
            for endpoint in [
                "list_sessions",
                "list_workers",
                "get_indices?name=countdown",
                "version",
            ] {
                assert_refused(&call("GET", &url(endpoint), bad, None, None));
            }
            // start_sample creates no session.
            let start = json!({"name": "countdown", "index": 1});
            assert_refused(&call("POST", &url("start_sample"), bad, None, Some(start)));
            // cancel and cancel_all leave the session alive; interact does not step it.
            assert_refused(&call(
                "POST",
                &url("cancel"),
                bad,
                Some(live.session_id),
                Some(json!({})),
            ));
            assert_refused(&call(
                "POST",
                &url("cancel_all?force=true"),
                bad,
                None,
                None,
            ));
            let tick = json!({"messages": [call_message("c", "tick", json!({}))]});
            assert_refused(&call(
                "POST",
                &url("interact"),
                bad,
                Some(live.session_id),
                Some(tick),
            ));
            // A cancel notice does not finish the session.
            let notice = json!({"session_id": live.session_id});
            assert_refused(&call(
                "POST",
                &url("cancel_notice"),
                bad,
                Some(live.session_id),
                Some(notice),
            ));
            // mark_stale does not mark the worker stale.
            let stale = json!({"name": "countdown", "worker_id": 1, "stale": true});
            assert_refused(&call("POST", &url("mark_stale"), bad, None, Some(stale)));
            // A heartbeat registers no worker.
            let heartbeat = json!({"name": "intruder", "address": "http://127.0.0.1:9/api",
                                   "concurrency": 4, "indices": [0]});
            assert_refused(&call(
                "POST",
                &url("receive_heartbeat"),
                bad,
                None,
                Some(heartbeat),
            ));
            for endpoint in ["clean_worker", "clean_session", "sync_all"] {
                assert_refused(&call("POST", &url(endpoint), bad, None, None));
            }
            // An unknown path is refused the same way.
            assert_refused(&call("GET", &url("nope"), bad, None, None));
        }
        assert_eq!(client.list_sessions().unwrap(), sessions);
        assert_eq!(workers_now(), workers);
        assert_eq!(workers["countdown"]["workers"]["1"]["stale"], false);
        assert!(workers.get("intruder").is_none());
        // The session is where it was: instance 2 needs three ticks, the first is "2 to go".
        let step = client
            .interact(live.session_id, vec![call_message("c", "tick", json!({}))])
            .unwrap();
        assert_eq!(
            (step.finish, step.messages[0]["content"].clone()),
            (false, json!("2 to go"))
        );

        // The client without the token (or with a wrong one) gets the 401 as an error.
        for bad in [None, Some("wrong-token")] {
            let refused = RemoteTask::with_client(client_with(&controller, bad), "countdown");
            assert!(
                matches!(
                    refused,
                    Err(agentry_serve::ClientError::Http { status: 401, .. })
                ),
                "{refused:?}"
            );
        }
        // The header's scheme is case-insensitive.
        let a = call("GET", &url("version"), None, None, None);
        assert_refused(&a);
        let lower = ureq::get(&url("version"))
            .set("Authorization", &format!("bearer {TOKEN}"))
            .call()
            .unwrap();
        assert_eq!(lower.status(), 200);
    }

    #[test]
    fn a_controller_with_a_token_refuses_a_worker_without_it() {
        let controller = controller_with_token(Some(TOKEN));
        let without = agentry_serve::worker::serve(
            countdown(),
            worker_config("countdown", Some(&controller), 4),
        )
        .unwrap();
        let mut config = worker_config("other", Some(&controller), 4);
        config.token = Some(Token::new("another-token").unwrap());
        let wrong = agentry_serve::worker::serve(countdown(), config).unwrap();
        // Heartbeats every 200 ms: a second is five refused heartbeats from each.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            client_with(&controller, Some(TOKEN))
                .list_workers()
                .unwrap(),
            json!({})
        );
        drop((without, wrong));
    }

    #[test]
    fn a_worker_with_a_token_is_not_used_by_a_controller_without_it() {
        // The controller takes the worker's heartbeat (it has no token), but its sync with
        // the worker is refused, so the worker never becomes ALIVE and gets no session.
        let controller = controller();
        let mut config = worker_config("countdown", Some(&controller), 4);
        config.token = token();
        let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
        let listed = || {
            let (_, workers) = get(&format!("{}/list_workers", controller.url())).unwrap();
            workers["countdown"]["workers"]["1"].clone()
        };
        wait_until("the heartbeat", Duration::from_secs(5), || {
            listed()["address"] == worker.url()
        });
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(listed()["status"], "COMA");
        let refused = ControllerClient::new(&controller.url())
            .start_sample("countdown", &TaskIndex::Int(0))
            .unwrap_err();
        assert_eq!(
            refused,
            agentry_serve::ClientError::Http {
                status: 400,
                message: "no workers available for task countdown".into()
            }
        );
    }
}
