//! `Lights`: a row of lights, some off; the agent switches them all on with `toggle(index)`.
//!
//! A complete user task in under 150 lines: a seeded generator with disjoint train and test
//! splits and three difficulty levels, an episode that answers every bad call with an error
//! observation, and an oracle for the warm-up demonstrations.

use agentry::env::tool;
use agentry::env::{
    Environment, Param, ParamKind, Reset, Split, Status, Step, TaskGenerator, ToolCall, ToolSchema,
};

/// The task: rows of 3, 5 or 7 lights (difficulty 1, 2, 3).
#[derive(Default)]
pub struct Lights;

impl Lights {
    /// The row of `index` in `split`: a pattern of the level's width that is not all on.
    /// Patterns are numbered by their bits; a pattern is a test pattern when its number is a
    /// multiple of 5, so the splits never share one.
    fn pattern(split: Split, difficulty: u8, index: u64) -> Vec<bool> {
        let width = 1 + 2 * u32::from(difficulty.clamp(1, 3));
        let all_on = (1u64 << width) - 1;
        let in_split = |n: &u64| n.is_multiple_of(5) == (split == Split::Test);
        let candidates: Vec<u64> = (0..all_on).filter(in_split).collect();
        let n = candidates[(index % candidates.len() as u64) as usize];
        (0..width).map(|bit| n >> bit & 1 == 1).collect()
    }
}

impl TaskGenerator for Lights {
    fn version(&self) -> &str {
        "lights-1"
    }

    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(LightsEnv {
            lights: Lights::pattern(split, difficulty, index),
        })
    }

    fn vocabulary(&self) -> Vec<String> {
        let words = ["on", "off", "light", "is", "now", "all", "lights", "are"];
        let digits = (0..7).map(|i| i.to_string());
        words.iter().map(|w| w.to_string()).chain(digits).collect()
    }
}

/// One episode: the current row.
#[derive(Clone)]
struct LightsEnv {
    lights: Vec<bool>,
}

impl LightsEnv {
    /// The row as `0 off 1 on 2 off`: numbered, so finding an index is copying a word.
    fn row(&self) -> String {
        let states: Vec<String> = self
            .lights
            .iter()
            .enumerate()
            .map(|(i, &on)| format!("{i} {}", if on { "on" } else { "off" }))
            .collect();
        states.join(" ")
    }

    fn solved(&self) -> bool {
        self.lights.iter().all(|&on| on)
    }

    fn schema() -> ToolSchema {
        ToolSchema::new(
            "toggle",
            "switch one light, counting from 0",
            vec![Param::required("index", ParamKind::Integer, "which light")],
        )
    }
}

impl Environment for LightsEnv {
    fn reset(&mut self) -> Reset {
        Reset {
            instruction: format!("lights : {} . switch all on", self.row()),
            tools: vec![LightsEnv::schema()],
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        let error = |observation: String| Step {
            observation,
            reward: 0.0,
            status: Status::InvalidAction,
        };
        let tools = [LightsEnv::schema()];
        if let Err(message) = tool::find(&tools, call).and_then(|t| t.validate(call)) {
            return error(message);
        }
        let index = call.arguments["index"].as_u64().unwrap_or(u64::MAX);
        let Some(light) = usize::try_from(index)
            .ok()
            .and_then(|i| self.lights.get_mut(i))
        else {
            return error(format!(
                "Error: there are {} lights, numbered from 0.",
                self.lights.len()
            ));
        };
        *light = !*light;
        let solved = self.solved();
        Step {
            observation: if solved {
                "all lights are on".to_string()
            } else {
                self.row()
            },
            reward: if solved { 1.0 } else { 0.0 },
            status: if solved {
                Status::Completed
            } else {
                Status::Running
            },
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        let off = self.lights.iter().position(|&on| !on)?;
        Some(ToolCall::new("toggle", [("index", off.into())]))
    }

    fn success(&self) -> bool {
        self.solved()
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}
