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

use agentry_env::{Reset, ToolCall, ToolSchema, render_call};

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
