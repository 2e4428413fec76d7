//! Endpoint evaluations against scripted endpoints: replies that are no call get the parser's
//! error, an endpoint that fails ends its episodes with the reason (none is lost), a full
//! context ends an episode as a rollout's does, and the run directory holds what an
//! evaluation writes.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common;
use agentry_env::{Status, ToolCallFormat};
use agentry_runtime::endpoint::{
    ChatEndpoint, EndpointFailure, EndpointOptions, EndpointReply, EndpointRequest,
    evaluate_endpoint,
};
use agentry_runtime::serving::ChatMessage;
use agentry_runtime::train::RunOptions;

const TWO_TASKS: &str = r#"
experiment scripted_endpoint {
    seed = 3
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, context = 256 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    task os { env = os, max_turns = 3, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train { steps = 0, max_new_tokens = 16 }
    eval { episodes = 3, decoding = greedy }
}
"#;

/// What a scripted endpoint answers on turn `turn` (1 on the first).
type Script = fn(turn: usize) -> Result<EndpointReply, EndpointFailure>;

struct Scripted {
    script: Script,
    requests: AtomicUsize,
}

impl ChatEndpoint for Scripted {
    fn model(&self) -> String {
        "org/scripted".to_string()
    }

    fn describe(&self) -> String {
        "scripted".to_string()
    }

    fn reply(&self, request: &EndpointRequest<'_>) -> Result<EndpointReply, EndpointFailure> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        assert_eq!(request.temperature, 0.0, "greedy is temperature 0");
        assert_eq!(request.max_tokens, 16);
        assert!(!request.tools.is_empty(), "the task's tools are sent");
        assert!(matches!(request.messages[0], ChatMessage::User(_)));
        let turn = request
            .messages
            .iter()
            .filter(|m| matches!(m, ChatMessage::Assistant { .. }))
            .count()
            + 1;
        (self.script)(turn)
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::json!({"requests": self.requests.load(Ordering::Relaxed)})
    }
}

/// The episodes of the run directory's `episodes/final.jsonl`.
fn episodes(run_dir: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run_dir.join("episodes/final.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn evaluate(name: &str, script: Script) -> (std::path::PathBuf, usize) {
    let out = common::scratch_in("endpoint", name);
    let endpoint = Scripted {
        script,
        requests: AtomicUsize::new(0),
    };
    let options = RunOptions {
        out: out.clone(),
        quiet: true,
        ..RunOptions::default()
    };
    let settings = EndpointOptions {
        call_format: ToolCallFormat::Compact,
        concurrency: 3,
    };
    let summary = evaluate_endpoint(
        &common::experiment(TWO_TASKS),
        &options,
        &endpoint,
        &settings,
    )
    .expect("the evaluation runs");
    (summary.run_dir, endpoint.requests.load(Ordering::Relaxed))
}

fn text(content: &str) -> Result<EndpointReply, EndpointFailure> {
    Ok(EndpointReply {
        content: content.to_string(),
        ..EndpointReply::default()
    })
}

#[test]
fn replies_that_are_no_call_get_the_parsers_error() {
    let (run_dir, requests) = evaluate("no-call", |_| text("I would rather chat."));
    let all = episodes(&run_dir);
    assert_eq!(all.len(), 6, "three episodes of each task");
    assert_eq!(requests, 18, "three turns each");
    for e in &all {
        assert_eq!(e["status"], "task_limit_reached");
        for turn in e["turns"].as_array().unwrap() {
            assert_eq!(turn["reply"], "I would rather chat.");
            assert_eq!(turn["status"], "invalid_action");
            assert!(
                turn["observation"].as_str().unwrap().starts_with("Error:"),
                "{turn}"
            );
        }
    }
    let summary = common::json(&run_dir.join("summary.json"));
    assert_eq!(summary["after_rl"]["success"], 0.0);
    assert_eq!(summary["steps"], 0);
    assert!(run_dir.join("report.md").is_file());
    assert!(run_dir.join("samples-final.txt").is_file());
    let endpoint = common::json(&run_dir.join("endpoint.json"));
    assert_eq!(endpoint["requests"]["requests"], 18);
    assert_eq!(endpoint["call_format"], "compact");
    let evals = common::eval_lines(&run_dir);
    assert_eq!(evals.len(), 1);
    let config = common::json(&run_dir.join("config.json"));
    assert_eq!(config["config"], "endpoint.org-scripted");
    assert!(
        run_dir
            .parent()
            .unwrap()
            .ends_with("scripted_endpoint/endpoint.org-scripted")
    );
}

/// An endpoint that fails (after its client's retries) ends each episode at that turn with
/// `TaskError` and the reason as the observation: every episode is still recorded.
#[test]
fn a_failing_endpoint_ends_episodes_with_the_reason() {
    let (run_dir, _) = evaluate("failing", |turn| match turn {
        1 => text("count(variable=\"#0\")"),
        _ => Err(EndpointFailure::Failed("HTTP 503 four times".to_string())),
    });
    let all = episodes(&run_dir);
    assert_eq!(all.len(), 6);
    for e in &all {
        assert_eq!(e["status"], "task_error", "{e}");
        let turns = e["turns"].as_array().unwrap();
        let last = turns.last().unwrap();
        assert_eq!(last["reply"], "");
        assert_eq!(
            last["observation"],
            "Error: the endpoint failed: HTTP 503 four times"
        );
        assert_eq!(turns.len(), 2, "{e}");
    }
    let summary = common::json(&run_dir.join("summary.json"));
    assert_eq!(summary["after_rl"]["tasks"]["kg"]["episodes"], 3);
}

/// A conversation the model's context cannot hold ends the episode as a rollout ends one
/// with no room for a reply.
#[test]
fn a_full_context_ends_the_episode() {
    let (run_dir, _) = evaluate("full", |turn| match turn {
        1 => text("count(variable=\"#0\")"),
        _ => Err(EndpointFailure::ContextFull),
    });
    for e in episodes(&run_dir) {
        assert_eq!(e["status"], "task_limit_reached", "{e}");
        assert_eq!(e["turns"].as_array().unwrap().len(), 1);
    }
    // Statuses as the environment crate spells them.
    assert_eq!(
        serde_json::to_value(Status::TaskLimitReached).unwrap(),
        "task_limit_reached"
    );
}
