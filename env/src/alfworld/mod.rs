//! ALFWorld: a text household (ALFWorld/TextWorld style) where the agent moves between
//! receptacles, opens them, takes, processes and puts objects to reach a goal such as
//! `put a clean mug in cabinet.`, through one tool, `take_action(action)`.
//!
//! Each instance is one room (a kitchen or a bedroom, as in ALFWorld) generated from a seed:
//! numbered receptacles (`cabinet 2`), some of which open and close, numbered objects lying in
//! or on them, distractors, a lamp in bedrooms, and one of ALFWorld's six goal types. The
//! reward is 1 on the step that reaches the goal, which ends the episode ([`Status::Completed`]).
//! An impossible or unknown command is answered `Nothing happens.` with [`Status::Running`], as
//! in ALFWorld; a malformed tool call gets `Error: ...` and [`Status::InvalidAction`]. Three
//! identical consecutive actions end the episode with [`Status::Completed`] and reward 0 (the
//! turn limit itself is the runtime's).
//!
//! - [`world`]: kinds, goals and the seeded generation of a room.
//! - [`action`]: the tool, its argument checking and the parsing of the ALFWorld commands.
//! - [`episode`]: one episode: the commands' semantics and observations, and the oracle.
//!
//! Instances are procedurally generated, so there is no list to split: instance `index` of a
//! split draws candidate rooms from seeds derived from `(generator seed, difficulty, index,
//! attempt)` and keeps the first whose canonical content ([`Instance::key`]) hashes to that
//! split (one in five to test). The split is a function of the content, so no room is in both.

pub mod action;
pub mod episode;
pub mod world;

pub use episode::{AlfworldEnv, MAX_REPEATS, NOTHING_HAPPENS};
pub use world::{
    Goal, GoalKind, Instance, Object, ObjectKind, Process, Receptacle, ReceptacleKind, Room,
};

use std::collections::BTreeSet;
use std::sync::Arc;

#[cfg(doc)]
use crate::Status;
use crate::content_hash::content_hash;
use crate::{Environment, Split, TaskGenerator};

/// The version of generated instances; bumped whenever they change.
pub const VERSION: &str = "alfworld-1";

/// The seed of the standard task ([`Alfworld::default`]).
pub const STANDARD_SEED: u64 = 1;

/// The ALFWorld task: a seeded generator of household rooms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alfworld {
    seed: u64,
}

impl Default for Alfworld {
    /// The standard task.
    fn default() -> Self {
        Alfworld::new(STANDARD_SEED)
    }
}

impl Alfworld {
    /// The task whose instances derive from `seed`.
    pub fn new(seed: u64) -> Alfworld {
        Alfworld { seed }
    }

    /// The split a room belongs to: decided by a hash of its canonical content.
    pub fn split_of(&self, instance: &Instance) -> Split {
        Split::of_hash(content_hash(&[self.seed], &instance.key()))
    }

    /// The room of instance `index` of `split` at `difficulty` (clamped to 1..=3).
    pub fn room(&self, split: Split, difficulty: u8, index: u64) -> Instance {
        let difficulty = difficulty.clamp(1, 3);
        // Each attempt lands in the wanted split with probability 4/5 (train) or 1/5 (test),
        // so the loop ends after a few attempts (more than 200 happen with probability below
        // 1e-19).
        let mut attempt: u64 = 0;
        loop {
            let seed = content_hash(&[self.seed, u64::from(difficulty), index, attempt], "room");
            let room = Instance::generate(seed, difficulty);
            if self.split_of(&room) == split {
                return room;
            }
            attempt = attempt.wrapping_add(1);
        }
    }

    /// The episode of instance `index` of `split` at `difficulty`, as its concrete type.
    pub fn episode(&self, split: Split, difficulty: u8, index: u64) -> AlfworldEnv {
        AlfworldEnv::new(Arc::new(self.room(split, difficulty, index)))
    }
}

impl TaskGenerator for Alfworld {
    fn version(&self) -> &str {
        VERSION
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(self.episode(split, difficulty, index))
    }

    /// The pieces of every instruction and observation: observation, goal, tool and error
    /// words, kind names and numbers, each also with a trailing `.` (the tokenizer keeps `.`
    /// in a word, so `1.` ends a sentence as one piece), and the punctuation used.
    fn vocabulary(&self) -> Vec<String> {
        let words: BTreeSet<String> = episode::OBSERVATION_WORDS
            .iter()
            .chain(action::ERROR_WORDS)
            .copied()
            .chain(action::words())
            .chain(ReceptacleKind::ALL.iter().map(|k| k.name()))
            .chain(ObjectKind::ALL.iter().map(|k| k.name()))
            .map(str::to_string)
            .chain((1..=world::MAX_NUMBER).map(|n| n.to_string()))
            .collect();
        let mut pieces: BTreeSet<String> = words.iter().map(|w| format!("{w}.")).collect();
        pieces.extend(words);
        pieces.extend([",", ":", "/"].map(str::to_string));
        pieces.into_iter().collect()
    }
}
