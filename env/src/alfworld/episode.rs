//! One ALFWorld episode: the changing state of the room, the commands' semantics and
//! observations, the goal check, and the oracle.
//!
//! Observations follow ALFWorld's wording (`You arrive at countertop 1. On the countertop 1,
//! you see a apple 1, and a knife 2.`). A well-formed call whose action is not a command of the
//! room, or is impossible right now, is answered `Nothing happens.` with status
//! [`Status::Running`], as ALFWorld does; only malformed tool calls get `Error: ...` and
//! [`Status::InvalidAction`].

use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::json;

use super::action::{self, ACTION, Action, TAKE_ACTION};
use super::world::{Goal, GoalKind, Instance, Process};
use crate::{Environment, Reset, Status, Step, ToolCall};

/// The answer to an action that is not possible now.
pub const NOTHING_HAPPENS: &str = "Nothing happens.";

/// How many identical consecutive actions end the episode.
pub const MAX_REPEATS: u8 = 3;

const CLEAN: u8 = 1;
const HOT: u8 = 2;
const COLD: u8 = 4;
const ON: u8 = 8;

/// Words of the observations and the instruction besides kind names and numbers.
pub(crate) const OBSERVATION_WORDS: &[&str] = &[
    "You", "are", "in", "the", "middle", "of", "a", "room", "Looking", "quickly", "around", "you",
    "see", "Your", "task", "is", "to", "arrive", "at", "On", "nothing", "The", "closed", "open",
    "In", "it", "pick", "up", "from", "put", "on", "close", "using", "clean", "heat", "cool",
    "turn", "off", "There", "special", "about", "and", "hot", "cold", "facing", "carrying", "not",
    "anything", "Nothing", "happens", "episode", "ends", "repeated", "same", "action", "three",
    "times", "examine", "with", "two",
];

/// One episode of an ALFWorld instance.
#[derive(Clone, Debug)]
pub struct AlfworldEnv {
    instance: Arc<Instance>,
    /// The receptacle the agent stands at; `None` in the middle of the room.
    at: Option<usize>,
    holding: Option<usize>,
    /// Per object: the receptacle it is in or on; `None` while held.
    location: Vec<Option<usize>>,
    /// Per receptacle: whether it is open.
    open: Vec<bool>,
    /// Per object: `CLEAN`, `HOT`, `COLD` and `ON` bits.
    flags: Vec<u8>,
    /// Per receptacle: whether the agent has seen its contents (arrived at it or opened it
    /// while open). Only the agent moves things, so what it saw is still where it saw it.
    seen: Vec<bool>,
    /// The last well-formed action, normalized, and how many times in a row it came.
    last_action: String,
    repeats: u8,
    finished: bool,
    reward: f32,
}

impl AlfworldEnv {
    /// An episode of `instance`, in its starting state.
    pub fn new(instance: Arc<Instance>) -> AlfworldEnv {
        let mut env = AlfworldEnv {
            instance,
            at: None,
            holding: None,
            location: Vec::new(),
            open: Vec::new(),
            flags: Vec::new(),
            seen: Vec::new(),
            last_action: String::new(),
            repeats: 0,
            finished: false,
            reward: 0.0,
        };
        env.restart();
        env
    }

    fn restart(&mut self) {
        let inst = &self.instance;
        self.at = None;
        self.holding = None;
        self.location = inst.objects().iter().map(|o| Some(o.location)).collect();
        self.open = inst.receptacles().iter().map(|r| r.open).collect();
        self.flags = vec![0; inst.objects().len()];
        self.seen = vec![false; inst.receptacles().len()];
        self.last_action.clear();
        self.repeats = 0;
        self.finished = false;
        self.reward = 0.0;
    }

    /// The instance of this episode.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// Whether the episode has ended (goal reached or an action repeated three times).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The index of the receptacle the agent stands at, if any.
    pub fn at(&self) -> Option<usize> {
        self.at
    }

    /// The index of the object the agent holds, if any.
    pub fn holding(&self) -> Option<usize> {
        self.holding
    }

    /// Whether the goal holds in the current state.
    pub fn goal_reached(&self) -> bool {
        let inst = &self.instance;
        let objects = inst.objects();
        let receptacles = inst.receptacles();
        match *inst.goal() {
            Goal::Look { object, lamp } => {
                let holds = self
                    .holding
                    .is_some_and(|h| objects.get(h).is_some_and(|o| o.kind == object));
                holds
                    && self.at.is_some_and(|r| {
                        objects.iter().enumerate().any(|(i, o)| {
                            o.kind == lamp
                                && self.location.get(i) == Some(&Some(r))
                                && self.flag(i, ON)
                        })
                    })
            }
            Goal::Place {
                kind,
                object,
                target,
            } => {
                let needed = if kind == GoalKind::PickTwoObjAndPlace {
                    2
                } else {
                    1
                };
                receptacles.iter().enumerate().any(|(r, rec)| {
                    rec.kind == target
                        && objects
                            .iter()
                            .enumerate()
                            .filter(|(i, o)| {
                                o.kind == object
                                    && self.location.get(*i) == Some(&Some(r))
                                    && kind.process().is_none_or(|p| self.processed(*i, p))
                            })
                            .count()
                            >= needed
                })
            }
        }
    }

    fn flag(&self, object: usize, bit: u8) -> bool {
        self.flags.get(object).is_some_and(|f| f & bit != 0)
    }

    fn processed(&self, object: usize, process: Process) -> bool {
        self.flag(
            object,
            match process {
                Process::Clean => CLEAN,
                Process::Heat => HOT,
                Process::Cool => COLD,
            },
        )
    }

    /// Records that the agent saw what receptacle `r` holds, if it can see into it.
    fn see(&mut self, r: usize) {
        if self.accessible(r)
            && let Some(seen) = self.seen.get_mut(r)
        {
            *seen = true;
        }
    }

    /// Where the agent has seen object `o`, if it has.
    fn known_location(&self, o: usize) -> Option<usize> {
        let r = (*self.location.get(o)?)?;
        self.seen.get(r).copied().unwrap_or(false).then_some(r)
    }

    /// Whether the agent can see into and reach into receptacle `r`.
    fn accessible(&self, r: usize) -> bool {
        self.open.get(r).copied().unwrap_or(false)
    }

    fn receptacle_name(&self, r: usize, out: &mut String) {
        if let Some(rec) = self.instance.receptacles().get(r) {
            let _ = write!(out, "{} {}", rec.kind.name(), rec.number);
        }
    }

    fn object_name(&self, o: usize, out: &mut String) {
        if let Some(obj) = self.instance.objects().get(o) {
            let _ = write!(out, "{} {}", obj.kind.name(), obj.number);
        }
    }

    /// `a x 1, a y 2, and a z 3` (ALFWorld's listing), or `nothing`.
    fn list(&self, items: impl Iterator<Item = usize>, objects: bool, out: &mut String) {
        let items: Vec<usize> = items.collect();
        if items.is_empty() {
            out.push_str("nothing");
        }
        for (k, &i) in items.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            if k > 0 && k + 1 == items.len() {
                out.push_str("and ");
            }
            out.push_str("a ");
            if objects {
                self.object_name(i, out);
            } else {
                self.receptacle_name(i, out);
            }
        }
    }

    /// What the agent sees at receptacle `r`.
    fn describe(&self, r: usize, out: &mut String) {
        let Some(rec) = self.instance.receptacles().get(r) else {
            return;
        };
        let contents = (0..self.location.len()).filter(|&i| self.location.get(i) == Some(&Some(r)));
        if rec.kind.openable() {
            out.push_str("The ");
            self.receptacle_name(r, out);
            if self.accessible(r) {
                out.push_str(" is open. In it, you see ");
                self.list(contents, true, out);
                out.push('.');
            } else {
                out.push_str(" is closed.");
            }
        } else {
            out.push_str("On the ");
            self.receptacle_name(r, out);
            out.push_str(", you see ");
            self.list(contents, true, out);
            out.push('.');
        }
    }

    /// `Looking quickly around you, you see a cabinet 1, ..., and a shelf 2.`
    fn look_around(&self, out: &mut String) {
        out.push_str("Looking quickly around you, you see ");
        self.list(0..self.instance.receptacles().len(), false, out);
        out.push('.');
    }

    /// Executes a command; `None` when it is not possible now.
    fn execute(&mut self, action: Action) -> Option<String> {
        let mut out = String::with_capacity(96);
        let inst = Arc::clone(&self.instance);
        let objects = inst.objects();
        let receptacles = inst.receptacles();
        match action {
            Action::GoTo(r) => {
                if self.at == Some(r) {
                    return None;
                }
                self.at = Some(r);
                self.see(r);
                out.push_str("You arrive at ");
                self.receptacle_name(r, &mut out);
                out.push_str(". ");
                self.describe(r, &mut out);
            }
            Action::Take(o, r) => {
                let portable = objects.get(o).is_some_and(|x| !x.kind.is_lamp());
                if self.at != Some(r)
                    || self.holding.is_some()
                    || !portable
                    || self.location.get(o) != Some(&Some(r))
                    || !self.accessible(r)
                {
                    return None;
                }
                *self.location.get_mut(o)? = None;
                self.holding = Some(o);
                out.push_str("You pick up the ");
                self.object_name(o, &mut out);
                out.push_str(" from the ");
                self.receptacle_name(r, &mut out);
                out.push('.');
            }
            Action::Put(o, r) => {
                if self.at != Some(r) || self.holding != Some(o) || !self.accessible(r) {
                    return None;
                }
                *self.location.get_mut(o)? = Some(r);
                self.holding = None;
                out.push_str("You put the ");
                self.object_name(o, &mut out);
                out.push(' ');
                out.push_str(receptacles.get(r)?.kind.preposition());
                out.push_str(" the ");
                self.receptacle_name(r, &mut out);
                out.push('.');
            }
            Action::Open(r) => {
                if self.at != Some(r) || !receptacles.get(r)?.kind.openable() || self.accessible(r)
                {
                    return None;
                }
                *self.open.get_mut(r)? = true;
                self.see(r);
                out.push_str("You open the ");
                self.receptacle_name(r, &mut out);
                out.push_str(". ");
                self.describe(r, &mut out);
            }
            Action::Close(r) => {
                if self.at != Some(r) || !receptacles.get(r)?.kind.openable() || !self.accessible(r)
                {
                    return None;
                }
                *self.open.get_mut(r)? = false;
                out.push_str("You close the ");
                self.receptacle_name(r, &mut out);
                out.push('.');
            }
            Action::Process(process, o, r) => {
                if self.at != Some(r)
                    || self.holding != Some(o)
                    || receptacles.get(r)?.kind != process.appliance()
                {
                    return None;
                }
                let flags = self.flags.get_mut(o)?;
                *flags = match process {
                    Process::Clean => *flags | CLEAN,
                    Process::Heat => (*flags | HOT) & !COLD,
                    Process::Cool => (*flags | COLD) & !HOT,
                };
                let _ = write!(out, "You {} the ", process.verb());
                self.object_name(o, &mut out);
                out.push_str(" using the ");
                self.receptacle_name(r, &mut out);
                out.push('.');
            }
            Action::Use(o) => {
                let lamp = objects.get(o).is_some_and(|x| x.kind.is_lamp());
                if !lamp || self.at.is_none() || self.location.get(o) != Some(&self.at) {
                    return None;
                }
                let flags = self.flags.get_mut(o)?;
                *flags ^= ON;
                let on = *flags & ON != 0;
                out.push_str(if on {
                    "You turn on the "
                } else {
                    "You turn off the "
                });
                self.object_name(o, &mut out);
                out.push('.');
            }
            Action::ExamineObject(o) => {
                let visible = self.holding == Some(o)
                    || self.at.is_some_and(|r| {
                        self.location.get(o) == Some(&Some(r)) && self.accessible(r)
                    });
                if !visible {
                    return None;
                }
                let flags = self.flags.get(o).copied().unwrap_or(0);
                if objects.get(o)?.kind.is_lamp() {
                    out.push_str("The ");
                    self.object_name(o, &mut out);
                    out.push_str(if flags & ON != 0 {
                        " is on."
                    } else {
                        " is off."
                    });
                } else {
                    let states: Vec<&str> = [(CLEAN, "clean"), (HOT, "hot"), (COLD, "cold")]
                        .into_iter()
                        .filter(|(bit, _)| flags & bit != 0)
                        .map(|(_, w)| w)
                        .collect();
                    if states.is_empty() {
                        out.push_str("There is nothing special about the ");
                        self.object_name(o, &mut out);
                        out.push('.');
                    } else {
                        out.push_str("The ");
                        self.object_name(o, &mut out);
                        out.push_str(" is ");
                        out.push_str(&states.join(" and "));
                        out.push('.');
                    }
                }
            }
            Action::ExamineReceptacle(r) => {
                if self.at != Some(r) {
                    return None;
                }
                self.describe(r, &mut out);
            }
            Action::Look => match self.at {
                None => {
                    out.push_str("You are in the middle of a room. ");
                    self.look_around(&mut out);
                }
                Some(r) => {
                    out.push_str("You are facing the ");
                    self.receptacle_name(r, &mut out);
                    out.push_str(". ");
                    self.look_around(&mut out);
                }
            },
            Action::Inventory => match self.holding {
                None => out.push_str("You are not carrying anything."),
                Some(o) => {
                    out.push_str("You are carrying: a ");
                    self.object_name(o, &mut out);
                    out.push('.');
                }
            },
        }
        Some(out)
    }

    /// The oracle's next action text, planned from what the agent has observed, so that a
    /// policy imitating it could act the same: the receptacles the room lists, the contents of
    /// those it has visited, what it holds. An object or lamp not seen yet is searched for by
    /// visiting the unseen receptacles in the order the room lists them (opening a closed
    /// one). Then: take it, process it, go to the target, open it, put it (or use the lamp).
    /// Anything else the agent is holding is put down first, so the oracle can take over at
    /// any point of an episode.
    pub fn oracle_action(&self) -> Option<String> {
        if self.finished {
            return None;
        }
        let inst = &self.instance;
        let objects = inst.objects();
        let receptacles = inst.receptacles();
        let rname = |r: usize| {
            let mut s = String::new();
            self.receptacle_name(r, &mut s);
            s
        };
        let oname = |o: usize| {
            let mut s = String::new();
            self.object_name(o, &mut s);
            s
        };
        // Go to `r`, open it if needed, then do `then`.
        let at_open = |r: usize, then: String| -> String {
            if self.at != Some(r) {
                format!("go to {}", rname(r))
            } else if !self.accessible(r) {
                format!("open {}", rname(r))
            } else {
                then
            }
        };
        let put = |o: usize, r: usize| -> Option<String> {
            let prep = receptacles.get(r)?.kind.preposition();
            Some(at_open(r, format!("put {} {prep} {}", oname(o), rname(r))))
        };
        // The first receptacle in the room's listing whose contents the agent has not seen.
        let search = || -> Option<String> {
            let r = (0..receptacles.len()).find(|&r| !self.seen.get(r).copied().unwrap_or(true))?;
            Some(at_open(r, String::new()))
        };
        // Take the first object `wanted` accepts among those seen, or search on.
        let fetch = |wanted: &dyn Fn(usize) -> bool| -> Option<String> {
            match (0..objects.len())
                .find_map(|o| Some((o, self.known_location(o)?)).filter(|&(o, _)| wanted(o)))
            {
                Some((o, r)) => Some(at_open(r, format!("take {} from {}", oname(o), rname(r)))),
                None => search(),
            }
        };
        let goal = *inst.goal();
        let wanted = goal.object();
        // Something else in hand: put it down where the agent stands.
        if let Some(h) = self.holding
            && objects.get(h)?.kind != wanted
        {
            return put(h, self.at?);
        }
        match goal {
            Goal::Look { object, lamp } => match self.holding {
                Some(_) => {
                    let lit = (0..objects.len()).find_map(|l| {
                        (objects.get(l)?.kind == lamp).then_some((l, self.known_location(l)?))
                    });
                    match lit {
                        Some((l, r)) if self.at == Some(r) => Some(format!("use {}", oname(l))),
                        Some((_, r)) => Some(format!("go to {}", rname(r))),
                        None => search(),
                    }
                }
                None => fetch(&|o| objects.get(o).is_some_and(|x| x.kind == object)),
            },
            Goal::Place {
                kind,
                object,
                target,
            } => {
                let in_target = |r: usize| {
                    (0..objects.len())
                        .filter(|&i| {
                            objects.get(i).is_some_and(|o| o.kind == object)
                                && self.location.get(i) == Some(&Some(r))
                        })
                        .count()
                };
                // The target: for two objects, the receptacle that already holds the most (the
                // agent put them there, so it knows).
                let t = (0..receptacles.len())
                    .filter(|&r| receptacles.get(r).is_some_and(|x| x.kind == target))
                    .max_by_key(|&r| (in_target(r), std::cmp::Reverse(r)))?;
                match self.holding {
                    Some(h) => match kind.process() {
                        Some(p) if !self.processed(h, p) => {
                            let a = receptacles.iter().position(|x| x.kind == p.appliance())?;
                            if self.at != Some(a) {
                                Some(format!("go to {}", rname(a)))
                            } else {
                                Some(format!("{} {} with {}", p.verb(), oname(h), rname(a)))
                            }
                        }
                        _ => put(h, t),
                    },
                    None => {
                        let two = kind == GoalKind::PickTwoObjAndPlace;
                        fetch(&|o| {
                            objects.get(o).is_some_and(|x| x.kind == object)
                                && !(two && self.location.get(o) == Some(&Some(t)))
                        })
                    }
                }
            }
        }
    }

    fn stop(&mut self, observation: String, reward: f32, status: Status) -> Step {
        if status == Status::Completed {
            self.finished = true;
            self.reward = reward;
        }
        Step {
            observation,
            reward,
            status,
        }
    }
}

impl Environment for AlfworldEnv {
    fn reset(&mut self) -> Reset {
        self.restart();
        let mut instruction = String::with_capacity(256);
        instruction.push_str("You are in the middle of a room. ");
        self.look_around(&mut instruction);
        instruction.push_str("\n\nYour task is to: ");
        instruction.push_str(&self.instance.goal().text());
        Reset {
            instruction,
            tools: action::schemas(),
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
        let text = match action::action_text(call) {
            Ok(text) => text,
            Err(observation) => return self.stop(observation, 0.0, Status::InvalidAction),
        };
        let mut normalized = String::with_capacity(text.len());
        action::normalize(text, &mut normalized);
        if normalized == self.last_action {
            self.repeats = self.repeats.saturating_add(1);
        } else {
            self.repeats = 1;
            self.last_action = normalized;
        }
        let mut observation = action::parse(&self.last_action, &self.instance)
            .and_then(|a| self.execute(a))
            .unwrap_or_else(|| NOTHING_HAPPENS.to_string());
        if self.goal_reached() {
            self.stop(observation, 1.0, Status::Completed)
        } else if self.repeats >= MAX_REPEATS {
            observation.push_str(" You repeated the same action three times: the episode ends.");
            self.stop(observation, 0.0, Status::Completed)
        } else {
            self.stop(observation, 0.0, Status::Running)
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        self.oracle_action()
            .map(|a| ToolCall::new(TAKE_ACTION, [(ACTION, json!(a))]))
    }

    fn success(&self) -> bool {
        self.reward == 1.0
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}
