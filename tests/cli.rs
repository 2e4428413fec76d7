//! The `agentry` command line: check, expand, run and report, on real files.

use std::process::Command;

/// Scratch directories and the readers of run directories (metrics, JSON files, listings),
/// shared with the runtime's tests.
#[path = "../runtime/tests/it/common.rs"]
mod common;

fn agentry(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the agentry binary runs")
}

/// The standard output of a command that must have succeeded; if it failed, the test fails
/// showing both its outputs.
fn assert_success(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn check_accepts_every_recipe() {
    let out = agentry(&["check", "experiments/quickstart.arl"]);
    assert_success(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "experiments/quickstart.arl: ok\n"
    );
}

#[test]
fn check_reports_every_error_with_its_location_and_exits_1() {
    let out = agentry(&["check", "tests/ui/many_errors.arl"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "--> tests/ui/many_errors.arl:5:21",
        "unknown environment `webshp`",
        "--> tests/ui/many_errors.arl:6:22",
        "did you mean `group_size`?",
        "--> tests/ui/many_errors.arl:7:33",
        "`batch` must be at least 1",
    ] {
        assert!(
            stderr.contains(expected),
            "missing `{expected}` in:\n{stderr}"
        );
    }
    assert!(stderr.contains('^'), "no caret in:\n{stderr}");
}

#[test]
fn check_of_several_files_reports_each_and_fails_if_any_fails() {
    let out = agentry(&[
        "check",
        "experiments/quickstart.arl",
        "tests/ui/unknown_key.arl",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("quickstart.arl: ok"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tests/ui/unknown_key.arl:6:22"));
}

#[test]
fn check_of_a_missing_file_is_an_error_not_a_panic() {
    let out = agentry(&["check", "experiments/nope.arl"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read `experiments/nope.arl`"));
}

#[test]
fn expand_prints_the_generated_experiment_type() {
    let out = agentry(&["expand", "experiments/quickstart.arl"]);
    let code = assert_success(&out);
    assert!(
        code.contains("impl ::agentry::Experiment for Quickstart"),
        "{code}"
    );
    syn::parse_file(&code).expect("expand prints valid Rust");
}

#[test]
fn run_refuses_files_that_name_rust_types() {
    let out = agentry(&["run", "tests/ui/missing_user_type.arl", "--quiet"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("task `maze`"), "{stderr}");
    assert!(stderr.contains("agentry::experiment!"), "{stderr}");
}

#[test]
fn run_resume_without_a_checkpoint_is_an_error_before_any_work() {
    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-run");
    let out = agentry(&[
        "run",
        "experiments/quickstart.arl",
        "--quiet",
        "--resume",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no checkpoint to resume from"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
}

/// `--warmup-from` with nothing to take from is an error before any work, for every file given;
/// with `--resume` it is a usage error.
#[test]
fn run_warmup_from_without_a_warmup_to_take_is_an_error_before_any_work() {
    let root = common::scratch_in("cli", "cli-warmup-from");
    let out_dir = root.join("runs");
    let [empty, out_arg] = [&root, &out_dir].map(|p| p.to_str().unwrap());
    let out = agentry(&[
        "run",
        "experiments/quickstart.arl",
        "experiments/quickstart.arl",
        "--quiet",
        "--out",
        out_arg,
        "--warmup-from",
        empty,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("holds `checkpoints/rl-000000.ckpt`")
            && stderr.contains("train.checkpoint_every"),
        "{stderr}"
    );
    assert!(!out_dir.exists(), "nothing ran");

    let out = agentry(&[
        "run",
        "experiments/quickstart.arl",
        "--warmup-from",
        empty,
        "--resume",
        empty,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--warmup-from") && stderr.contains("--resume"),
        "{stderr}"
    );
}

/// `--steps` goes through the checker: below a curriculum stage's `until` it is an error naming
/// the rule, with a hint, before any work (no run directory).
#[test]
fn run_rejects_steps_that_break_a_rule_before_any_work() {
    let root = common::scratch_in("cli", "cli-steps");
    let file = root.join("staged.arl");
    std::fs::write(
        &file,
        r#"
experiment cli_steps {
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    curriculum { stage short { until = 5, max_turns = 1 }, stage rest {} }
    algorithm grpo { group_size = 2 }
    train { steps = 10, batch = 4, max_new_tokens = 8 }
}
"#,
    )
    .unwrap();
    let out = root.join("runs");
    let run = |steps: &str| {
        agentry(&[
            "run",
            file.to_str().unwrap(),
            "--quiet",
            "--out",
            out.to_str().unwrap(),
            "--steps",
            steps,
        ])
    };
    let rejected = run("3");
    assert_eq!(rejected.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&rejected.stderr);
    let message = "stage `short` ends at step 5, after training ends (`steps = 3`); \
                   pass `--steps 5` or more";
    assert!(stderr.contains(message), "{stderr}");
    assert!(stderr.contains("staged.arl"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!out.exists(), "a rejected override started a run");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when the test ends, however it ends.
struct Killed(std::process::Child);

/// How a child process ended, and its standard error.
struct Ended {
    status: std::process::ExitStatus,
    stderr: String,
}

impl Killed {
    /// Waits (at most two minutes) for the process to end by itself.
    fn wait(mut self) -> Ended {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while self.0.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the process did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = self.0.stderr.take() {
            std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
        }
        Ended {
            status: self.0.wait().unwrap(),
            stderr,
        }
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn worker_refuses_an_unknown_task_naming_the_known_ones() {
    let out = agentry(&["worker", "--task", "chess"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid value 'chess'"), "{stderr}");
    assert!(stderr.contains("alfworld, db, kg, os, webshop"), "{stderr}");
}

#[test]
fn controller_on_a_port_in_use_is_an_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = agentry(&["controller", "--host", "127.0.0.1", "--port", &port]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("error: cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
}

#[test]
fn controller_and_worker_commands_serve_a_task() {
    let (cport, wport) = (free_port(), free_port());
    let api = format!("http://127.0.0.1:{cport}/api");
    let spawn = |args: &[&str]| {
        Killed(
            Command::new(env!("CARGO_BIN_EXE_agentry"))
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let _controller = spawn(&[
        "controller",
        "--host",
        "127.0.0.1",
        "--port",
        &cport.to_string(),
    ]);
    let _worker = spawn(&[
        "worker",
        "--task",
        "kg",
        "--controller",
        &api,
        "--host",
        "127.0.0.1",
        "--port",
        &wport.to_string(),
        "--instances",
        "5",
        "--concurrency",
        "2",
    ]);
    let client = agentry::serve::ControllerClient::new(&api);
    let started = first_session(&client);
    assert_eq!(started.messages[0]["role"], "user");
    assert_eq!(client.get_indices("kg").unwrap().len(), 5);
    client.cancel(started.session_id).unwrap();
}

/// The first session of task `kg` (instance 4) the controller behind `client` starts, polling
/// for up to 20 s: a worker heartbeats at once, and again every 8 s if the controller was not
/// up yet.
fn first_session(client: &agentry::serve::ControllerClient) -> agentry::serve::client::Started {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match client.start_sample("kg", &agentry::serve::protocol::TaskIndex::Int(4)) {
            Ok(started) => return started,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no session: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// `agentry ARGS` with the environment variables `vars` set, and `AGENTRY_TOKEN` removed
/// unless `vars` sets it.
fn agentry_with(args: &[&str], vars: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTRY_TOKEN")
        .envs(vars.iter().copied());
    command
}

#[test]
fn help_says_where_they_listen_and_never_shows_the_token() {
    for command in ["controller", "worker"] {
        let out = agentry_with(&[command, "--help"], &[("AGENTRY_TOKEN", "hunter2-secret")])
            .output()
            .unwrap();
        let help = assert_success(&out);
        for expected in [
            "[default: 127.0.0.1]",
            "--host 0.0.0.0",
            "--token <TOKEN>",
            "[env: AGENTRY_TOKEN]",
            "`ps`",
        ] {
            assert!(
                help.contains(expected),
                "{command}: no {expected:?} in\n{help}"
            );
        }
        assert!(!help.contains("hunter2"), "{help}");
    }
}

#[test]
fn a_bad_token_is_an_error_that_does_not_repeat_it() {
    for command in [
        &["controller", "--port", "0"][..],
        &["worker", "--task", "kg", "--port", "0"],
    ] {
        let mut args = command.to_vec();
        args.extend(["--token", "two words"]);
        let out = agentry_with(&args, &[]).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("error: --token / AGENTRY_TOKEN: the token must be"),
            "{stderr}"
        );
        assert!(!stderr.contains("two words"), "{stderr}");
        let out = agentry_with(command, &[("AGENTRY_TOKEN", "")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("the token is empty"), "{stderr}");
    }
}

#[test]
fn controller_and_worker_share_a_token_from_the_environment() {
    const TOKEN: &str = "cli-s3cret";
    let (cport, wport) = (free_port(), free_port());
    let api = format!("http://127.0.0.1:{cport}/api");
    let spawn = |args: &[&str]| {
        Killed(
            agentry_with(args, &[("AGENTRY_TOKEN", TOKEN)])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    // Default --host: loopback, which this test reaches.
    let _controller = spawn(&["controller", "--port", &cport.to_string()]);
    let _worker = spawn(&[
        "worker",
        "--task",
        "kg",
        "--controller",
        &api,
        "--port",
        &wport.to_string(),
        "--instances",
        "5",
    ]);
    let token = agentry::serve::Token::new(TOKEN).unwrap();
    let client = agentry::serve::ControllerClient::new(&api).with_token(Some(token));
    // The worker's heartbeat and the controller's sync both carry the token, or no session
    // could start.
    let started = first_session(&client);
    assert_eq!(started.messages[0]["role"], "user");
    let without = agentry::serve::ControllerClient::new(&api);
    match without.cancel(started.session_id) {
        Err(agentry::serve::ClientError::Http { status: 401, .. }) => {}
        other => panic!("{other:?}"),
    }
    client.cancel(started.session_id).unwrap();
}

#[test]
fn a_remote_task_reaches_a_controller_with_the_token_in_the_environment() {
    let mut config = agentry::serve::ControllerConfig::new("127.0.0.1:0".parse().unwrap());
    config.token = Some(agentry::serve::Token::new("run-s3cret").unwrap());
    let controller = agentry::serve::controller::serve(config).unwrap();
    let root = common::scratch_in("cli", "cli-remote-token");
    let file = root.join("remote.arl");
    std::fs::write(
        &file,
        format!(
            r#"
experiment cli_remote {{
    seed = 1
    device = flex
    model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 }} }}
    task kg {{ remote = "{}", name = "kg" }}
    algorithm grpo {{ group_size = 2 }}
    train {{ steps = 1, batch = 4, max_new_tokens = 8 }}
}}
"#,
            controller.url()
        ),
    )
    .unwrap();
    let out = root.join("runs");
    let args = [
        "run",
        file.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ];
    let run = |vars: &[(&str, &str)]| {
        let out = agentry_with(&args, vars).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = run(&[]);
    assert!(
        stderr.contains("the controller answered 401: missing bearer token"),
        "{stderr}"
    );
    let stderr = run(&[("AGENTRY_TOKEN", "not-it")]);
    assert!(
        stderr.contains("the controller answered 401: wrong bearer token"),
        "{stderr}"
    );
    // With the token the controller answers the question itself: it serves no task `kg`.
    let stderr = run(&[("AGENTRY_TOKEN", "run-s3cret")]);
    assert!(
        stderr.contains("the controller answered 400: task kg does not exist"),
        "{stderr}"
    );
}

/// A tiny run through `agentry run`, then `agentry replay` of its final evaluation's episodes:
/// identical ones exit 0, a tampered one exits 1 with the first difference, a bad name is an
/// error (exit 1, no panic).
#[test]
fn replay_checks_a_recorded_episode_and_exits_1_on_a_difference() {
    let root = common::scratch_in("cli", "cli-replay");
    let file = root.join("tiny.arl");
    std::fs::write(
        &file,
        r#"
experiment cli_replay {
    seed = 3
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train { steps = 1, batch = 4, max_new_tokens = 8 }
    eval { episodes = 2 }
}
"#,
    )
    .unwrap();
    let out = root.join("runs");
    let run = agentry(&[
        "run",
        file.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_success(&run);
    let run_dir = common::run_dir_of(&out, "cli_replay");
    let episodes = run_dir.join("episodes/final.jsonl");
    let name = format!("{}:1", episodes.display());

    let replay = agentry(&["replay", &name]);
    let stdout = assert_success(&replay);
    assert!(stdout.contains("== kg instance 0 difficulty 1"), "{stdout}");
    assert!(stdout.ends_with("verdict: identical\n"), "{stdout}");

    // The same line with its first observation edited.
    let text = std::fs::read_to_string(&episodes).unwrap();
    let mut line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    if let Some(turn) = line["turns"].get_mut(0) {
        turn["observation"] = serde_json::Value::from("not what the environment said");
        let tampered = run_dir.join("episodes/tampered.jsonl");
        std::fs::write(&tampered, format!("{line}\n")).unwrap();
        let replay = agentry(&["replay", &format!("{}:1", tampered.display())]);
        assert_eq!(replay.status.code(), Some(1));
        let stdout = String::from_utf8_lossy(&replay.stdout);
        assert!(
            stdout.contains("verdict: MISMATCH: turn 1: observation differs"),
            "{stdout}"
        );
    }

    let missing = agentry(&["replay", &format!("{}:9", episodes.display())]);
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("there is no line 9"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
#[test]
fn report_of_a_directory_that_is_not_a_run_is_an_error() {
    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-run-dir");
    let out = agentry(&["report", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a run directory: it has no `metrics.jsonl`"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A run directory written by hand, as an older or a cross-policy run leaves it: an evaluation
/// line without `decoding` (read as greedy), RL lines with a staleness histogram and alerts, no
/// `summary.json` (the run has not finished).
#[test]
fn report_regenerates_the_report_of_a_run_directory() {
    let dir = common::scratch_in("cli", "report-by-hand");
    std::fs::write(
        dir.join("experiment.json"),
        r#"{"name":"by_hand","seed":3,"device":"flex","algorithm":{"kind":"grpo"},
            "train":{"steps":10},"eval":{"split":"test","episodes":4}}"#,
    )
    .unwrap();
    let kg = |success: f64| {
        format!(
            r#"{{"kg":{{"episodes":4,"success":{success},"success_ci":[0.1,0.9],"mean_return":{success},"mean_turns":2.5}}}}"#
        )
    };
    let mut lines = Vec::new();
    for step in 1..=3u64 {
        let alerts = if step >= 2 {
            r#","alerts":["grad_spike"]"#
        } else {
            ""
        };
        lines.push(format!(
            r#"{{"phase":"rl","step":{step},"stage":"all","tasks":{},"success":0.5,"mean_return":0.5,"entropy":1.5,"kl":0.01,"loss":0.1,"grad_norm":2.0,"staleness":{{"0":6,"1":2}}{alerts}}}"#,
            kg(0.25 * step as f64)
        ));
    }
    lines.push(format!(
        r#"{{"phase":"eval","step":3,"label":"periodic","tasks":{},"success":0.5,"success_ci":[0.2,0.8]}}"#,
        kg(0.5)
    ));
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(dir.join("samples-periodic.txt"), "== kg instance 0\n").unwrap();

    let out = agentry(&["report", dir.to_str().unwrap()]);
    assert!(assert_success(&out).contains("report.md"));
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for needle in [
        "# Run report: `by_hand`",
        "| device | flex (requested; the run has not finished) |",
        "| RL steps | 3 of 10 |",
        "## Latest evaluation (step 3, periodic): the run has not finished",
        "| kg | greedy | 0.500 | [0.100, 0.900] | 0.500 | 2.50 |",
        "| mean versions behind | 0.25 |",
        "| grad_spike | 2 | 2 | 3 |",
        "(plots/staleness.png)",
        "[samples-periodic.txt](samples-periodic.txt)",
    ] {
        assert!(
            report.contains(needle),
            "report.md lacks {needle:?}:\n{report}"
        );
    }
    for plot in [
        "train_success",
        "return",
        "entropy",
        "kl",
        "staleness",
        "eval_success_greedy",
    ] {
        let png = std::fs::read(dir.join("plots").join(format!("{plot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{plot}.png");
        let svg = std::fs::read_to_string(dir.join("plots").join(format!("{plot}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{plot}.svg");
    }
    assert!(!dir.join("plots/eval_success_sampled.png").exists());
}

/// A tiny experiment with a sweep: 2 seeds × (base + 1 ablation).
const SWEEP: &str = r#"experiment tiny_sweep {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train {
        steps = 1, batch = 2, lr = 1e-3, max_new_tokens = 8
        warmup = sft { steps = 2, demonstrations = 4, batch = 2 }
    }
    eval { episodes = 3 }
    sweep { seeds = [1, 2], ablate algorithm.entropy = 0.01 }
}
"#;

/// The run directories under `dir` (those holding `metrics.jsonl`), sorted.
fn run_dirs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.join("metrics.jsonl").is_file() {
            found.push(path);
        } else if path.is_dir() {
            found.extend(run_dirs(&path));
        }
    }
    found.sort();
    found
}

/// The `(overall success, success per task)` of the last `label` evaluation of a run.
fn evaluation(run: &std::path::Path, label: &str) -> (f64, f64) {
    let line = common::metrics(run)
        .into_iter()
        .rfind(|v| v["phase"] == "eval" && v["label"] == label)
        .unwrap();
    (
        line["success"].as_f64().unwrap(),
        line["tasks"]["kg"]["success"].as_f64().unwrap(),
    )
}

/// `mean [lo, hi]` of two seeds' rates as the table prints it (t(1) = 12.706204736).
fn two_seed_cell(a: f64, b: f64) -> String {
    let mean = (a + b) / 2.0;
    let sd = ((a - mean).powi(2) + (b - mean).powi(2)).sqrt();
    let half = 12.706_204_736 * sd / 2f64.sqrt();
    format!(
        "{mean:.3} [{:.3}, {:.3}]",
        (mean - half).max(0.0),
        (mean + half).min(1.0)
    )
}

#[test]
fn run_expands_a_sweep_and_compare_tabulates_it() {
    let root = common::scratch_in("cli", "cli-sweep");
    let file = root.join("tiny_sweep.arl");
    std::fs::write(&file, SWEEP).unwrap();
    let out_dir = root.join("runs");
    let (file, out_arg) = (file.to_str().unwrap(), out_dir.to_str().unwrap());

    // Part of the sweep: an unknown configuration is refused before any work.
    let out = agentry(&[
        "run",
        file,
        "--quiet",
        "--out",
        out_arg,
        "--config",
        "ablate.x=1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "`tiny_sweep` has no configuration `ablate.x=1`; it has base, ablate.algorithm.entropy=0.01"
        ),
        "{stderr}"
    );

    let out = agentry(&["run", file, "--quiet", "--out", out_arg]);
    let stdout = assert_success(&out);
    assert!(!stdout.contains("not expanded"), "{stdout}");
    assert!(
        stdout.contains("run 4/4: configuration `ablate.algorithm.entropy=0.01`, seed 2"),
        "{stdout}"
    );
    let runs = run_dirs(&out_dir.join("tiny_sweep"));
    assert_eq!(runs.len(), 4, "{runs:?}");
    let ablation_dir = out_dir
        .join("tiny_sweep")
        .join("ablate.algorithm.entropy=0.01");
    let (ablated, base): (Vec<_>, Vec<_>) = runs.iter().partition(|r| r.starts_with(&ablation_dir));
    assert_eq!((ablated.len(), base.len()), (2, 2));
    for (i, run) in base.iter().chain(&ablated).enumerate() {
        let config = common::json(&run.join("config.json"));
        let label = if i < 2 {
            "base"
        } else {
            "ablate.algorithm.entropy=0.01"
        };
        let seed = 1 + (i as u64 % 2);
        assert_eq!(config["config"], label);
        assert_eq!(config["seed"], seed);
        assert_eq!(config["experiment"], "tiny_sweep");
        let name = run.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(&format!("seed{seed}-")), "{name}");
        let spec = common::json(&run.join("experiment.json"));
        assert_eq!(spec["seed"], seed);
        assert!(
            stdout.contains(&format!("  {label} seed {seed}: {}", run.display())),
            "{stdout}"
        );
    }

    // The table, with numbers recomputed from the runs' own metrics.
    let out = agentry(&[
        "compare",
        out_dir.join("tiny_sweep").to_str().unwrap(),
        "--out",
        root.join("table.md").to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_success(&out);
    assert_eq!(
        std::fs::read_to_string(root.join("table.md")).unwrap(),
        table
    );
    assert!(
        stdout.contains(table.as_ref()),
        "the sweep prints the same table:\n{stdout}"
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "| configuration | seeds | kg | overall |");
    for (row, name, runs, label) in [
        (2, "base", &base, "final"),
        (3, "base (after warm-up)", &base, "warmup"),
        (4, "ablate.algorithm.entropy=0.01", &ablated, "final"),
        (
            5,
            "ablate.algorithm.entropy=0.01 (after warm-up)",
            &ablated,
            "warmup",
        ),
    ] {
        let (a, b) = (evaluation(runs[0], label), evaluation(runs[1], label));
        let expected = format!(
            "| {name} | 2 | {} | {} |",
            two_seed_cell(a.1, b.1),
            two_seed_cell(a.0, b.0)
        );
        assert_eq!(lines[row], expected, "{table}");
    }
    assert!(table.contains("Student's t interval"), "{table}");

    // Seed by seed against the base: each seed's difference, and the base's gain over its
    // warm-up first.
    let curves = root.join("curves");
    let out = agentry(&[
        "compare",
        out_dir.join("tiny_sweep").to_str().unwrap(),
        "--paired",
        "base",
        "--plot",
        curves.to_str().unwrap(),
    ]);
    let paired = assert_success(&out);
    // And the learning curves, a chart per task and overall.
    for chart in ["curves-kg", "curves-overall"] {
        let png = curves.join(format!("{chart}.png"));
        assert!(
            paired.contains(&format!("wrote {}", png.display())),
            "{paired}"
        );
        assert!(std::fs::metadata(&png).unwrap().len() > 1000);
        let svg = std::fs::read_to_string(curves.join(format!("{chart}.svg"))).unwrap();
        assert!(svg.contains("ablate.algorithm.entropy=0.01"), "{chart}");
    }
    let per_seed = |a: &[&std::path::PathBuf],
                    a_label: &str,
                    b: &[&std::path::PathBuf],
                    b_label: &str|
     -> String {
        (0..2)
            .map(|i| {
                let d = evaluation(a[i], a_label).0 - evaluation(b[i], b_label).0;
                format!("{}: {d:+.3}", i + 1)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    for line in [
        format!(
            "- base: final − after warm-up: {}",
            per_seed(&base, "final", &base, "warmup")
        ),
        format!(
            "- ablate.algorithm.entropy=0.01 − base: {}",
            per_seed(&ablated, "final", &base, "final")
        ),
    ] {
        assert!(paired.contains(&line), "{line}\n{paired}");
    }
    assert!(
        paired.contains("| base: final − after warm-up | 2 |"),
        "{paired}"
    );
    let out = agentry(&[
        "compare",
        out_dir.join("tiny_sweep").to_str().unwrap(),
        "--paired",
        "nothing",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`--paired nothing`: no configuration"),
        "{stderr}"
    );

    // One configuration and one seed of it.
    let part = root.join("part");
    let out = agentry(&[
        "run",
        file,
        "--quiet",
        "--out",
        part.to_str().unwrap(),
        "--config",
        "ablate.algorithm.entropy=0.01",
        "--seed",
        "2",
    ]);
    assert_success(&out);
    let runs = run_dirs(&part);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].starts_with(part.join("tiny_sweep/ablate.algorithm.entropy=0.01")));
    let out = agentry(&["compare", runs[0].to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("| ablate.algorithm.entropy=0.01 | 1* |"),
        "{table}"
    );
    assert!(table.contains("Wilson"), "{table}");
}

#[test]
fn compare_of_a_bad_run_names_the_file() {
    let root = common::scratch_in("cli", "cli-compare-bad");
    std::fs::write(root.join("metrics.jsonl"), "{\"phase\":\"eval\"\n").unwrap();
    std::fs::write(
        root.join("config.json"),
        r#"{"experiment":"x","config":"base","seed":1}"#,
    )
    .unwrap();
    let out = agentry(&["compare", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: `{}` line 1: not JSON",
            root.join("metrics.jsonl").display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn resume_continues_one_configuration_of_a_sweep() {
    let root = common::scratch_in("cli", "cli-sweep-resume");
    let file = root.join("tiny_sweep.arl");
    let source = SWEEP.replace(
        "steps = 1, batch = 2,",
        "steps = 2, checkpoint_every = 1, batch = 2,",
    );
    std::fs::write(&file, source).unwrap();
    let (file, out_arg) = (file.to_str().unwrap(), root.join("runs"));
    let out_arg = out_arg.to_str().unwrap();
    let label = "ablate.algorithm.entropy=0.01";
    let out = agentry(&[
        "run", file, "--quiet", "--out", out_arg, "--config", label, "--seed", "2", "--steps", "1",
    ]);
    assert_success(&out);
    let runs = run_dirs(&root.join("runs"));
    assert_eq!(runs.len(), 1, "{runs:?}");
    // The whole sweep is selected, but the run directory's config.json names the one run.
    let out = agentry(&[
        "run",
        file,
        "--quiet",
        "--resume",
        runs[0].to_str().unwrap(),
    ]);
    let stdout = assert_success(&out);
    assert!(stdout.contains("resuming from"), "{stdout}");
    assert!(
        stdout.contains(&format!("  {label} seed 2: {}", runs[0].display())),
        "{stdout}"
    );
    assert_eq!(run_dirs(&root.join("runs")), runs, "no new run directory");
    // A selection that leaves the run out is refused before any work.
    let out = agentry(&[
        "run",
        file,
        "--quiet",
        "--config",
        "base",
        "--resume",
        runs[0].to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "is configuration `{label}` seed 2, which --config/--seed leave out"
        )),
        "{stderr}"
    );
}

/// Two experiments that differ only in what RL reads (`name` and `algorithm.entropy`).
fn twin(name: &str, entropy: f64) -> String {
    format!(
        r#"experiment {name} {{
    seed = 5
    device = flex
    model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }} }}
    task kg {{ env = kg, max_turns = 2, difficulty = 1 }}
    algorithm grpo {{ group_size = 2, entropy = {entropy} }}
    train {{
        steps = 1, batch = 2, lr = 1e-3, max_new_tokens = 8
        warmup = sft {{ steps = 2, demonstrations = 4, batch = 2 }}
    }}
    eval {{ episodes = 2 }}
}}
"#
    )
}

#[test]
fn run_of_several_files_checks_them_all_first_and_shares_their_warmups() {
    let root = common::scratch_in("cli", "cli-several");
    let (one, two, bad) = (
        root.join("one.arl"),
        root.join("two.arl"),
        root.join("bad.arl"),
    );
    std::fs::write(&one, twin("one", 0.0)).unwrap();
    std::fs::write(&two, twin("two", 0.01)).unwrap();
    std::fs::write(&bad, "experiment bad {").unwrap();
    let out_dir = root.join("runs");
    let [one, two, bad, out_arg] = [&one, &two, &bad, &out_dir].map(|p| p.to_str().unwrap());

    // A bad last file stops the command before the first file runs.
    let out = agentry(&["run", one, two, bad, "--quiet", "--out", out_arg]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.arl:1:"), "{stderr}");
    assert!(!out_dir.exists(), "nothing ran");

    let out = agentry(&["run", one, two, "--resume", out_arg, "--quiet"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--resume continues one run: give only the file it belongs to")
    );

    let out = agentry(&["run", one, two, "--quiet", "--out", out_arg]);
    let stdout = assert_success(&out);
    let [first, second] = [
        run_dirs(&out_dir.join("one")),
        run_dirs(&out_dir.join("two")),
    ]
    .map(|mut runs| runs.pop().expect("one run each"));
    let summary = |run: &std::path::Path| common::json(&run.join("summary.json"));
    assert!(summary(&first).get("warmup_from").is_none());
    assert_eq!(summary(&second)["warmup_from"], first.to_str().unwrap());
    assert_eq!(
        evaluation(&second, "warmup"),
        evaluation(&first, "warmup"),
        "the second file's warm-up is the first's"
    );
    assert!(stdout.contains("(the warm-up of "), "{stdout}");
    // The shared warm-ups lived as long as the command.
    assert_eq!(common::entry_names(&out_dir), ["one", "two"]);
}

#[test]
fn run_warns_of_tasks_whose_demonstrations_the_policy_could_not_produce() {
    let root = common::scratch_in("cli", "cli-unteachable");
    let file = root.join("short_context.arl");
    // A WebShop oracle episode (instruction, a results page, an item page) is longer than 384
    // tokens; a KG one is not. A KG call takes at most 28 tokens, some DB calls more than 30.
    std::fs::write(
        &file,
        r#"experiment short_context {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 384, vocab = 700 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    task webshop { env = webshop, max_turns = 6, difficulty = 1 }
    task db { env = db, max_turns = 6, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train {
        steps = 1, batch = 2, lr = 1e-3, max_new_tokens = 30
        warmup = sft { steps = 1, demonstrations = 48, batch = 2 }
    }
    eval { episodes = 1, decoding = greedy }
}
"#,
    )
    .unwrap();
    let out_dir = root.join("runs");
    let out = agentry(&[
        "run",
        file.to_str().unwrap(),
        "--quiet",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = assert_success(&out);
    // The three tasks have thousands of words: the tokenizer takes `vocab` tokens, and the
    // run says how many it would need.
    assert!(
        stdout.lines().any(|l| l.ends_with("| vocab 700")),
        "{stdout}"
    );
    let spelled = stdout
        .lines()
        .find(|l| l.starts_with("warning: the tasks' text has "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let needed: usize = spelled
        .split("it holds 700 tokens of the ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{spelled}"));
    assert!(needed > 1000, "{spelled}");
    assert!(
        spelled.starts_with(&format!(
            "warning: the tasks' text has {} words",
            needed - 700
        )) && spelled.ends_with(&format!(
            "raise the model's `vocab` to {needed} to keep every word whole"
        )),
        "{spelled}"
    );
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("warning: task"))
        .collect();
    assert_eq!(warnings.len(), 2, "{stdout}");
    assert!(
        warnings[0].starts_with("warning: task `webshop`: none of its ")
            && warnings[0].contains(
                "oracle demonstrations fits in the context (384 tokens) within its turn budget \
                 (6 turns), so the warm-up cannot teach it"
            ),
        "{stdout}"
    );
    // Most DB calls fit in 30 tokens; those that do not are named with the longest.
    let db = warnings[1];
    assert!(db.starts_with("warning: task `db`: "), "{stdout}");
    assert!(
        db.contains(
            "oracle demonstrations make a call longer than a turn may generate \
             (`max_new_tokens` = 30; the longest takes "
        ) && db.ends_with(
            "tokens): the policy is taught such calls but is cut off before it finishes one; \
             raise `train.max_new_tokens`"
        ),
        "{stdout}"
    );
    let longest: usize = db
        .split("the longest takes ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(longest > 30, "{db}");
}

/// Every file of a run directory, by path relative to it, with its bytes; `metrics.jsonl`
/// without its wall-clock fields (`*_seconds`, `trajectories_per_second`), and without what
/// names the directory or measures time: `summary.json`'s `run_dir` and `cpu_threads`, `report.md` and `plots/`
/// (they show timings) and `checkpoints/` (a checkpoint records the byte length of
/// `metrics.jsonl`, timings included; `policy.mpk` holds the final weights), and `policy.mpk`
/// without its parameters' ids ([`without_param_ids`]).
fn run_contents(run: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                if name != "plots" && name != "checkpoints" {
                    walk(root, &path, out);
                }
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let bytes = match name.as_str() {
                "report.md" => continue,
                "metrics.jsonl" => {
                    serde_json::to_vec_pretty(&common::metrics_without_timings(root)).unwrap()
                }
                "summary.json" => {
                    let mut value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    let value = value.as_object_mut().unwrap();
                    value.remove("run_dir");
                    // What the test varies; it must record it, truthfully.
                    value
                        .remove("cpu_threads")
                        .expect("summary.json records cpu_threads");
                    serde_json::to_vec_pretty(&value).unwrap()
                }
                "policy.mpk" => without_param_ids(bytes),
                _ => bytes,
            };
            out.push((name, bytes));
        }
    }
    let mut out = Vec::new();
    walk(run, run, &mut out);
    out.sort();
    out
}

/// burn's recorded weights with each parameter's id blanked: burn draws a parameter's id
/// (`ParamId`, 13 characters, MessagePack `"id": <str8 of 13>`) from a generator it does not
/// seed, so ids differ between processes while the tensors' bytes do not.
fn without_param_ids(mut bytes: Vec<u8>) -> Vec<u8> {
    const KEY: &[u8] = b"\xa2id\xad";
    let mut i = 0;
    while i + KEY.len() + 13 <= bytes.len() {
        if &bytes[i..i + KEY.len()] == KEY {
            bytes[i + KEY.len()..i + KEY.len() + 13].fill(b'_');
            i += KEY.len() + 13;
        } else {
            i += 1;
        }
    }
    bytes
}

/// Runs `file` into `out_dir` on `threads` CPU threads (one through `RAYON_NUM_THREADS`, more
/// through `--threads`: both ways of sizing the pool); its one run directory.
fn run_on_threads(
    file: &std::path::Path,
    out_dir: &std::path::Path,
    threads: usize,
) -> std::path::PathBuf {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .args(["run", file.to_str().unwrap(), "--quiet", "--out"])
        .arg(out_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match threads {
        1 => command.env("RAYON_NUM_THREADS", "1"),
        _ => command
            .args(["--threads", &threads.to_string()])
            .env_remove("RAYON_NUM_THREADS"),
    };
    let out = command.output().expect("the agentry binary runs");
    assert_success(&out);
    let mut dirs = run_dirs(out_dir);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

#[test]
fn a_seed_gives_the_same_run_with_one_rayon_thread_or_two() {
    let root = common::scratch_in("cli", "cli-threads");
    let file = root.join("threads.arl");
    // Warm-up, RL with sampling, and both decodings of the evaluation: every place the backend
    // computes (matmuls, reductions, softmax, the optimizer) and the RNG is drawn.
    std::fs::write(
        &file,
        r#"experiment threads {
    seed = 11
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train {
        steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft { steps = 2, demonstrations = 4, batch = 2 }
    }
    eval { episodes = 3, decoding = both }
}
"#,
    )
    .unwrap();
    // One thread from the environment, two from `--threads`: both ways of sizing the pool.
    let runs: Vec<Vec<(String, Vec<u8>)>> = [1, 2]
        .map(|threads| {
            let dir = run_on_threads(&file, &root.join(format!("threads-{threads}")), threads);
            let summary = common::json(&dir.join("summary.json"));
            assert_eq!(
                summary["cpu_threads"], threads,
                "the summary records the pool's size"
            );
            run_contents(&dir)
        })
        .into_iter()
        .collect();
    let names = |run: &[(String, Vec<u8>)]| run.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&runs[0]), names(&runs[1]));
    for ((name, one), (_, two)) in runs[0].iter().zip(&runs[1]) {
        assert!(
            one == two,
            "{name} differs between RAYON_NUM_THREADS=1 and =2:\n{}\n---\n{}",
            String::from_utf8_lossy(one),
            String::from_utf8_lossy(two)
        );
    }
    for expected in [
        "metrics.jsonl",
        "summary.json",
        "policy.mpk",
        "episodes/final.jsonl",
        "episodes/final-sampled.jsonl",
        "samples-final.txt",
    ] {
        assert!(
            names(&runs[0]).iter().any(|n| n == expected),
            "{expected} missing: {:?}",
            names(&runs[0])
        );
    }
}

/// One HTTP/1.1 request on loopback, answered with its status line and body (`Connection:
/// close`: the body is everything after the headers).
fn http(port: u16, method: &str, path: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer serve-secret\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("a head and a body");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// `agentry serve RUN_DIR` answers OpenAI chat requests with the trained policy: over raw HTTP
/// here, and through the official `openai` Python client when `OPENAI_PYTHON` names a Python
/// that has it (CI makes one): plain, streaming, tools, log-probabilities, seeds, typed errors,
/// and 64 concurrent requests equal to the same ones one at a time.
#[test]
fn serve_answers_openai_clients_with_a_trained_run() {
    let root = common::scratch_in("cli", "cli-serve");
    let file = root.join("tiny.arl");
    std::fs::write(
        &file,
        r#"
experiment cli_serve {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 32, heads = 2, ffn = 64, context = 256 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    train {
        steps = 1, batch = 4, max_new_tokens = 16
        warmup = sft { steps = 150, lr = 1e-2, demonstrations = 32, batch = 8 }
    }
    eval { episodes = 4 }
}
"#,
    )
    .unwrap();
    let out = root.join("runs");
    let run = agentry(&[
        "run",
        file.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_success(&run);
    let run_dir = common::run_dir_of(&out, "cli_serve");
    let port = free_port();
    let _server = Killed(
        agentry_with(
            &[
                "serve",
                run_dir.to_str().unwrap(),
                "--port",
                &port.to_string(),
                "--name",
                "tiny",
            ],
            &[("AGENTRY_TOKEN", "serve-secret")],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "agentry serve did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, body) = http(port, "GET", "/v1/models", "");
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains("\"id\":\"tiny\""), "{body}");
    let request = r#"{"model": "tiny", "messages": [{"role": "user", "content": "Which relations does #0 have?"}], "temperature": 0, "max_tokens": 5}"#;
    let (status, body) = http(port, "POST", "/v1/chat/completions", request);
    assert!(status.contains("200"), "{status} {body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["object"], "chat.completion");
    let tokens = reply["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=5).contains(&tokens), "{reply}");
    let again = http(port, "POST", "/v1/chat/completions", request).1;
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["choices"], reply["choices"], "greedy replies repeat");
    let long = format!(
        r#"{{"model": "tiny", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "count ".repeat(400)
    );
    let (status, body) = http(port, "POST", "/v1/chat/completions", &long);
    assert!(status.contains("400"), "{status} {body}");
    assert!(body.contains("context_length_exceeded"), "{body}");

    // The run's own greedy evaluation, played again through the endpoint, episode by episode.
    let evaluated = agentry_with(
        &[
            "eval",
            file.to_str().unwrap(),
            "--endpoint",
            &format!("http://127.0.0.1:{port}/v1"),
            "--model",
            "tiny",
            "--api-key-env",
            "TINY_KEY",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        &[("TINY_KEY", "serve-secret")],
    )
    .output()
    .unwrap();
    assert_success(&evaluated);
    let endpoint_dir = common::run_dir_of(&out.join("cli_serve"), "endpoint.tiny");
    let episodes = |dir: &std::path::Path| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join("episodes/final.jsonl")).unwrap();
        text.lines()
            .map(|line| {
                let e: serde_json::Value = serde_json::from_str(line).unwrap();
                let turns: Vec<_> = e["turns"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        serde_json::json!([t["reply"], t["observation"], t["reward"], t["status"]])
                    })
                    .collect();
                serde_json::json!([e["task"], e["index"], turns, e["success"], e["status"]])
            })
            .collect()
    };
    let (own, through) = (episodes(&run_dir), episodes(&endpoint_dir));
    assert_eq!(own.len(), 4);
    assert_eq!(
        through, own,
        "the endpoint evaluation plays the run's own episodes"
    );
    let summary = common::json(&endpoint_dir.join("summary.json"));
    assert_eq!(
        summary["after_rl"],
        common::json(&run_dir.join("summary.json"))["after_rl"]
    );
    assert!(endpoint_dir.join("report.md").is_file());
    let requests = common::json(&endpoint_dir.join("endpoint.json"));
    assert_eq!(requests["requests"]["failed"], 0, "{requests}");
    assert_eq!(requests["call_format"], "compact");
    // `agentry compare` puts it beside the run it served.
    let compare = agentry(&[
        "compare",
        run_dir.to_str().unwrap(),
        endpoint_dir.to_str().unwrap(),
    ]);
    let table = assert_success(&compare);
    assert!(
        table.contains("| base ") && table.contains("| endpoint.tiny "),
        "{table}"
    );
    // Its episodes replay: the recorded replies, stepped again, answer as recorded.
    for line in 1..=4 {
        let episode = format!(
            "{}:{line}",
            endpoint_dir.join("episodes/final.jsonl").display()
        );
        let replay = agentry(&["replay", &episode]);
        let stdout = assert_success(&replay);
        assert!(stdout.ends_with("verdict: identical\n"), "{stdout}");
        assert!(stdout.contains("no weights to check"), "{stdout}");
    }
    // An endpoint's run has no weights: exporting or serving it says so.
    let export = agentry(&[
        "export",
        endpoint_dir.to_str().unwrap(),
        "--merged",
        "/nonexistent",
    ]);
    assert_eq!(export.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&export.stderr);
    assert!(
        stderr.contains("evaluated a model behind an endpoint"),
        "{stderr}"
    );

    match std::env::var("OPENAI_PYTHON") {
        Ok(python) => {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_client.py");
            let base = format!("http://127.0.0.1:{port}/v1");
            let out = Command::new(python)
                .args([script, &base, "tiny", "serve-secret"])
                .output()
                .expect("python runs");
            let stdout = assert_success(&out);
            assert!(stdout.ends_with("ok\n"), "{stdout}");
        }
        Err(_) => eprintln!(
            "NOTE: OPENAI_PYTHON is not set: the official openai client's checks of \
             `agentry serve` did not run (CI sets it)"
        ),
    }
}

/// A sweep of two runs whose every update trains (Dr. GRPO with the KL penalty on the reward,
/// two epochs), `REPLICAS` trainer replicas per node.
const NODES: &str = r#"experiment tiny_nodes {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm dr_grpo { group_size = 2, epochs = 2, kl = k1(0.5, as = reward) }
    train {
        steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft { steps = 2, demonstrations = 4, batch = 2 }
        data_parallel = REPLICAS
    }
    eval { episodes = 2 }
    sweep { seeds = [1, 2] }
}
"#;

/// Each warm-up and RL step's loss and gradient norm of every run under `dir`, in order.
fn updates(dir: &std::path::Path) -> Vec<Vec<(f64, f64)>> {
    run_dirs(dir)
        .iter()
        .map(|run| common::losses(run))
        .collect()
}

/// `agentry orchestrator` on a free port of loopback, and its address.
fn orchestrator() -> (Killed, String) {
    let port = free_port();
    let process = Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["orchestrator", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (Killed(process), format!("ws://127.0.0.1:{port}"))
}

/// `agentry run --nodes 2`: rank 0 runs the sweep, rank 1 trains beside it, `per_node`
/// replicas on each, through `agentry orchestrator` on loopback; every update is one process's
/// with as many replicas (the same summands), and rank 1 writes nothing and exits when rank 0
/// is done.
fn nodes_train_as_one_process(per_node: usize) {
    let root = common::scratch_in("cli", &format!("cli-nodes-{per_node}"));
    let file = |replicas: usize| {
        let path = root.join(format!("nodes-{replicas}.arl"));
        std::fs::write(&path, NODES.replace("REPLICAS", &replicas.to_string())).unwrap();
        path.to_str().unwrap().to_string()
    };
    let dir = |name: &str| root.join(name).to_str().unwrap().to_string();

    let one_process = dir("one-process");
    let all = file(2 * per_node);
    assert_success(&agentry(&["run", &all, "--out", &one_process, "--quiet"]));

    let (_orchestrator, orchestrator) = orchestrator();
    let each = file(per_node);
    let node = |rank: u32, out: &str| {
        let address = format!("ws://127.0.0.1:{}", free_port());
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentry"));
        command.args(["run", &each, "--out", out, "--quiet", "--nodes", "2"]);
        command.args([
            "--node-rank",
            &rank.to_string(),
            "--orchestrator",
            &orchestrator,
        ]);
        command.args(["--node-address", &address, "--node-timeout", "120"]);
        command
    };
    let (leader_out, follower_out) = (dir("leader"), dir("follower"));
    let follower = Killed(
        node(1, &follower_out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let leader = node(0, &leader_out).output().unwrap();
    let stdout = assert_success(&leader);
    let replicas = format!("({} data-parallel replicas on 2 nodes)", 2 * per_node);
    assert!(stdout.contains(&replicas), "{stdout}");
    let follower = follower.wait();
    assert!(follower.status.success(), "rank 1: {}", follower.stderr);
    assert!(
        !std::path::Path::new(&follower_out).exists(),
        "rank 1 wrote runs"
    );

    let (nodes, process) = (
        updates(std::path::Path::new(&leader_out)),
        updates(std::path::Path::new(&one_process)),
    );
    assert_eq!(nodes.len(), 2, "both runs of the sweep");
    assert!(nodes.iter().all(|run| run.len() == 2 + 2), "{nodes:?}");
    if per_node == 1 {
        // Two summands: the same sum in either order.
        assert_eq!(nodes, process);
        return;
    }
    // One process sums ((r0 + r1) + r2) + r3, two nodes (r0 + r1) + (r2 + r3).
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-6);
    for (got, want) in nodes.iter().flatten().zip(process.iter().flatten()) {
        assert!(
            close(got.0, want.0) && close(got.1, want.1),
            "{nodes:?}\n{process:?}"
        );
    }
}

#[test]
fn two_nodes_train_as_one_process_with_two_replicas() {
    nodes_train_as_one_process(1);
}

#[test]
fn two_nodes_of_two_replicas_train_as_one_process_with_four() {
    nodes_train_as_one_process(2);
}

/// Rank 1 is killed during a run: rank 0's step fails naming the cause and the way on; both
/// ranks started again resume the run from its checkpoint, through the same orchestrator, and
/// finish it.
#[test]
fn a_node_that_stops_fails_the_step_and_the_run_resumes() {
    let root = common::scratch_in("cli", "cli-nodes-stop");
    let file = root.join("long.arl");
    let source = NODES
        .replace("REPLICAS", "1")
        .replace(
            "steps = 2, batch = 4",
            "steps = 40, batch = 4, checkpoint_every = 2",
        )
        .replace("sweep { seeds = [1, 2] }", "");
    std::fs::write(&file, source).unwrap();
    let file = file.to_str().unwrap().to_string();
    let (_orchestrator, orchestrator) = orchestrator();
    let out = root.join("runs");
    let node = |rank: u32, resume: Option<&std::path::Path>| {
        let address = format!("ws://127.0.0.1:{}", free_port());
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentry"));
        command.args([
            "run",
            &file,
            "--quiet",
            "--nodes",
            "2",
            "--node-timeout",
            "60",
        ]);
        command.args([
            "--node-rank",
            &rank.to_string(),
            "--orchestrator",
            &orchestrator,
        ]);
        command
            .args(["--node-address", &address])
            .arg("--out")
            .arg(&out);
        if let Some(run) = resume {
            command.arg("--resume").arg(run);
        }
        command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        command
    };
    let mut follower = Killed(node(1, None).spawn().unwrap());
    let leader = Killed(node(0, None).spawn().unwrap());
    // Once the run has a checkpoint past its warm-up, rank 1 stops.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let run = loop {
        let runs = out.join("tiny_nodes");
        let found = std::fs::read_dir(&runs)
            .ok()
            .and_then(|mut dirs| dirs.next());
        if let Some(run) = found.map(|d| d.unwrap().path())
            && run.join("checkpoints/rl-000004.ckpt").exists()
        {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "no checkpoint came");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    follower.0.kill().unwrap();
    let failed = leader.wait();
    assert!(!failed.status.success());
    // Killed mid-transfer, rank 1's broken connection fails the exchange at once; killed
    // between exchanges (rank 0 rolling out, or waiting for rank 1 to fetch a tensor), nothing
    // breaks and the step fails on `--node-timeout`. Either error names the cause.
    let cause = failed.stderr.contains("did a node stop?")
        || failed
            .stderr
            .contains("no answer from the other nodes within 60 s (a node stopped");
    assert!(
        failed
            .stderr
            .contains("data-parallel training failed at RL step")
            && cause
            && failed.stderr.contains("--resume RUN_DIR"),
        "{}",
        failed.stderr
    );
    let _ = follower.wait();

    let follower = Killed(node(1, Some(&run)).spawn().unwrap());
    let resumed = node(0, Some(&run)).output().unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(follower.wait().status.success());
    let summary = common::json(&run.join("summary.json"));
    assert_eq!(summary["steps"], 40, "{summary}");
}

#[test]
fn orchestrator_on_a_port_in_use_is_an_error() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = agentry(&["orchestrator", "--port", &port]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("error: cannot listen on port {port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
}

#[test]
fn node_flags_are_checked_before_any_work() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--nodes", "2", "--node-rank", "2"],
            "--node-rank 2 is not below --nodes 2",
        ),
        (&["--nodes", "1"], "--nodes 1 needs at least 2 nodes"),
        (
            &["--nodes", "2", "--node-address", "127.0.0.1:9"],
            "--node-address",
        ),
    ];
    for (flags, message) in cases {
        let mut args = vec![
            "run",
            "experiments/quickstart.arl",
            "--orchestrator",
            "ws://127.0.0.1:9",
        ];
        args.extend_from_slice(flags);
        let out = agentry(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // LoRA dropout on several nodes, on either rank, before any work.
    let root = common::scratch_in("cli", "cli-nodes-dropout");
    let file = root.join("lora.arl");
    let lora = NODES.replace("REPLICAS", "1").replace(
        "context = 128 } }",
        "context = 128 }\n        finetune = lora { rank = 2, dropout = 0.1 } }",
    );
    std::fs::write(&file, lora).unwrap();
    let out_dir = root.join("runs");
    for rank in ["0", "1"] {
        let args = [
            "run",
            file.to_str().unwrap(),
            "--nodes",
            "2",
            "--node-rank",
            rank,
        ];
        let mut args = args.to_vec();
        args.extend(["--orchestrator", "ws://127.0.0.1:9"]);
        args.extend(["--out", out_dir.to_str().unwrap()]);
        let out = agentry(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank}");
        assert!(
            stderr.contains("trains LoRA with dropout (0.1), which several nodes cannot repeat"),
            "rank {rank}: {stderr}"
        );
    }
    assert!(!out_dir.exists(), "a refused run started");
    let out = agentry(&["run", "experiments/quickstart.arl", "--nodes", "2"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--orchestrator"),
        "clap names the missing flag"
    );
}

#[test]
fn medium_matmul_precision_is_recorded_thread_count_free_and_bf16_only_where_supported() {
    let root = common::scratch_in("cli", "cli-precision");
    // Wide enough that the SwiGLU's down projection (`[tokens, 256] · [256, 64]`) and the
    // weights' gradients (`[64, tokens] · [tokens, 256]`) are products the bf16 engines take.
    let source = |precision: &str| {
        format!(
            r#"experiment precision {{
    seed = 5
    device = flex
    matmul_precision = {precision}
    model policy {{ arch = transformer {{ layers = 1, d_model = 64, heads = 2, ffn = 256, context = 256 }} }}
    task kg {{ env = kg, max_turns = 2, difficulty = 1 }}
    algorithm grpo {{ group_size = 2 }}
    train {{
        steps = 1, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft {{ steps = 3, demonstrations = 8, batch = 4 }}
    }}
    eval {{ episodes = 2 }}
}}
"#
        )
    };
    let run = |precision: &str, threads: usize| {
        let file = root.join(format!("{precision}.arl"));
        std::fs::write(&file, source(precision)).unwrap();
        let dir = run_on_threads(&file, &root.join(format!("{precision}-{threads}")), threads);
        let summary = common::json(&dir.join("summary.json"));
        let recorded = summary["matmul_precision"].as_str().unwrap().to_string();
        (run_contents(&dir), recorded)
    };
    let (medium, recorded) = run("medium", 1);
    let (medium_two, _) = run("medium", 2);
    assert!(
        medium == medium_two,
        "a run at medium precision differs between one thread and two"
    );
    let (highest, highest_recorded) = run("highest", 1);
    assert_eq!(highest_recorded, "highest");
    let file = |run: &[(String, Vec<u8>)], name: &str| {
        run.iter()
            .find(|(n, _)| n == name)
            .map(|(_, bytes)| bytes.clone())
            .unwrap()
    };
    let same =
        ["metrics.jsonl", "policy.mpk"].map(|name| file(&medium, name) == file(&highest, name));
    match recorded.as_str() {
        "medium (bf16 on AMX tiles)" | "medium (bf16 by AVX-512 BF16)" => assert_eq!(
            same,
            [false, false],
            "bf16 products left the warm-up's losses and weights unchanged"
        ),
        "medium (f32: this CPU has no bf16 products)" => assert_eq!(
            same,
            [true, true],
            "without bf16 products, medium must compute what highest does"
        ),
        other => panic!("summary.json records matmul_precision {other:?}"),
    }
}
