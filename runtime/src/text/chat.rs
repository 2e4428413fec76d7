//! The chat format: how an episode becomes tokens.
//!
//! Layout (specials in angle brackets, no extra spaces):
//!
//! ```text
//! <|system|>get_relations(variable) count(variable)<|end|><|user|>question<|end|><|assistant|>
//! count(variable="#0")<|end|><|tool|>observation<|end|><|assistant|>...
//! ```
//!
//! The policy writes each tool call compactly as `name(arg="value", n=3)`: Python-style keyword
//! arguments whose values are JSON literals. The agent mask of a [`Transcript`] marks exactly the
//! tokens the policy generated (each call and its end token).

use agentry_env::{Reset, ToolCall, ToolSchema};
use serde_json::{Map, Value};

use super::tokenizer::{Special, Tokenizer};

/// A rendered conversation: tokens, and which of them the policy generated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// Every token of the conversation so far.
    pub tokens: Vec<u32>,
    /// `true` exactly for tokens the policy generated; same length as `tokens`.
    pub agent_mask: Vec<bool>,
}

impl Transcript {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    fn push(&mut self, tokens: &[u32], agent: bool) {
        self.tokens.extend_from_slice(tokens);
        self.agent_mask
            .extend(std::iter::repeat_n(agent, tokens.len()));
    }
}

/// Renders episodes into tokens with a [`Tokenizer`]; see the module docs for the layout.
#[derive(Clone, Debug)]
pub struct ChatFormat {
    tokenizer: Tokenizer,
}

impl ChatFormat {
    /// A chat format over `tokenizer`.
    pub fn new(tokenizer: Tokenizer) -> Self {
        ChatFormat { tokenizer }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The token that ends every message, and so every agent turn.
    pub fn end_token(&self) -> u32 {
        self.tokenizer.special(Special::End)
    }

    /// The system message text: the tools as compact signatures on one line,
    /// e.g. `get_neighbors(variable, relation) count(variable)`.
    pub fn system_text(tools: &[ToolSchema]) -> String {
        tools
            .iter()
            .map(|t| {
                let params: Vec<&str> = t.parameters.iter().map(|p| p.name.as_str()).collect();
                format!("{}({})", t.name, params.join(", "))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The start of an episode: system message, user instruction and the first assistant
    /// header; the mask is all `false`.
    pub fn begin(&self, reset: &Reset) -> Transcript {
        let mut t = Transcript::default();
        t.push(&[Special::System.id()], false);
        t.push(
            &self.tokenizer.encode(&Self::system_text(&reset.tools)),
            false,
        );
        t.push(&[Special::End.id(), Special::User.id()], false);
        t.push(&self.tokenizer.encode(&reset.instruction), false);
        t.push(&[Special::End.id(), Special::Assistant.id()], false);
        t
    }

    /// Appends what the policy generated this turn (ending with the end token when it stopped);
    /// the mask is `true` for all of it.
    pub fn push_agent(&self, transcript: &mut Transcript, generated: &[u32]) {
        transcript.push(generated, true);
    }

    /// Appends a tool result and the next assistant header; the mask is `false`.
    ///
    /// If the previous agent turn did not end with the end token (it was cut off), one is
    /// inserted first (masked `false`) so the layout stays well-formed.
    pub fn push_observation(&self, transcript: &mut Transcript, observation: &str) {
        if transcript.tokens.last() != Some(&self.end_token()) {
            transcript.push(&[self.end_token()], false);
        }
        transcript.push(&[Special::Tool.id()], false);
        transcript.push(&self.tokenizer.encode(observation), false);
        transcript.push(&[Special::End.id(), Special::Assistant.id()], false);
    }

    /// The text of a generated turn, up to (without) the first end token.
    pub fn agent_text(&self, generated: &[u32]) -> String {
        let end = generated
            .iter()
            .position(|&t| t == self.end_token())
            .unwrap_or(generated.len());
        self.tokenizer.decode(&generated[..end])
    }

    /// The tokens the policy should generate for `call`, including the end token
    /// (for supervised training on oracle demonstrations).
    pub fn demo_turn(&self, call: &ToolCall) -> Vec<u32> {
        let mut tokens = self.tokenizer.encode(&render_call(call));
        tokens.push(self.end_token());
        tokens
    }

    /// The plain texts of a demonstrated episode (system line, instruction, each call and each
    /// observation), to train a tokenizer with [`Tokenizer::train`].
    pub fn corpus_text(reset: &Reset, turns: &[(ToolCall, String)]) -> Vec<String> {
        let mut texts = vec![Self::system_text(&reset.tools), reset.instruction.clone()];
        for (call, observation) in turns {
            texts.push(render_call(call));
            texts.push(observation.clone());
        }
        texts
    }
}

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

/// Parses a call written as `name(arg="value", n=3)`. The error is a short message for the
/// agent, ready to be its observation.
pub fn parse_call(text: &str) -> Result<ToolCall, String> {
    let s = text.trim();
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
}
