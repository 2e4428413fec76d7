//! A pretrained model's own chat template (Jinja), rendered as Python's `transformers` does in
//! `apply_chat_template`, with minijinja.
//!
//! The environment matches transformers': `trim_blocks` and `lstrip_blocks`, loop controls,
//! `raise_exception`, Python's string and dict methods (`.strip()`, `.items()`, through
//! minijinja-contrib's `pycompat`), and a `tojson` that writes JSON as Python's
//! `json.dumps(..., ensure_ascii=False)` does (`", "` and `": "` separators, nothing escaped
//! for HTML), since that is the text the model saw in training. `strftime_now` is left
//! undefined on purpose: templates that date their prompt (Llama 3.1) then fall back to a fixed
//! date, so the same seed still renders the same prompt on any day.

use std::sync::Arc;

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{Environment, Error, ErrorKind};

/// The template's name inside its environment.
const NAME: &str = "chat_template";

/// Bounds a template's work (instructions run), so a pathological template fails with an error
/// instead of hanging a run; real chat templates use a small fraction of it.
const FUEL: u64 = 50_000_000;

/// A compiled chat template and the special tokens it may print.
#[derive(Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    env: Arc<Environment<'static>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

/// Two templates are equal when their sources and special tokens are.
impl PartialEq for ChatTemplate {
    fn eq(&self, other: &Self) -> bool {
        (&self.source, &self.bos_token, &self.eos_token)
            == (&other.source, &other.bos_token, &other.eos_token)
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are the texts of the tokenizer's
    /// beginning- and end-of-sequence tokens (empty when it has none), as transformers passes
    /// them. A syntax error is an error naming its line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| describe(&e))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| format!("the chat template does not compile: {}", describe(&e)))?;
        Ok(ChatTemplate {
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            env: Arc::new(env),
        })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The beginning-of-sequence token's text the template may print.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The end-of-sequence token's text the template may print.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Whether the template reads the `tools` variable, i.e. puts the tools' schemas in the
    /// prompt itself (Qwen2.5's does; SmolLM2's plain ChatML does not).
    pub fn uses_tools(&self) -> bool {
        self.env
            .get_template(NAME)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false)
    }

    /// Renders a conversation as `apply_chat_template(messages, tools=tools,
    /// add_generation_prompt=..., tokenize=False)` does: `messages` are OpenAI-style objects
    /// (`role`, `content`, optionally `tool_calls`), `tools` OpenAI function schemas.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| format!("the chat template: {}", describe(&e)))?;
        let ctx = minijinja::context! {
            messages => Value::from(Serde(messages)),
            tools => tools.map(|tools| Value::from(Serde(tools))),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template
            .render(ctx)
            .map_err(|e| format!("the chat template failed to render: {}", describe(&e)))
    }
}

/// An error with its cause chain and, when known, the template line.
fn describe(error: &Error) -> String {
    let mut out = error.to_string();
    if let Some(line) = error.line() {
        out.push_str(&format!(" (template line {line})"));
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        out.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    out
}

/// transformers' `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised: {message}"),
    ))
}

/// transformers' `tojson` filter: Python's `json.dumps(value, ensure_ascii=False,
/// indent=indent)`. The other keyword arguments it takes are accepted and ignored.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    for ignored in ["ensure_ascii", "separators", "sort_keys"] {
        let _: Option<Value> = kwargs.get(ignored)?;
    }
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot write as JSON").with_source(e)
    })?;
    let text = match indent {
        None => agentry_env::syntax::python_json(&json),
        Some(n) => {
            // Python's indented form is serde_json's pretty form with `n` spaces.
            let indent = " ".repeat(n);
            let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut out = Vec::new();
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
            serde::Serialize::serialize(&json, &mut serializer).map_err(|e| {
                Error::new(ErrorKind::InvalidOperation, "cannot write as JSON").with_source(e)
            })?;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    Ok(Value::from_safe_string(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    /// transformers' setup: blocks eat the newline after them (`trim_blocks`), Python's
    /// `.strip()`, Python's JSON.
    fn renders_like_transformers() {
        let source = "{{ bos_token }}{% for m in messages %}\n\
                      <{{ m.role }}>{{ m.content.strip() }}{% if m.tool_calls %}\
                      {{ m.tool_calls[0].function | tojson }}{% endif %}\n\
                      {% endfor %}{% if tools %}{{ tools[0] | tojson }}{% endif %}\
                      {% if add_generation_prompt %}<assistant>{% endif %}";
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        assert!(t.uses_tools());
        let messages = [
            json!({"role": "user", "content": " hi "}),
            json!({"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function",
                                   "function": {"name": "f", "arguments": {"x": "<é>"}}}]}),
        ];
        let tools = [json!({"name": "f"})];
        assert_eq!(
            t.render(&messages, Some(&tools), true).unwrap(),
            "<s><user>hi<assistant>{\"name\": \"f\", \"arguments\": {\"x\": \"<é>\"}}\
             {\"name\": \"f\"}<assistant>"
        );
        assert_eq!(
            t.render(&messages[..1], None, false).unwrap(),
            "<s><user>hi"
        );
    }

    #[test]
    fn errors_are_results() {
        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(err.contains("does not compile"), "{err}");
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], None, false).unwrap_err();
        assert!(err.contains("no system role"), "{err}");
        let t = ChatTemplate::new("{{ messages[0].content.nope() }}", "", "").unwrap();
        assert!(t.render(&[json!({"content": "x"})], None, false).is_err());
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let err = t.render(&[], None, false).unwrap_err();
        assert!(err.contains("fuel") || err.contains("range"), "{err}");
        let t = ChatTemplate::new("{{ tools | tojson(indent=2) }}", "", "").unwrap();
        assert_eq!(
            t.render(&[], Some(&[json!({"a": [1]})]), false).unwrap(),
            "[\n  {\n    \"a\": [\n      1\n    ]\n  }\n]"
        );
    }
}
