//! The chat format: how an episode becomes tokens.
//!
//! Layout (specials in angle brackets, no extra spaces):
//!
//! ```text
//! <|system|>get_relations(variable) count(variable)<|end|><|user|>question<|end|><|assistant|>
//! count(variable="#0")<|end|><|tool|>observation<|end|><|assistant|>...
//! ```
//!
//! The policy writes each tool call in the compact form of [`agentry_env::syntax`],
//! `name(arg="value", n=3)`. The agent mask of a [`Transcript`] marks exactly the
//! tokens the policy generated (each call and its end token).
//!
//! With a Hugging Face checkpoint's tokenizer ([`Tokenizer::from_hf`]) the same turns are
//! framed by the checkpoint's own markers, so the model sees the turn layout it was trained on:
//!
//! ```text
//! ChatML:  <|im_start|>system\n…<|im_end|>\n<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n
//!          …<|im_end|>\n<|im_start|>tool\n…<|im_end|>\n<|im_start|>assistant\n
//! Llama 3: <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n…<|eot_id|>…
//! ```
//!
//! The turn-end marker (`<|im_end|>`, `<|eot_id|>`) is the token that stops generation.

use agentry_env::{Reset, ToolCall, ToolSchema, render_call};

use super::hf::TurnMarkers;
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

/// The tokens around messages: a conversation is `start`, then per message the role's
/// header, the text, `end` and `after_end`.
#[derive(Clone, Debug, PartialEq)]
struct Frame {
    start: Vec<u32>,
    /// Headers of the system, user, assistant and tool roles.
    headers: [Vec<u32>; 4],
    end: u32,
    after_end: Vec<u32>,
}

/// A message's role, indexing [`Frame::headers`].
#[derive(Clone, Copy)]
enum Role {
    System = 0,
    User = 1,
    Assistant = 2,
    Tool = 3,
}

impl Frame {
    fn of(tokenizer: &Tokenizer) -> Self {
        const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
        let Some((_, markers)) = tokenizer.hf() else {
            let header = |s: Special| vec![s.id()];
            return Frame {
                start: Vec::new(),
                headers: [
                    header(Special::System),
                    header(Special::User),
                    header(Special::Assistant),
                    header(Special::Tool),
                ],
                end: Special::End.id(),
                after_end: Vec::new(),
            };
        };
        match markers {
            TurnMarkers::ChatMl { start, end } => Frame {
                start: Vec::new(),
                headers: ROLES.map(|role| {
                    let mut h = vec![start];
                    h.extend(tokenizer.encode(&format!("{role}\n")));
                    h
                }),
                end,
                after_end: tokenizer.encode("\n"),
            },
            TurnMarkers::Llama3 {
                begin,
                start_header,
                end_header,
                eot,
            } => Frame {
                start: begin.into_iter().collect(),
                headers: ROLES.map(|role| {
                    let mut h = vec![start_header];
                    h.extend(tokenizer.encode(role));
                    h.push(end_header);
                    h.extend(tokenizer.encode("\n\n"));
                    h
                }),
                end: eot,
                after_end: Vec::new(),
            },
        }
    }

    fn header(&self, role: Role) -> &[u32] {
        &self.headers[role as usize]
    }
}

/// Renders episodes into tokens with a [`Tokenizer`]; see the module docs for the layout.
#[derive(Clone, Debug)]
pub struct ChatFormat {
    tokenizer: Tokenizer,
    frame: Frame,
}

impl ChatFormat {
    /// A chat format over `tokenizer`.
    pub fn new(tokenizer: Tokenizer) -> Self {
        let frame = Frame::of(&tokenizer);
        ChatFormat { tokenizer, frame }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The token that ends every message, and so every agent turn.
    pub fn end_token(&self) -> u32 {
        self.frame.end
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
        t.push(&self.frame.start, false);
        self.push_message(&mut t, Role::System, &Self::system_text(&reset.tools));
        self.push_message(&mut t, Role::User, &reset.instruction);
        t.push(self.frame.header(Role::Assistant), false);
        t
    }

    /// A whole non-agent message: header, text, end.
    fn push_message(&self, t: &mut Transcript, role: Role, text: &str) {
        t.push(self.frame.header(role), false);
        t.push(&self.tokenizer.encode(text), false);
        self.push_end(t);
    }

    /// The end of a message: the end token and what follows it (masked `false`).
    fn push_end(&self, t: &mut Transcript) {
        t.push(&[self.frame.end], false);
        t.push(&self.frame.after_end, false);
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
        if transcript.tokens.last() == Some(&self.end_token()) {
            transcript.push(&self.frame.after_end, false);
        } else {
            self.push_end(transcript);
        }
        self.push_message(transcript, Role::Tool, observation);
        transcript.push(self.frame.header(Role::Assistant), false);
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
