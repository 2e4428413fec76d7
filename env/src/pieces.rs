//! How text splits into the pieces of the runtime's word-level tokenizer.
//!
//! One rule, in one place: the tokenizer splits by it, and every task lists its
//! [`vocabulary`](crate::TaskGenerator::vocabulary) in these pieces. Pieces are runs of
//! `[A-Za-z0-9_#.]` (words), runs of whitespace, and single other characters; the dots that
//! end a word run are a piece of their own (`1.` is `1` and `.`), so a word at the end of a
//! sentence is the same token as the word inside one, and a policy can copy it. Dots inside a
//! run stay (`people.person`, `3.5`, `notes.txt`), and a run of dots alone is one piece.

/// Whether `c` belongs to a word run.
pub fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '#' | '.')
}

/// Every piece of `text`, in order; concatenated they give back `text`.
pub fn pieces(text: &str) -> impl Iterator<Item = &str> {
    split(text, true)
}

/// The rule before final dots were split off: a word run keeps them (`1.` is one piece). The
/// runtime's tokenizers saved in that format (`agentry-word-bytes-v1`) still split by it.
pub fn pieces_keeping_final_dots(text: &str) -> impl Iterator<Item = &str> {
    split(text, false)
}

fn split(text: &str, final_dots_apart: bool) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let end = if is_word_char(first) {
            let run = rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len());
            match rest[..run].trim_end_matches('.').len() {
                word if final_dots_apart && word > 0 => word,
                _ => run,
            }
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
                "done",
                ".",
                "é"
            ]
        );
        assert_eq!(
            word_runs(text).collect::<Vec<_>>(),
            ["get_neighbors", "variable", "#0", "done", "."]
        );
        assert_eq!(pieces("").count(), 0);
    }

    #[test]
    fn final_dots_are_a_piece_of_their_own() {
        let split = |text| pieces(text).collect::<Vec<_>>();
        assert_eq!(split("drawer 1."), ["drawer", " ", "1", "."]);
        assert_eq!(
            split("on shelf. Next"),
            ["on", " ", "shelf", ".", " ", "Next"]
        );
        assert_eq!(split("wait..."), ["wait", "..."]);
        assert_eq!(split("1.)"), ["1", ".", ")"]);
        // Dots inside a run stay, and dots alone are one piece.
        assert_eq!(split("people.person 3.5 notes.txt."), {
            ["people.person", " ", "3.5", " ", "notes.txt", "."]
        });
        assert_eq!(split("... .bashrc"), ["...", " ", ".bashrc"]);
        for text in ["a..b.", "x.", ".", "..", "é.", "v1.2.3..", " . "] {
            assert_eq!(pieces(text).collect::<String>(), text);
            assert_eq!(pieces_keeping_final_dots(text).collect::<String>(), text);
        }
        assert_eq!(
            pieces_keeping_final_dots("drawer 1.").collect::<Vec<_>>(),
            ["drawer", " ", "1."]
        );
    }
}
