//! Tests of the WebShop task: the oracle solves every instance within the turn limit, splits
//! are disjoint, the same seed gives the same transcripts, random and malformed calls never
//! panic and get error observations, cloning mid-episode, rewards, and the vocabulary.

use std::collections::HashSet;
use std::sync::OnceLock;

use agentry_env::pieces::words;
use agentry_env::webshop::{
    CATALOGUE_SIZE, Goal, PAGE_SIZE, Page, STANDARD_SEED, TYPES, VERSION, Webshop, WebshopEnv,
};
use agentry_env::{Environment, Split, Status, Step, TaskGenerator, ToolCall, parse_call};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value as Json, json};

const SPLITS: [Split; 2] = [Split::Train, Split::Test];

/// The runtime's default turn limit for `env = webshop`.
const MAX_TURNS: usize = 20;

fn shop() -> &'static Webshop {
    static SHOP: OnceLock<Webshop> = OnceLock::new();
    SHOP.get_or_init(|| Webshop::new(STANDARD_SEED))
}

fn vocab() -> &'static HashSet<String> {
    static VOCAB: OnceLock<HashSet<String>> = OnceLock::new();
    VOCAB.get_or_init(|| shop().vocabulary().into_iter().collect())
}

/// Every multi-character piece of `text` (single characters are always tokens) is a word of
/// the vocabulary.
fn assert_in_vocab(text: &str) {
    for w in words(text).filter(|w| w.len() > 1) {
        assert!(
            vocab().contains(w),
            "`{w}` of `{text}` is not in the vocabulary"
        );
    }
}

fn search(keywords: &str) -> ToolCall {
    ToolCall::new("search_action", [("keywords", json!(keywords))])
}

fn click(value: &str) -> ToolCall {
    ToolCall::new("click_action", [("value", json!(value))])
}

/// Follows the oracle from reset; returns the calls with their steps.
fn run_oracle(env: &mut dyn Environment) -> Vec<(ToolCall, Step)> {
    env.reset();
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
        assert!(
            trace.len() <= MAX_TURNS,
            "oracle needs more than {MAX_TURNS} turns"
        );
    }
    trace
}

#[test]
fn oracle_solves_every_instance_within_the_turn_limit() {
    let shop = shop();
    for split in SPLITS {
        let mut turns = [0usize; 3];
        let mut count = 0;
        for d in 1..=3u8 {
            for i in 0..334 {
                let mut env = shop.episode(split, d, i);
                let reset = env.reset();
                assert_in_vocab(&reset.instruction);
                let trace = run_oracle(&mut env);
                let (_, last) = trace.last().unwrap();
                assert_eq!(last.status, Status::Completed);
                assert_eq!(last.reward, 1.0, "{}", reset.instruction);
                assert!(env.success());
                assert!(env.oracle().is_none());
                for (c, step) in &trace {
                    assert_in_vocab(&step.observation);
                    assert_in_vocab(&agentry_env::render_call(c));
                }
                // Search, open the product, one click per option, buy.
                assert_eq!(trace.len(), 3 + env.goal().options.len());
                turns[usize::from(d) - 1] += trace.len();
                count += 1;
            }
        }
        assert!(count >= 1000);
        println!("{split:?}: {count} instances solved; oracle turns by difficulty {turns:?}");
    }
}

#[test]
fn splits_are_disjoint() {
    let shop = shop();
    for d in 1..=3 {
        let instructions = |split| -> HashSet<String> {
            (0..1200)
                .map(|i| shop.goal(split, d, i).instruction)
                .collect()
        };
        let train = instructions(Split::Train);
        let test = instructions(Split::Test);
        assert!(train.is_disjoint(&test), "difficulty {d}");
        assert!(train.iter().all(|t| !shop.is_test(t)));
        assert!(test.iter().all(|t| shop.is_test(t)));
        // Mostly distinct instances within a split.
        assert!(
            train.len() > 1000 && test.len() > 1000,
            "{} {}",
            train.len(),
            test.len()
        );
    }
}

#[test]
fn difficulty_adds_constraints_lookalikes_and_tighter_caps() {
    let shop = shop();
    let mean = |d: u8, f: &dyn Fn(&Goal) -> f64| -> f64 {
        (0..300)
            .map(|i| f(&shop.goal(Split::Train, d, i)))
            .sum::<f64>()
            / 300.0
    };
    let constraints = |g: &Goal| (g.attributes.len() + g.options.len()) as f64;
    let slack = |g: &Goal| {
        let price = shop.catalog().product(g.target).unwrap().price_cents as f64;
        (g.cap_dollars as f64 * 100.0 - price) / price
    };
    assert!(mean(1, &constraints) == 2.0);
    assert!(mean(3, &constraints) > mean(2, &constraints) + 0.8);
    assert!(mean(2, &constraints) > mean(1, &constraints) + 0.8);
    assert!(mean(1, &slack) > 0.3);
    assert!(mean(3, &slack) < 0.05);
    // Difficulty 3: the first results page of the oracle's query shows a look-alike that does
    // not satisfy the goal.
    for i in 0..100 {
        let g = shop.goal(Split::Test, 3, i);
        let results = shop.catalog().search(&g.query);
        let families = [
            shop.catalog().product(g.target).unwrap().family,
            shop.catalog().product(g.pick).unwrap().family,
        ];
        assert!(results.iter().take(PAGE_SIZE).any(|&p| {
            let p = shop.catalog().product(p).unwrap();
            families.contains(&p.family) && !g.satisfied_by(p)
        }));
    }
    // Difficulty 1: the attribute is in the target's title.
    for i in 0..100 {
        let g = shop.goal(Split::Train, 1, i);
        let target = shop.catalog().product(g.target).unwrap();
        assert!(target.title.contains(g.attributes[0]));
    }
}

#[test]
fn catalogue_is_large_varied_and_seeded() {
    let shop = shop();
    let catalog = shop.catalog();
    assert_eq!(catalog.len(), CATALOGUE_SIZE);
    assert!(catalog.len() >= 1000);
    let ids: HashSet<&str> = catalog.products().iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), catalog.len());
    for kind in 0..TYPES.len() {
        assert!(catalog.products().iter().filter(|p| p.kind == kind).count() >= 60);
    }
    let families: HashSet<u32> = catalog.products().iter().map(|p| p.family).collect();
    assert!(
        families.len() < catalog.len() * 3 / 4,
        "near-duplicates exist"
    );
    let other = Webshop::new(STANDARD_SEED + 1);
    assert_ne!(other.catalog().products(), catalog.products());
    assert_eq!(
        Webshop::new(STANDARD_SEED).catalog().products(),
        catalog.products()
    );
}

#[test]
fn same_arguments_same_instance() {
    let a = Webshop::new(5);
    let b = Webshop::new(5);
    assert_eq!(a.version(), VERSION);
    assert_eq!(a.vocabulary(), b.vocabulary());
    for d in 1..=3 {
        for split in SPLITS {
            for i in [0, 1, 17, 1_000_003] {
                assert_eq!(a.goal(split, d, i), b.goal(split, d, i));
                let mut x = a.instance(split, d, i);
                let mut y = b.instance(split, d, i);
                assert_eq!(x.reset(), y.reset());
                assert_eq!(x.oracle(), y.oracle());
            }
        }
    }
}

/// A seeded random agent: mostly clicks on things of the page and searches with vocabulary
/// words, sometimes garbage; returns the serialized transcript.
fn random_transcript(shop: &Webshop, seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let words = shop.vocabulary();
    let mut out = Vec::new();
    for i in 0..20 {
        let mut env = shop.instance(Split::Test, 1 + (i % 3) as u8, i);
        out.push(serde_json::to_value(env.reset()).unwrap());
        for _ in 0..MAX_TURNS {
            let c = match rng.random_range(0..4) {
                0 => env.oracle().unwrap_or_else(|| click("buy now")),
                1 => search(&format!(
                    "{} {}",
                    words.choose(&mut rng).unwrap(),
                    words.choose(&mut rng).unwrap()
                )),
                2 => click(words.choose(&mut rng).unwrap()),
                _ => click(
                    ["back to search", "next >", "< prev", "buy now"]
                        .choose(&mut rng)
                        .unwrap(),
                ),
            };
            let step = env.step(&c);
            let done = step.done();
            out.push(json!([c, step]));
            if done {
                break;
            }
        }
    }
    serde_json::to_string(&out).unwrap()
}

#[test]
fn same_seed_gives_identical_transcripts() {
    let oracle = |shop: &Webshop| -> String {
        let mut out = Vec::new();
        for d in 1..=3 {
            for i in 0..30 {
                let mut env = shop.instance(Split::Train, d, i);
                let trace = run_oracle(env.as_mut());
                out.push(serde_json::to_string(&trace).unwrap());
            }
        }
        out.join("\n")
    };
    let a = Webshop::new(7);
    let b = Webshop::new(7);
    assert_eq!(oracle(&a), oracle(&b));
    assert_eq!(random_transcript(&a, 3), random_transcript(&b, 3));
    assert_ne!(random_transcript(&a, 3), random_transcript(&a, 4));
}

#[test]
fn pages_and_buttons() {
    let shop = shop();
    let mut env = shop.episode(Split::Train, 2, 0);
    env.reset();
    let goal = env.goal().clone();
    assert_eq!(env.page(), Page::Search);
    // Nothing to click on the search page.
    let step = env.step(&click("back to search"));
    assert_eq!(step.status, Status::InvalidAction);
    assert!(step.observation.starts_with("Error:"));
    let step = env.step(&search(&goal.query));
    assert_eq!(step.status, Status::Running);
    assert!(step.observation.starts_with("results page 1 of "));
    assert_eq!(step.observation.lines().count(), 2 + PAGE_SIZE);
    assert!(step.observation.contains("[next >]"));
    assert!(!step.observation.contains("[< prev]"));
    // Search only on the search page.
    let step = env.step(&search("shampoo"));
    assert_eq!(step.status, Status::InvalidAction);
    assert!(
        step.observation
            .starts_with("Error: search is only available")
    );
    // Page 2, then back to page 1.
    let step = env.step(&click("next >"));
    assert!(
        step.observation.starts_with("results page 2 of "),
        "{}",
        step.observation
    );
    assert!(step.observation.contains("[< prev]"));
    let step = env.step(&click("< prev"));
    assert!(step.observation.starts_with("results page 1 of "));
    // A product not on this page is not clickable; the pick is.
    let pick = shop.catalog().product(goal.pick).unwrap();
    let step = env.step(&click(&format!("[{}]", pick.id.to_uppercase())));
    assert_eq!(step.status, Status::Running, "{}", step.observation);
    assert_eq!(env.page(), Page::Item);
    assert!(step.observation.contains(&pick.title));
    assert!(step.observation.contains("[buy now]"));
    assert!(step.observation.contains("selected : none"));
    let step = env.step(&click("description"));
    assert!(step.observation.contains("description : this"));
    let step = env.step(&click("buy now"));
    assert_eq!(
        step.status,
        Status::InvalidAction,
        "buy now is on the item page only"
    );
    env.step(&click("< prev"));
    let step = env.step(&click("features"));
    assert!(step.observation.contains(pick.attributes[0]));
    env.step(&click("< prev"));
    assert_eq!(env.page(), Page::Item);
    let (group, value) = goal.options[0];
    let step = env.step(&click(value));
    assert!(
        step.observation.contains(&format!("selected : {value}")),
        "{}",
        step.observation
    );
    assert!(step.observation.contains(&format!("{group} :")));
    let step = env.step(&click("back to search"));
    assert_eq!(step.observation, "search page");
    let step = env.step(&search("zzzz qqqq"));
    assert!(
        step.observation
            .starts_with("results page 1 of 1 , 0 results")
    );
    // The oracle takes over from anywhere.
    while let Some(c) = env.oracle() {
        let step = env.step(&c);
        assert_ne!(step.status, Status::InvalidAction);
    }
    assert!(env.success());
    let step = env.step(&click("buy now"));
    assert_eq!(step.status, Status::Completed);
    assert_eq!(step.reward, 0.0);
    assert!(step.observation.starts_with("Error"));
}

/// Opens the oracle's pick of `env` and returns it.
fn open_pick(env: &mut WebshopEnv) {
    env.reset();
    let q = env.oracle().unwrap();
    env.step(&q);
    let open = env.oracle().unwrap();
    assert_eq!(env.step(&open).status, Status::Running);
    assert_eq!(env.page(), Page::Item);
}

#[test]
fn rewards_follow_the_webshop_formula() {
    let shop = shop();
    for i in 0..50 {
        // Buying without selecting options: every option missed.
        let mut env = shop.episode(Split::Train, 3, i);
        open_pick(&mut env);
        let g = env.goal().clone();
        let step = env.step(&click("buy now"));
        let n = (g.attributes.len() + g.options.len() + 1) as f32;
        let expected = (g.attributes.len() + 1) as f32 / n;
        assert_eq!(step.reward, expected);
        assert_eq!(step.status, Status::Completed);
        assert!(!env.success());
        assert!(
            step.observation
                .starts_with("thank you for shopping ! you bought b0")
        );
        assert!(step.observation.ends_with(&format!("reward {expected:.2}")));
        assert_in_vocab(&step.observation);
    }
    // A product of another type: 0.5 in the same category, else 0.1, times the matched share.
    let catalog = shop.catalog();
    let g = shop.goal(Split::Train, 1, 0);
    for p in catalog.products() {
        let selected = vec![None; p.options.len()];
        let r = g.reward(p, &selected);
        let r_type = if p.kind == g.kind {
            1.0
        } else if TYPES[p.kind].category == TYPES[g.kind].category {
            0.5
        } else {
            0.1
        };
        let matched = g
            .attributes
            .iter()
            .filter(|a| p.attributes.contains(a))
            .count()
            + usize::from(p.price_cents <= g.cap_dollars * 100);
        assert_eq!(r, r_type * matched as f32 / 3.0);
    }
    // A wrong option value scores like a missing one; the right one completes the goal.
    let mut env = shop.episode(Split::Train, 1, 3);
    open_pick(&mut env);
    let (group, value) = env.goal().options[0];
    let pick = shop.catalog().product(env.goal().pick).unwrap();
    let values = &pick.options.iter().find(|(g, _)| *g == group).unwrap().1;
    if let Some(other) = values.iter().find(|v| **v != value) {
        let mut wrong = env.clone();
        wrong.step(&click(other));
        assert_eq!(wrong.step(&click("buy now")).reward, 2.0 / 3.0);
    }
    env.step(&click(value));
    assert_eq!(env.step(&click("buy now")).reward, 1.0);
}

#[test]
fn bad_calls_are_error_observations() {
    let shop = shop();
    let mut env = shop.episode(Split::Train, 1, 0);
    env.reset();
    let long = "x".repeat(agentry_env::tool::MAX_ARGUMENT_CHARS + 1);
    let table: Vec<(ToolCall, &str)> = vec![
        (
            ToolCall::new("fly", [("value", json!("x"))]),
            "Error: unknown tool ; the tools are search_action and click_action",
        ),
        (
            ToolCall::new("search_action", []),
            "Error: missing argument keywords",
        ),
        (
            ToolCall::new("click_action", []),
            "Error: missing argument value",
        ),
        (
            ToolCall::new("search_action", [("keywords", json!(3))]),
            "Error: argument keywords must be a string",
        ),
        (
            ToolCall::new("click_action", [("value", json!(["a"]))]),
            "Error: argument value must be a string",
        ),
        (
            ToolCall::new("search_action", [("keywords", json!(long))]),
            "Error: argument keywords is too long",
        ),
        (
            ToolCall::new(
                "search_action",
                [("keywords", json!("tea")), ("page", json!(2))],
            ),
            "Error: unexpected argument",
        ),
        (search("   "), "Error: keywords are empty"),
        (
            click("buy now"),
            "Error: nothing to click on the search page ; use search_action",
        ),
    ];
    for (c, expected) in &table {
        let step = env.step(c);
        assert_eq!(step.status, Status::InvalidAction, "{c:?}");
        assert_eq!(step.reward, 0.0);
        assert_eq!(step.observation, *expected);
        assert_in_vocab(&step.observation);
    }
    env.step(&search("shampoo"));
    for value in [
        "",
        "b0",
        "buy now",
        "description",
        "lavender",
        "next",
        "[next >",
        "< prev",
    ] {
        let step = env.step(&click(value));
        assert_eq!(step.status, Status::InvalidAction, "{value}");
        assert_eq!(
            step.observation,
            "Error: value is not clickable on this page"
        );
    }
}

/// A random call, and whether it is malformed (bad tool, missing, extra, mistyped or
/// oversized argument).
fn random_call(rng: &mut ChaCha8Rng, words: &[String], page_words: &[String]) -> (ToolCall, bool) {
    let name = match rng.random_range(0..10) {
        0..=3 => "search_action".to_string(),
        4..=8 => "click_action".to_string(),
        _ => garbage(rng, 12),
    };
    let mut malformed = name != "search_action" && name != "click_action";
    let param = if name == "search_action" {
        "keywords"
    } else {
        "value"
    };
    let mut arguments = Map::new();
    let value = match rng.random_range(0..12) {
        0..=4 => json!(page_words.choose(rng).cloned().unwrap_or_default()),
        5..=7 => {
            let n = rng.random_range(1..4);
            json!(
                (0..n)
                    .map(|_| words.choose(rng).unwrap().as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
        8 => json!(garbage(rng, 30)),
        9 => {
            malformed = true;
            json!("a".repeat(agentry_env::tool::MAX_ARGUMENT_CHARS + rng.random_range(1..100)))
        }
        10 => {
            malformed = true;
            [
                json!(rng.random::<i32>()),
                Json::Null,
                json!(true),
                json!(["x"]),
                json!({"a": 1}),
            ]
            .choose(rng)
            .unwrap()
            .clone()
        }
        _ => {
            malformed = true;
            Json::Null
        }
    };
    // Missing argument, or the argument under another name, or an extra one.
    match rng.random_range(0..10) {
        0 => malformed = true,
        1 => {
            malformed = true;
            arguments.insert(garbage(rng, 6) + "_x", value);
        }
        2 => {
            malformed = true;
            arguments.insert(param.to_string(), value);
            arguments.insert("extra".to_string(), json!("x"));
        }
        _ => {
            arguments.insert(param.to_string(), value);
        }
    }
    (ToolCall { name, arguments }, malformed)
}

fn garbage(rng: &mut ChaCha8Rng, max: usize) -> String {
    const CHARS: &[char] = &[
        'a', 'z', '0', ' ', '[', ']', '>', '<', '"', '\\', 'é', '€', '\n', '(', ')', '=', ',', '{',
        '}', 'b', '.',
    ];
    let n = rng.random_range(0..=max);
    (0..n).map(|_| *CHARS.choose(rng).unwrap()).collect()
}

/// Bracketed texts of an observation: what the page offers to click.
fn clickable(observation: &str) -> Vec<String> {
    observation
        .split('[')
        .skip(1)
        .filter_map(|s| s.split(']').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn random_and_malformed_calls_never_panic() {
    let shop = shop();
    let words = shop.vocabulary();
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut calls = 0usize;
    let mut malformed_calls = 0usize;
    let mut instance = 0u64;
    let mut completed = 0;
    while calls < 100_000 {
        let split = *SPLITS.choose(&mut rng).unwrap();
        let mut env = shop.instance(split, rng.random_range(1..=3), instance);
        instance += 1;
        let reset = env.reset();
        let mut page_words: Vec<String> = Vec::new();
        let mut over = false;
        for _ in 0..rng.random_range(1..60) {
            let step = match rng.random_range(0..10) {
                // Follow the oracle now and then, to reach deep pages.
                0..=1 => match env.oracle() {
                    Some(c) => env.step(&c),
                    None => env.step(&click("buy now")),
                },
                2 => {
                    // Random text through the policy's parser.
                    let text = match rng.random_range(0..3) {
                        0 => garbage(&mut rng, 40),
                        1 => format!("click_action(value=\"{}\")", garbage(&mut rng, 8)),
                        _ => format!(
                            "{{\"name\": \"search_action\", \"arguments\": {{\"keywords\": {}}}}}",
                            json!(words.choose(&mut rng).unwrap())
                        ),
                    };
                    match parse_call(&text) {
                        Ok(c) => env.step(&c),
                        Err(e) => {
                            assert!(e.starts_with("Error"));
                            continue;
                        }
                    }
                }
                _ => {
                    let (c, malformed) = random_call(&mut rng, &words, &page_words);
                    let step = env.step(&c);
                    if malformed {
                        malformed_calls += 1;
                        assert!(step.observation.starts_with("Error"), "{c:?}");
                        assert!(matches!(
                            step.status,
                            Status::InvalidAction | Status::Completed
                        ));
                        assert_eq!(step.status == Status::Completed, over);
                    }
                    step
                }
            };
            calls += 1;
            assert_in_vocab(&step.observation);
            assert!((0.0..=1.0).contains(&step.reward));
            if over {
                assert_eq!(step.status, Status::Completed);
                assert_eq!(step.reward, 0.0);
            } else {
                assert_eq!(
                    step.status == Status::InvalidAction,
                    step.observation.starts_with("Error"),
                    "{}",
                    step.observation
                );
                assert!(matches!(
                    step.status,
                    Status::Running | Status::InvalidAction | Status::Completed
                ));
            }
            if step.status == Status::Running {
                page_words = clickable(&step.observation);
            }
            if step.status == Status::Completed && !over {
                completed += 1;
            }
            over |= step.done();
            assert_eq!(env.oracle().is_none(), over);
        }
        if !over {
            // The oracle still finishes from wherever the random calls left the episode.
            while let Some(c) = env.oracle() {
                assert_ne!(env.step(&c).status, Status::InvalidAction);
            }
            assert!(env.success(), "{}", reset.instruction);
        }
    }
    assert!(malformed_calls > 20_000, "{malformed_calls}");
    assert!(completed > 100, "{completed}");
    println!(
        "{calls} calls over {instance} instances, {malformed_calls} malformed, {completed} purchases"
    );
}

#[test]
fn clone_mid_episode_then_continue_or_diverge() {
    let shop = shop();
    for d in 1..=3 {
        for i in 0..20 {
            let mut env = shop.instance(Split::Test, d, i);
            let reset = env.reset();
            let mut oracle_calls = Vec::new();
            let mut probe = env.box_clone();
            while let Some(c) = probe.oracle() {
                probe.step(&c);
                oracle_calls.push(c);
            }
            // Clone after k oracle calls; both continue identically.
            let k = i as usize % oracle_calls.len();
            for c in &oracle_calls[..k] {
                env.step(c);
            }
            let mut copy = env.box_clone();
            let detour = [click("features"), click("< prev"), click("back to search")];
            for c in &detour {
                assert_eq!(env.step(c), copy.step(c), "{}", reset.instruction);
            }
            while let Some(c) = env.oracle() {
                assert_eq!(copy.oracle().as_ref(), Some(&c));
                assert_eq!(env.step(&c), copy.step(&c), "{}", reset.instruction);
            }
            assert!(copy.oracle().is_none());
            assert!(env.success() && copy.success());
            // A clone that diverges leaves the original untouched.
            let mut env = shop.instance(Split::Test, d, i);
            env.reset();
            env.step(&oracle_calls[0]);
            let mut copy = env.box_clone();
            copy.step(&click("back to search"));
            copy.step(&search("tea"));
            while let Some(c) = env.oracle() {
                env.step(&c);
            }
            assert!(env.success());
            assert!(!copy.success());
            assert!(copy.oracle().is_some());
        }
    }
}

#[test]
fn vocabulary_is_bounded_and_covers_tools() {
    let shop = shop();
    let mut env = shop.instance(Split::Train, 1, 0);
    let reset = env.reset();
    for tool in &reset.tools {
        assert_in_vocab(&tool.name);
        assert_in_vocab(&tool.description);
        for p in &tool.parameters {
            assert_in_vocab(&p.name);
            assert_in_vocab(&p.description);
        }
    }
    let vocabulary = shop.vocabulary();
    assert!(vocabulary.len() < 3000, "{}", vocabulary.len());
    assert!(
        vocabulary
            .iter()
            .all(|w| words(w).count() == 1 && words(w).next() == Some(w))
    );
    println!("vocabulary: {} words", vocabulary.len());
}

/// A fingerprint of the standard task's first instances: when it changes, generated instances
/// changed and `VERSION` must be bumped (then update the fingerprint).
#[test]
fn instances_are_pinned_by_the_version() {
    let shop = shop();
    let mut text = String::new();
    for d in 1..=3 {
        for split in SPLITS {
            for i in 0..10 {
                let g = shop.goal(split, d, i);
                let pick = shop.catalog().product(g.pick).unwrap();
                text.push_str(&format!("{}|{}|{}\n", g.instruction, pick.id, pick.title));
            }
        }
    }
    // FNV-1a, stable across platforms.
    let fingerprint = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    assert_eq!(VERSION, "webshop-1");
    assert_eq!(
        fingerprint, 5_213_993_013_687_199_011,
        "instances changed: bump VERSION and this fingerprint"
    );
}
