//! A Hugging Face `tokenizer.json`, through the `tokenizers` crate (the library Python's
//! `transformers` uses), so a checkpoint's text is split exactly as it was in training.
//!
//! Plain text never encodes to a special token here: text such as `<|im_end|>` inside an
//! observation is split as ordinary characters, so an environment cannot end a turn or forge a
//! role by printing a marker. Special tokens are placed by id ([`HfTokenizer::token_id`]).

use std::path::Path;

use super::tokenizer::TokenizerError;

/// Text with characters a small vocabulary lacks (Latin-1, CJK, emoji, private use), encoded
/// once at load time.
const PROBE: &str = "a Zé 東京 😀 \u{E000}\n\t";

/// The special tokens that frame chat turns, by family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnMarkers {
    /// ChatML (Qwen2): `<|im_start|>role\n ... <|im_end|>\n`.
    ChatMl {
        /// `<|im_start|>`.
        start: u32,
        /// `<|im_end|>`, which ends every turn.
        end: u32,
    },
    /// Llama 3: `<|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>`.
    Llama3 {
        /// `<|begin_of_text|>`, when the vocabulary has it.
        begin: Option<u32>,
        /// `<|start_header_id|>`.
        start_header: u32,
        /// `<|end_header_id|>`.
        end_header: u32,
        /// `<|eot_id|>`, which ends every turn.
        eot: u32,
    },
}

impl TurnMarkers {
    /// The token that ends every turn (and so stops generation).
    pub fn end(self) -> u32 {
        match self {
            TurnMarkers::ChatMl { end, .. } => end,
            TurnMarkers::Llama3 { eot, .. } => eot,
        }
    }
}

/// A loaded `tokenizer.json`.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The special added tokens, by id.
    specials: Vec<(u32, String)>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.specials)
            .finish()
    }
}

impl HfTokenizer {
    /// Reads a `tokenizer.json`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&bytes, &path.display().to_string())
    }

    /// Parses the contents of a `tokenizer.json`; `origin` names where it came from in errors.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self, TokenizerError> {
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| TokenizerError::Invalid {
                path: origin.to_string(),
                reason: format!("not a Hugging Face tokenizer: {e}"),
            })?;
        Self::from_tokenizer(inner, origin)
    }

    /// Wraps a tokenizer built in code (the GGUF loader builds one from a file's metadata);
    /// `origin` names where it came from in errors.
    pub fn from_tokenizer(
        mut inner: tokenizers::Tokenizer,
        origin: &str,
    ) -> Result<Self, TokenizerError> {
        let name = || origin.to_string();
        inner.set_encode_special_tokens(true);
        let mut specials: Vec<(u32, String)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (id, token.content))
            .collect();
        specials.sort();
        let tokenizer = HfTokenizer { inner, specials };
        // Fail at load time, not in the middle of a run, if the model cannot encode some text
        // (an unknown-token id outside the vocabulary is the one way a loaded model fails).
        tokenizer
            .encode(PROBE)
            .map_err(|e| TokenizerError::Invalid {
                path: name(),
                reason: format!("cannot encode text: {e}"),
            })?;
        Ok(tokenizer)
    }

    /// Encodes text without adding special tokens (no BOS), as Python's
    /// `tokenizer.encode(text, add_special_tokens=False)` does for text without markers.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Encodes trusted text, such as a rendered chat template, in which special tokens'
    /// texts (`<|im_start|>`) stand for the special tokens: each becomes its single id, and
    /// the text between them is encoded as [`HfTokenizer::encode`] does. This is what Python's
    /// `tokenizer.encode(text, add_special_tokens=False)` does; never use it on text an
    /// environment or a user wrote.
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The earliest special token in the rest, the longest one where several start there.
            let next = self
                .specials
                .iter()
                .filter(|(_, token)| !token.is_empty())
                .filter_map(|(id, token)| rest.find(token.as_str()).map(|at| (at, token, *id)))
                .min_by_key(|(at, token, _)| (*at, std::cmp::Reverse(token.len())));
            let Some((at, token, id)) = next else {
                out.extend(self.encode(rest)?);
                break;
            };
            out.extend(self.encode(&rest[..at])?);
            out.push(id);
            rest = &rest[at + token.len()..];
        }
        Ok(out)
    }

    /// Decodes ids, special tokens included as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.inner.decode(ids, false).map_err(|e| e.to_string())
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token (special or not) by its text.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The special tokens (`special: true` in `added_tokens`), by id.
    pub fn specials(&self) -> &[(u32, String)] {
        &self.specials
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.binary_search_by_key(&id, |(i, _)| *i).is_ok()
    }

    /// The chat turn markers the vocabulary defines as special tokens: ChatML's, else
    /// Llama 3's; `None` when it has neither.
    pub fn turn_markers(&self) -> Option<TurnMarkers> {
        let special = |token: &str| {
            self.specials
                .iter()
                .find(|(_, t)| t == token)
                .map(|(id, _)| *id)
        };
        if let (Some(start), Some(end)) = (special("<|im_start|>"), special("<|im_end|>")) {
            return Some(TurnMarkers::ChatMl { start, end });
        }
        let (start_header, end_header, eot) = (
            special("<|start_header_id|>")?,
            special("<|end_header_id|>")?,
            special("<|eot_id|>")?,
        );
        Some(TurnMarkers::Llama3 {
            begin: special("<|begin_of_text|>"),
            start_header,
            end_header,
            eot,
        })
    }

    /// The tokenizer's `tokenizer.json`.
    pub fn to_json(&self) -> Result<String, String> {
        self.inner
            .to_string(false)
            .map_err(|e| format!("cannot serialize: {e}"))
    }
}

/// Two tokenizers are equal when they serialize to the same `tokenizer.json`.
impl PartialEq for HfTokenizer {
    fn eq(&self, other: &Self) -> bool {
        self.specials == other.specials
            && self.inner.to_string(false).ok() == other.inner.to_string(false).ok()
    }
}
