//! Tests of the DB task: the oracle solves every instance, splits are disjoint, random and
//! malformed calls never panic and get error observations, determinism, cloning mid-episode,
//! vocabulary coverage, and the SQL limits.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use agentry_env::db::sql::{self, MAX_ROWS_SHOWN};
use agentry_env::db::{Db, DbEnv, Goal, VERSION, canonical_content, split_of};
use agentry_env::tool::MAX_ARGUMENT_CHARS;
use agentry_env::{Environment, Split, Status, Step, TaskGenerator, ToolCall, parse_call};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

const SPLITS: [Split; 2] = [Split::Train, Split::Test];

fn sql_call(query: &str) -> ToolCall {
    ToolCall::new("execute_sql", [("query", json!(query))])
}

fn commit(answers: &[&str]) -> ToolCall {
    ToolCall::new("commit_final_answer", [("answers", json!(answers))])
}

/// Follows the oracle from reset; returns the calls with their steps.
fn run_oracle(env: &mut dyn Environment) -> Vec<(ToolCall, Step)> {
    let mut trace = Vec::new();
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        assert_ne!(
            step.status,
            Status::InvalidAction,
            "{c:?}: {}",
            step.observation
        );
        trace.push((c, step));
        assert!(trace.len() <= 4, "oracle does not end");
    }
    trace
}

fn assert_in_vocab(vocab: &HashSet<String>, text: &str) {
    for piece in agentry_env::pieces::words(text) {
        assert!(
            vocab.contains(piece),
            "`{piece}` of `{text}` is not in the vocabulary"
        );
    }
}

#[test]
fn oracle_solves_1000_instances_per_split_and_vocabulary_covers_its_path() {
    let db = Db::default();
    let vocab: HashSet<String> = db.vocabulary().into_iter().collect();
    let mut writes = 0;
    for split in SPLITS {
        for i in 0..1000u64 {
            let d = (i % 3) as u8 + 1;
            let mut env = db.episode(split, d, i / 3);
            let reset = env.reset();
            assert_in_vocab(&vocab, &reset.instruction);
            let trace = run_oracle(&mut env);
            assert_eq!(trace.len(), 2, "{}", reset.instruction);
            for (call, step) in &trace {
                for value in call.arguments.values() {
                    match value {
                        Value::String(s) => assert_in_vocab(&vocab, s),
                        Value::Array(items) => items
                            .iter()
                            .for_each(|v| assert_in_vocab(&vocab, v.as_str().unwrap())),
                        other => panic!("unexpected argument {other}"),
                    }
                }
                assert_in_vocab(&vocab, &step.observation);
            }
            let (_, last) = trace.last().unwrap();
            assert_eq!(last.status, Status::Completed);
            assert_eq!(last.reward, 1.0, "{}", reset.instruction);
            assert!(env.success());
            assert!(env.oracle().is_none());
            if matches!(env.instance().question.goal, Goal::Write(_)) {
                writes += 1;
            }
        }
    }
    assert!(writes > 100, "only {writes} write tasks");
    assert!(vocab.len() < 3000, "vocabulary of {}", vocab.len());
}

#[test]
fn other_seeds_are_solvable_too() {
    for seed in [0, 7, 12345] {
        let db = Db::new(seed);
        for d in 1..=3 {
            for split in SPLITS {
                for i in 0..30 {
                    let mut env = db.instance(split, d, i);
                    env.reset();
                    run_oracle(env.as_mut());
                    assert!(env.success());
                }
            }
        }
    }
}

#[test]
fn splits_are_disjoint() {
    let db = Db::default();
    for d in 1..=3 {
        let mut sets: Vec<HashSet<String>> = Vec::new();
        for split in SPLITS {
            let mut set = HashSet::new();
            for i in 0..1000 {
                let (instance, _) = db.build(split, d, i);
                let content = canonical_content(&instance.script, &instance.question);
                assert_eq!(split_of(&content), split);
                set.insert(content);
            }
            // Distinct draws almost never give the same instance.
            assert!(set.len() > 990, "{} distinct of 1000", set.len());
            sets.push(set);
        }
        assert!(sets[0].is_disjoint(&sets[1]), "difficulty {d}");
    }
}

#[test]
fn same_arguments_same_instance_and_difficulty_grows() {
    let a = Db::new(5);
    let b = Db::new(5);
    assert_eq!(a.version(), VERSION);
    assert_eq!(a.vocabulary(), b.vocabulary());
    for d in 1..=3 {
        for split in SPLITS {
            for i in [0, 1, 17, 1_000_003] {
                let mut x = a.instance(split, d, i);
                let mut y = b.instance(split, d, i);
                assert_eq!(x.reset(), y.reset());
                assert_eq!(x.oracle(), y.oracle());
            }
        }
    }
    // Difficulty 1 never joins or writes; difficulty 3 always joins or writes.
    let db = Db::default();
    for i in 0..200 {
        let easy = db.episode(Split::Train, 1, i);
        let q = &easy.instance().question;
        assert!(!q.sql.contains("JOIN") && !q.sql.contains("GROUP") && q.goal == Goal::Answer);
        let hard = db.episode(Split::Train, 3, i);
        let q = &hard.instance().question;
        assert!(
            q.sql.contains("JOIN") || matches!(q.goal, Goal::Write(_)),
            "{}",
            q.sql
        );
    }
}

#[test]
fn wrong_answers_and_wrong_changes_score_zero() {
    let db = Db::default();
    let mut answered = false;
    let mut written = false;
    for i in 0..200 {
        let mut env = db.episode(Split::Train, 3, i);
        env.reset();
        match env.instance().question.goal {
            Goal::Answer if !answered => {
                // The right values plus one more are wrong; order and number format are not.
                let mut answers = env.instance().answers.clone();
                let mut copy = env.box_clone();
                answers.reverse();
                let padded: Vec<String> = answers.iter().map(|a| format!(" {a} ")).collect();
                let step = copy.step(&ToolCall::new(
                    "commit_final_answer",
                    [("answers", json!(padded))],
                ));
                assert_eq!((step.reward, step.status), (1.0, Status::Completed));
                answers.push("Lyon".to_string());
                let step = env.step(&ToolCall::new(
                    "commit_final_answer",
                    [("answers", json!(answers))],
                ));
                assert_eq!((step.reward, step.status), (0.0, Status::Completed));
                assert!(!env.success());
                assert!(env.oracle().is_none());
                let again = env.step(&commit(&[]));
                assert_eq!((again.reward, again.status), (0.0, Status::Completed));
                answered = true;
            }
            Goal::Write(_) if !written && env.instance().question.sql.contains(" + ") => {
                // Committing without the change fails; so does the increase applied twice.
                let mut copy = env.box_clone();
                assert_eq!(copy.step(&commit(&[])).reward, 0.0);
                let gold = env.oracle().unwrap();
                assert_eq!(env.step(&gold).status, Status::Running);
                assert_eq!(env.step(&gold).status, Status::Running);
                assert_eq!(env.oracle(), Some(commit(&[])));
                assert_eq!(env.step(&commit(&[])).reward, 0.0);
                written = true;
            }
            _ => {}
        }
    }
    assert!(answered && written);
}

#[test]
fn numbers_are_normalized() {
    assert_eq!(sql::number(85.0), "85");
    assert_eq!(sql::number(85.3333), "85.33");
    assert_eq!(sql::number(0.5), "0.5");
    assert_eq!(sql::number(-2.0), "-2");
    assert_eq!(sql::normalize(" 85.0 "), "85");
    assert_eq!(sql::normalize("85.00"), "85");
    assert_eq!(sql::normalize("Ava Stone "), "Ava Stone");
    assert_eq!(sql::normalize("nan"), "nan");
    assert_eq!(sql::normalize("inf"), "inf");
    assert_eq!(
        sql::canonical(&["2".to_string(), "1.0".to_string()]),
        ["1", "2"]
    );
}

/// A fresh difficulty-1 episode, reset.
fn fresh() -> DbEnv {
    let mut env = Db::default().episode(Split::Train, 1, 0);
    env.reset();
    env
}

#[test]
fn statements_are_limited() {
    let mut env = fresh();
    let table = env.instance().data.domain.tables[0].name;
    let refused: &[(&str, &str)] = &[
        ("", "Error: the query is empty."),
        ("  -- nothing", "Error: the query is empty."),
        (
            "SELECT 1; SELECT 2",
            "Error: give one SQL statement per call.",
        ),
        (
            "ATTACH DATABASE '/tmp/db-escape.sqlite' AS x",
            "Error: this statement is not allowed",
        ),
        ("VACUUM INTO '/tmp/db-escape.sqlite'", "Error:"),
        (
            "PRAGMA table_info(employees)",
            "Error: this statement is not allowed",
        ),
        ("BEGIN", "Error: this statement is not allowed"),
        ("SAVEPOINT a", "Error: this statement is not allowed"),
        (
            "CREATE TEMP TABLE t(x)",
            "Error: this statement is not allowed",
        ),
        (
            "SELECT load_extension('x')",
            "Error: not authorized to use function: load_extension",
        ),
        ("SELECT * FROM nowhere", "Error: no such table: nowhere"),
        ("SELEC 1", "Error: near \"SELEC\": syntax error"),
        ("SELECT zeroblob(1000000)", "Error: string or blob too big"),
    ];
    for (query, expected) in refused {
        let step = env.step(&sql_call(query));
        assert_eq!(step.status, Status::InvalidAction, "{query}");
        assert!(
            step.observation.starts_with(expected),
            "{query}: {}",
            step.observation
        );
    }
    assert!(!std::path::Path::new("/tmp/db-escape.sqlite").exists());
    // A recursive CTE that never ends is stopped quickly, at the same point every time.
    for _ in 0..2 {
        let start = Instant::now();
        let step = env.step(&sql_call(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c",
        ));
        assert!(start.elapsed() < Duration::from_secs(3));
        assert_eq!(step.status, Status::InvalidAction);
        assert_eq!(
            step.observation,
            "Error: the query was stopped after 10000000 steps; it runs too long."
        );
    }
    // Endless rows are cut, and at most MAX_ROWS_SHOWN are shown.
    let step = env.step(&sql_call(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
    ));
    assert_eq!(step.status, Status::Running);
    assert_eq!(step.observation.lines().count(), MAX_ROWS_SHOWN + 2);
    assert!(
        step.observation
            .ends_with("(more than 10000 rows, 20 shown)"),
        "{}",
        step.observation
    );
    let step = env.step(&sql_call(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 45) SELECT x, 'a' AS y FROM c",
    ));
    assert!(step.observation.starts_with("x | y\n1 | a\n2 | a\n"));
    assert!(step.observation.ends_with("\n20 | a\n(45 rows, 20 shown)"));
    // Writes report the rows they changed; the table is still there.
    let step = env.step(&sql_call(&format!("DELETE FROM {table} WHERE id < 0")));
    assert_eq!(step.observation, "Query OK, 0 rows affected.");
    let step = env.step(&sql_call(&format!(
        "CREATE TABLE notes AS SELECT id FROM {table}"
    )));
    assert_eq!(step.status, Status::Running, "{}", step.observation);
    let step = env.step(&sql_call("SELECT printf('%.200c', 'x') AS long"));
    assert_eq!(step.observation.lines().nth(1).unwrap().len(), 63);
}

#[test]
fn reset_restores_the_database() {
    let mut env = fresh();
    // The last table is referred to by none, so it can be dropped.
    let table = env.instance().data.domain.tables.last().unwrap().name;
    let count = format!("SELECT COUNT(*) FROM {table}");
    let before = env.step(&sql_call(&count)).observation;
    env.step(&sql_call(&format!("DROP TABLE {table}")));
    assert_eq!(env.step(&sql_call(&count)).status, Status::InvalidAction);
    env.reset();
    assert_eq!(env.step(&sql_call(&count)).observation, before);
    run_oracle(&mut env);
    assert!(env.success());
}

#[test]
fn clone_mid_episode_copies_the_database() {
    let db = Db::default();
    let mut checked = 0;
    for i in 0..40 {
        let mut env = db.episode(Split::Test, 3, i);
        env.reset();
        let Goal::Write(t) = env.instance().question.goal else {
            continue;
        };
        let table = env.instance().data.domain.tables[t].name;
        let gold = env.oracle().unwrap();
        env.step(&gold);
        let mut copy = env.box_clone();
        // Continuing both with the same calls gives identical observations.
        let dump = sql_call(&format!("SELECT * FROM {table} ORDER BY id"));
        for c in [&dump, &sql_call(&format!("SELECT COUNT(*) FROM {table}"))] {
            assert_eq!(env.step(c), copy.step(c));
        }
        assert_eq!(env.oracle(), copy.oracle());
        // Then they diverge: the copy adds a row, the original is untouched and solves.
        let step = copy.step(&sql_call(&format!(
            "INSERT INTO {table} (id) VALUES (1000)"
        )));
        assert_eq!(step.status, Status::Running, "{}", step.observation);
        assert_ne!(env.step(&dump), copy.step(&dump));
        assert_eq!(copy.step(&commit(&[])).reward, 0.0);
        run_oracle(&mut env);
        assert!(env.success());
        // A clone before any write, and a clone of a finished episode.
        let mut fresh = db.episode(Split::Test, 3, i);
        fresh.reset();
        let mut early = fresh.box_clone();
        run_oracle(early.as_mut());
        assert!(early.success());
        let done = env.box_clone();
        assert!(done.success() && done.oracle().is_none());
        checked += 1;
    }
    assert!(checked >= 5, "{checked}");
}

/// Plays one episode: the oracle with probability `p_oracle` per turn, else a random call;
/// returns the transcript.
fn play(db: &Db, split: Split, d: u8, index: u64, rng: &mut ChaCha8Rng) -> Vec<(ToolCall, Step)> {
    let mut env = db.instance(split, d, index);
    env.reset();
    let vocab = db.vocabulary();
    let mut trace = Vec::new();
    for _ in 0..8 {
        let c = match env.oracle() {
            Some(o) if rng.random_bool(0.5) => o,
            _ => random_call(rng, &vocab, &[]).0,
        };
        let step = env.step(&c);
        let done = step.done();
        trace.push((c, step));
        if done {
            break;
        }
    }
    trace
}

#[test]
fn same_seed_same_transcripts() {
    let run = || {
        let db = Db::new(3);
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let mut out = Vec::new();
        for i in 0..30 {
            let d = (i % 3) as u8 + 1;
            let mut env = db.instance(Split::Train, d, i);
            let reset = env.reset();
            out.push(serde_json::to_string(&reset).unwrap());
            for (c, step) in run_oracle(env.as_mut()) {
                out.push(serde_json::to_string(&(c, step)).unwrap());
            }
            for (c, step) in play(&db, Split::Test, d, i, &mut rng) {
                out.push(serde_json::to_string(&(c, step)).unwrap());
            }
        }
        out.join("\n")
    };
    let a = run();
    assert_eq!(a, run());
    assert!(a.len() > 10_000);
}

/// A random call; the flag says whether it is malformed by construction (so it must get an
/// error observation).
fn random_call(rng: &mut ChaCha8Rng, vocab: &[String], queries: &[String]) -> (ToolCall, bool) {
    let word = |rng: &mut ChaCha8Rng| vocab.choose(rng).unwrap().clone();
    let garbage = |rng: &mut ChaCha8Rng| {
        let n = rng.random_range(0..40);
        (0..n)
            .map(|_| {
                if rng.random_bool(0.2) {
                    char::from_u32(rng.random_range(0..0x3000)).unwrap_or('?')
                } else {
                    char::from(*b"()'\";,*=<>|-+ \n\\%_.#aZ09".choose(rng).unwrap())
                }
            })
            .collect::<String>()
    };
    let sentence = |rng: &mut ChaCha8Rng| {
        let n = rng.random_range(1..12);
        (0..n).map(|_| word(rng)).collect::<Vec<_>>().join(" ")
    };
    let string = |rng: &mut ChaCha8Rng| -> String {
        match rng.random_range(0..4) {
            0 => word(rng),
            1 => sentence(rng),
            2 => garbage(rng),
            _ => queries.choose(rng).cloned().unwrap_or_default(),
        }
    };
    let good_value = |rng: &mut ChaCha8Rng, name: &str| -> Value {
        if name == "query" {
            json!(string(rng))
        } else {
            let n = rng.random_range(0..4);
            json!((0..n).map(|_| string(rng)).collect::<Vec<_>>())
        }
    };
    // Commits are rarer, so episodes last a while.
    let name = match rng.random_range(0..16) {
        0 => garbage(rng),
        1 => word(rng),
        2..15 => "execute_sql".to_string(),
        _ => "commit_final_answer".to_string(),
    };
    let param = match name.as_str() {
        "execute_sql" => Some("query"),
        "commit_final_answer" => Some("answers"),
        _ => None,
    };
    let mut arguments = Map::new();
    let mut malformed = param.is_none();
    match (param, rng.random_range(0..10)) {
        (Some(_), 0) => {
            // Missing.
            malformed = true;
            if rng.random_bool(0.5) {
                arguments.insert(word(rng), json!(string(rng)));
            }
        }
        (Some(p), 1) => {
            // Mistyped.
            malformed = true;
            let bad = match rng.random_range(0..5) {
                0 => json!(rng.random::<i32>()),
                1 => Value::Null,
                2 => json!(true),
                3 if p == "query" => json!([string(rng)]),
                3 => json!(string(rng)),
                _ => json!({"a": 1}),
            };
            arguments.insert(p.to_string(), bad);
        }
        (Some(p), 2) => {
            // Oversized.
            malformed = true;
            let long = "x".repeat(MAX_ARGUMENT_CHARS + 1);
            let value = if p == "query" {
                json!(long)
            } else {
                json!([long])
            };
            arguments.insert(p.to_string(), value);
        }
        (Some(p), 3) => {
            // Extra.
            malformed = true;
            arguments.insert(p.to_string(), good_value(rng, p));
            arguments.insert(format!("{}x", word(rng)), json!(string(rng)));
        }
        (Some(p), _) => {
            arguments.insert(p.to_string(), good_value(rng, p));
        }
        (None, _) => {
            for _ in 0..rng.random_range(0..3) {
                arguments.insert(word(rng), good_value(rng, "query"));
            }
        }
    }
    (ToolCall { name, arguments }, malformed)
}

#[test]
fn random_and_malformed_calls_get_error_observations() {
    let db = Db::new(9);
    let vocab = db.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut calls = 0;
    let mut errors = 0;
    let mut index = 0;
    let start = Instant::now();
    while calls < 100_000 {
        let d = (index % 3) as u8 + 1;
        let mut env = db.episode(Split::Train, d, index);
        index += 1;
        env.reset();
        let tables: Vec<&str> = env
            .instance()
            .data
            .domain
            .tables
            .iter()
            .map(|t| t.name)
            .collect();
        let mut queries = vec![env.instance().question.sql.clone()];
        for t in &tables {
            queries.push(format!("SELECT * FROM {t}"));
            queries.push(format!("SELECT COUNT(*) FROM {t} WHERE id > 3"));
            queries.push(format!("DELETE FROM {t} WHERE id = 2"));
            queries.push(format!("UPDATE {t} SET id = id + 100 WHERE id = 1"));
        }
        for _ in 0..60 {
            // Text through the parser, as the runtime sees it.
            let (c, malformed) = if rng.random_bool(0.2) {
                let text = match rng.random_range(0..3) {
                    0 => format!(
                        "execute_sql(query={})",
                        json!(queries.choose(&mut rng).unwrap())
                    ),
                    1 => format!(
                        "{}({}",
                        vocab.choose(&mut rng).unwrap(),
                        vocab.choose(&mut rng).unwrap()
                    ),
                    _ => {
                        let (c, _) = random_call(&mut rng, &vocab, &queries);
                        serde_json::to_string(&c).unwrap()
                    }
                };
                match parse_call(&text) {
                    Ok(c) => (c, false),
                    Err(message) => {
                        assert!(message.starts_with("Error"), "{message}");
                        calls += 1;
                        continue;
                    }
                }
            } else {
                random_call(&mut rng, &vocab, &queries)
            };
            let step = env.step(&c);
            calls += 1;
            assert!(
                matches!(
                    step.status,
                    Status::Running | Status::InvalidAction | Status::Completed
                ),
                "{c:?}: {step:?}"
            );
            assert_eq!(
                step.status == Status::InvalidAction,
                step.observation.starts_with("Error"),
                "{c:?}: {}",
                step.observation
            );
            if malformed {
                assert_eq!(step.status, Status::InvalidAction, "{c:?}");
                errors += 1;
            }
            assert!(step.reward == 0.0 || step.reward == 1.0);
            assert!(step.observation.chars().count() < 20_000);
            if step.done() {
                break;
            }
        }
    }
    assert!(errors > 20_000, "{errors}");
    eprintln!(
        "{calls} calls over {index} instances in {:?}",
        start.elapsed()
    );
}

#[test]
fn tools_are_in_the_vocabulary() {
    let db = Db::default();
    let vocab: HashSet<String> = db.vocabulary().into_iter().collect();
    let mut env = db.instance(Split::Train, 1, 0);
    let reset = env.reset();
    let names: BTreeSet<&str> = reset.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["commit_final_answer", "execute_sql"])
    );
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
fn print_examples() {
    let db = Db::default();
    // Instances 0 and 1 of each difficulty, and the first join question of difficulty 3.
    let join = (0..)
        .find(|&i| db.episode(Split::Train, 3, i).instance().question.goal == Goal::Answer)
        .unwrap();
    for (d, i) in [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (3, join)] {
        let mut env = db.instance(Split::Train, d, i);
        let reset = env.reset();
        println!("d{d} i{i}: {}", reset.instruction);
        for (c, step) in run_oracle(env.as_mut()) {
            println!(
                "  {} -> {} [{}]",
                agentry_env::render_call(&c),
                step.observation,
                step.reward
            );
        }
    }
}

#[test]
fn an_endless_view_in_place_of_the_table_cannot_hang_the_commit() {
    let db = Db::default();
    let mut env = (0..200)
        .map(|i| db.episode(Split::Train, 3, i))
        .find(|e| {
            let tables = e.instance().data.domain.tables.len();
            e.instance().question.goal == Goal::Write(tables - 1)
        })
        .unwrap();
    env.reset();
    let Goal::Write(t) = env.instance().question.goal else {
        unreachable!()
    };
    let table = env.instance().data.domain.tables[t].name;
    for query in [
        format!("DROP TABLE {table}"),
        format!(
            "CREATE VIEW {table} AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
        ),
    ] {
        let step = env.step(&sql_call(&query));
        assert_eq!(
            step.status,
            Status::Running,
            "{query}: {}",
            step.observation
        );
    }
    let start = Instant::now();
    let step = env.step(&commit(&[]));
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!((step.reward, step.status), (0.0, Status::Completed));
}

#[test]
fn oracle_recovers_after_detours() {
    let db = Db::default();
    for d in 1..=3 {
        for i in 0..50 {
            let mut env = db.episode(Split::Test, d, i);
            env.reset();
            let table = env.instance().data.domain.tables[0].name;
            // Detours: a read, a failing statement, a malformed call, an unknown tool.
            let detours = [
                sql_call(&format!("SELECT * FROM {table}")),
                sql_call("SELECT nothing FROM nowhere"),
                ToolCall::new("execute_sql", [("sql", json!("SELECT 1"))]),
                ToolCall::new("run_sql", [("query", json!("SELECT 1"))]),
            ];
            for c in &detours {
                env.step(c);
            }
            let gold = env.oracle().unwrap();
            env.step(&gold);
            // And again between the gold statement and the commit.
            for c in &detours {
                env.step(c);
            }
            run_oracle(&mut env);
            assert!(env.success(), "{}", env.instance().instruction);
        }
    }
}
