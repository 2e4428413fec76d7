//! The task's one tool, `take_action(action)`, the checking of its call, and the parsing of the
//! action text into an [`Action`] of the ALFWorld command set.
//!
//! Error observations are made only of words from the task's vocabulary and never echo what
//! the agent wrote, so a word-level tokenizer covers every observation.

use serde_json::Value as Json;

use super::world::Instance;
use crate::tool::{MAX_ARGUMENT_CHARS, Param, ParamKind, ToolCall, ToolSchema};

/// The tool's name.
pub const TAKE_ACTION: &str = "take_action";
/// Its one parameter.
pub const ACTION: &str = "action";

const TOOL_DESCRIPTION: &str = "take one action in the room: go to X, take X from Y, put X in Y, \
put X on Y, open X, close X, clean X with Y, heat X with Y, cool X with Y, use X, examine X, \
look, inventory";
const PARAM_DESCRIPTION: &str = "the action, like go to countertop 1";

/// The tool schemas of the task: just `take_action`.
pub fn schemas() -> Vec<ToolSchema> {
    vec![ToolSchema::new(
        TAKE_ACTION,
        TOOL_DESCRIPTION,
        vec![Param::required(
            ACTION,
            ParamKind::String,
            PARAM_DESCRIPTION,
        )],
    )]
}

/// Every word of the tool's name, parameter and descriptions.
pub(crate) fn words() -> impl Iterator<Item = &'static str> {
    [TAKE_ACTION, ACTION]
        .into_iter()
        .chain(TOOL_DESCRIPTION.split([' ', ',', ':']))
        .chain(PARAM_DESCRIPTION.split(' '))
        .filter(|w| !w.is_empty())
}

/// Words of the error observations of [`action_text`] and the episode, besides the tool's and
/// the parameter's names.
pub(crate) const ERROR_WORDS: &[&str] = &[
    "Error", "there", "is", "no", "such", "tool", "the", "only", "needs", "argument", "must", "be",
    "a", "string", "too", "long", "has", "other", "than", "episode", "over",
];

/// The action text of a `take_action` call, or the error observation of a malformed call:
/// unknown tool, missing, non-string, oversized or unexpected argument.
pub fn action_text(call: &ToolCall) -> Result<&str, String> {
    if call.name != TAKE_ACTION {
        return Err(format!(
            "Error: there is no such tool. The only tool is {TAKE_ACTION}."
        ));
    }
    let text = match call.arguments.get(ACTION) {
        None => return Err(format!("Error: {TAKE_ACTION} needs the argument {ACTION}.")),
        Some(Json::String(s)) if s.chars().count() > MAX_ARGUMENT_CHARS => {
            return Err(format!("Error: the argument {ACTION} is too long."));
        }
        Some(Json::String(s)) => s.as_str(),
        Some(_) => return Err(format!("Error: the argument {ACTION} must be a string.")),
    };
    if call.arguments.len() > 1 {
        return Err(format!(
            "Error: {TAKE_ACTION} has no other argument than {ACTION}."
        ));
    }
    Ok(text)
}

/// One command of the ALFWorld command set, with its things resolved to indices of the
/// instance's receptacles (`r`) and objects (`o`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `go to R`.
    GoTo(usize),
    /// `take O from R`.
    Take(usize, usize),
    /// `put O in R`, `put O on R` or `put O in/on R`.
    Put(usize, usize),
    /// `open R`.
    Open(usize),
    /// `close R`.
    Close(usize),
    /// `clean O with R`, `heat O with R` or `cool O with R`; the verb is the
    /// [`super::world::Process`].
    Process(super::world::Process, usize, usize),
    /// `use O`.
    Use(usize),
    /// `examine O`.
    ExamineObject(usize),
    /// `examine R`.
    ExamineReceptacle(usize),
    /// `look`.
    Look,
    /// `inventory`.
    Inventory,
}

/// Parses a normalized action (lowercase words separated by single spaces) against the
/// instance's names; `None` if it is not a command or names a thing the room does not have.
pub fn parse(text: &str, instance: &Instance) -> Option<Action> {
    use super::world::Process;
    // Commands have at most six words; longer texts are not commands.
    let mut words = [""; 7];
    let mut n = 0;
    for w in text.split(' ') {
        *words.get_mut(n)? = w;
        n += 1;
    }
    let words = words.get(..n)?;
    let object = |k: &str, n: &str| instance.find_object(k, n);
    let receptacle = |k: &str, n: &str| instance.find_receptacle(k, n);
    Some(match *words {
        ["look"] => Action::Look,
        ["inventory"] => Action::Inventory,
        ["go", "to", r, n] => Action::GoTo(receptacle(r, n)?),
        ["take", o, on, "from", r, rn] => Action::Take(object(o, on)?, receptacle(r, rn)?),
        ["put", o, on, "in" | "on" | "in/on", r, rn] => {
            Action::Put(object(o, on)?, receptacle(r, rn)?)
        }
        ["open", r, n] => Action::Open(receptacle(r, n)?),
        ["close", r, n] => Action::Close(receptacle(r, n)?),
        [verb @ ("clean" | "heat" | "cool"), o, on, "with", r, rn] => {
            let process = match verb {
                "clean" => Process::Clean,
                "heat" => Process::Heat,
                _ => Process::Cool,
            };
            Action::Process(process, object(o, on)?, receptacle(r, rn)?)
        }
        ["use", o, n] => Action::Use(object(o, n)?),
        ["examine", k, n] => match object(k, n) {
            Some(o) => Action::ExamineObject(o),
            None => Action::ExamineReceptacle(receptacle(k, n)?),
        },
        _ => return None,
    })
}

/// The action text in canonical form: ASCII-lowercased, words separated by single spaces.
pub fn normalize(text: &str, out: &mut String) {
    out.clear();
    for (i, w) in text.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.extend(w.chars().map(|c| c.to_ascii_lowercase()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_agrees_with_argument_checking() {
        for schema in schemas() {
            let call = ToolCall::new(&schema.name, [(ACTION, json!("look"))]);
            assert!(schema.validate(&call).is_ok());
            assert_eq!(action_text(&call), Ok("look"));
        }
    }

    #[test]
    fn normalization_collapses_space_and_case() {
        let mut out = String::new();
        normalize("  Go   TO\tdesk 1 ", &mut out);
        assert_eq!(out, "go to desk 1");
        normalize("", &mut out);
        assert_eq!(out, "");
    }
}
