//! WebShop: find and buy the product an instruction describes, in a generated web shop
//! (WebShop, Yao et al. 2022, on a generated catalogue so a small policy trained from scratch
//! can learn it).
//!
//! The agent reads an instruction such as `i want to buy shockproof and heavy bass bluetooth
//! speaker , with color : grey , and price lower than 53.00 dollars`, searches with
//! `search_action(keywords)` and browses with `click_action(value)`: results pages, item pages,
//! option values, `buy now`.
//! Buying ends the episode with WebShop's reward in [0, 1]; the episode counts as solved when
//! the reward is exactly 1.
//!
//! - [`catalog`]: the seeded catalogue and its BM25 index.
//! - [`goal`]: instructions generated from a target product, and the reward.
//! - [`tools`]: the tool schemas and argument checking.
//! - [`episode`]: one episode: pages, clicks, the oracle.
//!
//! Instance `index` of a split is drawn from an RNG seeded by the generator's seed, the
//! difficulty, the split, the index and an attempt number; a drawn goal is kept if it passes
//! the generation checks and a hash of its instruction puts it in the requested split (one in
//! five to test), else the next attempt is drawn. The split is thus a function of the
//! instruction text alone, so no instruction is in both splits.

pub mod catalog;
pub mod episode;
pub mod goal;
pub mod tools;

pub use catalog::{CATALOGUE_SIZE, Catalog, MAX_RESULTS, PAGE_SIZE, Product, ProductType, TYPES};
pub use episode::{Page, WebshopEnv};
pub use goal::Goal;

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::content_hash::content_hash;
use crate::{Environment, Split, TaskGenerator};

/// The version of generated instances; bumped whenever they change.
pub const VERSION: &str = "webshop-1";

/// The catalogue seed of the standard task ([`Webshop::default`]).
pub const STANDARD_SEED: u64 = 1;

/// The WebShop task: a catalogue, and goals drawn over it.
#[derive(Clone, Debug)]
pub struct Webshop {
    seed: u64,
    catalog: Arc<Catalog>,
}

impl Default for Webshop {
    /// The standard catalogue.
    fn default() -> Self {
        Webshop::new(STANDARD_SEED)
    }
}

impl Webshop {
    /// The task over the catalogue generated from `seed`.
    pub fn new(seed: u64) -> Webshop {
        Webshop {
            seed,
            catalog: Arc::new(Catalog::generate(seed)),
        }
    }

    /// The catalogue.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Whether an instruction belongs to the test split.
    pub fn is_test(&self, instruction: &str) -> bool {
        Split::of_hash(content_hash(&[self.seed], instruction)) == Split::Test
    }

    /// The goal of instance `index` of `split` at `difficulty` (clamped to 1..=3).
    ///
    /// Draws until a goal passes the checks and falls in `split` (one goal in five is a test
    /// goal); in release builds this takes tens of microseconds, a few hundred for test goals
    /// of difficulty 3.
    pub fn goal(&self, split: Split, difficulty: u8, index: u64) -> Goal {
        let difficulty = difficulty.clamp(1, 3);
        let want_test = split == Split::Test;
        let mut attempt = 0u64;
        loop {
            let seed = content_hash(
                &[
                    self.seed,
                    u64::from(difficulty),
                    u64::from(want_test),
                    index,
                    attempt,
                ],
                "goal",
            );
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            if let Some(goal) = goal::generate(&self.catalog, &mut rng, difficulty)
                && self.is_test(&goal.instruction) == want_test
            {
                return goal;
            }
            attempt += 1;
        }
    }

    /// The episode of instance `index` of `split` at `difficulty` (clamped to 1..=3), as its
    /// concrete type.
    pub fn episode(&self, split: Split, difficulty: u8, index: u64) -> WebshopEnv {
        let goal = self.goal(split, difficulty, index);
        WebshopEnv::new(self.catalog.clone(), Arc::new(goal))
    }
}

impl TaskGenerator for Webshop {
    fn version(&self) -> &str {
        VERSION
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(self.episode(split, difficulty, index))
    }

    /// Every word of instructions, pages and tools: fixed words, the catalogue's brands,
    /// nouns, attributes, option groups and values, product ids, prices, price caps, ratings,
    /// result counts and the rewards a receipt can show.
    fn vocabulary(&self) -> Vec<String> {
        let mut words: BTreeSet<String> = BTreeSet::new();
        let mut add = |text: &str| {
            for w in crate::pieces::words(text) {
                if !words.contains(w) {
                    words.insert(w.to_string());
                }
            }
        };
        for w in fixed_words() {
            add(w);
        }
        for b in catalog::BRANDS {
            add(b);
        }
        let mut max_price = 0;
        for ty in TYPES {
            add(ty.noun);
            add(ty.category);
            ty.attributes.iter().for_each(|a| add(a));
            for (g, values) in ty.groups {
                add(g);
                values.iter().for_each(|v| add(v));
            }
            max_price = max_price.max(ty.price.1 + 4);
        }
        for p in self.catalog.products() {
            add(&p.id);
            add(&p.price());
            add(&p.rating());
        }
        // Caps reach the price plus 60 % plus a dollar.
        for dollars in 1..=(max_price + 1) * 8 / 5 + 2 {
            add(&format!("{dollars}.00"));
        }
        for n in 0..=MAX_RESULTS {
            add(&n.to_string());
        }
        for reward in rewards() {
            add(&format!("{reward:.2}"));
        }
        words.into_iter().collect()
    }
}

/// Every reward a purchase can earn: `r_type * k / n` for the goal sizes of every difficulty.
fn rewards() -> impl Iterator<Item = f32> {
    // A goal has at most 3 attributes and 3 options: n is at most 7.
    [1.0f32, 0.5, 0.1].into_iter().flat_map(|r_type| {
        (1..=7usize).flat_map(move |n| (0..=n).map(move |k| r_type * k as f32 / n as f32))
    })
}

/// Every word of the task that does not depend on the catalogue.
fn fixed_words() -> impl Iterator<Item = &'static str> {
    tools::words()
        .chain(tools::ERROR_WORDS.iter().copied())
        .chain(episode::OBSERVATION_WORDS.iter().copied())
        .chain(goal::INSTRUCTION_WORDS.iter().copied())
        .chain(goal::LEADS.iter().copied())
}
