//! Tests of the OS task: the oracle solves every instance within the turn limit, splits are
//! disjoint, random and malformed calls never panic, transcripts are deterministic, clones
//! snapshot episodes, the vocabulary covers the oracle's path, and the sandbox never reaches
//! the host.

use std::collections::{BTreeMap, HashSet};

use agentry_env::os::shell::{CUT_NOTE, MAX_OUTPUT_CHARS, Shell};
use agentry_env::os::tasks::{Goal, TEMPLATES};
use agentry_env::os::{Os, OsEnv, VERSION, fs};
use agentry_env::pieces::word_runs;
use agentry_env::tool::MAX_ARGUMENT_CHARS;
use agentry_env::{Environment, Split, Status, TaskGenerator, ToolCall, parse_call, render_call};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value as Json, json};

const SPLITS: [Split; 2] = [Split::Train, Split::Test];
/// The runtime's default turn limit for `env = os`.
const DEFAULT_MAX_TURNS: usize = 8;

fn bash(script: &str) -> ToolCall {
    ToolCall::new("bash_action", [("script", json!(script))])
}

/// Every path of the file system is normalized: absolute, no empty, `.` or `..` component.
fn assert_normalized(fs: &fs::Fs) {
    for (path, _) in fs.iter() {
        assert!(path.starts_with('/'), "{path}");
        if path != "/" {
            assert!(
                path.split('/')
                    .skip(1)
                    .all(|c| !c.is_empty() && c != "." && c != ".."),
                "{path}"
            );
        }
    }
}

fn assert_in_vocab(vocab: &HashSet<String>, text: &str) {
    for w in word_runs(text) {
        assert!(
            vocab.contains(w),
            "`{w}` of `{text}` is not in the vocabulary"
        );
    }
}

/// Follows the oracle from reset; returns the instruction, the calls with their observations,
/// and the last reward and status.
fn run_oracle(env: &mut dyn Environment) -> (String, Vec<(ToolCall, String)>, f32, Status) {
    let instruction = env.reset().instruction;
    let mut trace = Vec::new();
    let mut last = (0.0, Status::Running);
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        assert_ne!(
            step.status,
            Status::InvalidAction,
            "{c:?}: {}",
            step.observation
        );
        assert!(
            !step.observation.starts_with("Error"),
            "{}",
            step.observation
        );
        trace.push((c, step.observation));
        last = (step.reward, step.status);
        assert!(
            trace.len() <= DEFAULT_MAX_TURNS,
            "oracle does not end within {DEFAULT_MAX_TURNS} turns: {instruction}"
        );
    }
    (instruction, trace, last.0, last.1)
}

#[test]
fn oracle_solves_1000_instances_of_each_split_within_the_turn_limit() {
    let os = Os::default();
    let vocab: HashSet<String> = os.vocabulary().into_iter().collect();
    for split in SPLITS {
        let mut templates: BTreeMap<&str, usize> = BTreeMap::new();
        for i in 0..1000u64 {
            let d = (i % 3) as u8 + 1;
            let mut env = os.episode(split, d, i / 3);
            let (instruction, trace, reward, status) = run_oracle(&mut env);
            assert_eq!(status, Status::Completed, "{instruction}");
            assert_eq!(reward, 1.0, "{instruction}: {trace:?}");
            assert!(env.success());
            assert!(env.oracle().is_none());
            // Test 6: the vocabulary covers the instruction, the calls and the observations.
            assert_in_vocab(&vocab, &instruction);
            for (c, obs) in &trace {
                assert_in_vocab(&vocab, &render_call(c));
                assert_in_vocab(&vocab, obs);
            }
            *templates.entry(env.task().template).or_default() += 1;
        }
        let all: usize = TEMPLATES.iter().map(|t| t.len()).sum();
        assert_eq!(templates.len(), all, "{split:?}: {templates:?}");
        println!("{split:?}: {templates:?}");
    }
    println!("vocabulary {}", vocab.len());
}

#[test]
fn other_seeds_are_solvable_too() {
    for seed in [0, 7, 12345] {
        let os = Os::new(seed);
        for d in 1..=3 {
            for split in SPLITS {
                for i in 0..40 {
                    let (_, _, reward, _) = run_oracle(os.instance(split, d, i).as_mut());
                    assert_eq!(reward, 1.0);
                }
            }
        }
    }
}

#[test]
fn train_and_test_are_disjoint() {
    let os = Os::default();
    for d in 1..=3 {
        let mut sets = Vec::new();
        for split in SPLITS {
            let set: HashSet<String> = (0..1000)
                .map(|i| {
                    let task = os.task(split, d, i);
                    assert_eq!(os.split_of(&task, d), split);
                    task.canonical()
                })
                .collect();
            // Content is varied: duplicates within a split are rare.
            assert!(set.len() > 950, "difficulty {d} {split:?}: {}", set.len());
            sets.push(set);
        }
        assert!(sets[0].is_disjoint(&sets[1]), "difficulty {d}");
    }
}

#[test]
fn difficulty_levels_differ() {
    let os = Os::default();
    for i in 0..200 {
        let bash_calls = |d: u8| -> Vec<String> {
            os.task(Split::Train, d, i)
                .plan
                .iter()
                .filter(|c| c.name == "bash_action")
                .map(|c| c.str_arg("script").to_string())
                .collect()
        };
        // 1: one simple command.
        let one = bash_calls(1);
        assert_eq!(one.len(), 1);
        assert!(!one[0].contains('|') && !one[0].contains('*'), "{one:?}");
        // 2: one command line with a pipe, a glob or a redirection.
        let two = bash_calls(2);
        assert_eq!(two.len(), 1);
        assert!(two[0].contains(['|', '*', '>']), "{two:?}");
        // 3: several steps.
        assert_eq!(bash_calls(3).len(), 2);
    }
}

#[test]
fn same_arguments_same_instance_and_version() {
    let (a, b) = (Os::new(5), Os::new(5));
    assert_eq!(a.version(), VERSION);
    assert_eq!(a.vocabulary(), b.vocabulary());
    for d in 1..=3 {
        for split in SPLITS {
            for i in [0, 1, 17, 1_000_003] {
                assert_eq!(a.task(split, d, i), b.task(split, d, i));
            }
        }
        assert_ne!(
            a.task(Split::Train, d, 0).canonical(),
            Os::new(6).task(Split::Train, d, 0).canonical()
        );
    }
}

#[test]
fn state_tasks_are_not_solved_by_doing_nothing_and_wrong_answers_fail() {
    let os = Os::default();
    let (mut states, mut questions) = (0, 0);
    for i in 0..300 {
        let d = (i % 3) as u8 + 1;
        let mut env = os.episode(Split::Train, d, i / 3);
        env.reset();
        let step = match env.task().goal.clone() {
            Goal::State(_) => {
                states += 1;
                // Answering is refused for a state task, and finishing at once fails.
                let refused = env.step(&ToolCall::new("answer_action", [("answer", json!("x"))]));
                assert_eq!(refused.status, Status::InvalidAction);
                assert!(refused.observation.starts_with("Error"));
                env.step(&ToolCall::new("finish_action", []))
            }
            Goal::Answer(answer) => {
                questions += 1;
                let refused = env.step(&ToolCall::new("finish_action", []));
                assert_eq!(refused.status, Status::InvalidAction);
                let wrong = format!("{answer}0");
                env.step(&ToolCall::new("answer_action", [("answer", json!(wrong))]))
            }
        };
        assert_eq!((step.reward, step.status), (0.0, Status::Completed));
        assert!(!env.success());
        assert!(env.oracle().is_none());
        // After the end, the episode stays over.
        let after = env.step(&bash("ls"));
        assert_eq!((after.reward, after.status), (0.0, Status::Completed));
    }
    assert!(states > 50 && questions > 50, "{states} {questions}");
    // The answer is compared after trimming.
    for i in 0.. {
        let mut env = os.episode(Split::Test, 1, i);
        env.reset();
        if let Goal::Answer(answer) = env.task().goal.clone() {
            let padded = format!("  {answer}\n");
            let step = env.step(&ToolCall::new("answer_action", [("answer", json!(padded))]));
            assert_eq!(step.reward, 1.0);
            break;
        }
    }
}

/// Words the random agent draws from: the task's vocabulary plus shell syntax and paths.
const SHELL_BITS: [&str; 40] = [
    "|",
    "&&",
    "||",
    ";",
    ">",
    ">>",
    "<",
    "2>",
    "2>&1",
    "&",
    "(",
    ")",
    "'",
    "\"",
    "$",
    "$HOME",
    "${X",
    "`",
    "\\",
    "*",
    "?",
    "~",
    "..",
    "/",
    "-",
    "-n",
    "-r",
    "-la",
    "--x",
    "[",
    "[^a-",
    "^",
    ".*",
    "\n",
    "$(ls)",
    "/dev/null",
    "-type",
    "-name",
    "'*.log'",
    "#",
];
const PATHS: [&str; 12] = [
    "/",
    "/etc/passwd",
    "/proc",
    "../../../..",
    "/tmp/work/*",
    "/home/user/docs/*.txt",
    "~/x",
    "/var/app/*/*.log",
    "/var/log/access.log",
    "/data/nums.txt",
    "*",
    ".",
];
const COMMANDS: [&str; 22] = [
    "cat", "cd", "chmod", "cp", "cut", "echo", "find", "grep", "head", "ls", "mkdir", "mv", "pwd",
    "rm", "sort", "tail", "touch", "uniq", "wc", "yes", "python", "sudo",
];

fn garbage(rng: &mut ChaCha8Rng, max: usize) -> String {
    let n = rng.random_range(0..=max);
    (0..n)
        .map(|_| match rng.random_range(0..4) {
            0 => char::from(rng.random_range(0u8..128)),
            1 => char::from_u32(rng.random_range(0x80..0x3000)).unwrap_or('?'),
            2 => ['\u{0}', '\u{7f}', '\u{feff}', '\u{fffd}', '😀'][rng.random_range(0..5)],
            _ => char::from(rng.random_range(b'a'..=b'z')),
        })
        .collect()
}

fn random_script(rng: &mut ChaCha8Rng, vocab: &[String]) -> String {
    let n = rng.random_range(0..12);
    let mut parts: Vec<String> = Vec::new();
    for _ in 0..n {
        parts.push(match rng.random_range(0..10) {
            0..=2 => COMMANDS.choose(rng).unwrap().to_string(),
            3..=4 => vocab.choose(rng).unwrap().clone(),
            5..=6 => SHELL_BITS.choose(rng).unwrap().to_string(),
            7 => PATHS.choose(rng).unwrap().to_string(),
            8 => garbage(rng, 8),
            _ => rng.random_range(-5i64..2000).to_string(),
        });
    }
    let sep = if rng.random_bool(0.8) { " " } else { "" };
    parts.join(sep)
}

fn random_value(rng: &mut ChaCha8Rng, vocab: &[String]) -> Json {
    match rng.random_range(0..8) {
        0 => json!(rng.random_range(-100i64..100)),
        1 => Json::Null,
        2 => json!(true),
        3 => json!(["ls"]),
        4 => json!({"script": "ls"}),
        5 => json!(1.5),
        6 => json!(vocab.choose(rng).unwrap()),
        _ => json!(garbage(rng, 6)),
    }
}

#[test]
fn random_and_malformed_calls_never_panic() {
    let os = Os::default();
    let vocab = os.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let oversized = "x".repeat(MAX_ARGUMENT_CHARS + 1);
    let mut index = 0u64;
    let new_env = |index: &mut u64, rng: &mut ChaCha8Rng| -> OsEnv {
        *index += 1;
        let split = if rng.random_bool(0.5) {
            Split::Train
        } else {
            Split::Test
        };
        let mut env = os.episode(split, rng.random_range(1..=3), *index);
        env.reset();
        env
    };
    let mut env = new_env(&mut index, &mut rng);
    let (mut malformed, mut scripts, mut parsed) = (0, 0, 0);
    for n in 0..100_000 {
        if n % 40 == 0 {
            env = new_env(&mut index, &mut rng);
        }
        let kind = rng.random_range(0..12);
        let (call, bad) = match kind {
            0 => {
                let mut name = garbage(&mut rng, 12);
                if ["bash_action", "answer_action", "finish_action"].contains(&name.as_str()) {
                    name.push('x');
                }
                let args = [("script", random_value(&mut rng, &vocab))];
                (ToolCall::new(&name, args), true)
            }
            1 => (ToolCall::new("bash_action", []), true),
            2 => {
                let mut v = random_value(&mut rng, &vocab);
                if v.is_string() {
                    v = json!(7);
                }
                (ToolCall::new("bash_action", [("script", v)]), true)
            }
            3 => {
                let extra = vocab.choose(&mut rng).unwrap().clone();
                let extra = if extra == "script" {
                    "x".to_string()
                } else {
                    extra
                };
                let mut args = Map::new();
                args.insert("script".to_string(), json!("ls"));
                args.insert(extra, random_value(&mut rng, &vocab));
                (
                    ToolCall {
                        name: "bash_action".to_string(),
                        arguments: args,
                    },
                    true,
                )
            }
            4 => (bash(&format!("ls {oversized}")), true),
            5 => {
                let call = match rng.random_range(0..3) {
                    0 => ToolCall::new("answer_action", []),
                    1 => ToolCall::new("answer_action", [("answer", json!(3))]),
                    _ => ToolCall::new("answer_action", [("answer", json!(oversized))]),
                };
                (call, true)
            }
            6 => (
                ToolCall::new(
                    "finish_action",
                    [("answer", random_value(&mut rng, &vocab))],
                ),
                true,
            ),
            7 => {
                // Random text through the policy's call syntax.
                let text = match rng.random_range(0..4) {
                    0 => garbage(&mut rng, 30),
                    1 => format!(
                        "bash_action(script={})",
                        json!(random_script(&mut rng, &vocab))
                    ),
                    2 => format!("bash_action(script=\"{}\"", garbage(&mut rng, 10)),
                    _ => format!(
                        "{{\"name\": \"bash_action\", \"arguments\": {}}}",
                        garbage(&mut rng, 10)
                    ),
                };
                match parse_call(&text) {
                    Ok(call) => {
                        parsed += 1;
                        (call, false)
                    }
                    Err(message) => {
                        assert!(message.starts_with("Error"), "{message}");
                        continue;
                    }
                }
            }
            11 if rng.random_bool(0.2) => {
                let call = if rng.random_bool(0.5) {
                    ToolCall::new("finish_action", [])
                } else {
                    let word = vocab.choose(&mut rng).unwrap();
                    ToolCall::new("answer_action", [("answer", json!(word))])
                };
                (call, false)
            }
            _ => {
                scripts += 1;
                (bash(&random_script(&mut rng, &vocab)), false)
            }
        };
        let step = env.step(&call);
        assert!(step.reward == 0.0 || step.reward == 1.0);
        assert!(
            step.observation.chars().count() <= MAX_OUTPUT_CHARS + CUT_NOTE.len() + 1,
            "{}",
            step.observation.len()
        );
        if bad {
            malformed += 1;
            assert_eq!(step.status, Status::InvalidAction, "{call:?}");
            assert!(
                step.observation.starts_with("Error"),
                "{}",
                step.observation
            );
        } else if call.name == "bash_action"
            && call.arguments.len() == 1
            && let Some(Json::String(s)) = call.arguments.get("script")
            && s.chars().count() <= MAX_ARGUMENT_CHARS
        {
            // A well-formed script is run, whatever it does.
            assert_eq!(step.status, Status::Running);
        }
        assert!(env.shell().fs().bytes() <= fs::MAX_BYTES);
        assert!(env.shell().fs().len() <= fs::MAX_NODES);
        if n % 97 == 0 {
            assert_normalized(env.shell().fs());
        }
        if step.done() {
            env = new_env(&mut index, &mut rng);
        }
    }
    assert!(malformed > 40_000 && scripts > 20_000 && parsed > 1_000);
}

/// Runs the oracle or a seeded random agent and returns the serialized observations.
fn transcript(os: &Os, split: Split, d: u8, i: u64, agent_seed: Option<u64>) -> String {
    let mut env = os.instance(split, d, i);
    let reset = env.reset();
    let mut log = vec![serde_json::to_string(&reset).unwrap()];
    let vocab = os.vocabulary();
    let mut rng = agent_seed.map(ChaCha8Rng::seed_from_u64);
    for _ in 0..DEFAULT_MAX_TURNS {
        let call = match &mut rng {
            None => match env.oracle() {
                Some(c) => c,
                None => break,
            },
            Some(rng) => {
                if rng.random_bool(0.15) {
                    ToolCall::new("answer_action", [("answer", json!("7"))])
                } else {
                    bash(&random_script(rng, &vocab))
                }
            }
        };
        let step = env.step(&call);
        log.push(serde_json::to_string(&(&call, &step)).unwrap());
        if step.done() {
            break;
        }
    }
    log.join("\n")
}

#[test]
fn same_seed_gives_byte_identical_transcripts() {
    for d in 1..=3 {
        for split in SPLITS {
            for i in 0..20 {
                let (a, b) = (Os::new(3), Os::new(3));
                assert_eq!(
                    transcript(&a, split, d, i, None),
                    transcript(&b, split, d, i, None)
                );
                let seed = Some(100 + i);
                assert_eq!(
                    transcript(&a, split, d, i, seed),
                    transcript(&b, split, d, i, seed)
                );
            }
        }
    }
}

#[test]
fn clone_mid_episode_is_a_snapshot() {
    let os = Os::default();
    for d in 1..=3 {
        for i in 0..30 {
            let mut env = os.instance(Split::Train, d, i);
            env.reset();
            let first = env.oracle().unwrap();
            env.step(&first);
            env.step(&bash(
                "mkdir -p /home/user/tmpdir && echo hi > /home/user/tmpdir/a",
            ));
            let mut copy = env.box_clone();
            // The same calls give the same observations on the original and the clone.
            let calls = [
                bash("cat /home/user/tmpdir/a; ls /home/user"),
                bash("cd /tmp && pwd"),
                bash("pwd; rm -r /home/user/tmpdir; ls /home/user/tmpdir"),
            ];
            for c in &calls {
                assert_eq!(env.step(c), copy.step(c));
            }
            // Diverging: the copy deletes everything it can; the original still solves.
            copy.step(&bash("rm -rf /home /var /data /tmp /etc"));
            while let Some(c) = env.oracle() {
                env.step(&c);
            }
            assert!(env.success());
            assert_eq!(
                copy.step(&bash("ls /")).observation,
                "root",
                "the copy's file system is its own"
            );
        }
    }
}

#[test]
fn vocabulary_is_small_and_covers_the_tools() {
    let os = Os::default();
    let vocab: HashSet<String> = os.vocabulary().into_iter().collect();
    assert!(vocab.len() < 3000, "{}", vocab.len());
    let reset = os.instance(Split::Train, 1, 0).reset();
    assert_eq!(reset.tools.len(), 3);
    for tool in &reset.tools {
        assert_in_vocab(&vocab, &tool.name);
        assert_in_vocab(&vocab, &tool.description);
        for p in &tool.parameters {
            assert_in_vocab(&vocab, &p.name);
            assert_in_vocab(&vocab, &p.description);
        }
    }
}

#[test]
fn shell_behaves_like_bash() {
    let os = Os::default();
    let task = os.task(Split::Train, 1, 0);
    let mut sh = Shell::new(task.fs.clone());
    let cases: [(&str, &str); 18] = [
        ("pwd", "/home/user\n"),
        ("cd ../../../.. && pwd", "/\n"),
        ("cd ~ && pwd", "/home/user\n"),
        ("frobnicate -x", "bash: frobnicate: command not found\n"),
        (
            "ls -q",
            "ls: invalid option -- 'q'\nTry 'ls --help' for more information.\n",
        ),
        ("cat /etc/hostname", "sandbox\n"),
        (
            "ls /proc",
            "ls: cannot access '/proc': No such file or directory\n",
        ),
        ("echo \"a  b\" 'c $HOME' $HOME", "a  b c $HOME /home/user\n"),
        ("mkdir -p d/e && cd d/e && pwd", "/home/user/d/e\n"),
        (
            "cd /home/user; echo 3 > n; echo 1 >> n; sort -n n",
            "1\n3\n",
        ),
        ("grep -n 3 n; grep -v 3 n; grep -c -i X n", "1:3\n1\n0\n"),
        ("echo a b c | wc -w", "3\n"),
        (
            "touch t && chmod 700 t && ls -l t",
            "-rwx------ 1 user user 0 t\n",
        ),
        ("rm d", "rm: cannot remove 'd': Is a directory\n"),
        (
            "rm -r d && ls d",
            "ls: cannot access 'd': No such file or directory\n",
        ),
        ("find . -name 'n*' -type f", "./n\n"),
        (
            "cat /nope; echo $?; cd /tmp && echo $PWD $NOPE \"$NOPE\"x",
            "cat: /nope: No such file or directory\n1\n/tmp x\n",
        ),
        (
            "cd /data; echo n*.txt '*.txt' ${HOME}/q",
            "nums.txt *.txt /home/user/q\n",
        ),
    ];
    for (script, expected) in cases {
        assert_eq!(sh.run(script), expected, "{script}");
    }
}

#[test]
fn sandbox_never_reaches_the_host() {
    // A file on the host that the sandbox must not see or change.
    let host_dir = std::env::temp_dir();
    let host_file = host_dir.join(format!("agentry-os-test-{}", std::process::id()));
    let secret = "host-secret-4f1d9a";
    std::fs::write(&host_file, secret).unwrap();
    let host_path = host_file.to_string_lossy().to_string();
    let hostname = std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let os = Os::default();
    let vocab: HashSet<String> = os.vocabulary().into_iter().collect();
    let deep = "a/".repeat(200);
    let long_pipeline = vec!["cat /data/nums.txt"; 40].join(" | ");
    let big = vec!["/var/log/access.log"; 150].join(" ");
    let scripts: Vec<String> = vec![
        "rm -rf /".into(),
        "rm -rf /*; ls /".into(),
        "cat /etc/passwd".into(),
        "cd ../../../../../..; ls; cat etc/hostname".into(),
        "ls /proc; cat /proc/self/environ; cat /proc/cpuinfo".into(),
        format!("cat {host_path}"),
        format!("rm -f {host_path}"),
        format!("echo pwned > {host_path}"),
        format!("cp /etc/passwd {host_path}"),
        format!("ls {}", host_dir.to_string_lossy()),
        "cat ../../../../etc/hostname ../../../../../../etc/shadow".into(),
        "cat /dev/urandom; cat /dev/zero".into(),
        format!("mkdir -p {deep}"),
        long_pipeline,
        format!("cat {big}"),
        format!("cat {big} > /tmp/big; cat /tmp/big /tmp/big /tmp/big >> /tmp/big; wc -c /tmp/big"),
        "cat /data/nums.txt >> /data/nums.txt; cat /data/nums.txt >> /data/nums.txt; wc -l /data/nums.txt".into(),
        "echo \u{0}\u{1}\u{7f}\u{fffd}\u{feff} ÿþ > bin; cat bin | grep -c . ; sort bin | uniq -c".into(),
        "yes; python -c 'import os'; sudo ls; bash -c ls; sh; exec ls; source x".into(),
        "ls $(cat /etc/hostname)".into(),
        "echo `hostname`".into(),
        "grep -r root /".into(),
        "cp -r / /tmp; mv / /tmp; cp -r /home /home/user; mv /home /home/user/x".into(),
        "cd /tmp && cp -r . ..; mv . ..; rm -rf . ..".into(),
        "find / -name '*' | wc -l".into(),
        format!("grep {} /data/nums.txt", "a*".repeat(200)),
    ];
    for seed in 0..3 {
        let mut env = os.episode(Split::Train, 3, seed);
        env.reset();
        for script in &scripts {
            let step = env.step(&bash(script));
            assert_eq!(step.status, Status::Running, "{script}");
            assert!(
                step.observation.chars().count() <= MAX_OUTPUT_CHARS + CUT_NOTE.len() + 1,
                "{script}"
            );
            assert!(!step.observation.contains(secret), "{script}");
            if !hostname.is_empty() && !vocab.contains(&hostname) {
                assert!(!step.observation.contains(&hostname), "{script}");
            }
            assert!(env.shell().fs().bytes() <= fs::MAX_BYTES);
            assert!(env.shell().fs().len() <= fs::MAX_NODES);
            assert_normalized(env.shell().fs());
        }
    }
    // Huge outputs are cut with a note.
    let mut env = os.episode(Split::Train, 1, 0);
    env.reset();
    let step = env.step(&bash(&format!("cat {big}")));
    assert!(step.observation.ends_with(CUT_NOTE), "{}", step.observation);
    // Work per script is bounded: grep over hundreds of copies of a large file stops early.
    env.step(&bash(&format!("cat {big} > /tmp/b")));
    let many = vec!["/tmp/b"; 300].join(" ");
    let step = env.step(&bash(&format!("grep -c '{}' {many}", "x*".repeat(30))));
    assert!(
        step.observation.contains("the sandbox's limit"),
        "{}",
        step.observation
    );
    // Deep directories are bounded.
    let step = env.step(&bash(&format!("mkdir -p /x/{deep}")));
    assert!(
        step.observation.contains("File name too long"),
        "{}",
        step.observation
    );
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), secret);
    std::fs::remove_file(&host_file).unwrap();
}

#[test]
fn the_module_has_no_host_access() {
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/os")];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for forbidden in [
                "std::fs",
                "std::process",
                "std::net",
                "std::env",
                "std::{",
                "std::os",
                "std::io",
                "include_str!",
                "include_bytes!",
                "env!(",
                "Command::new",
            ] {
                assert!(
                    !text.contains(forbidden),
                    "{} uses {forbidden}",
                    path.display()
                );
            }
            files += 1;
        }
    }
    assert_eq!(files, 19);
}
