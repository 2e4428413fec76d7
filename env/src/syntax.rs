//! The text form of a tool call, as the policy writes it.
//!
//! Two forms are accepted:
//!
//! - compact, the one the chat format renders: `name(arg="value", n=3)`, Python-style keyword
//!   arguments whose values are JSON literals;
//! - OpenAI function-calling JSON: `{"name": "count", "arguments": {"variable": "#0"}}`, where
//!   `arguments` may also be a string holding that object (as OpenAI's API returns it).
//!
//! Pretrained instruct models write calls in their family's own form instead; [`ToolCallFormat`]
//! names the form a policy uses, and [`ToolCallFormat::Hermes`] is Hermes/Qwen's
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, whose JSON is the OpenAI
//! form above.
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
        parse_json_call(s, r#"write {"name": "tool", "arguments": {...}}."#)
    } else {
        parse_compact_call(s)
    }
}

/// The text form of tool calls a policy writes and reads, chosen per model: the form its
/// training taught it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `name(arg="value")` (or OpenAI JSON): the form policies trained from scratch learn.
    Compact,
    /// Hermes/Qwen's `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, the form
    /// instruct models with tool use were tuned on.
    Hermes,
}

/// How a reply in [`ToolCallFormat::Hermes`] should look, for error messages.
const HERMES_HINT: &str = "answer with exactly one call as \
    <tool_call>\n{\"name\": \"tool\", \"arguments\": {...}}\n</tool_call>.";

impl ToolCallFormat {
    /// Reads the one call in a reply; the error is a message for the agent.
    pub fn parse(self, text: &str) -> Result<ToolCall, String> {
        match self {
            ToolCallFormat::Compact => parse_call(text),
            ToolCallFormat::Hermes => parse_hermes_call(text),
        }
    }

    /// How a call of `name` starts in this form, up to where its arguments begin: a reply
    /// begun with it can only be a call of `name` (how a server forces a named function).
    pub fn call_prefix(self, name: &str) -> String {
        match self {
            ToolCallFormat::Compact => format!("{name}("),
            ToolCallFormat::Hermes => format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                serde_json::Value::String(name.to_string())
            ),
        }
    }

    /// Writes a call as a policy of this format should (oracle demonstrations).
    pub fn render(self, call: &ToolCall) -> String {
        match self {
            ToolCallFormat::Compact => render_call(call),
            ToolCallFormat::Hermes => format!(
                "<tool_call>\n{}\n</tool_call>",
                python_json(&serde_json::json!({
                    "name": call.name,
                    "arguments": call.arguments,
                }))
            ),
        }
    }
}

/// Parses a reply holding exactly one `<tool_call>{json}</tool_call>`; text around the tags
/// (a model's thoughts) is allowed, and `arguments` may be an object or a string holding one.
fn parse_hermes_call(text: &str) -> Result<ToolCall, String> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let Some(start) = text.find(OPEN) else {
        return Err(format!(
            "Error: the reply has no <tool_call>; {HERMES_HINT}"
        ));
    };
    let inner = &text[start + OPEN.len()..];
    let Some(end) = inner.find(CLOSE) else {
        return Err(format!(
            "Error: <tool_call> is not closed by </tool_call>; {HERMES_HINT}"
        ));
    };
    if inner.contains(OPEN) {
        return Err(format!(
            "Error: the reply holds more than one <tool_call>; make one call per turn: {HERMES_HINT}"
        ));
    }
    let body = inner[..end].trim();
    if !body.starts_with('{') {
        return Err(format!(
            "Error: the <tool_call> does not hold a JSON object (`{}`); {HERMES_HINT}",
            snippet(body)
        ));
    }
    parse_json_call(body, HERMES_HINT)
}

/// JSON as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` and `": "`
/// separators, non-ASCII kept), which is what Hugging Face chat templates' `tojson` produces
/// and so what instruct models saw in training.
pub fn python_json(value: &Value) -> String {
    let mut out = String::new();
    write_python_json(value, &mut out);
    out
}

fn write_python_json(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, out);
            }
            out.push('}');
        }
        // Scalars: serde_json escapes strings as Python does with ensure_ascii=False.
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Parses `{"name": ..., "arguments": {...}}`; `hint` ends each error message.
fn parse_json_call(s: &str, hint: &str) -> Result<ToolCall, String> {
    let value: Value = serde_json::from_str(s)
        .map_err(|e| format!("Error: the call is not valid JSON ({e}); {hint}"))?;
    let Value::Object(mut object) = value else {
        unreachable!("text starting with `{{` parses only as an object")
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(format!("Error: `name` must be a string; {hint}")),
        None => return Err(format!("Error: the call has no `name`; {hint}")),
    };
    let arguments = match object.remove("arguments") {
        None => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(Value::String(text)) => match serde_json::from_str(&text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => {
                return Err(format!("Error: `arguments` must be a JSON object; {hint}"));
            }
        },
        Some(_) => {
            return Err(format!("Error: `arguments` must be a JSON object; {hint}"));
        }
    };
    if let Some(extra) = object.keys().next() {
        return Err(format!(
            "Error: unexpected field `{}` in the call; {hint}",
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

    #[test]
    fn hermes_renders_and_parses() {
        let hermes = ToolCallFormat::Hermes;
        let call = ToolCall::new("count", [("variable", json!("#0 é")), ("n", json!(3))]);
        let text = hermes.render(&call);
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"count\", \"arguments\": {\"variable\": \"#0 é\", \"n\": 3}}\n</tool_call>"
        );
        assert_eq!(hermes.parse(&text).unwrap(), call);
        // Thoughts around the tags, compact JSON, arguments as a string: all accepted.
        let text = "I will count.\n<tool_call>{\"name\":\"count\",\"arguments\":\"{\\\"variable\\\": \\\"#0 é\\\", \\\"n\\\": 3}\"}</tool_call> done";
        assert_eq!(hermes.parse(text).unwrap(), call);
        assert_eq!(ToolCallFormat::Compact.render(&call), render_call(&call));
    }

    /// A call's rendering starts with its prefix, in both forms.
    #[test]
    fn calls_start_with_their_prefix() {
        let call = ToolCall::new("get_neighbors", [("variable", json!("#0"))]);
        for format in [ToolCallFormat::Compact, ToolCallFormat::Hermes] {
            let prefix = format.call_prefix(&call.name);
            assert!(
                format.render(&call).starts_with(&prefix),
                "{format:?}: {prefix}"
            );
        }
    }

    #[test]
    fn hermes_errors_name_the_format() {
        let hermes = ToolCallFormat::Hermes;
        let huge = format!("<tool_call>{}", "{".repeat(1 << 20));
        for (text, message) in [
            ("count(variable=\"#0\")", "has no <tool_call>"),
            ("", "has no <tool_call>"),
            ("<tool_call>{\"name\": \"count\"}", "not closed"),
            (huge.as_str(), "not closed"),
            (
                "<tool_call><tool_call>{\"name\": \"a\"}</tool_call></tool_call>",
                "more than one",
            ),
            (
                "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>",
                "more than one",
            ),
            (
                "<tool_call>count()</tool_call>",
                "does not hold a JSON object",
            ),
            ("<tool_call>[1]</tool_call>", "does not hold a JSON object"),
            ("<tool_call>{\"name\": \"a\"</tool_call>", "not valid JSON"),
            (
                "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
                "must be a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"a\", \"arguments\": \"3\"}</tool_call>",
                "must be a JSON object",
            ),
            ("</tool_call>{\"name\": \"a\"}<tool_call>", "not closed"),
        ] {
            let err = hermes.parse(text).expect_err(text);
            assert!(err.contains(message), "{text}: {err}");
            assert!(
                err.contains("<tool_call>\n{\"name\""),
                "the hint is given: {err}"
            );
        }
    }

    #[test]
    fn python_json_matches_json_dumps() {
        let value = json!({"a": [1, 2.5, null, true], "b": {"c": "x\"y\n<é>"}, "d": {}});
        assert_eq!(
            python_json(&value),
            r#"{"a": [1, 2.5, null, true], "b": {"c": "x\"y\n<é>"}, "d": {}}"#
        );
    }
}
