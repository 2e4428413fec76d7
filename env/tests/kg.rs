//! Tests of the KG task: oracle solves everything, splits, determinism, error observations,
//! robustness to random calls, and cloning mid-episode.

use std::collections::{BTreeSet, HashSet};

use agentry_env::kg::{Kg, KgEnv, STANDARD_WORLD_SEED, VERSION, Value};
use agentry_env::{Environment, Split, Status, TaskGenerator, ToolCall};
use proptest::prelude::*;
use serde_json::{Map, Value as Json, json};

const SPLITS: [Split; 2] = [Split::Train, Split::Test];

fn call(name: &str, args: &[(&str, Json)]) -> ToolCall {
    ToolCall::new(name, args.iter().map(|(k, v)| (*k, v.clone())))
}

/// Follows the oracle from reset; returns the calls' observations and the last step.
fn run_oracle(env: &mut dyn Environment) -> (Vec<(ToolCall, String)>, f32, Status) {
    env.reset();
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
        trace.push((c, step.observation));
        last = (step.reward, step.status);
        assert!(trace.len() <= 8, "oracle does not end");
    }
    (trace, last.0, last.1)
}

fn vocab(kg: &Kg) -> HashSet<String> {
    kg.vocabulary().into_iter().collect()
}

fn assert_in_vocab(vocab: &HashSet<String>, text: &str) {
    // Words as the tokenizer sees them: `:` and `,` stand apart from the names they follow.
    for w in text
        .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
        .filter(|w| !w.is_empty())
    {
        assert!(
            vocab.contains(w),
            "`{w}` of `{text}` is not in the vocabulary"
        );
    }
}

#[test]
fn oracle_solves_every_instance() {
    let kg = Kg::default();
    let vocab = vocab(&kg);
    let mut total = 0;
    for d in 1..=3 {
        for split in SPLITS {
            let n = kg.questions(split, d).len();
            assert!(n > 0);
            for i in 0..n as u64 {
                let mut env = kg.episode(split, d, i);
                let reset = env.reset();
                assert_in_vocab(&vocab, &reset.instruction);
                let (trace, reward, status) = run_oracle(&mut env);
                for (_, obs) in &trace {
                    assert_in_vocab(&vocab, obs);
                }
                assert_eq!(status, Status::Completed);
                assert_eq!(reward, 1.0, "{}", reset.instruction);
                assert!(env.success());
                assert_eq!(env.f1(), 1.0);
                assert_eq!(trace.len(), env.question().program().len() + 1);
                assert!(env.oracle().is_none());
            }
            println!("difficulty {d} {split:?}: {n} questions, all solved by the oracle");
            total += n;
        }
    }
    println!("total {total}, vocabulary {}", vocab.len());
}

#[test]
fn other_worlds_are_solvable_too() {
    for seed in [0, 2, 99] {
        let kg = Kg::new(seed);
        for d in 1..=3 {
            for split in SPLITS {
                for i in 0..kg.questions(split, d).len().min(200) as u64 {
                    let mut env = kg.instance(split, d, i);
                    let (_, reward, _) = run_oracle(env.as_mut());
                    assert_eq!(reward, 1.0);
                }
            }
        }
    }
}

#[test]
fn splits_are_disjoint_and_about_80_20() {
    let kg = Kg::default();
    for d in 1..=3 {
        let train: HashSet<&str> = kg
            .questions(Split::Train, d)
            .iter()
            .map(|q| q.text())
            .collect();
        let test: HashSet<&str> = kg
            .questions(Split::Test, d)
            .iter()
            .map(|q| q.text())
            .collect();
        assert_eq!(
            train.len(),
            kg.questions(Split::Train, d).len(),
            "duplicates"
        );
        assert_eq!(test.len(), kg.questions(Split::Test, d).len(), "duplicates");
        assert!(train.is_disjoint(&test));
        let share = test.len() as f64 / (train.len() + test.len()) as f64;
        assert!((0.14..0.26).contains(&share), "test share {share}");
    }
}

#[test]
fn same_arguments_same_instance() {
    let a = Kg::new(5);
    let b = Kg::new(5);
    assert_eq!(a.vocabulary(), b.vocabulary());
    assert_eq!(a.version(), VERSION);
    for d in 1..=3 {
        for split in SPLITS {
            for i in [0, 1, 17, 1_000_003] {
                let mut x = a.instance(split, d, i);
                let mut y = b.instance(split, d, i);
                assert_eq!(x.reset(), y.reset());
                assert_eq!(x.oracle(), y.oracle());
            }
            let n = a.questions(split, d).len() as u64;
            assert_eq!(
                a.instance(split, d, 3).reset(),
                a.instance(split, d, 3 + n).reset()
            );
        }
    }
    assert_ne!(Kg::new(6).vocabulary(), a.vocabulary());
}

#[test]
fn bad_calls_are_error_observations() {
    let kg = Kg::default();
    // A one-hop question, so its entity is known.
    let mut env = kg.episode(Split::Train, 1, 0);
    let reset = env.reset();
    let entity = kg.world().name(env.question().entities()[0]).to_string();
    let other = kg
        .world()
        .names()
        .iter()
        .find(|n| **n != entity)
        .unwrap()
        .clone();
    let long = "x".repeat(5000);
    let vocab = vocab(&kg);
    // Make #0 a set and #1 a count.
    let first = env.oracle().unwrap();
    assert_eq!(env.step(&first).status, Status::Running);
    assert_eq!(
        env.step(&call("count", &[("variable", json!("#0"))]))
            .status,
        Status::Running
    );
    let table: Vec<(ToolCall, &str)> = vec![
        (
            call("fly", &[("variable", json!("#0"))]),
            "error unknown tool",
        ),
        (
            call("get_neighbors", &[("variable", json!("#0"))]),
            "error missing argument relation",
        ),
        (call("count", &[]), "error missing argument variable"),
        (
            call("count", &[("variable", json!(3))]),
            "error argument variable must be a string",
        ),
        (
            call("count", &[("variable", json!(["#0"]))]),
            "error argument variable must be a string",
        ),
        (
            call("count", &[("variable", json!(long))]),
            "error argument variable is too long",
        ),
        (
            call("count", &[("variable", json!("#0")), ("extra", json!("x"))]),
            "error unexpected argument",
        ),
        (
            call("count", &[("variable", json!("#9"))]),
            "error unknown variable",
        ),
        (
            call("count", &[("variable", json!("#"))]),
            "error unknown variable",
        ),
        (
            call("count", &[("variable", json!("#-1"))]),
            "error unknown variable",
        ),
        (
            call("count", &[("variable", json!("#99999999999999999999999"))]),
            "error unknown variable",
        ),
        (
            call("count", &[("variable", json!("zzqx"))]),
            "error unknown entity",
        ),
        (
            call("count", &[("variable", json!(""))]),
            "error unknown entity",
        ),
        (
            call("count", &[("variable", json!(other))]),
            "error entity not in the question",
        ),
        (
            call("count", &[("variable", json!("#1"))]),
            "error variable is a count",
        ),
        (
            call("get_relations", &[("variable", json!("#1"))]),
            "error variable is a count",
        ),
        (
            call(
                "get_neighbors",
                &[("variable", json!(entity)), ("relation", json!("likes"))],
            ),
            "error unknown relation",
        ),
        (
            call(
                "argmax",
                &[("variable", json!("#0")), ("attribute", json!("weight"))],
            ),
            "error unknown attribute",
        ),
        (
            call(
                "intersection",
                &[("variable1", json!("#0")), ("variable2", json!(entity))],
            ),
            "error cannot intersect",
        ),
    ];
    for (c, expected) in &table {
        let step = env.step(c);
        assert_eq!(step.status, Status::InvalidAction, "{c:?}");
        assert_eq!(step.reward, 0.0);
        assert!(
            step.observation.starts_with(expected),
            "{c:?}: {}",
            step.observation
        );
        assert_in_vocab(&vocab, &step.observation);
    }
    // A relation of another type, and an attribute of another type.
    let ty = kg.world().entity_type(env.question().entities()[0]);
    let wrong = agentry_env::kg::Relation::ALL
        .into_iter()
        .find(|r| r.source() != ty)
        .unwrap();
    let step = env.step(&call(
        "get_neighbors",
        &[
            ("variable", json!(entity)),
            ("relation", json!(wrong.name())),
        ],
    ));
    assert_eq!(
        step.observation,
        format!("error {} has no relation {}", ty.name(), wrong.name())
    );
    assert_eq!(step.status, Status::InvalidAction);
    let wrong = agentry_env::kg::Attribute::ALL
        .into_iter()
        .find(|a| a.owner() != ty)
        .unwrap();
    let step = env.step(&call(
        "argmin",
        &[
            ("variable", json!(entity)),
            ("attribute", json!(wrong.name())),
        ],
    ));
    assert_eq!(
        step.observation,
        format!("error {} has no attribute {}", ty.name(), wrong.name())
    );
    // The episode goes on: the oracle still solves it.
    assert_eq!(env.variables().len(), 2);
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        assert_ne!(step.status, Status::InvalidAction, "{}", step.observation);
    }
    assert!(env.success(), "{}", reset.instruction);
    // After the end, every call is refused and the episode stays over.
    let step = env.step(&first);
    assert_eq!(step.status, Status::Completed);
    assert_eq!(step.reward, 0.0);
}

#[test]
fn wrong_answers_score_zero_with_f1() {
    let kg = Kg::default();
    // Find a question whose answer has several entities; answer with one of the two hops wrong.
    let q = (0..kg.questions(Split::Train, 1).len() as u64)
        .map(|i| kg.episode(Split::Train, 1, i))
        .find(|e| matches!(e.question().answer(), Value::Set(_, s) if s.len() >= 2))
        .unwrap();
    let mut env = q.clone();
    env.reset();
    let entity = kg.world().name(env.question().entities()[0]).to_string();
    // The question entity itself: wrong type or not in the answer.
    let step = env.step(&call("final_answer", &[("variable", json!(entity))]));
    assert_eq!(step.status, Status::Completed);
    assert_eq!(step.reward, 0.0);
    assert!(!env.success());
    assert_eq!(env.f1(), 0.0);
    assert!(env.oracle().is_none());
    // A count answer to a set question.
    let mut env = q.clone();
    env.reset();
    let first = env.oracle().unwrap();
    env.step(&first);
    env.step(&call("count", &[("variable", json!("#0"))]));
    let step = env.step(&call("final_answer", &[("variable", json!("#1"))]));
    assert_eq!((step.reward, step.status), (0.0, Status::Completed));
}

#[test]
fn partial_answers_get_partial_f1() {
    let kg = Kg::default();
    // "which films did X and Y both act in": answering X's films is a superset of the answer.
    for i in 0..kg.questions(Split::Train, 3).len() as u64 {
        let mut env = kg.episode(Split::Train, 3, i);
        if !env.question().text().starts_with("which films did") {
            continue;
        }
        env.reset();
        let first = env.oracle().unwrap();
        env.step(&first);
        let (Value::Set(_, given), Value::Set(_, answer)) =
            (env.variables()[0].clone(), env.question().answer().clone())
        else {
            continue;
        };
        if given == answer {
            continue;
        }
        env.step(&call("final_answer", &[("variable", json!("#0"))]));
        let precision = answer.len() as f32 / given.len() as f32;
        let expected = 2.0 * precision / (precision + 1.0);
        assert!((env.f1() - expected).abs() < 1e-6);
        assert!(!env.success());
        return;
    }
    panic!("no suitable question");
}

#[test]
fn oracle_recovers_after_detours() {
    let kg = Kg::default();
    for d in 1..=3 {
        for i in 0..50 {
            let mut env = kg.episode(Split::Test, d, i);
            env.reset();
            let entity = kg.world().name(env.question().entities()[0]).to_string();
            // Detours: a listing, a useless variable, an error.
            env.step(&call("get_relations", &[("variable", json!(entity))]));
            env.step(&call("count", &[("variable", json!(entity))]));
            env.step(&call("count", &[("variable", json!("#7"))]));
            let mut steps = 0;
            while let Some(c) = env.oracle() {
                // Take a detour in the middle too.
                if steps == 1 {
                    env.step(&call("get_attributes", &[("variable", json!("#0"))]));
                    env.step(&call("count", &[("variable", json!("#0"))]));
                }
                let step = env.step(&c);
                assert_ne!(step.status, Status::InvalidAction, "{}", step.observation);
                steps += 1;
            }
            assert!(env.success(), "{}", env.question().text());
        }
    }
}

#[test]
fn clone_mid_episode_then_diverge() {
    let kg = Kg::default();
    let mut env = kg.instance(Split::Train, 2, 4);
    env.reset();
    let first = env.oracle().unwrap();
    env.step(&first);
    let mut copy = env.box_clone();
    // The copy gives a wrong answer, the original finishes correctly.
    let bad = copy.step(&call("final_answer", &[("variable", json!("#0"))]));
    assert_eq!(bad.status, Status::Completed);
    assert!(copy.oracle().is_none());
    while let Some(c) = env.oracle() {
        env.step(&c);
    }
    assert!(env.success());
    assert_eq!(bad.reward, 0.0, "the copy answered the intermediate step");
    assert!(!copy.success());
    // A clone of the concrete type sees the same state.
    let mut concrete: KgEnv = kg.episode(Split::Train, 2, 4);
    concrete.reset();
    concrete.step(&first);
    let twin = concrete.clone();
    assert_eq!(twin.variables(), concrete.variables());
    assert_eq!(twin.oracle(), concrete.oracle());
}

#[test]
fn vocabulary_is_small_and_covers_tools() {
    let kg = Kg::default();
    let vocab = vocab(&kg);
    let mut env = kg.instance(Split::Train, 1, 0);
    let reset = env.reset();
    for tool in &reset.tools {
        assert_in_vocab(&vocab, &tool.name);
        assert_in_vocab(&vocab, &tool.description);
        for p in &tool.parameters {
            assert_in_vocab(&vocab, &p.name);
            assert_in_vocab(&vocab, &p.description);
        }
    }
    let names: BTreeSet<&String> = kg.world().names().iter().collect();
    assert_eq!(names.len(), kg.world().len());
    assert!((150..=300).contains(&kg.world().len()));
    assert!(vocab.len() < 500, "{}", vocab.len());
}

fn arg_value() -> impl Strategy<Value = Json> {
    prop_oneof![
        4 => prop_oneof![
            Just("#0".to_string()),
            Just("#1".to_string()),
            Just("#2".to_string()),
            Just("#15".to_string()),
            Just("#99".to_string()),
            Just("directed".to_string()),
            Just("acted_in".to_string()),
            Just("born_in".to_string()),
            Just("age".to_string()),
            Just("year".to_string()),
            Just("@entity".to_string()),
            "\\PC{0,12}",
        ]
        .prop_map(Json::String),
        1 => any::<i64>().prop_map(|n| json!(n)),
        1 => Just(Json::Null),
        1 => Just(json!(["#0"])),
    ]
}

fn any_call() -> impl Strategy<Value = ToolCall> {
    let name = prop_oneof![
        8 => prop_oneof![
            Just("get_relations"),
            Just("get_neighbors"),
            Just("intersection"),
            Just("get_attributes"),
            Just("argmax"),
            Just("argmin"),
            Just("count"),
            Just("final_answer"),
        ]
        .prop_map(str::to_string),
        1 => "\\PC{0,10}",
    ];
    let key = prop_oneof![
        Just("variable".to_string()),
        Just("variable1".to_string()),
        Just("variable2".to_string()),
        Just("relation".to_string()),
        Just("attribute".to_string()),
        "[a-z]{0,6}",
    ];
    (name, prop::collection::vec((key, arg_value()), 0..4)).prop_map(|(name, args)| ToolCall {
        name,
        arguments: args.into_iter().collect::<Map<_, _>>(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_calls_never_panic(
        difficulty in 1u8..=3,
        index in 0u64..10_000,
        calls in prop::collection::vec(any_call(), 0..24),
        follow_oracle in prop::collection::vec(any::<bool>(), 24),
    ) {
        let kg = kg();
        let vocab = vocab(kg);
        let mut env = kg.episode(Split::Train, difficulty, index);
        env.reset();
        let entities: Vec<String> =
            env.question().entities().iter().map(|&e| kg.world().name(e).to_string()).collect();
        let mut over = false;
        for (i, mut c) in calls.into_iter().enumerate() {
            if follow_oracle[i] && let Some(o) = env.oracle() {
                c = o;
            }
            for v in c.arguments.values_mut() {
                if v == "@entity" {
                    *v = json!(entities[i % entities.len()]);
                }
            }
            let step = env.step(&c);
            assert_in_vocab(&vocab, &step.observation);
            prop_assert!(step.reward == 0.0 || step.reward == 1.0);
            prop_assert!(step.reward == 0.0 || (step.status == Status::Completed && !over));
            if over {
                prop_assert_eq!(step.status, Status::Completed);
            } else {
                prop_assert!(matches!(
                    step.status,
                    Status::Running | Status::InvalidAction | Status::Completed
                ));
            }
            prop_assert_eq!(step.status == Status::Completed, env.finished());
            over |= step.done();
            prop_assert!(env.variables().len() <= agentry_env::kg::MAX_VARIABLES);
            prop_assert!((0.0..=1.0).contains(&env.f1()));
            prop_assert_eq!(env.oracle().is_none(), over);
        }
    }
}

fn kg() -> &'static Kg {
    static KG: std::sync::OnceLock<Kg> = std::sync::OnceLock::new();
    KG.get_or_init(|| Kg::new(STANDARD_WORLD_SEED))
}

#[test]
fn print_examples() {
    let kg = Kg::default();
    for d in 1..=3 {
        let mut env = kg.instance(Split::Train, d, 0);
        let reset = env.reset();
        println!("d{d}: {}", reset.instruction);
        let (trace, reward, _) = run_oracle(env.as_mut());
        for (c, obs) in trace {
            let schema = reset.tools.iter().find(|t| t.name == c.name).unwrap();
            let args: Vec<&str> = schema
                .parameters
                .iter()
                .map(|p| c.str_arg(&p.name))
                .collect();
            println!("  {}({}) -> {obs}", c.name, args.join(", "));
        }
        println!("  reward {reward}");
    }
}

/// 100,000 seeded random and malformed calls (unknown tools, missing, extra, mistyped and
/// oversized arguments, vocabulary words and garbage, random text through the policy's parser)
/// over many instances: no panic, and every malformed call is an `error` observation with
/// `InvalidAction`.
#[test]
fn a_hundred_thousand_random_and_malformed_calls() {
    use rand::seq::IndexedRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    let kg = kg();
    let vocab = vocab(kg);
    let words: Vec<String> = kg.vocabulary();
    let tools = [
        "get_relations",
        "get_neighbors",
        "intersection",
        "get_attributes",
        "argmax",
        "argmin",
        "count",
        "final_answer",
    ];
    let params = [
        "variable",
        "relation",
        "variable1",
        "variable2",
        "attribute",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let (mut calls, mut malformed, mut instance) = (0usize, 0usize, 0u64);
    while calls < 100_000 {
        let split = SPLITS[rng.random_range(0..2)];
        let mut env = kg.episode(split, rng.random_range(1..=3), instance);
        instance += 1;
        env.reset();
        for _ in 0..rng.random_range(1..40) {
            let word = |rng: &mut ChaCha8Rng| Json::String(words.choose(rng).unwrap().clone());
            let (call, bad) = match rng.random_range(0..8) {
                0 => match env.oracle() {
                    Some(c) => (c, false),
                    None => (call("count", &[("variable", json!("#0"))]), false),
                },
                1 => {
                    let name: String = (0..rng.random_range(0..12))
                        .map(|_| rng.random_range(b' '..=b'~') as char)
                        .collect();
                    (call(&name, &[("variable", json!("#0"))]), true)
                }
                2 => (call(tools.choose(&mut rng).unwrap(), &[]), true),
                3 => {
                    let huge = "x".repeat(agentry_env::tool::MAX_ARGUMENT_CHARS + 1);
                    (call("count", &[("variable", json!(huge))]), true)
                }
                4 => {
                    let value = [json!(3), json!(null), json!(["#0"]), json!({"a": 1})]
                        .choose(&mut rng)
                        .unwrap()
                        .clone();
                    (call("get_relations", &[("variable", value)]), true)
                }
                5 => (
                    call("count", &[("variable", json!("#0")), ("extra", json!("x"))]),
                    true,
                ),
                6 => {
                    let text: String = (0..rng.random_range(0..30))
                        .map(|_| *b"(){}[]\"=,:#_ abc01".choose(&mut rng).unwrap() as char)
                        .collect();
                    match agentry_env::parse_call(&text) {
                        Ok(c) => (c, false),
                        Err(e) => {
                            assert!(e.starts_with("Error"), "{e}");
                            calls += 1;
                            continue;
                        }
                    }
                }
                _ => {
                    let name = tools.choose(&mut rng).unwrap();
                    let mut args = Map::new();
                    for p in params {
                        if rng.random_bool(0.5) {
                            args.insert(p.to_string(), word(&mut rng));
                        }
                    }
                    (
                        ToolCall {
                            name: name.to_string(),
                            arguments: args,
                        },
                        false,
                    )
                }
            };
            let over = env.finished();
            let step = env.step(&call);
            calls += 1;
            assert_in_vocab(&vocab, &step.observation);
            if over {
                assert_eq!(step.status, Status::Completed);
            } else if bad {
                malformed += 1;
                assert_eq!(step.status, Status::InvalidAction, "{call:?}");
                assert!(
                    step.observation.starts_with("error"),
                    "{}",
                    step.observation
                );
            }
        }
    }
    assert!(malformed > 40_000, "{malformed}");
}
