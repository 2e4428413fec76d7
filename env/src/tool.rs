//! Tools as JSON-schema functions, and the calls a policy makes to them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Longest string argument accepted; longer inputs are refused with an error observation.
pub const MAX_ARGUMENT_CHARS: usize = 4096;

/// One call from the policy: a tool name and its arguments, as parsed from the policy's text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Arguments by parameter name.
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// A call with string arguments, in parameter order.
    pub fn new<'a>(name: &str, arguments: impl IntoIterator<Item = (&'a str, Value)>) -> Self {
        ToolCall {
            name: name.to_string(),
            arguments: arguments
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }

    /// The string argument `name`; call only after [`ToolSchema::validate`] accepted the call.
    pub fn str_arg(&self, name: &str) -> &str {
        self.arguments
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// The JSON type of a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A string.
    String,
    /// An integer.
    Integer,
    /// Any number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// An array of strings.
    StringArray,
}

impl ParamKind {
    fn json_type(self) -> Value {
        match self {
            ParamKind::String => json!({"type": "string"}),
            ParamKind::Integer => json!({"type": "integer"}),
            ParamKind::Number => json!({"type": "number"}),
            ParamKind::Boolean => json!({"type": "boolean"}),
            ParamKind::StringArray => json!({"type": "array", "items": {"type": "string"}}),
        }
    }

    fn accepts(self, value: &Value) -> bool {
        match self {
            ParamKind::String => value.is_string(),
            ParamKind::Integer => value.is_i64() || value.is_u64(),
            ParamKind::Number => value.is_number(),
            ParamKind::Boolean => value.is_boolean(),
            ParamKind::StringArray => value
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ParamKind::String => "a string",
            ParamKind::Integer => "an integer",
            ParamKind::Number => "a number",
            ParamKind::Boolean => "a boolean",
            ParamKind::StringArray => "an array of strings",
        }
    }
}

/// One parameter of a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Param {
    /// The parameter's name.
    pub name: String,
    /// Its JSON type.
    pub kind: ParamKind,
    /// What it means, for the prompt.
    pub description: String,
    /// Whether a call must give it.
    pub required: bool,
}

impl Param {
    /// A required parameter.
    pub fn required(name: &str, kind: ParamKind, description: &str) -> Self {
        Param {
            name: name.to_string(),
            kind,
            description: description.to_string(),
            required: true,
        }
    }
}

/// A tool the agent may call: an OpenAI-style function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// The function name.
    pub name: String,
    /// What it does, for the prompt.
    pub description: String,
    /// Its parameters, in the order a compact rendering lists them.
    pub parameters: Vec<Param>,
}

impl ToolSchema {
    /// A tool with the given parameters.
    pub fn new(name: &str, description: &str, parameters: Vec<Param>) -> Self {
        ToolSchema {
            name: name.to_string(),
            description: description.to_string(),
            parameters,
        }
    }

    /// The OpenAI function-calling JSON of this tool.
    pub fn to_json(&self) -> Value {
        let properties: Map<String, Value> = self
            .parameters
            .iter()
            .map(|p| {
                let mut schema = p.kind.json_type();
                schema["description"] = Value::String(p.description.clone());
                (p.name.clone(), schema)
            })
            .collect();
        let required: Vec<&str> = self
            .parameters
            .iter()
            .filter(|p| p.required)
            .map(|p| p.name.as_str())
            .collect();
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties, "required": required},
            }
        })
    }

    /// Checks a call against this schema; the error is a message for the agent.
    pub fn validate(&self, call: &ToolCall) -> Result<(), String> {
        for param in &self.parameters {
            match call.arguments.get(&param.name) {
                None if param.required => {
                    return Err(format!(
                        "Error: `{}` needs the argument `{}` ({}).",
                        self.name,
                        param.name,
                        param.kind.describe()
                    ));
                }
                None => {}
                Some(value) if !param.kind.accepts(value) => {
                    return Err(format!(
                        "Error: argument `{}` of `{}` must be {}.",
                        param.name,
                        self.name,
                        param.kind.describe()
                    ));
                }
                Some(value) if too_long(value) => {
                    return Err(format!(
                        "Error: argument `{}` of `{}` is longer than {MAX_ARGUMENT_CHARS} characters.",
                        param.name, self.name
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some(extra) = call
            .arguments
            .keys()
            .find(|k| !self.parameters.iter().any(|p| &p.name == *k))
        {
            return Err(format!("Error: `{}` has no argument `{extra}`.", self.name));
        }
        Ok(())
    }
}

fn too_long(value: &Value) -> bool {
    match value {
        Value::String(s) => s.chars().count() > MAX_ARGUMENT_CHARS,
        Value::Array(items) => {
            items.iter().map(|v| v.to_string().len()).sum::<usize>() > MAX_ARGUMENT_CHARS
        }
        _ => false,
    }
}

/// Finds the schema a call names, or the error observation for an unknown tool.
pub fn find<'a>(tools: &'a [ToolSchema], call: &ToolCall) -> Result<&'a ToolSchema, String> {
    tools.iter().find(|t| t.name == call.name).ok_or_else(|| {
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        format!(
            "Error: there is no tool `{}`. Available tools: {}.",
            call.name,
            names.join(", ")
        )
    })
}
