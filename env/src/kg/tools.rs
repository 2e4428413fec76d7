//! The KG task's tools: their schemas, and the checking of a call's arguments.
//!
//! Argument errors are answered with short messages made only of words from the task's
//! vocabulary (they never echo what the agent wrote), so a word-level tokenizer covers every
//! observation.

use serde_json::Value as Json;

use crate::tool::{MAX_ARGUMENT_CHARS, Param, ParamKind, ToolCall, ToolSchema};

/// `get_relations(variable)`.
pub const GET_RELATIONS: &str = "get_relations";
/// `get_neighbors(variable, relation)`.
pub const GET_NEIGHBORS: &str = "get_neighbors";
/// `intersection(variable1, variable2)`.
pub const INTERSECTION: &str = "intersection";
/// `get_attributes(variable)`.
pub const GET_ATTRIBUTES: &str = "get_attributes";
/// `argmax(variable, attribute)`.
pub const ARGMAX: &str = "argmax";
/// `argmin(variable, attribute)`.
pub const ARGMIN: &str = "argmin";
/// `count(variable)`.
pub const COUNT: &str = "count";
/// `final_answer(variable)`.
pub const FINAL_ANSWER: &str = "final_answer";

/// `(parameter, description)`.
type ParamSpec = (&'static str, &'static str);

/// `(tool, description, parameters)` of every tool. Descriptions use plain words only.
const TOOLS: [(&str, &str, &[ParamSpec]); 8] = [
    (
        GET_RELATIONS,
        "list the relations of a variable",
        &[(
            "variable",
            "an entity of the question or a variable like #0",
        )],
    ),
    (
        GET_NEIGHBORS,
        "follow a relation from a variable to a new variable",
        &[
            (
                "variable",
                "an entity of the question or a variable like #0",
            ),
            ("relation", "a relation name"),
        ],
    ),
    (
        INTERSECTION,
        "the entities in both variables as a new variable",
        &[
            (
                "variable1",
                "an entity of the question or a variable like #0",
            ),
            (
                "variable2",
                "an entity of the question or a variable like #0",
            ),
        ],
    ),
    (
        GET_ATTRIBUTES,
        "list the numeric attributes of a variable",
        &[(
            "variable",
            "an entity of the question or a variable like #0",
        )],
    ),
    (
        ARGMAX,
        "the entity of a variable with the highest attribute as a new variable",
        &[
            (
                "variable",
                "an entity of the question or a variable like #0",
            ),
            ("attribute", "an attribute name"),
        ],
    ),
    (
        ARGMIN,
        "the entity of a variable with the lowest attribute as a new variable",
        &[
            (
                "variable",
                "an entity of the question or a variable like #0",
            ),
            ("attribute", "an attribute name"),
        ],
    ),
    (
        COUNT,
        "the number of entities of a variable as a new variable",
        &[(
            "variable",
            "an entity of the question or a variable like #0",
        )],
    ),
    (
        FINAL_ANSWER,
        "give a variable as the answer and end the episode",
        &[(
            "variable",
            "an entity of the question or a variable like #0",
        )],
    ),
];

/// The schemas of the KG tools, in a fixed order.
pub fn schemas() -> Vec<ToolSchema> {
    TOOLS
        .iter()
        .map(|(name, description, params)| {
            ToolSchema::new(
                name,
                description,
                params
                    .iter()
                    .map(|(p, d)| Param::required(p, ParamKind::String, d))
                    .collect(),
            )
        })
        .collect()
}

/// Every word of the tool names, parameter names and descriptions.
pub(crate) fn words() -> impl Iterator<Item = &'static str> {
    TOOLS.iter().flat_map(|(name, description, params)| {
        std::iter::once(*name)
            .chain(description.split_whitespace())
            .chain(
                params
                    .iter()
                    .flat_map(|(p, d)| std::iter::once(*p).chain(d.split_whitespace())),
            )
    })
}

/// Words of the error observations [`arguments`] and the episode produce (besides names of
/// types, relations, attributes, tools, parameters and variables).
pub(crate) const ERROR_WORDS: &[&str] = &[
    "error",
    "unknown",
    "tool",
    "missing",
    "argument",
    "must",
    "be",
    "a",
    "string",
    "is",
    "too",
    "long",
    "unexpected",
    "variable",
    "entity",
    "not",
    "in",
    "the",
    "question",
    "relation",
    "attribute",
    "has",
    "no",
    "count",
    "empty",
    "cannot",
    "intersect",
    "and",
    "many",
    "variables",
    "episode",
    "over",
];

/// The string arguments of `call`, in the order of the tool's parameters, or an error
/// observation: unknown tool, missing, non-string, oversized or unexpected argument.
pub fn arguments(call: &ToolCall) -> Result<Vec<&str>, String> {
    let Some((_, _, params)) = TOOLS.iter().find(|(name, ..)| *name == call.name) else {
        return Err("error unknown tool".to_string());
    };
    let mut out = Vec::with_capacity(params.len());
    for (param, _) in params.iter() {
        match call.arguments.get(*param) {
            None => return Err(format!("error missing argument {param}")),
            Some(Json::String(s)) if s.chars().count() > MAX_ARGUMENT_CHARS => {
                return Err(format!("error argument {param} is too long"));
            }
            Some(Json::String(s)) => out.push(s.trim()),
            Some(_) => return Err(format!("error argument {param} must be a string")),
        }
    }
    if call
        .arguments
        .keys()
        .any(|k| !params.iter().any(|(p, _)| p == k))
    {
        return Err("error unexpected argument".to_string());
    }
    Ok(out)
}

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
                    .map(|p| (p.name.as_str(), json!("#0"))),
            );
            assert!(schema.validate(&call).is_ok());
            assert_eq!(
                arguments(&call).map(|a| a.len()),
                Ok(schema.parameters.len())
            );
        }
    }
}
