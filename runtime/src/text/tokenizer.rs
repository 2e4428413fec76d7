//! A word-level tokenizer with byte fallback.
//!
//! Text is pre-tokenized into pieces: runs of `[A-Za-z0-9_#.]`, whitespace runs, and single other
//! characters. Words carry no leading space, so a word reads the same in a question (`who
//! directed kavoren ?`) and in a call (`variable="kavoren"`): copying it is copying one token,
//! which a small policy learns; a space-prefixed word would be a different token. The vocabulary is the
//! special tokens, the 256 bytes, and the most frequent multi-byte pieces of a training corpus.
//! A known piece encodes to its id; any other piece encodes to its UTF-8 bytes, so
//! `decode(encode(s)) == s` for every string. Special tokens are never produced from plain text.

use std::collections::HashMap;
use std::path::Path;

use agentry_env::pieces::pieces;
use serde::{Deserialize, Serialize};

use super::hf::{HfTokenizer, TurnMarkers};
use super::template::ChatTemplate;

/// The special tokens, with fixed ids `0..Special::COUNT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Special {
    /// Padding, id 0.
    Pad,
    /// Starts the system message.
    System,
    /// Starts the user message.
    User,
    /// Starts an assistant (policy) message.
    Assistant,
    /// Starts a tool result message.
    Tool,
    /// Ends any message.
    End,
}

impl Special {
    /// How many special tokens there are.
    pub const COUNT: usize = 6;
    /// All special tokens, in id order.
    pub const ALL: [Special; Special::COUNT] = [
        Special::Pad,
        Special::System,
        Special::User,
        Special::Assistant,
        Special::Tool,
        Special::End,
    ];

    /// The token id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The marker text `decode` writes for this token.
    pub fn marker(self) -> &'static str {
        match self {
            Special::Pad => "<pad>",
            Special::System => "<|system|>",
            Special::User => "<|user|>",
            Special::Assistant => "<|assistant|>",
            Special::Tool => "<|tool|>",
            Special::End => "<|end|>",
        }
    }
}

/// First id of the 256 byte tokens.
const BYTE_BASE: u32 = Special::COUNT as u32;
/// First id of the piece tokens.
const PIECE_BASE: u32 = BYTE_BASE + 256;

/// Why a tokenizer could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Reading or writing the file failed.
    #[error("tokenizer file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a tokenizer's JSON.
    #[error("tokenizer file {path} is not valid tokenizer JSON: {source}")]
    Json {
        /// The file.
        path: String,
        /// The cause.
        source: serde_json::Error,
    },
    /// The JSON parsed but describes an impossible vocabulary.
    #[error("tokenizer file {path} is invalid: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// How often each multi-byte piece occurs in `corpus` (single bytes are always tokens).
fn piece_counts<'a>(corpus: impl IntoIterator<Item = &'a str>) -> HashMap<&'a str, u64> {
    let mut counts: HashMap<&'a str, u64> = HashMap::new();
    for text in corpus {
        for piece in pieces(text) {
            if piece.len() > 1 {
                *counts.entry(piece).or_default() += 1;
            }
        }
    }
    counts
}

/// The on-disk form.
#[derive(Serialize, Deserialize)]
struct TokenizerFile {
    format: String,
    pieces: Vec<String>,
}

const FORMAT: &str = "agentry-word-bytes-v1";

/// The on-disk form of a pretrained tokenizer with its chat template (without one, it is
/// written as the bare `tokenizer.json`, as before templates were carried).
#[derive(Serialize, Deserialize)]
struct TemplatedFile {
    format: String,
    /// The `tokenizer.json`, as text.
    tokenizer: String,
    chat_template: String,
    bos_token: String,
    eos_token: String,
}

const FORMAT_TEMPLATED: &str = "agentry-hf-chat-template-v1";

/// A pretrained tokenizer: its `tokenizer.json`, turn markers and, when the model has one, its
/// chat template.
#[derive(Clone, Debug, PartialEq)]
struct Pretrained {
    tokenizer: HfTokenizer,
    markers: TurnMarkers,
    template: Option<ChatTemplate>,
}

/// A lossless word-level tokenizer with byte fallback (see the module docs), or a Hugging Face
/// checkpoint's `tokenizer.json` ([`Tokenizer::from_hf`]), behind one interface so the chat
/// format, rollout and training take either.
#[derive(Clone, Debug, PartialEq)]
pub struct Tokenizer {
    pieces: Vec<String>,
    index: HashMap<String, u32>,
    /// A checkpoint's tokenizer; then `pieces` is empty and unused.
    hf: Option<Box<Pretrained>>,
}

impl Tokenizer {
    /// Builds the vocabulary from a corpus: the specials, the 256 bytes, then the most frequent
    /// multi-byte pieces (ties broken by piece text) until `max_vocab` tokens in all.
    pub fn train<'a>(corpus: impl IntoIterator<Item = &'a str>, max_vocab: usize) -> Self {
        Self::train_counting(corpus, max_vocab).0
    }

    /// [`Tokenizer::train`], and the tokens it would need to keep every piece of the corpus
    /// whole: below that, the rarest pieces are spelled in bytes. One pass over the corpus.
    pub fn train_counting<'a>(
        corpus: impl IntoIterator<Item = &'a str>,
        max_vocab: usize,
    ) -> (Self, usize) {
        let mut ranked: Vec<(&str, u64)> = piece_counts(corpus).into_iter().collect();
        let needed = PIECE_BASE as usize + ranked.len();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let room = max_vocab.saturating_sub(PIECE_BASE as usize);
        let pieces = ranked
            .into_iter()
            .take(room)
            .map(|(p, _)| p.to_string())
            .collect();
        (Self::from_pieces(pieces), needed)
    }

    fn from_pieces(pieces: Vec<String>) -> Self {
        let index = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), PIECE_BASE + i as u32))
            .collect();
        Tokenizer {
            pieces,
            index,
            hf: None,
        }
    }

    /// A checkpoint's tokenizer. Its vocabulary must define chat turn markers (ChatML or
    /// Llama 3, see [`HfTokenizer::turn_markers`]), which the chat format renders turns with.
    pub fn from_hf(hf: HfTokenizer) -> Result<Self, String> {
        let markers = hf.turn_markers().ok_or(
            "the tokenizer defines no chat turn markers: neither ChatML's special \
             <|im_start|> and <|im_end|> nor Llama 3's <|start_header_id|>, \
             <|end_header_id|> and <|eot_id|>",
        )?;
        Ok(Tokenizer {
            pieces: Vec::new(),
            index: HashMap::new(),
            hf: Some(Box::new(Pretrained {
                tokenizer: hf,
                markers,
                template: None,
            })),
        })
    }

    /// Attaches the model's chat template to a checkpoint's tokenizer, so the chat format lays
    /// episodes out as the model was tuned on and the policy calls tools in Hermes form
    /// ([`super::ChatFormat`]). The template is checked here: it must render a conversation
    /// with a tool message, turn by turn, ending assistant messages with the turn end.
    pub fn with_chat_template(mut self, template: ChatTemplate) -> Result<Self, String> {
        let Some(hf) = self.hf.as_deref_mut() else {
            return Err("a chat template needs a pretrained tokenizer".into());
        };
        hf.template = Some(template);
        super::chat::ChatFormat::try_new(self.clone())?;
        Ok(self)
    }

    /// The checkpoint's tokenizer and turn markers, when this is one.
    pub fn hf(&self) -> Option<(&HfTokenizer, TurnMarkers)> {
        self.hf.as_deref().map(|p| (&p.tokenizer, p.markers))
    }

    /// The model's chat template, when this is a checkpoint's tokenizer that carries one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.hf.as_deref().and_then(|p| p.template.as_ref())
    }

    /// Encodes text; never produces special tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if let Some((hf, _)) = self.hf() {
            // Loading encoded a probe of rare characters, so this does not fail in practice;
            // if it ever does, the text is replaced by nothing rather than stopping a run.
            return hf.encode(text).unwrap_or_default();
        }
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        for piece in pieces(text) {
            match self.index.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| BYTE_BASE + b as u32)),
            }
        }
        out
    }

    /// Decodes tokens; specials become their marker text, invalid UTF-8 and unknown ids become
    /// U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        if let Some((hf, _)) = self.hf() {
            return hf
                .decode(tokens)
                .unwrap_or_else(|_| "\u{FFFD}".repeat(tokens.len()));
        }
        let mut bytes = Vec::with_capacity(tokens.len() * 4);
        for &id in tokens {
            if (id as usize) < Special::COUNT {
                bytes.extend_from_slice(Special::ALL[id as usize].marker().as_bytes());
            } else if id < PIECE_BASE {
                bytes.push((id - BYTE_BASE) as u8);
            } else if let Some(piece) = self.pieces.get((id - PIECE_BASE) as usize) {
                bytes.extend_from_slice(piece.as_bytes());
            } else {
                bytes.extend_from_slice("\u{FFFD}".as_bytes());
            }
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// The number of token ids (specials, bytes and pieces).
    pub fn vocab_size(&self) -> usize {
        match self.hf() {
            Some((hf, _)) => hf.vocab_size(),
            None => PIECE_BASE as usize + self.pieces.len(),
        }
    }

    /// The padding id: 0, or a checkpoint's turn end (padding is masked, any real id does).
    pub fn pad(&self) -> u32 {
        self.special(Special::Pad)
    }

    /// The id of a special token. For a checkpoint's tokenizer, `End` and `Pad` are the turn
    /// end and the roles share the turn-start marker (its role name follows it as text).
    pub fn special(&self, special: Special) -> u32 {
        match self.hf() {
            None => special.id(),
            Some((_, markers)) => match (special, markers) {
                (Special::End | Special::Pad, _) => markers.end(),
                (_, TurnMarkers::ChatMl { start, .. }) => start,
                (_, TurnMarkers::Llama3 { start_header, .. }) => start_header,
            },
        }
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        match self.hf() {
            Some((hf, _)) => hf.is_special(id),
            None => (id as usize) < Special::COUNT,
        }
    }

    /// Writes the tokenizer as JSON: ours, or a checkpoint's `tokenizer.json`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TokenizerError> {
        let path = path.as_ref();
        let json = self.to_json().map_err(|reason| TokenizerError::Invalid {
            path: path.display().to_string(),
            reason,
        })?;
        std::fs::write(path, json).map_err(|source| TokenizerError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// The JSON [`Tokenizer::save`] writes (checkpoints embed it): a checkpoint's tokenizer as
    /// Hugging Face's `tokenizer.json`, or with its chat template as an object holding that
    /// file and the template; ours as its pieces.
    pub fn to_json(&self) -> Result<String, String> {
        if let Some(hf) = self.hf.as_deref() {
            let json = hf.tokenizer.to_json()?;
            let Some(template) = &hf.template else {
                return Ok(json);
            };
            let file = TemplatedFile {
                format: FORMAT_TEMPLATED.to_string(),
                tokenizer: json,
                chat_template: template.source().to_string(),
                bos_token: template.bos_token().to_string(),
                eos_token: template.eos_token().to_string(),
            };
            return serde_json::to_string(&file).map_err(|e| e.to_string());
        }
        let file = TokenizerFile {
            format: FORMAT.to_string(),
            pieces: self.pieces.clone(),
        };
        serde_json::to_string(&file).map_err(|e| e.to_string())
    }

    /// Reads a tokenizer written by [`Tokenizer::save`], or a Hugging Face `tokenizer.json`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses and validates the JSON of [`Tokenizer::to_json`]; `origin` names where it came
    /// from in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, TokenizerError> {
        let name = || origin.to_string();
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|source| TokenizerError::Json {
                path: name(),
                source,
            })?;
        // Ours always names its format; Hugging Face's `tokenizer.json` has no such key.
        if value.get("format").is_none() {
            let hf = HfTokenizer::from_json(text.as_bytes(), origin)?;
            return Self::from_hf(hf).map_err(|reason| TokenizerError::Invalid {
                path: name(),
                reason,
            });
        }
        let invalid = |reason: String| TokenizerError::Invalid {
            path: name(),
            reason,
        };
        if value["format"] == FORMAT_TEMPLATED {
            let file: TemplatedFile =
                serde_json::from_value(value).map_err(|source| TokenizerError::Json {
                    path: name(),
                    source,
                })?;
            let hf = HfTokenizer::from_json(file.tokenizer.as_bytes(), origin)?;
            let template = ChatTemplate::new(&file.chat_template, &file.bos_token, &file.eos_token)
                .map_err(invalid)?;
            return Self::from_hf(hf)
                .and_then(|t| t.with_chat_template(template))
                .map_err(invalid);
        }
        let file: TokenizerFile =
            serde_json::from_value(value).map_err(|source| TokenizerError::Json {
                path: name(),
                source,
            })?;
        if file.format != FORMAT {
            return Err(invalid(format!(
                "unknown format `{}` (expected `{FORMAT}` or `{FORMAT_TEMPLATED}`)",
                file.format
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for piece in &file.pieces {
            if piece.len() < 2 {
                return Err(invalid(format!(
                    "piece {piece:?} is shorter than two bytes"
                )));
            }
            if !seen.insert(piece.as_str()) {
                return Err(invalid(format!("piece {piece:?} appears twice")));
            }
        }
        if file.pieces.len() > (u32::MAX - PIECE_BASE) as usize {
            return Err(invalid("too many pieces".to_string()));
        }
        Ok(Self::from_pieces(file.pieces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_text() {
        let text = "get_neighbors(#0, \"people.person\")  hi  there\n\tx é";
        let pieces: Vec<&str> = pieces(text).collect();
        assert_eq!(pieces.concat(), text);
        assert!(pieces.contains(&"there"));
        assert!(pieces.contains(&"  "));
        assert!(pieces.contains(&"get_neighbors"));
        assert!(pieces.contains(&"people.person"));
    }

    #[test]
    fn the_vocabulary_needed_keeps_every_piece_whole() {
        let corpus = ["count(#0) count(#1) rare", "words words"];
        // The count does not depend on the room given.
        let (bare, needed) = Tokenizer::train_counting(corpus, 0);
        assert_eq!(
            bare.vocab_size(),
            PIECE_BASE as usize,
            "the specials and bytes only"
        );
        let multi_byte: std::collections::HashSet<&str> = corpus
            .iter()
            .flat_map(|text| pieces(text))
            .filter(|piece| piece.len() > 1)
            .collect();
        assert_eq!(needed, PIECE_BASE as usize + multi_byte.len());
        let whole = Tokenizer::train(corpus, needed);
        assert_eq!(whole.vocab_size(), needed);
        assert_eq!(whole.encode("rare").len(), 1);
        assert_eq!(Tokenizer::train(corpus, needed + 100).vocab_size(), needed);
        // One token fewer leaves the rarest piece (ties broken by text) to its bytes.
        let short = Tokenizer::train(corpus, needed - 1);
        assert_eq!(short.vocab_size(), needed - 1);
        assert_eq!(short.encode("rare").len(), 4);
        assert_eq!(short.encode("words").len(), 1);
    }

    #[test]
    fn known_pieces_are_single_tokens() {
        let tok = Tokenizer::train(["count(#0) count(#1)"], 1000);
        assert_eq!(tok.encode("count").len(), 1);
        assert_eq!(tok.decode(&tok.encode(" count(#1)")), " count(#1)");
        assert!(tok.encode("<|end|>").iter().all(|&t| !tok.is_special(t)));
    }
}
