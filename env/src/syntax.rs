//! The text form of a tool call, as the policy writes it.
//!
//! Two forms are accepted:
//!
//! - compact, the one the chat format renders: `name(arg="value", n=3)`, Python-style keyword
//!   arguments whose values are JSON literals;
//! - OpenAI function-calling JSON: `{"name": "count", "arguments": {"variable": "#0"}}`, where
//!   `arguments` may also be a string holding that object (as OpenAI's API returns it).
//!
//! Parsing never panics; every error is a short message for the agent, ready to be its
//! observation.

use serde_json::{Map, Value};

use crate::ToolCall;

/// Renders a call as `name(arg="value", n=3)`, arguments in map order, values as compact JSON.
pub fn render_call(call: &ToolCall) -> String {
    let mut out = String::with_capacity(call.name.len() + 16);
    out.push_str(&call.name);
    out.push('(');
    for (i, (key, value)) in call.arguments.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(key);
        out.push('=');
        out.push_str(&value.to_string());
    }
    out.push(')');
    out
}

const HINT: &str = "write calls as name(arg=\"value\").";

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Shortens text quoted in an error message.
fn snippet(s: &str) -> String {
    let mut out: String = s.chars().take(20).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Reads an identifier at the start of `s`.
fn ident(s: &str) -> Option<(&str, &str)> {
    if !s.starts_with(is_ident_start) {
        return None;
    }
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    Some(s.split_at(end))
}

/// Finds the end of the JSON value at the start of `s` (not validating it).
fn value_extent(s: &str) -> Result<usize, String> {
    let bytes = s.as_bytes();
    match bytes.first() {
        None => Err(format!("Error: missing value; {HINT}")),
        Some(b'"') => {
            let mut i = 1;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => i += 2,
                    b'"' => return Ok(i + 1),
                    _ => i += 1,
                }
            }
            Err(format!("Error: unterminated string; {HINT}"))
        }
        Some(b'[' | b'{') => {
            let mut depth = 0usize;
            let mut in_string = false;
            let mut i = 0;
            while i < bytes.len() {
                let b = bytes[i];
                if in_string {
                    match b {
                        b'\\' => i += 1,
                        b'"' => in_string = false,
                        _ => {}
                    }
                } else {
                    match b {
                        b'"' => in_string = true,
                        b'[' | b'{' => depth += 1,
                        b']' | b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(i + 1);
                            }
                        }
                        _ => {}
                    }
                }
                i += 1;
            }
            Err(format!("Error: unbalanced brackets in a value; {HINT}"))
        }
        Some(_) => Ok(s
            .find(|c: char| c == ',' || c == ')' || c.is_whitespace())
            .unwrap_or(s.len())),
    }
}

/// Parses `name(arg="value", n=3)`; `s` is trimmed.
fn parse_compact_call(s: &str) -> Result<ToolCall, String> {
    if s.is_empty() {
        return Err(format!("Error: empty action; {HINT}"));
    }
    let Some((name, rest)) = ident(s) else {
        return Err(format!(
            "Error: expected a tool name at `{}`; {HINT}",
            snippet(s)
        ));
    };
    let mut rest = rest.trim_start();
    let Some(r) = rest.strip_prefix('(') else {
        return Err(format!("Error: expected `(` after `{name}`; {HINT}"));
    };
    rest = r.trim_start();
    let mut arguments = Map::new();
    if let Some(r) = rest.strip_prefix(')') {
        rest = r;
    } else {
        loop {
            let Some((key, r)) = ident(rest) else {
                return Err(format!(
                    "Error: expected an argument name at `{}`; {HINT}",
                    snippet(rest)
                ));
            };
            let r = r.trim_start();
            let Some(r) = r.strip_prefix('=') else {
                return Err(format!("Error: expected `=` after `{key}`; {HINT}"));
            };
            let r = r.trim_start();
            let end = value_extent(r)?;
            let value: Value = serde_json::from_str(&r[..end]).map_err(|_| {
                format!(
                    "Error: the value of `{key}` is not a JSON literal (`{}`); {HINT}",
                    snippet(&r[..end])
                )
            })?;
            if arguments.insert(key.to_string(), value).is_some() {
                return Err(format!("Error: argument `{key}` is given twice."));
            }
            let r = r[end..].trim_start();
            if let Some(r) = r.strip_prefix(',') {
                rest = r.trim_start();
            } else if let Some(r) = r.strip_prefix(')') {
                rest = r;
                break;
            } else {
                return Err(format!(
                    "Error: expected `,` or `)` after the value of `{key}`; {HINT}"
                ));
            }
        }
    }
    if !rest.trim().is_empty() {
        return Err(format!(
            "Error: unexpected text after the call: `{}`; make one call per turn.",
            snippet(rest.trim())
        ));
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
    })
}

/// Parses a call in either form (see the module docs).
pub fn parse_call(text: &str) -> Result<ToolCall, String> {
    let s = text.trim();
    if s.starts_with('{') {
        parse_json_call(s)
    } else {
        parse_compact_call(s)
    }
}

/// Parses `{"name": ..., "arguments": {...}}`.
fn parse_json_call(s: &str) -> Result<ToolCall, String> {
    const JSON_HINT: &str = r#"write {"name": "tool", "arguments": {...}}."#;
    let value: Value = serde_json::from_str(s)
        .map_err(|e| format!("Error: the call is not valid JSON ({e}); {JSON_HINT}"))?;
    let Value::Object(mut object) = value else {
        unreachable!("text starting with `{{` parses only as an object")
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(format!("Error: `name` must be a string; {JSON_HINT}")),
        None => return Err(format!("Error: the call has no `name`; {JSON_HINT}")),
    };
    let arguments = match object.remove("arguments") {
        None => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(Value::String(text)) => match serde_json::from_str(&text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => {
                return Err(format!(
                    "Error: `arguments` must be a JSON object; {JSON_HINT}"
                ));
            }
        },
        Some(_) => {
            return Err(format!(
                "Error: `arguments` must be a JSON object; {JSON_HINT}"
            ));
        }
    };
    if let Some(extra) = object.keys().next() {
        return Err(format!(
            "Error: unexpected field `{}` in the call; {JSON_HINT}",
            snippet(extra)
        ));
    }
    Ok(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_and_parses() {
        let call = ToolCall::new(
            "get_neighbors",
            [("variable", json!("#0")), ("n", json!(3))],
        );
        let text = render_call(&call);
        assert_eq!(parse_call(&text).unwrap(), call);
        assert_eq!(parse_call("finish_action()").unwrap().name, "finish_action");
        let c = parse_call(" answer( xs = [\"a\", \"b,)\"] , ok=true ) ").unwrap();
        assert_eq!(c.arguments["xs"], json!(["a", "b,)"]));
        assert_eq!(c.arguments["ok"], json!(true));
    }

    #[test]
    fn errors_are_helpful() {
        assert!(
            parse_call("count")
                .unwrap_err()
                .contains("`(` after `count`")
        );
        assert!(parse_call("count(x=1, x=2)").unwrap_err().contains("twice"));
        assert!(
            parse_call("count(x=\"a)")
                .unwrap_err()
                .contains("unterminated")
        );
        assert!(
            parse_call("count(x=1) more")
                .unwrap_err()
                .contains("after the call")
        );
        assert!(
            parse_call("count(\"a\")")
                .unwrap_err()
                .contains("argument name")
        );
        assert!(
            parse_call("count(x=abc)")
                .unwrap_err()
                .contains("JSON literal")
        );
    }

    #[test]
    fn parses_openai_json() {
        let call = ToolCall::new("count", [("variable", json!("#0"))]);
        let text = r##"{"name": "count", "arguments": {"variable": "#0"}}"##;
        assert_eq!(parse_call(text).unwrap(), call);
        let text = r##" {"name": "count", "arguments": "{\"variable\": \"#0\"}"} "##;
        assert_eq!(parse_call(text).unwrap(), call);
        assert_eq!(
            parse_call(r#"{"name": "finish_action"}"#).unwrap(),
            ToolCall::new("finish_action", [])
        );
        for (text, message) in [
            (r#"{"name": "count""#, "not valid JSON"),
            (r#"{"arguments": {}}"#, "no `name`"),
            (r#"{"name": 3}"#, "`name` must be a string"),
            (
                r#"{"name": "count", "arguments": [1]}"#,
                "must be a JSON object",
            ),
            (
                r#"{"name": "count", "arguments": "[1]"}"#,
                "must be a JSON object",
            ),
            (r#"{"name": "count", "id": 1}"#, "unexpected field `id`"),
            (r#"{"name": "count"} more"#, "not valid JSON"),
        ] {
            let err = parse_call(text).expect_err(text);
            assert!(err.contains(message), "{text}: {err}");
        }
    }
}
