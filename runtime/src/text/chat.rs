//! The chat format: how an episode becomes tokens.
//!
//! Layout for a policy trained from scratch (specials in angle brackets, no extra spaces):
//!
//! ```text
//! <|system|>get_relations(variable) count(variable)<|end|><|user|>question<|end|><|assistant|>
//! count(variable="#0")<|end|><|tool|>observation<|end|><|assistant|>...
//! ```
//!
//! Such a policy writes each tool call in the compact form of [`agentry_env::syntax`],
//! `name(arg="value", n=3)`. The agent mask of a [`Transcript`] marks exactly the
//! tokens the policy generated (each call and its end token).
//!
//! A pretrained tokenizer that carries its model's chat template ([`Tokenizer::chat_template`])
//! is laid out by that template ([`ChatTemplate`], rendered as transformers does), and its
//! policy writes calls in Hermes/Qwen's `<tool_call>{json}</tool_call>`
//! ([`ToolCallFormat::Hermes`]), with the tools' JSON schemas in the system prompt: through the
//! template's own `tools` when it reads them, else in a Hermes-style system text of ours.
//!
//! Token in, token out: the policy's tokens are kept as generated, never re-tokenized from
//! text. The transcript is built incrementally from the template, as verl and SkyRL do for
//! multi-turn rollouts: the start is the render of system + user + generation prompt; each
//! observation adds the render of the conversation with a tool message minus the render
//! without it, both against a fixed placeholder assistant message, so what is added does not
//! depend on what the policy said; and what the template writes after an assistant's end token
//! (ChatML's `\n`) is added, unmasked, before the observation. Message texts are encoded
//! apart from the template's own text, so text in an observation never becomes a special token.
//!
//! A pretrained tokenizer without a template (a checkpoint saved before templates were carried)
//! keeps the hand-written frames of its turn markers and the compact calls it was trained with:
//!
//! ```text
//! ChatML:  <|im_start|>system\n…<|im_end|>\n<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n
//!          …<|im_end|>\n<|im_start|>tool\n…<|im_end|>\n<|im_start|>assistant\n
//! Llama 3: <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n…<|eot_id|>…
//! ```
//!
//! The turn-end marker (`<|im_end|>`, `<|eot_id|>`) is the token that stops generation.

use agentry_env::{Reset, ToolCall, ToolCallFormat, ToolSchema, render_call};
use serde_json::json;

use super::hf::TurnMarkers;
use super::template::ChatTemplate;
use super::tokenizer::{Special, Tokenizer};
/// A rendered conversation: tokens, and which of them the policy generated.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

    /// Tokens of the longest run the policy generated: its longest reply, end token included.
    pub fn longest_reply(&self) -> usize {
        self.agent_mask
            .chunk_by(|a, b| a == b)
            .filter(|run| run[0])
            .map(<[bool]>::len)
            .max()
            .unwrap_or(0)
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

/// Part of a layout: tokens as they are, or the text of message `i`, encoded when filled in.
#[derive(Clone, Debug, PartialEq)]
enum Piece {
    Tokens(Vec<u32>),
    Content(usize),
}

/// Where the tokens of an episode come from, whatever made them (hand-written frames or a
/// chat template).
#[derive(Clone, Debug, PartialEq)]
struct Layout {
    /// The start: system message (content 0), user message (content 1), generation prompt.
    begin: Vec<Piece>,
    /// A tool message (content 0) and the next generation prompt.
    observation: Vec<Piece>,
    /// The token that ends an assistant turn (and stops generation).
    end: u32,
    /// What follows the end token of an assistant turn, before the next message.
    after_end: Vec<u32>,
}

/// Texts that stand for message contents while a template is rendered: private-use characters
/// no template writes, so each content's place in the render is found exactly.
fn sentinel(i: usize) -> String {
    format!("\u{F0000}{i}\u{F0001}")
}

/// Cuts a rendered text at its sentinels: the template's own text becomes tokens (special
/// tokens' texts stand for them), each sentinel the content it stands for.
fn pieces_of(tokenizer: &Tokenizer, text: &str) -> Result<Vec<Piece>, String> {
    let trusted = |s: &str| -> Result<Piece, String> {
        let (hf, _) = tokenizer
            .hf()
            .ok_or("a chat template needs a pretrained tokenizer")?;
        hf.encode_with_specials(s)
            .map(Piece::Tokens)
            .map_err(|e| format!("cannot encode the chat template's text: {e}"))
    };
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('\u{F0000}') {
        let after = &rest[at + '\u{F0000}'.len_utf8()..];
        let index = after
            .find('\u{F0001}')
            .and_then(|end| Some((after[..end].parse::<usize>().ok()?, end)));
        let Some((i, end)) = index else {
            return Err("the chat template's render has a malformed placeholder".into());
        };
        out.push(trusted(&rest[..at])?);
        out.push(Piece::Content(i));
        rest = &after[end + '\u{F0001}'.len_utf8()..];
    }
    out.push(trusted(rest)?);
    out.retain(|p| !matches!(p, Piece::Tokens(t) if t.is_empty()));
    Ok(out)
}

/// A message for a template, its content a sentinel.
fn message(role: &str, content: usize) -> serde_json::Value {
    json!({"role": role, "content": sentinel(content)})
}

impl Layout {
    /// The hand-written frames: `start`, then per message the role's header, the text, the end
    /// token and what follows it.
    fn of_frames(tokenizer: &Tokenizer) -> Self {
        const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
        let (start, [system, user, assistant, tool], end, after_end) = match tokenizer.hf() {
            None => {
                let header = |s: Special| vec![s.id()];
                (
                    Vec::new(),
                    [
                        header(Special::System),
                        header(Special::User),
                        header(Special::Assistant),
                        header(Special::Tool),
                    ],
                    Special::End.id(),
                    Vec::new(),
                )
            }
            Some((_, TurnMarkers::ChatMl { start, end })) => (
                Vec::new(),
                ROLES.map(|role| {
                    let mut h = vec![start];
                    h.extend(tokenizer.encode(&format!("{role}\n")));
                    h
                }),
                end,
                tokenizer.encode("\n"),
            ),
            Some((
                _,
                TurnMarkers::Llama3 {
                    begin,
                    start_header,
                    end_header,
                    eot,
                },
            )) => (
                begin.into_iter().collect(),
                ROLES.map(|role| {
                    let mut h = vec![start_header];
                    h.extend(tokenizer.encode(role));
                    h.push(end_header);
                    h.extend(tokenizer.encode("\n\n"));
                    h
                }),
                eot,
                Vec::new(),
            ),
        };
        let mut ending = vec![end];
        ending.extend(&after_end);
        let message = |header: &[u32], content| {
            [
                Piece::Tokens(header.to_vec()),
                Piece::Content(content),
                Piece::Tokens(ending.clone()),
            ]
        };
        let mut begin = vec![Piece::Tokens(start)];
        begin.extend(message(&system, 0));
        begin.extend(message(&user, 1));
        begin.push(Piece::Tokens(assistant.clone()));
        let mut observation = message(&tool, 0).to_vec();
        observation.push(Piece::Tokens(assistant));
        Layout {
            begin,
            observation,
            end,
            after_end,
        }
    }

    /// The layout a chat template renders (see the module docs); `tools` are passed to the
    /// template's `tools` (the episode's schemas, or none).
    fn of_template(
        tokenizer: &Tokenizer,
        template: &ChatTemplate,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<Self, String> {
        let end = tokenizer.special(Special::End);
        let end_text = tokenizer.decode(&[end]);
        let start = [message("system", 0), message("user", 1)];
        let begin = template.render(&start, tools, true)?;
        // A placeholder assistant turn (content 3), then a tool message (content 2).
        let mut base = start.to_vec();
        base.push(message("assistant", 3));
        let before = template.render(&base, tools, false)?;
        base.push(message("tool", 2));
        let after = template.render(&base, tools, true)?;
        let Some(delta) = after.strip_prefix(before.as_str()) else {
            return Err(concat!(
                "the chat template renders a conversation differently once a tool message ",
                "follows, so turns cannot be added one at a time"
            )
            .into());
        };
        let placeholder = sentinel(3);
        let Some(at) = before.rfind(&placeholder) else {
            return Err("the chat template drops the assistant's message".into());
        };
        let Some(after_end) = before[at + placeholder.len()..].strip_prefix(end_text.as_str())
        else {
            return Err(format!(
                "the chat template does not end an assistant message with {end_text}, the \
                 token that stops generation"
            ));
        };
        // The reply must continue the start exactly as the policy continues it.
        if before[..at] != begin {
            return Err(
                "the chat template's generation prompt is not how it starts a reply".into(),
            );
        }
        let renumber = |pieces: Vec<Piece>, map: &dyn Fn(usize) -> Option<usize>| {
            pieces
                .into_iter()
                .map(|p| match p {
                    Piece::Content(i) => map(i)
                        .map(Piece::Content)
                        .ok_or("the chat template repeats an earlier message in a later turn"),
                    p => Ok(p),
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let begin = renumber(pieces_of(tokenizer, &begin)?, &|i| (i < 2).then_some(i))?;
        let observation = renumber(pieces_of(tokenizer, delta)?, &|i| (i == 2).then_some(0))?;
        let after_end = match pieces_of(tokenizer, after_end)?.as_slice() {
            [] => Vec::new(),
            [Piece::Tokens(tokens)] => tokens.clone(),
            _ => return Err("the chat template puts a message after an assistant's end".into()),
        };
        Ok(Layout {
            begin,
            observation,
            end,
            after_end,
        })
    }
}

/// Appends `pieces` (unmasked), each content taken from `contents` and encoded as plain text.
fn fill(tokenizer: &Tokenizer, t: &mut Transcript, pieces: &[Piece], contents: &[&str]) {
    for piece in pieces {
        match piece {
            Piece::Tokens(tokens) => t.push(tokens, false),
            Piece::Content(i) => {
                let text = contents.get(*i).copied().unwrap_or_default();
                t.push(&tokenizer.encode(text), false)
            }
        }
    }
}

/// What the system prompt says beside the tools when the template lists the tools itself.
const HERMES_INSTRUCTION: &str = "You are an agent that solves the user's task with the tools. Make exactly one tool call \
     per turn; each call's result comes back as a tool message.";

/// A sample tool the template's `tools` rendering is tried with when the format is built.
fn sample_tools() -> Vec<serde_json::Value> {
    vec![
        ToolSchema::new(
            "count",
            "Counts a variable's entities.",
            vec![agentry_env::Param::required(
                "variable",
                agentry_env::ParamKind::String,
                "A variable such as #0.",
            )],
        )
        .to_json(),
    ]
}

/// Renders episodes into tokens with a [`Tokenizer`]; see the module docs for the layout.
#[derive(Clone, Debug)]
pub struct ChatFormat {
    tokenizer: Tokenizer,
    /// The layout with the tools in the system message's text (ours).
    layout: Layout,
    calls: ToolCallFormat,
    /// The chat template, when it lists the episode's tools itself (through `tools`).
    tools_template: Option<ChatTemplate>,
}

impl ChatFormat {
    /// A chat format over `tokenizer`: its chat template and Hermes calls when it carries a
    /// template, else the hand-written frames and compact calls. A tokenizer's template is
    /// checked when it is attached ([`Tokenizer::with_chat_template`]), so this cannot fail;
    /// were it to, the hand-written frames are used.
    pub fn new(tokenizer: Tokenizer) -> Self {
        Self::try_new(tokenizer.clone()).unwrap_or_else(|_| ChatFormat {
            layout: Layout::of_frames(&tokenizer),
            tokenizer,
            calls: ToolCallFormat::Compact,
            tools_template: None,
        })
    }

    /// [`ChatFormat::new`], with the template's failure as an error.
    pub(crate) fn try_new(tokenizer: Tokenizer) -> Result<Self, String> {
        let Some(template) = tokenizer.chat_template() else {
            return Ok(ChatFormat {
                layout: Layout::of_frames(&tokenizer),
                tokenizer,
                calls: ToolCallFormat::Compact,
                tools_template: None,
            });
        };
        let layout = Layout::of_template(&tokenizer, template, None)?;
        // A template whose `tools` part fails on a plain schema is used without it.
        let tools_template = (template.uses_tools()
            && Layout::of_template(&tokenizer, template, Some(&sample_tools())).is_ok())
        .then(|| template.clone());
        Ok(ChatFormat {
            tokenizer,
            layout,
            calls: ToolCallFormat::Hermes,
            tools_template,
        })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The form the policy writes tool calls in.
    pub fn call_format(&self) -> ToolCallFormat {
        self.calls
    }

    /// The token that ends every message, and so every agent turn.
    pub fn end_token(&self) -> u32 {
        self.layout.end
    }

    /// The system message text of a compact-call policy: the tools as compact signatures on
    /// one line, e.g. `get_neighbors(variable, relation) count(variable)`.
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

    /// The system message text of a Hermes-call policy whose template does not list tools:
    /// the tools' JSON schemas in `<tools>` and how to call them, as Qwen2.5's template writes.
    pub fn hermes_system_text(tools: &[ToolSchema]) -> String {
        let mut out = format!(
            "{HERMES_INSTRUCTION}\n\n# Tools\n\nYou are provided with function signatures \
             within <tools></tools> XML tags:\n<tools>"
        );
        for tool in tools {
            out.push('\n');
            out.push_str(&agentry_env::syntax::python_json(&tool.to_json()));
        }
        out.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
             {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        out
    }

    /// The system message's text for an episode with `tools`: compact signatures, the
    /// Hermes instruction beside a template that lists the tools itself, or the tools' schemas
    /// in a Hermes-style text of ours.
    pub fn system_message(&self, tools: &[ToolSchema]) -> String {
        match (self.calls, &self.tools_template) {
            (ToolCallFormat::Compact, _) => Self::system_text(tools),
            (ToolCallFormat::Hermes, Some(_)) => HERMES_INSTRUCTION.to_string(),
            (ToolCallFormat::Hermes, None) => Self::hermes_system_text(tools),
        }
    }

    /// The start of an episode: system message, user instruction and the first assistant
    /// header; the mask is all `false`.
    pub fn begin(&self, reset: &Reset) -> Transcript {
        self.begin_with_system(None, reset)
    }

    /// [`ChatFormat::begin`] with a caller's system text (a served conversation's system
    /// message) before the tools' text in the system message, separated by a blank line.
    ///
    /// Without tools (a served chat that declares none) the system message is the caller's
    /// text alone: there is nothing to instruct about calls.
    pub fn begin_with_system(&self, system: Option<&str>, reset: &Reset) -> Transcript {
        let no_tools = reset.tools.is_empty();
        let with_caller = |tools_text: String| {
            let tools_text = if no_tools { String::new() } else { tools_text };
            match system {
                Some(s) if tools_text.is_empty() => s.to_string(),
                Some(s) => format!("{s}\n\n{tools_text}"),
                None => tools_text,
            }
        };
        let mut t = Transcript::default();
        if let Some(template) = &self.tools_template {
            let tools: Vec<serde_json::Value> =
                reset.tools.iter().map(ToolSchema::to_json).collect();
            // Rendered per episode, since the tools are part of it; should a task's schemas
            // make the template fail, the episode falls back to the tools in our text.
            if let Ok(layout) = Layout::of_template(&self.tokenizer, template, Some(&tools)) {
                let system = with_caller(self.system_message(&reset.tools));
                let contents = [system.as_str(), reset.instruction.as_str()];
                fill(&self.tokenizer, &mut t, &layout.begin, &contents);
                return t;
            }
        }
        let system = with_caller(match self.calls {
            ToolCallFormat::Compact => Self::system_text(&reset.tools),
            ToolCallFormat::Hermes => Self::hermes_system_text(&reset.tools),
        });
        let contents = [system.as_str(), reset.instruction.as_str()];
        fill(&self.tokenizer, &mut t, &self.layout.begin, &contents);
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
        transcript.push(&self.layout.after_end, false);
        fill(
            &self.tokenizer,
            transcript,
            &self.layout.observation,
            &[observation],
        );
    }

    /// The text of a generated turn, up to (without) the first end token.
    pub fn agent_text(&self, generated: &[u32]) -> String {
        let end = generated
            .iter()
            .position(|&t| t == self.end_token())
            .unwrap_or(generated.len());
        self.tokenizer.decode(&generated[..end])
    }

    /// The tool call of a generated turn, read in this format's call form; the error is the
    /// agent's next observation. Every reply is read here, so the form is chosen in one place.
    pub fn parse_reply(&self, generated: &[u32]) -> Result<ToolCall, String> {
        self.calls.parse(&self.agent_text(generated))
    }

    /// The tokens the policy should generate for `call`, including the end token
    /// (for supervised training on oracle demonstrations).
    pub fn demo_turn(&self, call: &ToolCall) -> Vec<u32> {
        let mut tokens = self.tokenizer.encode(&self.calls.render(call));
        tokens.push(self.end_token());
        tokens
    }

    /// The plain texts of a demonstrated episode (system line, instruction, each call and each
    /// observation), to train a word-level tokenizer with [`Tokenizer::train`] (compact calls).
    pub fn corpus_text(reset: &Reset, turns: &[(ToolCall, String)]) -> Vec<String> {
        let mut texts = vec![Self::system_text(&reset.tools), reset.instruction.clone()];
        for (call, observation) in turns {
            texts.push(render_call(call));
            texts.push(observation.clone());
        }
        texts
    }
}
