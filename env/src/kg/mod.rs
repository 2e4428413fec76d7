//! KG: question answering over a generated knowledge graph with tool calls (AgentBench's KG
//! task, shrunk so a small policy trained from scratch can learn it).
//!
//! The agent reads a question such as `which films did kavoren direct ?` and answers it by
//! building variables with tools (`get_neighbors`, `intersection`, `argmax`, `count`, ...) and
//! then calling `final_answer` on one of them. The reward is 1 for an exact answer (set
//! equality, or the equal count), else 0, given on the final step; [`KgEnv::f1`] gives
//! partial credit.
//!
//! - [`world`]: the seeded knowledge graph.
//! - [`questions`]: templates, solution programs and the enumeration of questions.
//! - [`tools`]: the tool schemas and argument checking.
//! - [`episode`]: one episode, with its oracle.
//!
//! All questions of a difficulty are enumerated, then split by a hash of their text into
//! train (~80%) and test (~20%), and each split is shuffled with a seeded RNG so consecutive
//! indices mix templates.

pub mod episode;
pub mod questions;
pub mod tools;
pub mod world;

pub use episode::{KgEnv, MAX_VARIABLES};
pub use questions::{Arg, Op, Question, Value};
pub use world::{Attribute, EntityId, EntityType, Relation, World};

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::content_hash::content_hash;
use crate::{Environment, Split, TaskGenerator};

/// The version of generated instances; bumped whenever they change.
pub const VERSION: &str = "kg-1";

/// The world seed of the standard world ([`Kg::default`]).
pub const STANDARD_WORLD_SEED: u64 = 1;

/// The KG task: a world and its questions, split by difficulty into train and test.
#[derive(Clone, Debug)]
pub struct Kg {
    world: Arc<World>,
    /// `questions[difficulty - 1][split]`: train is 0, test is 1.
    questions: Vec<[Vec<Arc<Question>>; 2]>,
}

impl Default for Kg {
    /// The standard world.
    fn default() -> Self {
        Kg::new(STANDARD_WORLD_SEED)
    }
}

impl Kg {
    /// The task over the world generated from `world_seed`.
    ///
    /// # Panics
    /// If some split of some difficulty has no question, which does not happen for the
    /// generator's sizes (every template has candidates in any world).
    pub fn new(world_seed: u64) -> Kg {
        let reserved: BTreeSet<&str> = fixed_words().collect();
        let world = Arc::new(World::generate(world_seed, |w| reserved.contains(w)));
        let questions = (1..=3u8)
            .map(|difficulty| {
                let mut splits: [Vec<Arc<Question>>; 2] = [Vec::new(), Vec::new()];
                for q in questions::enumerate(&world, difficulty) {
                    let h = content_hash(&[world_seed, u64::from(difficulty)], q.text());
                    splits[usize::from(Split::of_hash(h) == Split::Test)].push(Arc::new(q));
                }
                for (i, split) in splits.iter_mut().enumerate() {
                    assert!(
                        !split.is_empty(),
                        "kg world {world_seed}: no question of difficulty {difficulty} in split {i}"
                    );
                    let seed =
                        content_hash(&[world_seed, u64::from(difficulty), i as u64], "shuffle");
                    split.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
                }
                splits
            })
            .collect();
        Kg { world, questions }
    }

    /// The world.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// The questions of `split` at `difficulty` (clamped to 1..=3), in instance-index order.
    pub fn questions(&self, split: Split, difficulty: u8) -> &[Arc<Question>] {
        let d = usize::from(difficulty.clamp(1, 3)) - 1;
        let s = match split {
            Split::Train => 0,
            Split::Test => 1,
        };
        &self.questions[d][s]
    }

    /// The episode of instance `index` (wrapping around) of `split` at `difficulty` (clamped
    /// to 1..=3), as its concrete type.
    pub fn episode(&self, split: Split, difficulty: u8, index: u64) -> KgEnv {
        let questions = self.questions(split, difficulty);
        let question = &questions[(index % questions.len() as u64) as usize];
        KgEnv::new(self.world.clone(), question.clone())
    }
}

impl TaskGenerator for Kg {
    fn version(&self) -> &str {
        VERSION
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(self.episode(split, difficulty, index))
    }

    /// The questions of the split at that difficulty: a fixed set, which indices wrap around.
    fn instances(&self, split: Split, difficulty: u8) -> Option<u64> {
        Some(self.questions(split, difficulty).len() as u64)
    }

    /// Every word of the questions and observations: template, tool, error and observation
    /// words, type, relation, attribute and entity names, numbers up to the largest type's size,
    /// and the variables `#0` to `#15`.
    fn vocabulary(&self) -> Vec<String> {
        let max = EntityType::ALL.iter().map(|t| t.count()).max().unwrap_or(0);
        let words: BTreeSet<String> = fixed_words()
            .map(str::to_string)
            .chain(self.world.names().iter().cloned())
            .chain((0..=max).map(|n| n.to_string()))
            .chain((0..MAX_VARIABLES).map(|i| format!("#{i}")))
            .collect();
        words.into_iter().collect()
    }
}

/// Every word of the task that does not depend on the world.
fn fixed_words() -> impl Iterator<Item = &'static str> {
    questions::template_words()
        .chain(tools::words())
        .chain(tools::ERROR_WORDS.iter().copied())
        .chain(episode::OBSERVATION_WORDS.iter().copied())
        .chain(EntityType::ALL.iter().map(|t| t.name()))
        .chain(Relation::ALL.iter().map(|r| r.name()))
        .chain(Attribute::ALL.iter().map(|a| a.name()))
}
