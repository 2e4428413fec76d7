//! Tests of the ALFWorld task: the oracle solves every instance from what it sees, splits
//! are disjoint, random and malformed calls never panic and get error observations, runs are
//! deterministic, cloning mid-episode works, and the vocabulary covers the oracle's path.

use std::collections::{HashMap, HashSet};

use agentry_env::alfworld::{
    Alfworld, AlfworldEnv, GoalKind, MAX_REPEATS, NOTHING_HAPPENS, ObjectKind, ReceptacleKind,
    VERSION,
};
use agentry_env::pieces::words;
use agentry_env::tool::MAX_ARGUMENT_CHARS;
use agentry_env::{Environment, Split, Status, Step, TaskGenerator, ToolCall, parse_call};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value as Json, json};

const SPLITS: [Split; 2] = [Split::Train, Split::Test];

/// The runtime's default turn limit for this task (AgentBench-FC's).
const TURN_LIMIT: usize = 20;

/// The most actions the oracle takes, per difficulty: it searches the receptacles it has not
/// seen in the room's order, so a room of 12 closed receptacles can take 25.
const ORACLE_LONGEST: [usize; 3] = [8, 16, 25];

fn act(action: &str) -> ToolCall {
    ToolCall::new("take_action", [("action", json!(action))])
}

fn vocab(task: &Alfworld) -> HashSet<String> {
    task.vocabulary().into_iter().collect()
}

fn assert_in_vocab(vocab: &HashSet<String>, text: &str) {
    for p in words(text) {
        assert!(
            vocab.contains(p),
            "`{p}` of `{text}` is not in the vocabulary"
        );
    }
}

/// Follows the oracle from reset; returns the instruction, the actions with their steps.
fn run_oracle(env: &mut dyn Environment) -> (String, Vec<(String, Step)>) {
    let reset = env.reset();
    let mut trace = Vec::new();
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        assert_eq!(step.status == Status::Completed, step.done());
        trace.push((c.str_arg("action").to_string(), step));
        assert!(trace.len() <= 50, "the oracle does not end");
    }
    (reset.instruction, trace)
}

#[test]
fn oracle_solves_every_instance_from_what_it_sees() {
    let task = Alfworld::default();
    let vocab = vocab(&task);
    for split in SPLITS {
        let mut solved = 0;
        let mut longest = [0usize; 3];
        let mut total = [0usize; 3];
        let mut beyond_limit = [0usize; 3];
        for i in 0..334u64 {
            for d in 1..=3u8 {
                let mut env = task.episode(split, d, i);
                let (instruction, trace) = run_oracle(&mut env);
                assert_in_vocab(&vocab, &instruction);
                let last = &trace.last().expect("the oracle acts").1;
                assert_eq!(last.status, Status::Completed, "{instruction}");
                assert_eq!(last.reward, 1.0, "{instruction}");
                assert!(env.success());
                assert!(env.finished() && env.goal_reached());
                let k = usize::from(d - 1);
                assert!(trace.len() <= ORACLE_LONGEST[k], "{} actions", trace.len());
                for (action, step) in &trace {
                    assert_ne!(step.observation, NOTHING_HAPPENS, "{action}: {instruction}");
                    assert!(!step.observation.starts_with("Error"));
                    assert_in_vocab(&vocab, action);
                    assert_in_vocab(&vocab, &step.observation);
                }
                for (_, step) in &trace[..trace.len() - 1] {
                    assert_eq!((step.status, step.reward), (Status::Running, 0.0));
                }
                assert_acts_on_what_it_saw(&instruction, &trace);
                longest[k] = longest[k].max(trace.len());
                beyond_limit[k] += usize::from(trace.len() > TURN_LIMIT);
                total[k] += trace.len();
                solved += 1;
            }
        }
        assert!(solved >= 1000);
        println!(
            "{split:?}: {solved} solved; oracle actions per difficulty: longest {longest:?}, total {total:?}, more than {TURN_LIMIT} {beyond_limit:?}, over 334 each"
        );
    }
}

/// The oracle acts only on what the agent has read, so a policy could imitate it: it starts at
/// the first receptacle the room lists, and takes an object or uses a lamp only after an
/// observation showed it there.
fn assert_acts_on_what_it_saw(instruction: &str, trace: &[(String, Step)]) {
    let listed = instruction
        .split("you see a ")
        .nth(1)
        .and_then(|rest| rest.split([',', '.']).next())
        .unwrap();
    assert_eq!(trace[0].0, format!("go to {listed}"), "{instruction}");
    for (k, (action, _)) in trace.iter().enumerate() {
        let shown = |object: &str, place: &str| {
            trace[..k].iter().any(|(_, step)| {
                let o = &step.observation;
                o.contains(&format!("{place}. ")) && o.contains(&format!("a {object}"))
            })
        };
        if let Some(rest) = action.strip_prefix("take ") {
            let (object, place) = rest.split_once(" from ").unwrap();
            assert!(shown(object, place), "{action} unseen: {instruction}");
        }
        if let Some(lamp) = action.strip_prefix("use ") {
            let seen = trace[..k]
                .iter()
                .any(|(_, step)| step.observation.contains(&format!("a {lamp}")));
            assert!(seen, "{action} unseen: {instruction}");
        }
    }
}

#[test]
fn other_seeds_are_solvable_too() {
    for seed in [0, 7, 12345] {
        let task = Alfworld::new(seed);
        for d in 1..=3 {
            for i in 0..100 {
                let mut env = task.instance(Split::Test, d, i);
                let (_, trace) = run_oracle(env.as_mut());
                assert!(trace.len() <= ORACLE_LONGEST[usize::from(d - 1)]);
                assert!(env.success());
            }
        }
    }
}

#[test]
fn splits_are_disjoint() {
    let task = Alfworld::default();
    let mut keys: [HashSet<String>; 2] = [HashSet::new(), HashSet::new()];
    for d in 1..=3 {
        for (s, split) in SPLITS.into_iter().enumerate() {
            for i in 0..1500 {
                let room = task.room(split, d, i);
                assert_eq!(task.split_of(&room), split);
                keys[s].insert(room.key());
            }
        }
    }
    let [train, test] = &keys;
    // Rooms are random enough that almost none repeats.
    assert!(
        train.len() > 4400 && test.len() > 4400,
        "{} {}",
        train.len(),
        test.len()
    );
    assert!(train.is_disjoint(test));
    // The generator's other seeds split the same way: by content.
    let other = Alfworld::new(2);
    let room = other.room(Split::Test, 2, 3);
    assert_eq!(other.split_of(&room), Split::Test);
}

#[test]
fn test_share_is_about_one_in_five() {
    // Candidate rooms land in test about one time in five.
    let task = Alfworld::default();
    let mut test = 0;
    for i in 0..3000u64 {
        let room = agentry_env::alfworld::Instance::generate(i, (i % 3) as u8 + 1);
        test += usize::from(task.split_of(&room) == Split::Test);
    }
    assert!((450..750).contains(&test), "{test}");
}

#[test]
fn same_arguments_same_instance() {
    let a = Alfworld::new(5);
    let b = Alfworld::new(5);
    assert_eq!(a.version(), VERSION);
    assert_eq!(a.vocabulary(), b.vocabulary());
    for d in 1..=3 {
        for split in SPLITS {
            for i in [0, 1, 17, 1_000_003, u64::MAX] {
                assert_eq!(a.room(split, d, i), b.room(split, d, i));
                let mut x = a.instance(split, d, i);
                let mut y = b.instance(split, d, i);
                assert_eq!(x.reset(), y.reset());
                assert_eq!(x.oracle(), y.oracle());
            }
        }
    }
    // Difficulties outside 1..=3 are clamped.
    assert_eq!(a.room(Split::Test, 0, 4), a.room(Split::Test, 1, 4));
    assert_eq!(a.room(Split::Test, 200, 4), a.room(Split::Test, 3, 4));
    assert_ne!(a.room(Split::Train, 1, 0), a.room(Split::Train, 1, 1));
    assert_ne!(
        a.room(Split::Train, 3, 0),
        Alfworld::new(6).room(Split::Train, 3, 0)
    );
}

#[test]
fn difficulty_three_is_harder_than_one() {
    let task = Alfworld::default();
    let mut stats = Vec::new();
    for d in 1..=3u8 {
        let (mut receptacles, mut closed, mut objects, mut actions) = (0, 0, 0, 0);
        let mut kinds = HashSet::new();
        for i in 0..300 {
            let mut env = task.episode(Split::Train, d, i);
            let room = env.instance().clone();
            receptacles += room.receptacles().len();
            closed += room.receptacles().iter().filter(|r| !r.open).count();
            objects += room.objects().len();
            kinds.insert(room.goal().kind());
            actions += run_oracle(&mut env).1.len();
        }
        println!(
            "difficulty {d}: per room {:.1} receptacles, {:.1} closed, {:.1} objects, {:.1} oracle actions; goal types {}",
            receptacles as f64 / 300.0,
            closed as f64 / 300.0,
            objects as f64 / 300.0,
            actions as f64 / 300.0,
            kinds.len()
        );
        stats.push((receptacles, closed, objects, actions, kinds));
    }
    let (one, three) = (&stats[0], &stats[2]);
    assert!(three.0 > 2 * one.0 && three.2 > 2 * one.2 && three.3 > one.3 * 3 / 2);
    assert_eq!(one.1, 0, "difficulty 1 has no closed receptacle");
    assert!(three.1 > 300);
    let simple: HashSet<GoalKind> = [GoalKind::PickAndPlace, GoalKind::LookAtObjInLight].into();
    assert_eq!(one.4, simple);
    assert_eq!(three.4, GoalKind::ALL.into_iter().collect());
}

#[test]
fn observations_follow_alfworld() {
    let task = Alfworld::default();
    // A difficulty-3 heat goal: every openable receptacle starts closed.
    let (mut env, object) = (0..)
        .map(|i| task.episode(Split::Train, 3, i))
        .find_map(|env| match env.instance().goal().kind() {
            GoalKind::PickHeatThenPlace => {
                let object = env.instance().goal().object();
                Some((env, object))
            }
            _ => None,
        })
        .unwrap();
    let reset = env.reset();
    assert!(
        reset
            .instruction
            .starts_with("You are in the middle of a room. Looking quickly around you, you see a ")
    );
    assert!(reset.instruction.contains(&format!(
        "\n\nYour task is to: put a hot {} ",
        object.name()
    )));
    assert_eq!(reset.tools.len(), 1);
    assert_eq!(reset.tools[0].name, "take_action");
    let room = env.instance().clone();
    let microwave = room
        .receptacles()
        .iter()
        .find(|r| r.kind == ReceptacleKind::Microwave)
        .unwrap();
    assert!(!microwave.open);
    let name = format!("microwave {}", microwave.number);
    let step = env.step(&act(&format!("go to {name}")));
    assert_eq!(
        step.observation,
        format!("You arrive at {name}. The {name} is closed.")
    );
    assert_eq!((step.status, step.reward), (Status::Running, 0.0));
    let step = env.step(&act(&format!("open {name}")));
    assert!(
        step.observation.starts_with(&format!(
            "You open the {name}. The {name} is open. In it, you see "
        )),
        "{}",
        step.observation
    );
    assert!(step.observation.ends_with('.'));
    assert_eq!(
        env.step(&act(&format!("open {name}"))).observation,
        NOTHING_HAPPENS
    );
    assert_eq!(
        env.step(&act(&format!("close {name}"))).observation,
        format!("You close the {name}.")
    );
    assert_eq!(
        env.step(&act("inventory")).observation,
        "You are not carrying anything."
    );
    assert!(env.step(&act("look")).observation.starts_with(&format!(
        "You are facing the {name}. Looking quickly around you"
    )));
    // Heating needs the object in hand.
    let step = env.step(&act(&format!("heat {} 1 with {name}", object.name())));
    assert_eq!(step.observation, NOTHING_HAPPENS);
    assert_eq!(step.status, Status::Running);
    // Unknown commands and names are "Nothing happens." too, with status Running.
    for text in [
        "",
        "fly",
        "go to moon 1",
        "take apple 99 from desk 1",
        "go to",
    ] {
        let step = env.step(&act(text));
        assert_eq!(
            (step.observation.as_str(), step.status),
            (NOTHING_HAPPENS, Status::Running)
        );
    }
    // The oracle takes over and solves it; its transcript shows the remaining commands.
    let mut seen = Vec::new();
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        seen.push((c.str_arg("action").to_string(), step.observation));
    }
    assert!(env.success());
    let text = |prefix: &str| seen.iter().find(|(a, _)| a.starts_with(prefix)).unwrap();
    let (take, obs) = text("take ");
    let words: Vec<&str> = take.split(' ').collect();
    assert_eq!(
        obs,
        &format!(
            "You pick up the {} {} from the {} {}.",
            words[1], words[2], words[4], words[5]
        )
    );
    let (heat, obs) = text("heat ");
    let words: Vec<&str> = heat.split(' ').collect();
    assert_eq!(
        obs,
        &format!(
            "You heat the {} {} using the {} {}.",
            words[1], words[2], words[4], words[5]
        )
    );
    let (put, obs) = text("put ");
    let words: Vec<&str> = put.split(' ').collect();
    assert_eq!(
        obs,
        &format!(
            "You put the {} {} {} the {} {}.",
            words[1], words[2], words[3], words[4], words[5]
        )
    );
}

#[test]
fn listings_read_like_alfworld() {
    let task = Alfworld::default();
    // Find a surface with two or more objects at difficulty 3, and one with none.
    for i in 0..200 {
        let mut env = task.episode(Split::Train, 3, i);
        env.reset();
        let room = env.instance().clone();
        for (r, rec) in room.receptacles().iter().enumerate() {
            if rec.kind.openable() {
                continue;
            }
            let here: Vec<String> = room
                .objects()
                .iter()
                .filter(|o| o.location == r)
                .map(|o| format!("a {} {}", o.kind.name(), o.number))
                .collect();
            let name = format!("{} {}", rec.kind.name(), rec.number);
            let listed = match here.len() {
                0 => "nothing".to_string(),
                1 => here[0].clone(),
                n => format!("{}, and {}", here[..n - 1].join(", "), here[n - 1]),
            };
            let mut probe = env.clone();
            let step = probe.step(&act(&format!("go to {name}")));
            assert_eq!(
                step.observation,
                format!("You arrive at {name}. On the {name}, you see {listed}.")
            );
        }
    }
}

#[test]
fn look_goal_needs_the_lit_lamp_and_the_object_in_hand() {
    let task = Alfworld::default();
    let mut env = (0..)
        .map(|i| task.episode(Split::Train, 1, i))
        .find(|e| e.instance().goal().kind() == GoalKind::LookAtObjInLight)
        .unwrap();
    let reset = env.reset();
    assert!(reset.instruction.contains("Your task is to: examine the "));
    let room = env.instance().clone();
    let lamp = room.objects().iter().find(|o| o.kind.is_lamp()).unwrap();
    let lamp_name = format!("{} {}", lamp.kind.name(), lamp.number);
    let holder = room.receptacles()[lamp.location];
    let holder_name = format!("{} {}", holder.kind.name(), holder.number);
    // Using the lamp from afar does nothing; at it, empty-handed, it turns on and off.
    assert_eq!(
        env.step(&act(&format!("use {lamp_name}"))).observation,
        NOTHING_HAPPENS
    );
    env.step(&act(&format!("go to {holder_name}")));
    assert_eq!(
        env.step(&act(&format!("take {lamp_name} from {holder_name}")))
            .observation,
        NOTHING_HAPPENS,
        "lamps stay put"
    );
    assert_eq!(
        env.step(&act(&format!("use {lamp_name}"))).observation,
        format!("You turn on the {lamp_name}.")
    );
    assert_eq!(
        env.step(&act(&format!("examine {lamp_name}"))).observation,
        format!("The {lamp_name} is on.")
    );
    assert!(!env.finished());
    // The oracle fetches the object and comes back: arriving at the lit lamp with it wins.
    let mut last = None;
    while let Some(c) = env.oracle() {
        last = Some((c.str_arg("action").to_string(), env.step(&c)));
    }
    let (action, step) = last.unwrap();
    assert_eq!(action, format!("go to {holder_name}"));
    assert_eq!((step.reward, step.status), (1.0, Status::Completed));
}

#[test]
fn two_objects_must_share_one_receptacle() {
    let task = Alfworld::default();
    let mut env = (0..)
        .map(|i| task.episode(Split::Test, 3, i))
        .find(|e| e.instance().goal().kind() == GoalKind::PickTwoObjAndPlace)
        .unwrap();
    let reset = env.reset();
    assert!(reset.instruction.contains("Your task is to: put two "));
    let mut puts = 0;
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        if c.str_arg("action").starts_with("put ") {
            puts += 1;
            assert_eq!(step.reward, f32::from(u8::from(puts == 2)));
        }
    }
    assert_eq!(puts, 2);
    assert!(env.success());
}

#[test]
fn three_identical_actions_end_the_episode() {
    let task = Alfworld::default();
    let mut env = task.episode(Split::Train, 2, 0);
    env.reset();
    assert_eq!(env.step(&act("look")).status, Status::Running);
    assert_eq!(env.step(&act("inventory")).status, Status::Running);
    assert_eq!(env.step(&act("look")).status, Status::Running);
    // Spacing and case do not make an action different.
    assert_eq!(env.step(&act(" LOOK ")).status, Status::Running);
    // A malformed call in between does not count and does not break the run.
    let step = env.step(&ToolCall::new("take_action", [("action", json!(3))]));
    assert_eq!(step.status, Status::InvalidAction);
    let step = env.step(&act("look"));
    assert_eq!(step.status, Status::Completed);
    assert_eq!(step.reward, 0.0);
    assert!(
        step.observation
            .ends_with(" You repeated the same action three times: the episode ends.")
    );
    assert!(env.finished() && !env.success());
    assert!(env.oracle().is_none());
    let step = env.step(&act("inventory"));
    assert_eq!(step.observation, "Error: the episode is over.");
    assert_eq!((step.status, step.reward), (Status::Completed, 0.0));
    // Impossible actions count too.
    let mut env = task.episode(Split::Train, 2, 1);
    env.reset();
    for k in 1..=MAX_REPEATS {
        let step = env.step(&act("fly away"));
        assert_eq!(step.done(), k == MAX_REPEATS);
    }
    // reset starts over.
    env.reset();
    assert!(!env.finished());
    assert!(env.oracle().is_some());
}

#[test]
fn bad_calls_are_error_observations() {
    let task = Alfworld::default();
    let vocab = vocab(&task);
    let mut env = task.episode(Split::Train, 1, 3);
    env.reset();
    let long = "x".repeat(MAX_ARGUMENT_CHARS + 1);
    let table: Vec<(ToolCall, &str)> = vec![
        (
            ToolCall::new("go", [("action", json!("look"))]),
            "Error: there is no such tool. The only tool is take_action.",
        ),
        (
            ToolCall::new("take_action", []),
            "Error: take_action needs the argument action.",
        ),
        (
            ToolCall::new("take_action", [("act", json!("look"))]),
            "Error: take_action needs the argument action.",
        ),
        (
            ToolCall::new("take_action", [("action", json!(null))]),
            "Error: the argument action must be a string.",
        ),
        (
            ToolCall::new("take_action", [("action", json!(["look"]))]),
            "Error: the argument action must be a string.",
        ),
        (
            ToolCall::new("take_action", [("action", json!({"a": 1}))]),
            "Error: the argument action must be a string.",
        ),
        (
            ToolCall::new("take_action", [("action", json!(long))]),
            "Error: the argument action is too long.",
        ),
        (
            ToolCall::new(
                "take_action",
                [("action", json!("look")), ("target", json!("desk 1"))],
            ),
            "Error: take_action has no other argument than action.",
        ),
    ];
    for (c, expected) in &table {
        let step = env.step(c);
        assert_eq!(step.observation, *expected);
        assert_eq!((step.status, step.reward), (Status::InvalidAction, 0.0));
        assert_in_vocab(&vocab, &step.observation);
    }
    // A string of exactly the limit is well-formed.
    let step = env.step(&act(&"x".repeat(MAX_ARGUMENT_CHARS)));
    assert_eq!(
        (step.observation.as_str(), step.status),
        (NOTHING_HAPPENS, Status::Running)
    );
    // None of it changed the episode: the oracle still solves it.
    let (_, trace) = run_oracle(&mut env);
    assert!(env.success() && trace.len() <= ORACLE_LONGEST[2]);
}

/// A random call: well-formed commands with names from the room and the vocabulary, garbage
/// text, and malformed calls. Returns the call and whether it is malformed.
fn random_call(rng: &mut ChaCha8Rng, env: &AlfworldEnv, words: &[String]) -> (ToolCall, bool) {
    let room = env.instance();
    let name = |rng: &mut ChaCha8Rng| -> String {
        match rng.random_range(0..4) {
            0 => {
                let o = room.objects().choose(rng).unwrap();
                format!("{} {}", o.kind.name(), o.number)
            }
            1 => {
                let r = room.receptacles().choose(rng).unwrap();
                format!("{} {}", r.kind.name(), r.number)
            }
            2 => format!(
                "{} {}",
                ObjectKind::ALL.choose(rng).unwrap().name(),
                rng.random_range(0..5)
            ),
            _ => format!(
                "{} {}",
                ReceptacleKind::ALL.choose(rng).unwrap().name(),
                rng.random_range(0..8)
            ),
        }
    };
    let garbage = |rng: &mut ChaCha8Rng, n: usize| -> String {
        (0..rng.random_range(0..n))
            .map(|_| match rng.random_range(0..4) {
                0 => char::from(rng.random_range(32u8..127)),
                1 => char::from_u32(rng.random_range(0..0x11_0000)).unwrap_or('\u{fffd}'),
                2 => ' ',
                _ => char::from(rng.random_range(b'a'..=b'z')),
            })
            .collect()
    };
    match rng.random_range(0..20) {
        // Commands of the command set with random names.
        0..=7 => {
            let a = name(rng);
            let b = name(rng);
            let text = match rng.random_range(0..12) {
                0 => format!("go to {a}"),
                1 => format!("take {a} from {b}"),
                2 => format!("put {a} {} {b}", ["in", "on", "in/on"].choose(rng).unwrap()),
                3 => format!("open {a}"),
                4 => format!("close {a}"),
                5 => format!("clean {a} with {b}"),
                6 => format!("heat {a} with {b}"),
                7 => format!("cool {a} with {b}"),
                8 => format!("use {a}"),
                9 => format!("examine {a}"),
                10 => "look".to_string(),
                _ => "inventory".to_string(),
            };
            (act(&text), false)
        }
        // Random vocabulary words and garbage as the action.
        8..=10 => {
            let n = rng.random_range(0..8);
            let text: Vec<&str> = (0..n)
                .map(|_| words.choose(rng).unwrap().as_str())
                .collect();
            (act(&text.join(" ")), false)
        }
        11 => (act(&garbage(rng, 40)), false),
        // Malformed calls.
        12 => {
            let tool = if rng.random_bool(0.5) {
                garbage(rng, 12)
            } else {
                words.choose(rng).unwrap().clone()
            };
            if tool == "take_action" {
                return (ToolCall::new("take_action", []), true);
            }
            (ToolCall::new(&tool, [("action", json!("look"))]), true)
        }
        13 => (ToolCall::new("take_action", []), true),
        14 => {
            let value = match rng.random_range(0..6) {
                0 => json!(null),
                1 => json!(rng.random::<i64>()),
                2 => json!(rng.random::<f64>()),
                3 => json!(rng.random::<bool>()),
                4 => json!([name(rng)]),
                _ => json!({"action": name(rng)}),
            };
            (ToolCall::new("take_action", [("action", value)]), true)
        }
        15 => {
            let len = MAX_ARGUMENT_CHARS + 1 + rng.random_range(0..100);
            (act(&"go to desk 1 ".repeat(len / 12 + 1)), true)
        }
        16 => {
            let mut arguments = Map::new();
            arguments.insert("action".to_string(), json!(format!("go to {}", name(rng))));
            let key = loop {
                let key = garbage(rng, 8);
                if key != "action" {
                    break key;
                }
            };
            arguments.insert(key, json!(words.choose(rng).unwrap()));
            (
                ToolCall {
                    name: "take_action".to_string(),
                    arguments,
                },
                true,
            )
        }
        // Random text through the policy's call syntax.
        _ => {
            let text = match rng.random_range(0..4) {
                0 => garbage(rng, 60),
                1 => format!("take_action(action=\"{}\")", garbage(rng, 20)),
                2 => format!(
                    "take_action(action=\"{} {}\")",
                    words.choose(rng).unwrap(),
                    name(rng)
                ),
                _ => format!(
                    "{{\"name\": \"take_action\", \"arguments\": {{\"action\": {}}}}}",
                    [json!("look"), json!(1), json!(null)].choose(rng).unwrap()
                ),
            };
            match parse_call(&text) {
                Ok(call) => {
                    let malformed = agentry_env::alfworld::action::action_text(&call).is_err();
                    (call, malformed)
                }
                Err(message) => {
                    assert!(message.starts_with("Error"), "{message}");
                    (act("inventory"), false)
                }
            }
        }
    }
}

#[test]
fn random_and_malformed_calls_never_panic() {
    let task = Alfworld::default();
    let vocab = vocab(&task);
    let words: Vec<String> = task.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(20_261_129);
    let (mut calls, mut malformed, mut episodes, mut solved) = (0usize, 0usize, 0usize, 0usize);
    while calls < 120_000 {
        let split = *SPLITS.choose(&mut rng).unwrap();
        let mut env = task.episode(split, rng.random_range(1..=3), rng.random_range(0..5_000));
        env.reset();
        episodes += 1;
        let follow = rng.random_range(0.0..0.8);
        let mut over = false;
        for _ in 0..rng.random_range(1..40) {
            let (call, bad) = match env.oracle() {
                Some(o) if rng.random_bool(follow) => (o, false),
                _ => random_call(&mut rng, &env, &words),
            };
            let step = env.step(&call);
            calls += 1;
            malformed += usize::from(bad);
            assert!(step.reward == 0.0 || step.reward == 1.0);
            if over {
                assert_eq!(step.status, Status::Completed);
                assert!(step.observation.starts_with("Error"));
                assert_eq!(step.reward, 0.0);
                continue;
            }
            if bad {
                assert_eq!(step.status, Status::InvalidAction, "{call:?}");
                assert!(step.observation.starts_with("Error: "), "{call:?}");
            } else {
                assert!(
                    matches!(step.status, Status::Running | Status::Completed),
                    "{call:?}: {}",
                    step.observation
                );
                assert!(!step.observation.starts_with("Error"));
            }
            assert_in_vocab(&vocab, &step.observation);
            assert_eq!(
                step.reward == 1.0,
                step.status == Status::Completed && env.success()
            );
            assert_eq!(step.done(), env.finished());
            over = step.done();
            solved += usize::from(env.success());
            assert_eq!(env.oracle().is_none(), over);
        }
    }
    println!("{calls} calls ({malformed} malformed) over {episodes} episodes, {solved} solved");
    assert!(malformed > 15_000 && solved > 100);
}

/// A seeded agent that mixes the oracle, commands and malformed calls; returns the serialized
/// transcript.
fn transcript(task: &Alfworld, seed: u64) -> String {
    let words = task.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out: Vec<(Json, Step)> = Vec::new();
    for i in 0..40 {
        let mut env = task.episode(SPLITS[i % 2], (i % 3) as u8 + 1, i as u64 * 7);
        let reset = env.reset();
        out.push((
            json!(reset),
            Step {
                observation: String::new(),
                reward: 0.0,
                status: Status::Running,
            },
        ));
        for _ in 0..TURN_LIMIT {
            let call = match env.oracle() {
                Some(o) if rng.random_bool(0.5) => o,
                _ => random_call(&mut rng, &env, &words).0,
            };
            let step = env.step(&call);
            let done = step.done();
            out.push((json!(call), step));
            if done {
                break;
            }
        }
        let (_, trace) = run_oracle(&mut task.episode(SPLITS[i % 2], 3, i as u64));
        for (action, step) in trace {
            out.push((json!(action), step));
        }
    }
    serde_json::to_string(&out).unwrap()
}

#[test]
fn same_seed_gives_identical_transcripts() {
    let task = Alfworld::default();
    let a = transcript(&task, 42);
    let b = transcript(&Alfworld::default(), 42);
    assert_eq!(a, b);
    assert_ne!(a, transcript(&task, 43));
}

#[test]
fn clone_mid_episode_continues_identically() {
    let task = Alfworld::default();
    let words = task.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for i in 0..60 {
        let mut env = task.instance(Split::Train, (i % 3) as u8 + 1, i);
        env.reset();
        // A few steps of the oracle, then a snapshot.
        for _ in 0..3 {
            if let Some(c) = env.oracle() {
                env.step(&c);
            }
        }
        let mut copy = env.box_clone();
        assert_eq!(copy.oracle(), env.oracle());
        let mut calls = Vec::new();
        let concrete = task.episode(Split::Train, (i % 3) as u8 + 1, i);
        for _ in 0..15 {
            calls.push(match env.oracle() {
                Some(o) if rng.random_bool(0.5) => o,
                _ => random_call(&mut rng, &concrete, &words).0,
            });
            let c = calls.last().unwrap();
            assert_eq!(env.step(c), copy.step(c));
            assert_eq!(env.success(), copy.success());
            assert_eq!(env.oracle(), copy.oracle());
        }
    }
    // Diverging: the copy wastes its turns, the original finishes; neither affects the other.
    let mut env = task.episode(Split::Test, 3, 11);
    env.reset();
    let first = env.oracle().unwrap();
    env.step(&first);
    let mut copy = env.clone();
    for _ in 0..MAX_REPEATS {
        copy.step(&act("look"));
    }
    assert!(copy.finished() && !copy.success());
    while let Some(c) = env.oracle() {
        env.step(&c);
    }
    assert!(env.success());
    assert!(!copy.success());
}

#[test]
fn oracle_recovers_after_detours() {
    let task = Alfworld::default();
    let words = task.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for d in 1..=3 {
        for i in 0..200 {
            let mut env = task.episode(Split::Test, d, i);
            env.reset();
            // Random detours (without ending the episode by repetition), then the oracle.
            for _ in 0..rng.random_range(0..12) {
                let (c, _) = random_call(&mut rng, &env, &words);
                let mut probe = env.clone();
                if !probe.step(&c).done() {
                    env.step(&c);
                }
            }
            if env.finished() {
                continue;
            }
            let mut steps = 0;
            while let Some(c) = env.oracle() {
                let step = env.step(&c);
                assert_ne!(step.observation, NOTHING_HAPPENS, "{c:?}");
                steps += 1;
                assert!(steps <= 30);
            }
            assert!(env.success());
        }
    }
}

#[test]
fn vocabulary_covers_the_oracle_path_and_is_small() {
    let task = Alfworld::default();
    let vocab = vocab(&task);
    let mut env = task.instance(Split::Train, 1, 0);
    let reset = env.reset();
    for tool in &reset.tools {
        assert_in_vocab(&vocab, &tool.name);
        assert_in_vocab(&vocab, &tool.description);
        for p in &tool.parameters {
            assert_in_vocab(&vocab, &p.name);
            assert_in_vocab(&vocab, &p.description);
        }
    }
    // Every goal type's instruction and oracle path, at every difficulty.
    let mut seen: HashMap<GoalKind, usize> = HashMap::new();
    for d in 1..=3 {
        for i in 0..500 {
            let mut env = task.episode(Split::Test, d, i);
            let (instruction, trace) = run_oracle(&mut env);
            *seen.entry(env.instance().goal().kind()).or_default() += 1;
            assert_in_vocab(&vocab, &instruction);
            for (action, step) in trace {
                assert_in_vocab(&vocab, &action);
                assert_in_vocab(&vocab, &step.observation);
            }
        }
    }
    assert_eq!(seen.len(), 6);
    assert!(vocab.len() < 600, "{}", vocab.len());
    println!("vocabulary: {} pieces; goal types {seen:?}", vocab.len());
}

/// The book's sample transcripts are real oracle runs of the current generator.
#[test]
fn book_transcripts_are_current() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src/tasks/alfworld.md"),
    )
    .unwrap();
    let task = Alfworld::default();
    for (d, i) in [(1, 0), (3, 13)] {
        let mut env = task.instance(Split::Train, d, i);
        let (instruction, trace) = run_oracle(env.as_mut());
        let mut text = format!("Difficulty {d}, train instance {i}:\n\n```text\n{instruction}\n");
        for (action, step) in &trace {
            text.push_str(&format!(
                "take_action(action=\"{action}\")\n    {}\n",
                step.observation
            ));
        }
        let last = &trace.last().unwrap().1;
        text.push_str(&format!("reward {}, {:?}\n```", last.reward, last.status));
        assert!(page.contains(&text), "the book should show:\n{text}");
    }
}
