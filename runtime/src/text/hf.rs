//! A Hugging Face `tokenizer.json`, through the `tokenizers` crate (the library Python's
//! `transformers` uses), so a checkpoint's text is split exactly as it was in training.
//!
//! Plain text never encodes to a special token here: text such as `<|im_end|>` inside an
//! observation is split as ordinary characters, so an environment cannot end a turn or forge a
//! role by printing a marker. Special tokens are placed by id ([`HfTokenizer::token_id`]).

use std::path::Path;

use super::tokenizer::TokenizerError;

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
        let name = || path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: name(),
            source,
        })?;
        let mut inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Invalid {
                path: name(),
                reason: format!("not a Hugging Face tokenizer: {e}"),
            })?;
        inner.set_encode_special_tokens(true);
        let mut specials: Vec<(u32, String)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (id, token.content))
            .collect();
        specials.sort();
        let tokenizer = HfTokenizer { inner, specials };
        // Fail at load time, not in the middle of a run, if the model cannot encode at all
        // (for example an unknown-token id outside the vocabulary).
        tokenizer.encode("a").map_err(|e| TokenizerError::Invalid {
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
}
