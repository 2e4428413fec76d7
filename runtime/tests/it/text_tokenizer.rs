//! Tokenizer: losslessness, specials, determinism, persistence.

use agentry_runtime::text::{Special, Tokenizer, TokenizerError};
use proptest::prelude::*;

fn corpus() -> Vec<&'static str> {
    vec![
        "get_neighbors(variable=\"#0\", relation=\"people.person.nationality\")",
        "count(variable=\"#1\") the answer is #2",
        "What is the capital of France? The capital of France is Paris.",
        "ls -la /home/user && cat notes.txt",
    ]
}

fn tokenizer() -> Tokenizer {
    Tokenizer::train(corpus(), 300)
}

proptest! {
    #[test]
    fn roundtrip_any_string(s in any::<String>()) {
        let tok = tokenizer();
        prop_assert_eq!(tok.decode(&tok.encode(&s)), s);
    }

    #[test]
    fn roundtrip_wordy_strings(s in "[a-zA-Z0-9_#. \\n\\t\"(),=é漢🙂<|>-]{0,80}") {
        let tok = tokenizer();
        let ids = tok.encode(&s);
        prop_assert!(ids.iter().all(|&t| !tok.is_special(t) && (t as usize) < tok.vocab_size()));
        prop_assert_eq!(tok.decode(&ids), s);
    }
}

#[test]
fn specials_have_fixed_ids_and_markers() {
    let tok = tokenizer();
    assert_eq!(tok.pad(), 0);
    assert_eq!(tok.special(Special::Pad), 0);
    let ids: Vec<u32> = Special::ALL.iter().map(|&s| tok.special(s)).collect();
    assert_eq!(ids, (0..Special::COUNT as u32).collect::<Vec<_>>());
    assert_eq!(
        tok.decode(&[tok.special(Special::User), tok.special(Special::End)]),
        "<|user|><|end|>"
    );
    // Marker text in plain text is never a special token.
    let ids = tok.encode("<|end|><|assistant|><pad>");
    assert!(ids.iter().all(|&t| !tok.is_special(t)));
}

#[test]
fn frequent_pieces_are_single_tokens() {
    let tok = tokenizer();
    assert!(tok.vocab_size() <= 300);
    assert!(tok.vocab_size() > Special::COUNT + 256);
    // Words carry no leading space: a space is its own (byte) token.
    assert_eq!(tok.encode("France").len(), 1);
    assert_eq!(tok.encode(" France").len(), 2);
    assert_eq!(tok.encode("count").len(), 1);
    assert_eq!(tok.encode("capital of France").len(), 5);
    // Unknown words fall back to bytes.
    assert_eq!(tok.encode("zzq").len(), 3);
}

#[test]
fn training_is_deterministic_and_bounded() {
    let a = Tokenizer::train(corpus(), 280);
    let b = Tokenizer::train(corpus().into_iter().rev(), 280);
    assert_eq!(a, b);
    assert_eq!(a.vocab_size(), 280);
    let tiny = Tokenizer::train(corpus(), 10);
    assert_eq!(tiny.vocab_size(), Special::COUNT + 256);
    assert_eq!(tiny.decode(&tiny.encode("héllo")), "héllo");
}

#[test]
fn decode_is_total() {
    let tok = tokenizer();
    // Invalid UTF-8 and out-of-range ids do not panic.
    let bytes = [6 + 0xff, 6 + 0xc3, u32::MAX, 1_000_000];
    let text = tok.decode(&bytes);
    assert!(text.contains('\u{FFFD}'));
}

#[test]
fn save_and_load() {
    let dir = crate::common::scratch_in("text_tokenizer", "save_and_load");
    let path = dir.join("tokenizer.json");
    let tok = tokenizer();
    tok.save(&path).unwrap();
    assert_eq!(Tokenizer::load(&path).unwrap(), tok);

    std::fs::write(&path, "{not json").unwrap();
    assert!(matches!(
        Tokenizer::load(&path),
        Err(TokenizerError::Json { .. })
    ));
    std::fs::write(
        &path,
        r#"{"format":"agentry-word-bytes-v1","pieces":["ab","ab"]}"#,
    )
    .unwrap();
    let err = Tokenizer::load(&path).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    std::fs::write(&path, r#"{"format":"other","pieces":[]}"#).unwrap();
    assert!(matches!(
        Tokenizer::load(&path),
        Err(TokenizerError::Invalid { .. })
    ));
    assert!(matches!(
        Tokenizer::load(dir.join("missing.json")),
        Err(TokenizerError::Io { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}
