//! How text splits into the pieces of the runtime's word-level tokenizer.
//!
//! One rule, in one place: the tokenizer splits by it, and every task lists its
//! [`vocabulary`](crate::TaskGenerator::vocabulary) in these pieces. Pieces are runs of
//! `[A-Za-z0-9_#.]` (words), runs of whitespace, and single other characters.

/// Whether `c` belongs to a word run.
pub fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '#' | '.')
}

/// Every piece of `text`, in order; concatenated they give back `text`.
pub fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let end = if is_word_char(first) {
            rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len())
        } else if first.is_whitespace() {
            rest.find(|c: char| !c.is_whitespace())
                .unwrap_or(rest.len())
        } else {
            first.len_utf8()
        };
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// The pieces of `text` without its whitespace runs: what a vocabulary lists.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    pieces(text).filter(|p| !p.starts_with(char::is_whitespace))
}

/// Only the word runs of `text` (no whitespace, no punctuation).
pub fn word_runs(text: &str) -> impl Iterator<Item = &str> {
    pieces(text).filter(|p| p.starts_with(is_word_char))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_words_spaces_and_symbols() {
        let text = "get_neighbors(variable=\"#0\")  done. é";
        assert_eq!(pieces(text).collect::<String>(), text);
        assert_eq!(
            words(text).collect::<Vec<_>>(),
            [
                "get_neighbors",
                "(",
                "variable",
                "=",
                "\"",
                "#0",
                "\"",
                ")",
                "done.",
                "é"
            ]
        );
        assert_eq!(
            word_runs(text).collect::<Vec<_>>(),
            ["get_neighbors", "variable", "#0", "done."]
        );
        assert_eq!(pieces("").count(), 0);
    }
}
