//! Recorded trajectories and replay, on real tiny runs: every evaluation episode is written to
//! `episodes/*.jsonl`; a recorded episode replays identically (environment, re-scored
//! log-probabilities, greedy regeneration); a tampered record fails with the first difference;
//! bad input is an error, never a panic.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::{self, serial};
use agentry_runtime::replay::{Replay, ReplayError, replay};
use agentry_runtime::trajectory::Trajectory;

/// A tiny run: greedy evaluations after steps 1 (periodic, with a checkpoint of that step) and
/// 2 (final). The context is wide enough for a KG instruction and two turns.
const GREEDY: &str = r#"
experiment tiny_replay {
    seed = 11
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train { steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8, checkpoint_every = 1 }
    eval { every = 1, episodes = 3, decoding = greedy }
}
"#;

/// The same with sampled evaluations.
const SAMPLED: &str = r#"
experiment tiny_replay_sampled {
    seed = 12
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train { steps = 1, batch = 4, lr = 1e-3, max_new_tokens = 8, top_k = 20, temperature = 0.9 }
    eval { episodes = 3, decoding = sampled }
}
"#;

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("replay", name)
}

fn run(source: &str, name: &str) -> PathBuf {
    let _serial = serial();
    common::run_on_flex(&common::experiment(source), &scratch(name), None, None)
        .expect("the tiny run runs")
        .run_dir
}

fn greedy_run() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| run(GREEDY, "greedy"))
}

fn sampled_run() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| run(SAMPLED, "sampled"))
}

fn lines(file: &Path) -> Vec<Trajectory> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn replayed(file: &Path, line: usize) -> Replay {
    replay_alone(&format!("{}:{line}", file.display())).expect("the replay runs")
}

/// [`replay`] of `episode` under [`serial`]: a replay with weights builds its policy from burn's
/// global RNG (before loading the checkpoint into it), which a run may have just seeded.
fn replay_alone(episode: &str) -> Result<Replay, ReplayError> {
    let _serial = serial();
    replay(episode, None, None)
}

/// The first line of `file` with at least one turn (N from 1).
fn played_line(file: &Path) -> usize {
    lines(file)
        .iter()
        .position(|t| !t.turns.is_empty())
        .expect("an evaluation episode took a turn")
        + 1
}

/// Writes `trajectory` as the only line of `episodes/NAME.jsonl` of `run_dir`.
fn write_line(run_dir: &Path, name: &str, trajectory: &Trajectory) -> PathBuf {
    let file = run_dir.join("episodes").join(format!("{name}.jsonl"));
    std::fs::write(&file, serde_json::to_string(trajectory).unwrap() + "\n").unwrap();
    file
}

fn has(replay: &Replay, needle: &str) -> bool {
    replay.checks.iter().any(|c| c.contains(needle))
}

#[test]
fn every_evaluation_records_all_its_episodes() {
    let dir = greedy_run();
    let episodes = dir.join("episodes");
    for (file, version) in [("periodic-000001.jsonl", 1), ("final.jsonl", 2)] {
        let recorded = lines(&episodes.join(file));
        assert_eq!(recorded.len(), 3, "{file}: one line per evaluation episode");
        for (i, t) in recorded.iter().enumerate() {
            assert_eq!(t.task, "kg");
            assert_eq!(t.task_version, "kg-1");
            assert_eq!(t.index, i as u64);
            assert_eq!(t.max_turns, 2);
            assert_eq!(t.context, 256);
            assert!(t.decoding.greedy);
            assert_eq!(t.policy_versions, vec![version; t.turns.len()]);
            let total: f32 = t.turns.iter().map(|turn| turn.reward).sum();
            assert_eq!(total, t.reward);
            for turn in &t.turns {
                assert_eq!(turn.tokens.len(), turn.logprobs.len());
                assert!(!turn.observation.is_empty() || turn.status.is_terminal());
            }
        }
    }
}

#[test]
fn a_greedy_final_episode_replays_identically() {
    let file = greedy_run().join("episodes/final.jsonl");
    let line = played_line(&file);
    let replay = replayed(&file, line);
    assert!(replay.identical(), "{replay:#?}");
    assert_eq!(replay.verdict(), "verdict: identical");
    assert!(
        has(&replay, "every observation, reward and status identical"),
        "{replay:#?}"
    );
    assert!(has(&replay, "policy.mpk"), "{replay:#?}");
    assert!(has(&replay, "tokens identical"), "{replay:#?}");
    // The transcript is rendered as the samples file renders it.
    let samples = std::fs::read_to_string(greedy_run().join("samples-final.txt")).unwrap();
    assert!(
        samples.contains(&replay.transcript),
        "{}",
        replay.transcript
    );
    // Every episode of the evaluation replays, whatever its length.
    for n in 1..=3 {
        let replay = replayed(&file, n);
        assert!(replay.identical(), "line {n}: {replay:#?}");
    }
}

#[test]
fn a_periodic_episode_replays_with_the_checkpoint_of_its_step() {
    let file = greedy_run().join("episodes/periodic-000001.jsonl");
    let replay = replayed(&file, played_line(&file));
    assert!(replay.identical(), "{replay:#?}");
    assert!(has(&replay, "rl-000001.ckpt"), "{replay:#?}");
    assert!(has(&replay, "tokens identical"), "{replay:#?}");
}

#[test]
fn a_sampled_episode_passes_the_environment_and_the_rescoring() {
    let file = sampled_run().join("episodes/final-sampled.jsonl");
    let line = played_line(&file);
    assert!(!lines(&file)[line - 1].decoding.greedy);
    let replay = replayed(&file, line);
    assert!(replay.identical(), "{replay:#?}");
    assert!(has(&replay, "temperature 0.9"), "{replay:#?}");
    assert!(
        has(&replay, "not possible for a sampled episode"),
        "{replay:#?}"
    );
}

#[test]
fn without_the_weights_only_the_environment_is_checked() {
    let source = greedy_run();
    let dir = scratch("no-weights").join("run");
    std::fs::create_dir_all(dir.join("episodes")).unwrap();
    for name in ["experiment.json", "task_versions.json", "tokenizer.json"] {
        std::fs::copy(source.join(name), dir.join(name)).unwrap();
    }
    let file = dir.join("episodes/final.jsonl");
    std::fs::copy(source.join("episodes/final.jsonl"), &file).unwrap();
    let replay = replayed(&file, played_line(&file));
    assert!(replay.identical(), "{replay:#?}");
    assert!(
        has(&replay, "weights: none for policy version 2"),
        "{replay:#?}"
    );
}

#[test]
fn a_changed_observation_is_the_first_difference() {
    let dir = greedy_run();
    let file = dir.join("episodes/final.jsonl");
    let line = played_line(&file);
    let mut t = lines(&file).remove(line - 1);
    t.turns[0].observation.push_str(" (edited)");
    let replay = replayed(&write_line(dir, "tampered-observation", &t), 1);
    assert!(!replay.identical());
    let verdict = replay.verdict();
    assert!(
        verdict.starts_with("verdict: MISMATCH: turn 1: observation differs"),
        "{verdict}"
    );
    assert!(verdict.contains("(edited)"), "{verdict}");
}

#[test]
fn a_changed_token_or_log_prob_is_caught() {
    let dir = greedy_run();
    let file = dir.join("episodes/final.jsonl");
    let line = played_line(&file);
    let original = lines(&file).remove(line - 1);

    let mut t = original.clone();
    t.turns[0].tokens[0] = t.turns[0].tokens[0].wrapping_add(1) % 64 + 8;
    let replay = replayed(&write_line(dir, "tampered-token", &t), 1);
    let verdict = replay.verdict();
    assert!(
        verdict.contains("turn 1: the recorded reply text"),
        "{verdict}"
    );

    let mut t = original.clone();
    t.turns[0].tokens[0] = u32::MAX;
    let replay = replayed(&write_line(dir, "tampered-token-id", &t), 1);
    let verdict = replay.verdict();
    assert!(
        verdict.contains("turn 1: token id 4294967295 is not in the run's vocabulary"),
        "{verdict}"
    );

    let mut t = original;
    t.turns[0].logprobs[0] -= 0.5;
    let replay = replayed(&write_line(dir, "tampered-logprob", &t), 1);
    let verdict = replay.verdict();
    assert!(
        verdict.contains("turn 1: token 1") && verdict.contains("has recorded log-prob"),
        "{verdict}"
    );
}

#[test]
fn a_changed_task_version_is_refused() {
    let dir = greedy_run();
    let file = dir.join("episodes/final.jsonl");
    let mut t = lines(&file).remove(0);
    t.task_version = "kg-0".to_string();
    let file = write_line(dir, "other-version", &t);
    let error = replay_alone(&format!("{}:1", file.display())).unwrap_err();
    assert!(matches!(error, ReplayError::TaskChanged { .. }), "{error}");
    assert!(error.to_string().contains("`kg-0`"), "{error}");
}

#[test]
fn malformed_input_is_a_clear_error() {
    let dir = greedy_run();
    let file = dir.join("episodes/final.jsonl");
    let error = |name: String| replay_alone(&name).unwrap_err().to_string();

    let message = error(file.display().to_string());
    assert!(message.contains("names no line"), "{message}");
    let message = error(format!("{}:x", file.display()));
    assert!(
        message.contains("does not end in a line number"),
        "{message}"
    );
    let message = error(format!("{}:0", file.display()));
    assert!(message.contains("lines count from 1"), "{message}");
    let message = error(format!("{}:4", file.display()));
    assert!(
        message.contains("has 3 episodes (lines); there is no line 4"),
        "{message}"
    );
    let message = error(format!("{}:1", dir.join("episodes/nope.jsonl").display()));
    assert!(message.contains("cannot read"), "{message}");

    let mut t = lines(&file).remove(0);
    t.difficulty = 9;
    let odd = write_line(dir, "difficulty-9", &t);
    let message = error(format!("{}:1", odd.display()));
    assert!(message.contains("records difficulty 9"), "{message}");

    let bad = dir.join("episodes/bad.jsonl");
    std::fs::write(&bad, "{\"task\": \"kg\"\n").unwrap();
    let message = error(format!("{}:1", bad.display()));
    assert!(message.contains("is not a recorded episode"), "{message}");

    let outside = scratch("outside").join("final.jsonl");
    std::fs::copy(&file, &outside).unwrap();
    let message = error(format!("{}:1", outside.display()));
    assert!(
        message.contains("is not in the `episodes` folder"),
        "{message}"
    );

    let bare = scratch("bare").join("episodes");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(&file, bare.join("final.jsonl")).unwrap();
    let message = error(format!("{}:1", bare.join("final.jsonl").display()));
    assert!(
        message.contains("cannot replay from") && message.contains("experiment.json"),
        "{message}"
    );
}
