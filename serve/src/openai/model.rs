//! What the OpenAI server needs from a model: the seam between HTTP (this crate) and the policy
//! (the runtime, which this crate does not depend on; the `agentry` crate implements
//! [`ChatModel`] for a loaded policy, as it wires [`crate::HttpRemoteTasks`] the other way).

use tokio::sync::mpsc;

use super::wire::{ChatRequest, FinishReason, Invalid, RawToolCall, TokenLogprob};

/// A model that answers chat requests. Implementations run generation off the async runtime
/// (a dedicated thread owning the weights) and report through the channel [`ChatModel::submit`]
/// returns, so one slow request never blocks the server.
pub trait ChatModel: Send + Sync + 'static {
    /// The model's name, as `GET /v1/models` lists it and completions echo it.
    fn id(&self) -> &str;

    /// Starts answering `request`: its `n` choices are generated concurrently with every other
    /// request's (continuous batching), and their progress arrives on the returned channel,
    /// ending with [`Event::Finished`] (or [`Event::Failed`]). Dropping the receiver cancels
    /// the request (a client that disconnected).
    ///
    /// # Errors
    /// [`Refusal::Busy`] when the queue is full (the server answers 429), [`Refusal::Invalid`]
    /// when the request cannot be served as asked (the conversation does not fit the context, a
    /// message sequence the chat format cannot render; 400).
    fn submit(&self, request: ChatRequest) -> Result<mpsc::UnboundedReceiver<Event>, Refusal>;
}

/// Why a request was not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Too many requests are waiting; retry later.
    Busy,
    /// The request is well-formed but cannot be served.
    Invalid(Invalid),
}

/// Progress of a request's choices, in the order it happens.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// More text of choice `index`, final: it never contains (a prefix of) a stop sequence or
    /// the tool-call markup, which the model side holds back until it knows.
    Delta {
        /// Which choice (`0..n`).
        index: usize,
        /// The text; may be empty when only `logprobs` advance (e.g. tokens held back).
        text: String,
        /// One entry per token generated since the last delta, when the request asked for
        /// log-probabilities (empty otherwise).
        logprobs: Vec<TokenLogprob>,
    },
    /// Choice `index` ended.
    Done {
        /// Which choice.
        index: usize,
        /// Why it ended.
        finish_reason: FinishReason,
        /// The calls it made (with `finish_reason` [`FinishReason::ToolCalls`]).
        tool_calls: Vec<RawToolCall>,
    },
    /// Every choice ended: the request's token counts. Always the last event.
    Finished {
        /// Tokens of the rendered prompt.
        prompt_tokens: usize,
        /// Tokens generated over all choices.
        completion_tokens: usize,
    },
    /// Generation failed for a reason of the server's (the server answers 500, or ends a
    /// stream with an error event). Always the last event.
    Failed(String),
}
