//! One DB episode: a fresh in-memory SQLite database, the agent's statements, scoring and the
//! oracle.

use std::sync::Arc;

use rusqlite::Connection;
use rusqlite::backup::Backup;
use serde_json::{Value, json};

use super::questions::{Goal, Question};
use super::schema::Data;
use super::sql;
use super::tools::{self, COMMIT_FINAL_ANSWER, EXECUTE_SQL};
use crate::tool::find;
use crate::{Environment, Reset, Status, Step, ToolCall};

/// A validated instance: the database, the task and its expected outcome.
#[derive(Debug)]
pub struct Instance {
    /// The generated rows.
    pub data: Data,
    /// The SQL that creates the database.
    pub script: String,
    /// The task.
    pub question: Question,
    /// The instruction shown to the agent.
    pub instruction: String,
    /// For a question, the gold query's values, row by row, rendered as observations show
    /// them; empty for a write task.
    pub answers: Vec<String>,
    /// For a write task, [`sql::table_hash`] of the changed table after the gold statement.
    pub expected_hash: Option<u64>,
}

impl Instance {
    /// The gold statement as the oracle's call.
    pub fn gold_call(&self) -> ToolCall {
        ToolCall::new(EXECUTE_SQL, [("query", json!(self.question.sql))])
    }

    /// The final call the oracle makes.
    pub fn commit_call(&self) -> ToolCall {
        ToolCall::new(COMMIT_FINAL_ANSWER, [("answers", json!(self.answers))])
    }
}

/// One episode of a DB instance.
pub struct DbEnv {
    instance: Arc<Instance>,
    /// The episode's database; `None` only if SQLite failed to create or copy it.
    conn: Option<Connection>,
    /// Whether the database is as generated (no statement that writes has run).
    pristine: bool,
    /// Whether the oracle's gold statement has been executed.
    gold_ran: bool,
    finished: bool,
    reward: f32,
}

impl std::fmt::Debug for DbEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbEnv")
            .field("question", &self.instance.question.text)
            .field("pristine", &self.pristine)
            .field("gold_ran", &self.gold_ran)
            .field("finished", &self.finished)
            .field("reward", &self.reward)
            .finish()
    }
}

impl DbEnv {
    /// An episode of `instance` on `conn`, a locked-down database freshly made from the
    /// instance's script (or `None` to make it at `reset`).
    pub fn new(instance: Arc<Instance>, conn: Option<Connection>) -> DbEnv {
        DbEnv {
            pristine: conn.is_some(),
            instance,
            conn,
            gold_ran: false,
            finished: false,
            reward: 0.0,
        }
    }

    /// The instance.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// Whether the episode has ended (the agent committed an answer).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Runs `query` on the episode's database as the agent would, without counting as a turn
    /// (for tests and inspection); the error is the observation.
    pub fn query(&mut self, query: &str) -> Result<String, String> {
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| "Error: the database could not be created.".to_string())?;
        // A failed statement is rolled back by SQLite; counting it as a write anyway only
        // costs a rebuild at the next reset.
        let out = sql::run(conn, query);
        if out.as_ref().is_ok_and(|o| !o.writes) {
            return out.map(|o| o.observation());
        }
        self.pristine = false;
        out.map(|o| o.observation())
    }

    fn fresh_connection(script: &str) -> Option<Connection> {
        let mut conn = sql::open(script).ok()?;
        sql::lock_down(&mut conn).ok()?;
        Some(conn)
    }

    fn score(&mut self, answers: &[String]) -> bool {
        match self.instance.question.goal {
            Goal::Answer => sql::canonical(answers) == sql::canonical(&self.instance.answers),
            Goal::Write(t) => {
                let Some(table) = self.instance.data.domain.tables.get(t) else {
                    return false;
                };
                let Some(conn) = self.conn.as_mut() else {
                    return false;
                };
                let hash = sql::table_hash(conn, table.name);
                hash.is_some() && hash == self.instance.expected_hash
            }
        }
    }
}

fn invalid(observation: String) -> Step {
    Step {
        observation,
        reward: 0.0,
        status: Status::InvalidAction,
    }
}

impl Environment for DbEnv {
    fn reset(&mut self) -> Reset {
        if !self.pristine || self.conn.is_none() {
            self.conn = DbEnv::fresh_connection(&self.instance.script);
            self.pristine = true;
        }
        self.gold_ran = false;
        self.finished = false;
        self.reward = 0.0;
        Reset {
            instruction: self.instance.instruction.clone(),
            tools: tools::schemas(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if self.finished {
            return Step {
                observation: "Error: the episode is over.".to_string(),
                reward: 0.0,
                status: Status::Completed,
            };
        }
        let schemas = tools::schemas();
        if let Err(message) = find(&schemas, call).and_then(|tool| tool.validate(call)) {
            return invalid(message);
        }
        if call.name == EXECUTE_SQL {
            let is_gold = *call == self.instance.gold_call();
            return match self.query(call.str_arg("query")) {
                Ok(observation) => {
                    self.gold_ran |= is_gold;
                    Step {
                        observation,
                        reward: 0.0,
                        status: Status::Running,
                    }
                }
                Err(observation) if self.conn.is_none() => Step {
                    observation,
                    reward: 0.0,
                    status: Status::TaskError,
                },
                Err(observation) => invalid(observation),
            };
        }
        // `validate` accepted it, so `answers` is an array of strings.
        let answers: Vec<String> = call
            .arguments
            .get("answers")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let solved = self.score(&answers);
        self.finished = true;
        self.reward = f32::from(u8::from(solved));
        Step {
            observation: if solved {
                "Correct.".to_string()
            } else {
                "Wrong.".to_string()
            },
            reward: self.reward,
            status: Status::Completed,
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        if self.finished {
            None
        } else if self.gold_ran {
            Some(self.instance.commit_call())
        } else {
            Some(self.instance.gold_call())
        }
    }

    fn success(&self) -> bool {
        self.reward == 1.0
    }

    /// Copies the database with SQLite's backup API into a new locked-down connection.
    fn box_clone(&self) -> Box<dyn Environment> {
        let conn = self.conn.as_ref().and_then(|source| {
            let mut copy = sql::blank().ok()?;
            Backup::new(source, &mut copy).ok()?.step(-1).ok()?;
            sql::lock_down(&mut copy).ok()?;
            Some(copy)
        });
        Box::new(DbEnv {
            instance: self.instance.clone(),
            // A failed copy leaves `conn` empty: the clone's steps then report a task error.
            pristine: self.pristine && conn.is_some(),
            conn,
            gold_ran: self.gold_ran,
            finished: self.finished,
            reward: self.reward,
        })
    }
}
