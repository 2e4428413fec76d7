//! The WebShop task's tools, `search_action(keywords)` and `click_action(value)`, and the
//! checking of a call's arguments.
//!
//! Errors are short messages starting with `Error:`, made only of words from the task's
//! vocabulary: they never echo what the agent wrote.

use serde_json::Value as Json;

use crate::tool::{MAX_ARGUMENT_CHARS, Param, ParamKind, ToolCall, ToolSchema};

/// `search_action(keywords)`: search from the search page.
pub const SEARCH: &str = "search_action";
/// `click_action(value)`: click a button, a product id or an option value on the page.
pub const CLICK: &str = "click_action";

/// `(tool, description, parameter, parameter description)` of both tools.
const TOOLS: [(&str, &str, &str, &str); 2] = [
    (
        SEARCH,
        "search the shop for products ; only on the search page",
        "keywords",
        "the words to search for",
    ),
    (
        CLICK,
        "click a button , a product id or an option value shown on the page",
        "value",
        "the text of what to click",
    ),
];

/// The schemas of the two tools.
pub fn schemas() -> Vec<ToolSchema> {
    TOOLS
        .iter()
        .map(|(name, description, param, param_description)| {
            ToolSchema::new(
                name,
                description,
                vec![Param::required(param, ParamKind::String, param_description)],
            )
        })
        .collect()
}

/// A checked call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// `search_action` with its keywords, trimmed.
    Search(&'a str),
    /// `click_action` with its value, trimmed.
    Click(&'a str),
}

/// The action a call asks for, or an error observation: unknown tool, missing, non-string,
/// oversized or unexpected argument.
pub fn action(call: &ToolCall) -> Result<Action<'_>, String> {
    let Some((name, _, param, _)) = TOOLS.iter().find(|(name, ..)| *name == call.name) else {
        return Err(format!(
            "Error: unknown tool ; the tools are {SEARCH} and {CLICK}"
        ));
    };
    let text = match call.arguments.get(*param) {
        None => return Err(format!("Error: missing argument {param}")),
        Some(Json::String(s)) if s.chars().count() > MAX_ARGUMENT_CHARS => {
            return Err(format!("Error: argument {param} is too long"));
        }
        Some(Json::String(s)) => s.trim(),
        Some(_) => return Err(format!("Error: argument {param} must be a string")),
    };
    if call.arguments.len() > 1 {
        return Err("Error: unexpected argument".to_string());
    }
    Ok(if *name == SEARCH {
        Action::Search(text)
    } else {
        Action::Click(text)
    })
}

/// Every word of the tool names, parameter names and descriptions.
pub(crate) fn words() -> impl Iterator<Item = &'static str> {
    TOOLS.iter().flat_map(|(name, description, param, d)| {
        [*name, *param]
            .into_iter()
            .chain(description.split_whitespace())
            .chain(d.split_whitespace())
    })
}

/// Words of the error observations of [`action`] and the episode.
pub(crate) const ERROR_WORDS: &[&str] = &[
    "Error",
    ":",
    ";",
    "unknown",
    "tool",
    "the",
    "tools",
    "are",
    "and",
    "missing",
    "argument",
    "is",
    "too",
    "long",
    "must",
    "be",
    "a",
    "string",
    "unexpected",
    "search",
    "only",
    "available",
    "on",
    "page",
    "click",
    "back",
    "to",
    "first",
    "keywords",
    "empty",
    "nothing",
    "use",
    "not",
    "clickable",
    "this",
    "episode",
    "over",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_agree_with_argument_checking() {
        for schema in schemas() {
            let call = ToolCall::new(
                &schema.name,
                schema
                    .parameters
                    .iter()
                    .map(|p| (p.name.as_str(), json!(" x "))),
            );
            assert!(schema.validate(&call).is_ok());
            assert!(matches!(
                action(&call),
                Ok(Action::Search("x") | Action::Click("x"))
            ));
        }
    }
}
