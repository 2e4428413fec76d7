//! DB: questions and changes over a real SQLite database (AgentBench's DB task, with generated
//! schemas and rows).
//!
//! Each episode gets a fresh in-memory SQLite database of one of four domains (company, shop,
//! school, library; three or four tables linked by foreign keys, 3 to 60 rows each). The
//! instruction is a question ("What is the total salary of employees whose city is 'Lyon'?")
//! or a change ("Delete every order with a quantity below 3."), followed by the table schemas.
//! The agent runs SQL with `execute_sql` and ends with `commit_final_answer(answers)`.
//!
//! - A question is solved when the answers, as a multiset of normalized values
//!   ([`sql::normalize`]: trimmed, numbers in canonical form), equal the gold query's values.
//! - A change is solved when the changed table hashes ([`sql::table_hash`]: column names and
//!   the multiset of rows) as it does after the gold statement on a fresh copy; the answers are
//!   ignored.
//!
//! Modules: [`schema`] (domains and rows), [`questions`] (templates and gold SQL), [`sql`]
//! (the locked-down database, limits, rendering, hashing), [`tools`], [`episode`].
//!
//! Instance `index` of a split is drawn from a seeded RNG; a drawn instance belongs to the test
//! split exactly when a hash of its canonical content (the creating SQL, the question and the
//! gold SQL) is divisible by 5, and is skipped when it belongs to the other split or fails
//! validation, so no instance can be in both splits.

pub mod episode;
pub mod questions;
pub mod schema;
pub mod sql;
pub mod tools;

pub use episode::{DbEnv, Instance};
pub use questions::{Goal, Question};
pub use schema::{DOMAINS, Data, Domain};

use std::collections::BTreeSet;
use std::sync::Arc;

use rand::SeedableRng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;
use rusqlite::Connection;

use crate::content_hash::content_hash;
use crate::{Environment, Split, TaskGenerator};

/// The version of generated instances; bumped whenever they change.
pub const VERSION: &str = "db-1";

/// The seed of the standard task ([`Db::default`]).
pub const STANDARD_SEED: u64 = 1;

/// Largest number an answer may hold; instances whose answers go beyond are skipped, so the
/// vocabulary can hold every number `0..=MAX_NUMBER`.
pub const MAX_NUMBER: i64 = 2100;

/// Most draws for one instance (about 5 are needed on average for the test split).
const MAX_DRAWS: u64 = 10_000;

/// Text after a question in the instruction.
const ANSWER_HINT: &str = "Answer with commit_final_answer, one value per string.";
/// Text after a change in the instruction.
const WRITE_HINT: &str = "After the change, call commit_final_answer with an empty list.";

/// The DB task: a seed from which every instance is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Db {
    seed: u64,
}

impl Default for Db {
    /// The standard task.
    fn default() -> Self {
        Db::new(STANDARD_SEED)
    }
}

impl Db {
    /// The task drawn from `seed`.
    pub fn new(seed: u64) -> Db {
        Db { seed }
    }

    /// The validated instance `index` of `split` at `difficulty` (clamped to 1..=3), with its
    /// database ready for the agent.
    ///
    /// # Panics
    /// If no valid instance is found in 10,000 draws, which does not happen for the
    /// generator's templates (a draw is valid far more often than not).
    pub fn build(&self, split: Split, difficulty: u8, index: u64) -> (Instance, Connection) {
        let difficulty = difficulty.clamp(1, 3);
        let split_tag = match split {
            Split::Train => 0,
            Split::Test => 1,
        };
        for draw in 0..MAX_DRAWS {
            let seed = content_hash(
                &[self.seed, u64::from(difficulty), split_tag, index, draw],
                "db draw",
            );
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let Some(domain) = DOMAINS.choose(&mut rng) else {
                break;
            };
            let data = Data::generate(domain, &mut rng);
            let Some(question) = questions::generate(&data, difficulty, &mut rng) else {
                continue;
            };
            let script = data.script();
            if split_of(&canonical_content(&script, &question)) != split {
                continue;
            }
            if let Some(built) = validate(data, script, question) {
                return built;
            }
        }
        panic!("db: no valid instance for {split:?} difficulty {difficulty} index {index}");
    }

    /// The episode of instance `index` of `split` at `difficulty`, as its concrete type.
    pub fn episode(&self, split: Split, difficulty: u8, index: u64) -> DbEnv {
        let (instance, conn) = self.build(split, difficulty, index);
        DbEnv::new(Arc::new(instance), Some(conn))
    }
}

/// The canonical content of an instance, which decides its split: the creating SQL, the
/// question and the gold SQL.
pub fn canonical_content(script: &str, question: &Question) -> String {
    format!("{script}\n{}\n{}", question.text, question.sql)
}

/// The split an instance with this canonical content belongs to.
pub fn split_of(content: &str) -> Split {
    Split::of_hash(content_hash(&[], content))
}

/// Builds the database and checks the task: a question must have 1 to
/// [`sql::MAX_ROWS_SHOWN`] rows of values without `NULL`, numbers in `0..=MAX_NUMBER`, not a
/// lone zero count, and no tie at its `LIMIT`; a change must change its table.
fn validate(data: Data, script: String, question: Question) -> Option<(Instance, Connection)> {
    let mut conn = sql::open(&script).ok()?;
    let mut answers = Vec::new();
    let mut expected_hash = None;
    match question.goal {
        questions::Goal::Answer => {
            let out = sql::run(&mut conn, &question.sql).ok()?;
            if out.total == 0 || out.total > sql::MAX_ROWS_SHOWN || out.more {
                return None;
            }
            answers = out.rows.into_iter().flatten().collect();
            let bad_number = |a: &String| {
                a.parse::<f64>()
                    .is_ok_and(|x| x.fract() != 0.0 || !(0.0..=MAX_NUMBER as f64).contains(&x))
            };
            if answers.iter().any(|a| a == "NULL" || bad_number(a)) || answers == ["0"] {
                return None;
            }
            if let Some((tie_sql, k)) = &question.tie {
                let keys = sql::run(&mut conn, tie_sql).ok()?.rows;
                if keys.len() > *k && keys.get(k - 1) == keys.get(*k) {
                    return None;
                }
            }
        }
        questions::Goal::Write(t) => {
            let table = data.domain.tables.get(t)?.name;
            conn.execute_batch("BEGIN").ok()?;
            let before = sql::table_hash(&mut conn, table)?;
            let out = sql::run(&mut conn, &question.sql).ok()?;
            let after = sql::table_hash(&mut conn, table)?;
            conn.execute_batch("ROLLBACK").ok()?;
            if out.changed == 0 || before == after {
                return None;
            }
            expected_hash = Some(after);
        }
    }
    sql::lock_down(&mut conn).ok()?;
    let hint = match question.goal {
        questions::Goal::Answer => ANSWER_HINT,
        questions::Goal::Write(_) => WRITE_HINT,
    };
    let instruction = format!(
        "{}\n{hint}\nTable info: {}",
        question.text,
        data.table_info()
    );
    Some((
        Instance {
            data,
            script,
            question,
            instruction,
            answers,
            expected_hash,
        },
        conn,
    ))
}

impl TaskGenerator for Db {
    fn version(&self) -> &str {
        VERSION
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(self.episode(split, difficulty, index))
    }

    /// Every piece of the instructions, the oracle's SQL and the observations on its path:
    /// template, SQL, tool and observation words, table, column and `table.column` names, the
    /// words of generated values, and the numbers `0..=MAX_NUMBER`.
    fn vocabulary(&self) -> Vec<String> {
        let mut words: BTreeSet<String> = BTreeSet::new();
        let mut add = |text: &str| {
            for piece in crate::pieces::words(text) {
                words.insert(piece.to_string());
            }
        };
        add(questions::TEMPLATE_WORDS);
        add(questions::SQL_WORDS);
        add(ANSWER_HINT);
        add(WRITE_HINT);
        add(OBSERVATION_WORDS);
        for text in tools::texts() {
            add(text);
        }
        for domain in DOMAINS {
            for table in domain.tables {
                add(table.name);
                add(table.singular);
                add(table.plural);
                for column in table.columns {
                    add(column.name);
                    add(column.label);
                    add(&format!("{}.{}", table.name, column.name));
                }
            }
        }
        for word in schema::value_words() {
            add(word);
        }
        for n in 0..=MAX_NUMBER {
            add(&n.to_string());
        }
        words.into_iter().collect()
    }
}

/// Words of the instruction frame and of the observations on the oracle's path.
const OBSERVATION_WORDS: &str = "Table info : INTEGER PRIMARY KEY TEXT REFERENCES ( ) ; , | \
    rows row shown Query OK affected. Correct. Wrong.";
