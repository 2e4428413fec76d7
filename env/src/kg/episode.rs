//! One KG episode: the variables the agent creates, the tools' semantics, scoring and the
//! oracle.
//!
//! Observations are deliberately terse (`#0 = 3 film`, `relations = directed acted_in`,
//! `#2 = count 4`): entity names are never listed, since the agent only ever needs a
//! variable's type and size, and every token costs policy throughput.

use std::sync::Arc;

use serde_json::json;

use super::questions::{Arg, Op, Question, Value};
use super::tools::{self, arguments};
use super::world::{Attribute, EntityId, Relation, World, intersect};
use crate::{Environment, Reset, Status, Step, ToolCall};

/// Most variables one episode may create: `#0` to `#15`.
pub const MAX_VARIABLES: usize = 16;

/// One episode of a KG question.
#[derive(Clone, Debug)]
pub struct KgEnv {
    world: Arc<World>,
    question: Arc<Question>,
    variables: Vec<Value>,
    /// The variable each program step's result was stored in, when the oracle's call for that
    /// step was executed.
    step_variables: Vec<Option<usize>>,
    answered: Option<Value>,
    reward: f32,
    f1: f32,
}

impl KgEnv {
    /// An episode of `question` in `world`.
    pub fn new(world: Arc<World>, question: Arc<Question>) -> KgEnv {
        let steps = question.program().len();
        KgEnv {
            world,
            question,
            variables: Vec::new(),
            step_variables: vec![None; steps],
            answered: None,
            reward: 0.0,
            f1: 0.0,
        }
    }

    /// The question of this episode.
    pub fn question(&self) -> &Question {
        &self.question
    }

    /// The variables created so far; `#i` is element `i`.
    pub fn variables(&self) -> &[Value] {
        &self.variables
    }

    /// The agent's final answer, once given.
    pub fn answered(&self) -> Option<&Value> {
        self.answered.as_ref()
    }

    /// F1 of the final answer against the correct one (for a count: 1 if equal, else 0); 0
    /// before the final answer.
    pub fn f1(&self) -> f32 {
        self.f1
    }

    /// Whether the episode has ended (the agent called `final_answer`).
    pub fn finished(&self) -> bool {
        self.answered.is_some()
    }

    /// Resolves a variable argument: `#i`, or an entity named in the question.
    fn resolve(&self, arg: &str) -> Result<Value, String> {
        if let Some(index) = arg.strip_prefix('#') {
            return index
                .parse::<usize>()
                .ok()
                .and_then(|i| self.variables.get(i))
                .cloned()
                .ok_or_else(|| "error unknown variable".to_string());
        }
        let entity = self
            .world
            .lookup(arg)
            .ok_or_else(|| "error unknown entity".to_string())?;
        if !self.question.entities().contains(&entity) {
            return Err("error entity not in the question".to_string());
        }
        Ok(Value::Set(self.world.entity_type(entity), vec![entity]))
    }

    /// Resolves a variable argument that must hold a set.
    fn resolve_set(&self, arg: &str) -> Result<(super::EntityType, Vec<EntityId>), String> {
        match self.resolve(arg)? {
            Value::Set(ty, members) => Ok((ty, members)),
            Value::Count(_) => Err("error variable is a count".to_string()),
        }
    }

    /// Executes a call; `Ok` is the observation (and the new variable, if any).
    fn execute(&self, call: &ToolCall) -> Result<(String, Option<Value>), String> {
        let args = arguments(call)?;
        let world = &self.world;
        let relation = |name: &str, ty: super::EntityType| -> Result<Relation, String> {
            let r =
                Relation::from_name(name).ok_or_else(|| "error unknown relation".to_string())?;
            if r.source() != ty {
                return Err(format!("error {} has no relation {name}", ty.name()));
            }
            Ok(r)
        };
        let attribute = |name: &str, ty: super::EntityType| -> Result<Attribute, String> {
            let a =
                Attribute::from_name(name).ok_or_else(|| "error unknown attribute".to_string())?;
            if a.owner() != ty {
                return Err(format!("error {} has no attribute {name}", ty.name()));
            }
            Ok(a)
        };
        let new = |value: Value| -> Result<(String, Option<Value>), String> {
            if self.variables.len() >= MAX_VARIABLES {
                return Err("error too many variables".to_string());
            }
            Ok((describe(self.variables.len(), &value), Some(value)))
        };
        match call.name.as_str() {
            tools::GET_RELATIONS => {
                let (_, set) = self.resolve_set(args[0])?;
                let names: Vec<&str> = world.relations_of(&set).iter().map(|r| r.name()).collect();
                Ok((list("relations", &names), None))
            }
            tools::GET_ATTRIBUTES => {
                let (ty, _) = self.resolve_set(args[0])?;
                let names: Vec<&str> = ty.attributes().iter().map(|a| a.name()).collect();
                Ok((list("attributes", &names), None))
            }
            tools::GET_NEIGHBORS => {
                let (ty, set) = self.resolve_set(args[0])?;
                let r = relation(args[1], ty)?;
                new(Value::Set(r.target(), world.neighbors_of(&set, r)))
            }
            tools::INTERSECTION => {
                let (ta, a) = self.resolve_set(args[0])?;
                let (tb, b) = self.resolve_set(args[1])?;
                if ta != tb {
                    return Err(format!(
                        "error cannot intersect {} and {}",
                        ta.name(),
                        tb.name()
                    ));
                }
                new(Value::Set(ta, intersect(&a, &b)))
            }
            tools::ARGMAX | tools::ARGMIN => {
                let (ty, set) = self.resolve_set(args[0])?;
                let a = attribute(args[1], ty)?;
                if set.is_empty() {
                    return Err("error variable is empty".to_string());
                }
                let max = call.name == tools::ARGMAX;
                new(Value::Set(ty, world.extreme(&set, a, max)))
            }
            tools::COUNT => {
                let (_, set) = self.resolve_set(args[0])?;
                new(Value::Count(set.len()))
            }
            tools::FINAL_ANSWER => Ok(("done".to_string(), Some(self.resolve(args[0])?))),
            _ => Err("error unknown tool".to_string()),
        }
    }

    /// The next step of the program to run, with its call: the first step whose oracle call
    /// has not been executed yet, or the final answer.
    fn next(&self) -> Option<(usize, ToolCall)> {
        if self.finished() {
            return None;
        }
        let program = self.question.program();
        let arg = |a: Arg| -> Option<String> {
            match a {
                Arg::Entity(e) => Some(self.world.name(e).to_string()),
                Arg::Step(i) => self.step_variables[i].map(|v| format!("#{v}")),
            }
        };
        for (i, op) in program.iter().enumerate() {
            if self.step_variables[i].is_some() {
                continue;
            }
            let call = match *op {
                Op::Neighbors(from, r) => ToolCall::new(
                    tools::GET_NEIGHBORS,
                    [
                        ("variable", json!(arg(from)?)),
                        ("relation", json!(r.name())),
                    ],
                ),
                Op::Intersection(a, b) => ToolCall::new(
                    tools::INTERSECTION,
                    [("variable1", json!(arg(a)?)), ("variable2", json!(arg(b)?))],
                ),
                Op::Argmax(from, a) => ToolCall::new(
                    tools::ARGMAX,
                    [
                        ("variable", json!(arg(from)?)),
                        ("attribute", json!(a.name())),
                    ],
                ),
                Op::Argmin(from, a) => ToolCall::new(
                    tools::ARGMIN,
                    [
                        ("variable", json!(arg(from)?)),
                        ("attribute", json!(a.name())),
                    ],
                ),
                Op::Count(from) => ToolCall::new(tools::COUNT, [("variable", json!(arg(from)?))]),
            };
            return Some((i, call));
        }
        let last = Arg::Step(program.len().checked_sub(1)?);
        Some((
            program.len(),
            ToolCall::new(tools::FINAL_ANSWER, [("variable", json!(arg(last)?))]),
        ))
    }

    fn score(&mut self, given: Value) {
        let f1 = match (&given, self.question.answer()) {
            (Value::Count(a), Value::Count(b)) => f32::from(u8::from(a == b)),
            (Value::Set(_, a), Value::Set(_, b)) => {
                let hits = intersect(a, b).len() as f32;
                if hits == 0.0 {
                    0.0
                } else {
                    let precision = hits / a.len() as f32;
                    let recall = hits / b.len() as f32;
                    2.0 * precision * recall / (precision + recall)
                }
            }
            _ => 0.0,
        };
        self.reward = f32::from(u8::from(&given == self.question.answer()));
        self.f1 = f1;
        self.answered = Some(given);
    }
}

/// The observation for a new variable: `#0 = 3 film` or `#2 = count 4`.
fn describe(index: usize, value: &Value) -> String {
    match value {
        Value::Set(ty, members) => format!("#{index} = {} {}", members.len(), ty.name()),
        Value::Count(n) => format!("#{index} = count {n}"),
    }
}

fn list(what: &str, names: &[&str]) -> String {
    if names.is_empty() {
        format!("{what} = none")
    } else {
        format!("{what} = {}", names.join(" "))
    }
}

/// Words of the non-error observations besides names, numbers and variables.
pub(crate) const OBSERVATION_WORDS: &[&str] = &[
    "=",
    "count",
    "relations",
    "attributes",
    "none",
    "done",
    "entities",
    ":",
    ",",
];

impl Environment for KgEnv {
    fn reset(&mut self) -> Reset {
        let steps = self.question.program().len();
        self.variables.clear();
        self.step_variables = vec![None; steps];
        self.answered = None;
        self.reward = 0.0;
        self.f1 = 0.0;
        // As in AgentBench's KG task, the question is followed by the entities it names: the
        // names the agent may pass as a `variable`.
        let entities: Vec<&str> = self
            .question
            .entities()
            .iter()
            .map(|&e| self.world.name(e))
            .collect();
        Reset {
            instruction: format!("{} entities: {}", self.question.text(), entities.join(", ")),
            tools: tools::schemas(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if self.finished() {
            return Step {
                observation: "error episode is over".to_string(),
                reward: 0.0,
                status: Status::Completed,
            };
        }
        let expected = self.next();
        match self.execute(call) {
            Err(observation) => Step {
                observation,
                reward: 0.0,
                status: Status::InvalidAction,
            },
            Ok((observation, value)) if call.name == tools::FINAL_ANSWER => {
                if let Some(value) = value {
                    self.score(value);
                }
                Step {
                    observation,
                    reward: self.reward,
                    status: Status::Completed,
                }
            }
            Ok((observation, value)) => {
                if let Some(value) = value {
                    if let Some((i, expected)) = expected
                        && &expected == call
                        && i < self.step_variables.len()
                    {
                        self.step_variables[i] = Some(self.variables.len());
                    }
                    self.variables.push(value);
                }
                Step {
                    observation,
                    reward: 0.0,
                    status: Status::Running,
                }
            }
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        self.next().map(|(_, call)| call)
    }

    fn success(&self) -> bool {
        self.reward == 1.0
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}
