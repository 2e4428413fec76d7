//! The tokenizer a GGUF file describes in its `tokenizer.*` metadata, rebuilt as a Hugging
//! Face tokenizer (the `tokenizers` crate) so it splits text exactly as the model's own
//! `tokenizer.json` does.
//!
//! A GGUF has no `tokenizer.json`: it stores the vocabulary (`tokenizer.ggml.tokens`), the
//! token types (`token_type`: 1 normal, 3 control, 4 user-defined), the BPE merges and the
//! name of the pre-tokenizer (`tokenizer.ggml.pre`), which llama.cpp maps to its split
//! regexes (`llama-vocab.cpp`). Only byte-level BPE (`tokenizer.ggml.model = gpt2`) is read
//! here, with the pre-tokenizers below; each is the one in the original model's
//! `tokenizer.json` (llama.cpp's regexes for the same names agree with them):
//! - `smollm` (SmolLM, SmolLM2): digits split one by one, then GPT-2's byte-level regex.
//!   (transformers' GGUF converter leaves out the digit split; SmolLM2's `tokenizer.json`
//!   and llama.cpp both have it.)
//! - `gpt2`, `default`: GPT-2's byte-level regex.
//! - `llama-bpe`, `llama3`, `llama-v3`: Llama 3's split regex.
//! - `qwen2`, `deepseek-r1-qwen`: Qwen2's split regex, after NFC normalization.
//!
//! Control tokens become special added tokens (`<|im_start|>`), user-defined ones plain
//! added tokens, as transformers' converter does, so each keeps its single id.

use std::collections::BTreeMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::file::Value;
use crate::text::HfTokenizer;

/// Llama 3's pre-tokenizer split (its `tokenizer.json`, llama.cpp's `LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer split (its `tokenizer.json`, llama.cpp's `QWEN2`).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's token type of control tokens (`LLAMA_TOKEN_TYPE_CONTROL`).
const CONTROL: u64 = 3;
/// llama.cpp's token type of user-defined tokens (`LLAMA_TOKEN_TYPE_USER_DEFINED`).
const USER_DEFINED: u64 = 4;

/// Builds the tokenizer from the file's metadata; the error is a reason naming the key.
pub fn build(metadata: &BTreeMap<String, Value>, origin: &str) -> Result<HfTokenizer, String> {
    let get = |key: &str| {
        metadata
            .get(key)
            .ok_or_else(|| format!("has no `{key}`, so it describes no tokenizer"))
    };
    let model = get("tokenizer.ggml.model")?
        .as_str()
        .ok_or("`tokenizer.ggml.model` is not a string")?;
    if model != "gpt2" {
        return Err(format!(
            "`tokenizer.ggml.model` is `{model}`; only byte-level BPE (`gpt2`) is supported yet"
        ));
    }
    let tokens = strings(get("tokenizer.ggml.tokens")?, "tokenizer.ggml.tokens")?;
    let merges = strings(get("tokenizer.ggml.merges")?, "tokenizer.ggml.merges")?;
    let types: Vec<u64> = match metadata.get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(value) => value
            .as_array()
            .and_then(|items| items.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or("`tokenizer.ggml.token_type` is not an array of integers")?,
    };
    if types.len() != tokens.len() {
        return Err(format!(
            "`tokenizer.ggml.token_type` has {} entries for {} tokens",
            types.len(),
            tokens.len()
        ));
    }
    let pre = match metadata.get("tokenizer.ggml.pre") {
        None => "default",
        Some(v) => v.as_str().ok_or("`tokenizer.ggml.pre` is not a string")?,
    };

    let mut vocab = ahash_vocab(&tokens)?;
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| format!("merge `{m}` is not two tokens separated by a space"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(std::mem::take(&mut vocab), merges)
        .build()
        .map_err(|e| format!("the vocabulary and merges do not make a BPE model: {e}"))?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(false, true, true);
    let split = |regex: &str| -> Result<PreTokenizerWrapper, String> {
        Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| format!("the split regex does not compile: {e}"))
    };
    let without_regex = ByteLevel::new(false, true, false);
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        "smollm" => Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(byte_level),
        ])
        .into(),
        "gpt2" | "default" => byte_level.into(),
        "llama-bpe" | "llama3" | "llama-v3" => {
            Sequence::new(vec![split(LLAMA3_SPLIT)?, without_regex.into()]).into()
        }
        "qwen2" | "deepseek-r1-qwen" => {
            tokenizer.with_normalizer(Some(NFC));
            Sequence::new(vec![split(QWEN2_SPLIT)?, without_regex.into()]).into()
        }
        other => {
            return Err(format!(
                "`tokenizer.ggml.pre` is `{other}`, a pre-tokenizer not supported yet \
                 (smollm, gpt2, default, llama-bpe, llama3, llama-v3, qwen2 and \
                 deepseek-r1-qwen are)"
            ));
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));

    // In a byte-level vocabulary every real token is spelled in the byte alphabet; a control
    // token with other characters is a mislabel (transformers skips those too).
    let alphabet: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (token, &ty) in tokens.iter().zip(&types) {
        if ty == CONTROL && token.chars().all(|c| alphabet.contains(&c)) && !token.is_empty() {
            special.push(AddedToken::from(*token, true).normalized(false));
        } else if ty == USER_DEFINED && !token.is_empty() {
            user.push(AddedToken::from(*token, false).normalized(false));
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user);
    if tokenizer.get_vocab_size(true) != tokens.len() {
        return Err(format!(
            "the added tokens change the vocabulary's size from {} to {} (an added token is \
             not spelled as in the vocabulary)",
            tokens.len(),
            tokenizer.get_vocab_size(true)
        ));
    }
    HfTokenizer::from_tokenizer(tokenizer, origin).map_err(|e| e.to_string())
}

/// The vocabulary by token text; duplicate tokens are an error (ids would be ambiguous).
fn ahash_vocab(tokens: &[&str]) -> Result<tokenizers::models::bpe::Vocab, String> {
    let mut vocab = tokenizers::models::bpe::Vocab::default();
    for (id, token) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| "more than 2^32 tokens".to_string())?;
        if let Some(first) = vocab.insert(token.to_string(), id) {
            return Err(format!(
                "token {token:?} appears twice in `tokenizer.ggml.tokens` (ids {first} and {id})"
            ));
        }
    }
    Ok(vocab)
}

/// An array of strings.
fn strings<'a>(value: &'a Value, key: &str) -> Result<Vec<&'a str>, String> {
    value
        .as_array()
        .and_then(|items| items.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("`{key}` is not an array of strings"))
}
