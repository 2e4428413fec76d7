//! Protocol conformance of the worker API (§3 of the AgentRL protocol notes): every endpoint,
//! its status codes and bodies, against a recording stand-in for the controller.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::routing;
use common::*;
use serde_json::{Value, json};

type Log = Arc<Mutex<Vec<(String, Option<String>, Option<String>, Value)>>>;

/// A stand-in controller that records every call: (path, session_id header, Authorization
/// header, body).
struct Recorder {
    url: String,
    log: Log,
    _runtime: tokio::runtime::Runtime,
}

fn recorder() -> Recorder {
    async fn record(
        State(log): State<Log>,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> axum::Json<Value> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        log.lock().unwrap().push((
            uri.path().to_string(),
            header("session_id"),
            header("authorization"),
            body,
        ));
        axum::Json(Value::Null)
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let log = Log::default();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/api/receive_heartbeat", routing::post(record))
        .route("/api/cancel_notice", routing::post(record))
        .with_state(log.clone());
    runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
    Recorder {
        url,
        log,
        _runtime: runtime,
    }
}

fn recorded(log: &Log, path: &str) -> Vec<(Option<String>, Value)> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _, _)| p == path)
        .map(|(_, s, _, b)| (s.clone(), b.clone()))
        .collect()
}

/// The `Authorization` header of every recorded call to `path`.
fn authorizations(log: &Log, path: &str) -> Vec<Option<String>> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _, _)| p == path)
        .map(|(_, _, a, _)| a.clone())
        .collect()
}

#[test]
fn worker_speaks_the_protocol() {
    let recorder = recorder();
    let mut config = worker_config("countdown", None, 2);
    config.controller = Some(recorder.url.clone());
    config.instances = 5;
    let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
    let api = worker.url();
    let url = |endpoint: &str| format!("{api}/{endpoint}");

    // Heartbeat: exactly four keys, the advertised address, the indices.
    wait_until("a heartbeat", Duration::from_secs(5), || {
        !recorded(&recorder.log, "/api/receive_heartbeat").is_empty()
    });
    let (_, heartbeat) = recorded(&recorder.log, "/api/receive_heartbeat").remove(0);
    let mut keys: Vec<&String> = heartbeat.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["address", "concurrency", "indices", "name"]);
    assert_eq!(
        heartbeat,
        json!({"name": "countdown", "address": api, "concurrency": 2, "indices": [0, 1, 2, 3, 4]})
    );

    assert_eq!(
        get(&url("get_indices")).unwrap(),
        (200, json!([0, 1, 2, 3, 4]))
    );
    assert_eq!(
        get(&url("worker_status")).unwrap(),
        (200, json!({"concurrency": 2, "current": 0}))
    );

    // start_sample: header, EnvOut with the singular `metric`.
    let a = post(
        &url("start_sample"),
        None,
        json!({"index": 2, "session_id": 7}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.session, Some(7));
    assert_eq!(a.body["status"], "running");
    assert_eq!(a.body["finish"], false);
    assert_eq!(a.body["reward"], json!(0.0));
    assert_eq!(a.body["metric"], json!({}));
    assert_eq!(
        a.body["messages"],
        json!([{"role": "user", "content": "Call tick() 3 times."}])
    );
    assert_eq!(a.body["tools"][0]["function"]["name"], "tick");

    let a = post(
        &url("start_sample"),
        None,
        json!({"index": 0, "session_id": 7}),
    );
    assert_eq!(
        (a.status, a.body),
        (400, json!({"detail": "Session ID already exists"}))
    );
    let a = post(
        &url("start_sample"),
        None,
        json!({"index": 9, "session_id": 5}),
    );
    assert_eq!(a.status, 400);
    let a = post(
        &url("start_sample"),
        None,
        json!({"index": "0", "session_id": 5}),
    );
    assert_eq!(a.status, 400, "a string index is another index");
    let a = post(&url("start_sample"), None, json!({"index": 0}));
    assert_eq!(a.status, 422);
    let a = post(
        &url("start_sample"),
        None,
        json!({"index": 0, "session_id": 8}),
    );
    assert_eq!(a.status, 200);
    let a = post(
        &url("start_sample"),
        None,
        json!({"index": 1, "session_id": 9}),
    );
    assert_eq!(
        (a.status, a.body),
        (
            406,
            json!({"detail": "Sample concurrency limit reached: 2"})
        )
    );
    assert_eq!(
        get(&url("get_sessions")).unwrap(),
        (200, json!({"7": 2, "8": 0}))
    );
    assert_eq!(get(&url("worker_status")).unwrap().1["current"], 2);

    // interact: errors.
    let tick = call_message("call_1", "tick", json!({}));
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 99, "messages": [tick]}),
    );
    assert_eq!(
        (a.status, a.body),
        (400, json!({"detail": "No such session"}))
    );
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": []}),
    );
    assert_eq!(a.status, 500);
    assert!(
        a.body.is_string(),
        "plain text, as the Python worker: {}",
        a.body
    );
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(a.status, 500);
    let a = post(&url("interact"), None, json!({"session_id": 7}));
    assert_eq!(a.status, 422);
    let a = post_raw(&url("interact"), None, "{not json");
    assert_eq!(a.status, 422);
    // The session survived all of that.
    assert_eq!(get(&url("get_sessions")).unwrap().1["7"], 2);

    // A bad call is an observation for the agent, with its tool_call_id; a second call in the
    // same turn is answered, not executed.
    let bad = call_message("call_x", "jump", json!({}));
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [bad]}),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["session_id"], 7);
    let out = &a.body["env_out"];
    assert_eq!(out["status"], "running");
    assert_eq!(out["messages"][0]["role"], "tool");
    assert_eq!(out["messages"][0]["tool_call_id"], "call_x");
    assert!(
        out["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("no tool `jump`")
    );
    let two = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "tick", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "tick", "arguments": "{}"}}
    ]});
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [two]}),
    );
    let messages = &a.body["env_out"]["messages"];
    assert_eq!(
        messages[0],
        json!({"role": "tool", "content": "2 to go", "tool_call_id": "a"})
    );
    assert_eq!(messages[1]["tool_call_id"], "b");
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("not executed")
    );

    // Play to the end: the final step carries the reward and `metric.success`.
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [tick.clone()]}),
    );
    assert_eq!(a.body["env_out"]["status"], "running");
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [tick.clone()]}),
    );
    let out = &a.body["env_out"];
    assert_eq!(out["status"], "completed");
    assert_eq!(out["finish"], true);
    assert_eq!(out["reward"], json!(1.0));
    assert_eq!(out["metric"]["success"], true);
    assert_eq!(out["metric"]["turns"], 4);
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 7, "messages": [tick.clone()]}),
    );
    assert_eq!(
        (a.status, a.body),
        (400, json!({"detail": "No such session"}))
    );
    assert_eq!(get(&url("worker_status")).unwrap().1["current"], 1);

    // cancel, cancel_with_notice, cancel_all.
    let a = post(&url("cancel"), None, json!({"session_id": 8}));
    assert_eq!((a.status, a.body), (200, json!({"session_id": 8})));
    let a = post(&url("cancel"), None, json!({"session_id": 8}));
    assert_eq!(
        (a.status, a.body),
        (400, json!({"detail": "No such session"}))
    );
    assert_eq!(
        post(
            &url("start_sample"),
            None,
            json!({"index": 0, "session_id": 10})
        )
        .status,
        200
    );
    let a = post(&url("cancel_with_notice"), None, json!({"session_id": 10}));
    assert_eq!((a.status, a.body), (200, json!({"session_id": 10})));
    wait_until("a cancel notice", Duration::from_secs(5), || {
        !recorded(&recorder.log, "/api/cancel_notice").is_empty()
    });
    let notices = recorded(&recorder.log, "/api/cancel_notice");
    assert_eq!(
        notices,
        vec![(Some("10".to_string()), json!({"session_id": 10}))]
    );
    let a = post(&url("cancel_with_notice"), None, json!({"session_id": 10}));
    assert_eq!(a.status, 400);

    for id in [11, 12] {
        assert_eq!(
            post(
                &url("start_sample"),
                None,
                json!({"index": 1, "session_id": id})
            )
            .status,
            200
        );
    }
    let a = post_raw(&url("cancel_all"), None, "");
    assert_eq!((a.status, a.body), (200, Value::Null));
    assert_eq!(get(&url("get_sessions")).unwrap(), (200, json!({})));
    assert_eq!(get(&url("worker_status")).unwrap().1["current"], 0);
}

#[test]
fn a_panicking_environment_ends_only_its_session() {
    let worker =
        agentry_serve::worker::serve(countdown(), worker_config("countdown", None, 4)).unwrap();
    let url = |endpoint: &str| format!("{}/{endpoint}", worker.url());
    for id in [1, 2] {
        assert_eq!(
            post(
                &url("start_sample"),
                None,
                json!({"index": 0, "session_id": id})
            )
            .status,
            200
        );
    }
    let boom = call_message("c", "boom", json!({}));
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 1, "messages": [boom]}),
    );
    assert_eq!(a.status, 200);
    assert_eq!(a.body["env_out"]["status"], "task error");
    assert_eq!(a.body["env_out"]["finish"], true);
    assert_eq!(a.body["env_out"]["metric"]["success"], false);
    let tick = call_message("c", "tick", json!({}));
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 2, "messages": [tick]}),
    );
    assert_eq!(a.body["env_out"]["status"], "completed");
}

#[test]
fn the_turn_limit_ends_an_episode() {
    let mut config = worker_config("countdown", None, 1);
    config.max_turns = 2;
    let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
    let url = |endpoint: &str| format!("{}/{endpoint}", worker.url());
    assert_eq!(
        post(
            &url("start_sample"),
            None,
            json!({"index": 2, "session_id": 1})
        )
        .status,
        200
    );
    let text = json!({"role": "assistant", "content": "tick()"});
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 1, "messages": [text]}),
    );
    // A call written as text is parsed, and answered by a user message (no call id).
    assert_eq!(
        a.body["env_out"]["messages"],
        json!([{"role": "user", "content": "2 to go"}])
    );
    let junk = json!({"role": "assistant", "content": "(((("});
    let a = post(
        &url("interact"),
        None,
        json!({"session_id": 1, "messages": [junk]}),
    );
    let out = &a.body["env_out"];
    assert_eq!(out["status"], "task limit reached");
    assert_eq!(out["finish"], true);
    assert_eq!(out["metric"]["success"], false);
    assert_eq!(get(&url("worker_status")).unwrap().1["current"], 0);
}

#[test]
fn a_busy_session_refuses_a_second_interact() {
    let worker =
        agentry_serve::worker::serve(countdown(), worker_config("countdown", None, 1)).unwrap();
    let url = format!("{}/interact", worker.url());
    assert_eq!(
        post(
            &format!("{}/start_sample", worker.url()),
            None,
            json!({"index": 0, "session_id": 1})
        )
        .status,
        200
    );
    let slow = call_message("c", "wait", json!({"ms": 600}));
    let first = {
        let url = url.clone();
        std::thread::spawn(move || post(&url, None, json!({"session_id": 1, "messages": [slow]})))
    };
    std::thread::sleep(Duration::from_millis(150));
    let tick = call_message("c", "tick", json!({}));
    let a = post(&url, None, json!({"session_id": 1, "messages": [tick]}));
    assert_eq!(
        (a.status, a.body),
        (
            400,
            json!({"detail": "Task Executing, please do not send new request."})
        )
    );
    assert_eq!(
        first.join().unwrap().body["env_out"]["messages"][0]["content"],
        "waited"
    );
}

/// A worker with a token: without it (or with a wrong one) every call is a 401 in FastAPI's
/// shape and changes nothing; it sends the token with its heartbeats and cancel notices.
#[test]
fn a_worker_with_a_token_refuses_calls_without_it() {
    const TOKEN: &str = "w0rker-token";
    let recorder = recorder();
    let mut config = worker_config("countdown", None, 2);
    config.controller = Some(recorder.url.clone());
    config.instances = 5;
    config.token = Some(agentry_serve::Token::new(TOKEN).unwrap());
    let worker = agentry_serve::worker::serve(countdown(), config).unwrap();
    let api = worker.url();
    let url = |endpoint: &str| format!("{api}/{endpoint}");
    let with = Some(TOKEN);

    wait_until("a heartbeat", Duration::from_secs(5), || {
        !recorded(&recorder.log, "/api/receive_heartbeat").is_empty()
    });
    assert_eq!(
        authorizations(&recorder.log, "/api/receive_heartbeat")[0].as_deref(),
        Some("Bearer w0rker-token")
    );

    let started = call(
        "POST",
        &url("start_sample"),
        with,
        None,
        Some(json!({"index": 2, "session_id": 7})),
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let status = || call("GET", &url("worker_status"), with, None, None).body;
    assert_eq!(status(), json!({"concurrency": 2, "current": 1}));

    for bad in [
        None,
        Some("wrong"),
        Some("w0rker-tokem"),
        Some("w0rker-token-"),
    ] {
        let refused = |answer: Answer| {
            assert_eq!(answer.status, 401, "{}", answer.body);
            assert_eq!(answer.authenticate.as_deref(), Some("Bearer"));
            let body = answer.body.as_object().unwrap().clone();
            assert_eq!(body.keys().collect::<Vec<_>>(), ["detail"], "{body:?}");
        };
        for endpoint in ["get_sessions", "get_indices", "worker_status"] {
            refused(call("GET", &url(endpoint), bad, None, None));
        }
        let start = json!({"index": 0, "session_id": 8});
        refused(call("POST", &url("start_sample"), bad, None, Some(start)));
        let tick = json!({"session_id": 7, "messages": [call_message("c", "tick", json!({}))]});
        refused(call("POST", &url("interact"), bad, None, Some(tick)));
        for endpoint in ["cancel", "cancel_with_notice"] {
            let body = json!({"session_id": 7});
            refused(call("POST", &url(endpoint), bad, None, Some(body)));
        }
        for endpoint in ["cancel_all", "cancel_all_with_notice"] {
            refused(call("POST", &url(endpoint), bad, None, None));
        }
    }
    // Nothing changed: session 7 alone, not stepped (instance 2 needs three ticks).
    assert_eq!(status(), json!({"concurrency": 2, "current": 1}));
    assert_eq!(
        call("GET", &url("get_sessions"), with, None, None).body,
        json!({"7": 2})
    );
    let tick = json!({"session_id": 7, "messages": [call_message("c", "tick", json!({}))]});
    let stepped = call("POST", &url("interact"), with, None, Some(tick));
    assert_eq!(stepped.body["env_out"]["messages"][0]["content"], "2 to go");

    // With the token, a cancel with notice works, and the notice carries the token.
    let cancelled = call(
        "POST",
        &url("cancel_with_notice"),
        with,
        None,
        Some(json!({"session_id": 7})),
    );
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    wait_until("the cancel notice", Duration::from_secs(5), || {
        !recorded(&recorder.log, "/api/cancel_notice").is_empty()
    });
    assert_eq!(
        authorizations(&recorder.log, "/api/cancel_notice"),
        [Some("Bearer w0rker-token".to_string())]
    );
    assert_eq!(status(), json!({"concurrency": 2, "current": 0}));
}
