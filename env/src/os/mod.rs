//! OS: a sandboxed shell (AgentBench's OS task over an in-memory file system).
//!
//! The agent gets a question ("How many .log files are there in /var/app and its
//! subdirectories?") or a change to make ("Delete all files ending in .tmp under /tmp/work"),
//! explores and edits a generated file system with `bash_action(script)`, and ends with
//! `answer_action(answer)` (exact match after trimming) or `finish_action()` (the final file
//! system is checked). The reward is 1 when solved, else 0, given on the final step.
//!
//! The shell never touches the host: there is no process, file, network or environment
//! access, only [`fs::Fs`], a map in memory with size limits.
//!
//! - [`fs`]: the in-memory file system.
//! - [`shell`]: the shell language and its commands.
//! - [`tasks`]: the generated file system, the task templates, their oracle plans and checks.
//! - [`tools`]: the tool schemas.
//! - [`episode`]: one episode, with its oracle.
//!
//! Instances are drawn from a seeded stream of candidates; a candidate belongs to the test
//! split when the hash of its canonical content ([`tasks::Task::canonical`]) is divisible by 5,
//! so no instance can be in both splits.

pub mod episode;
pub mod fs;
pub mod shell;
pub mod tasks;
pub mod tools;

pub use episode::OsEnv;
pub use tasks::{Expect, Goal, Task};

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use crate::content_hash::{ContentHash, content_hash};
use crate::tool::ToolSchema;
use crate::{Environment, Split, TaskGenerator};

/// The version of generated instances; bumped whenever they change.
pub const VERSION: &str = "os-1";

/// The seed of the standard task ([`Os::default`]).
pub const STANDARD_SEED: u64 = 1;

/// Largest number in the vocabulary: every count, value and mode on the oracle's path is
/// below it.
pub const MAX_VOCAB_NUMBER: u32 = 1000;

/// The OS task: a seed, from which every instance is generated on demand.
#[derive(Clone, Debug)]
pub struct Os {
    seed: u64,
    tools: Arc<[ToolSchema]>,
}

impl Default for Os {
    /// The standard seed.
    fn default() -> Self {
        Os::new(STANDARD_SEED)
    }
}

impl Os {
    /// The task generated from `seed`.
    pub fn new(seed: u64) -> Os {
        Os {
            seed,
            tools: tools::schemas().into(),
        }
    }

    /// The split a generated task belongs to at `difficulty`: a pure function of its content
    /// (a hash of the same fields as [`Task::canonical`], streamed without building the text).
    pub fn split_of(&self, task: &Task, difficulty: u8) -> Split {
        let mut h = ContentHash::new(&[self.seed, u64::from(difficulty)]);
        h.write(task.template.as_bytes());
        h.write(&[0]);
        h.write(task.instruction.as_bytes());
        h.write(&[0]);
        for (path, node) in task.fs.iter() {
            h.write(path.as_bytes());
            h.write(&node.mode().to_le_bytes());
            match node {
                fs::Node::Dir { .. } => h.write(&[0]),
                fs::Node::File { content, .. } => {
                    h.write(&[1]);
                    h.write(&(content.len() as u64).to_le_bytes());
                    h.write(content.as_bytes());
                }
            }
        }
        Split::of_hash(h.finish())
    }

    /// Instance `index` of `split` at `difficulty` (clamped to 1..=3): the index draws a
    /// template; the first candidate file system of the index's seeded stream that fits the
    /// template and whose task belongs to `split` is the instance.
    pub fn task(&self, split: Split, difficulty: u8, index: u64) -> Task {
        let d = difficulty.clamp(1, 3);
        let templates = tasks::TEMPLATES
            .get(usize::from(d) - 1)
            .copied()
            .unwrap_or_default();
        // The template is fixed by the index, so templates are equally frequent even though
        // some decline more file systems than others.
        let mut rng =
            ChaCha8Rng::seed_from_u64(content_hash(&[self.seed, u64::from(d), index], "template"));
        let template = templates.choose(&mut rng).copied().unwrap_or_default();
        let mut attempt = 0u64;
        loop {
            let seed = content_hash(&[self.seed, u64::from(d), index, attempt], "os");
            attempt += 1;
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let fs = tasks::world(&mut rng);
            let Some((instruction, goal, plan)) = tasks::instantiate(template, &mut rng, &fs)
            else {
                continue;
            };
            let task = Task {
                template,
                instruction,
                fs,
                goal,
                plan,
            };
            if self.split_of(&task, d) == split {
                return task;
            }
        }
    }

    /// The episode of instance `index` of `split` at `difficulty`, as its concrete type.
    pub fn episode(&self, split: Split, difficulty: u8, index: u64) -> OsEnv {
        OsEnv::new(
            Arc::new(self.task(split, difficulty, index)),
            self.tools.clone(),
        )
    }
}

impl TaskGenerator for Os {
    fn version(&self) -> &str {
        VERSION
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(self.episode(split, difficulty, index))
    }

    /// Every word of the oracle's path: instruction, tool and command words, the generated
    /// names and contents, file names, and the numbers up to [`MAX_VOCAB_NUMBER`].
    fn vocabulary(&self) -> Vec<String> {
        let mut texts: Vec<String> = vec![
            tasks::TEMPLATE_TEXT.to_string(),
            shell::CUT_NOTE.to_string(),
            episode::NO_OUTPUT.to_string(),
            episode::DONE.to_string(),
            "total from urgent x bash type name".to_string(),
        ];
        texts.extend(episode::ERRORS.iter().map(|s| s.to_string()));
        for t in self.tools.iter() {
            texts.push(t.name.clone());
            texts.push(t.description.clone());
            for p in &t.parameters {
                texts.push(p.name.clone());
                texts.push(p.description.clone());
            }
        }
        let lists: [&[&str]; 14] = [
            &tasks::USERS,
            &tasks::STEMS,
            &tasks::EXTS,
            &tasks::WORDS,
            &tasks::LEVELS,
            &tasks::MESSAGES,
            &tasks::PAGES,
            &tasks::STATUSES,
            &tasks::SERVICES,
            &tasks::KEYWORDS,
            &tasks::CONFIG_KEYS,
            &tasks::CONFIG_LEVELS,
            &tasks::FIXED_NAMES,
            &shell::COMMANDS,
        ];
        texts.extend(lists.iter().flat_map(|l| l.iter().map(|s| s.to_string())));
        for stem in tasks::STEMS {
            for ext in tasks::EXTS {
                texts.push(format!("{stem}.{ext} .{ext}"));
            }
        }
        texts.extend(('a'..='z').chain('A'..='Z').map(String::from));
        texts.extend((0..=MAX_VOCAB_NUMBER).map(|n| n.to_string()));
        let words: BTreeSet<String> = texts
            .iter()
            .flat_map(|t| crate::pieces::word_runs(t))
            .map(str::to_string)
            .collect();
        words.into_iter().collect()
    }
}
