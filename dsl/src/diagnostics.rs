//! Errors about an `.arl` file, and their rendering as `file:line:col` with a source excerpt.
//!
//! A [`Diagnostic`] holds a byte span rather than a line and column, so the checker never has
//! to think about positions; [`Diagnostics::render`] turns spans into the rustc-like report a
//! researcher reads in their terminal or in a compile error:
//!
//! ```text
//! error: unknown key `group_sise` in `algorithm`
//!   --> experiments/bad.arl:14:9
//!    |
//! 14 |         group_sise = 8
//!    |         ^^^^^^^^^^ unknown key
//!    |
//!    = hint: did you mean `group_size`?
//! ```
//!
//! Rendering never panics: spans past the end or inside a UTF-8 character are clamped.

use std::fmt;

use crate::ast::Span;

/// One error, located in the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where the error is.
    pub span: Span,
    /// The headline: what is wrong.
    pub message: String,
    /// A few words printed under the carets.
    pub label: String,
    /// How to fix it, when we can tell.
    pub hint: Option<String>,
}

impl Diagnostic {
    /// An error at `span` with a headline and a caret label.
    pub fn new(span: Span, message: impl Into<String>, label: impl Into<String>) -> Diagnostic {
        Diagnostic {
            span,
            message: message.into(),
            label: label.into(),
            hint: None,
        }
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    /// Adds a hint when there is one.
    pub fn with_hint_opt(mut self, hint: Option<String>) -> Diagnostic {
        self.hint = hint;
        self
    }

    /// The 1-based line and column (in characters) of the span's start.
    pub fn line_col(&self, source: &str) -> (usize, usize) {
        line_col(source, self.span.start)
    }

    /// This error alone, in the format of [`Diagnostics::render`].
    pub fn render(&self, path: &str, source: &str) -> String {
        let start = clamp(source, self.span.start);
        let end = clamp(source, self.span.end.max(start));
        let (line, col) = line_col(source, start);
        let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = source[start..]
            .find('\n')
            .map_or(source.len(), |i| start + i);
        let text = source[line_start..line_end].trim_end_matches('\r');
        // Underline up to the end of the span or of its first line, at least one caret.
        let underline_end = end.min(line_start + text.len()).max(start);
        let before = display_width(&source[line_start..start.min(line_start + text.len())]);
        let carets = display_width(&source[start..underline_end]).max(1);

        let number = line.to_string();
        let pad = " ".repeat(number.len());
        let mut out = format!("error: {}\n", self.message);
        out += &format!("{pad}--> {path}:{line}:{col}\n");
        out += &format!("{pad} |\n");
        if text.is_empty() {
            out += &format!("{number} |\n");
        } else {
            out += &format!("{number} | {}\n", text.replace('\t', "    "));
        }
        let mut marker = format!("{pad} | {}{}", " ".repeat(before), "^".repeat(carets));
        if !self.label.is_empty() {
            marker.push(' ');
            marker += &self.label;
        }
        out += &marker;
        out.push('\n');
        if let Some(hint) = &self.hint {
            out += &format!("{pad} |\n{pad} = hint: {hint}\n");
        }
        out
    }
}

/// Every error found in one file; the `Err` of [`crate::parse`] and [`crate::check()`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// All errors in source order, a blank line between them, then a summary line.
    pub fn render(&self, path: &str, source: &str) -> String {
        let mut sorted: Vec<&Diagnostic> = self.0.iter().collect();
        sorted.sort_by_key(|d| d.span.start);
        let mut out = sorted
            .iter()
            .map(|d| d.render(path, source))
            .collect::<Vec<_>>()
            .join("\n");
        let n = self.0.len();
        if n > 0 {
            let plural = if n == 1 { "error" } else { "errors" };
            out += &format!("\nerror: could not check `{path}` ({n} {plural})\n");
        }
        out
    }

    /// The number of errors.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The errors.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }
}

impl From<Vec<Diagnostic>> for Diagnostics {
    fn from(diagnostics: Vec<Diagnostic>) -> Diagnostics {
        Diagnostics(diagnostics)
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for Diagnostics {
    /// Without the source at hand, only the messages and hints (one per line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(
                f,
                "error: {} (bytes {}..{})",
                d.message, d.span.start, d.span.end
            )?;
            if let Some(hint) = &d.hint {
                write!(f, "\n  hint: {hint}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// The 1-based line and 1-based column (counted in characters) of byte `offset`.
///
/// Offsets past the end or inside a character are clamped, so this never panics.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = clamp(source, offset);
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// The byte offset of 1-based `line` and `col` (in characters), if it exists; the inverse of
/// [`line_col`], handy in tests and editors.
pub fn offset_of(source: &str, line: usize, col: usize) -> Option<usize> {
    let mut start = 0;
    for _ in 1..line {
        start += source[start..].find('\n')? + 1;
    }
    let text = &source[start..];
    let text = &text[..text.find('\n').unwrap_or(text.len())];
    if col == text.chars().count() + 1 {
        return Some(start + text.len());
    }
    text.char_indices()
        .nth(col.checked_sub(1)?)
        .map(|(i, _)| start + i)
}

/// The largest character boundary at or before `offset`, within the source.
fn clamp(source: &str, offset: usize) -> usize {
    let mut offset = offset.min(source.len());
    while !source.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// Columns taken on screen, with tabs as four spaces (as the excerpt prints them).
fn display_width(text: &str) -> usize {
    text.chars().map(|c| if c == '\t' { 4 } else { 1 }).sum()
}

/// The candidate closest to `word`, if it is close enough to be the intended spelling.
///
/// Closeness is the optimal-string-alignment distance (Levenshtein plus swaps of adjacent
/// letters), and a candidate must be within a third of the word's length (at least 1).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// A "did you mean `x`?" hint for `word`, or `None` when nothing is close.
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    did_you_mean(word, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// Optimal-string-alignment distance between two strings, by characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// A list of names for messages: "`a`, `b` or `c`".
pub fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_shape() {
        let source = "\n".repeat(13) + "        group_sise = 8\n";
        let start = source.find("group_sise").unwrap();
        let d = Diagnostic::new(
            Span::new(start, start + 10),
            "unknown key `group_sise` in `algorithm`",
            "unknown key",
        )
        .with_hint("did you mean `group_size`?");
        let expected = "\
error: unknown key `group_sise` in `algorithm`
  --> experiments/bad.arl:14:9
   |
14 |         group_sise = 8
   |         ^^^^^^^^^^ unknown key
   |
   = hint: did you mean `group_size`?
";
        assert_eq!(d.render("experiments/bad.arl", &source), expected);
    }

    #[test]
    fn end_of_file_tabs_and_unicode_render() {
        let source = "\té = \"ü\"";
        let d = Diagnostic::new(Span::new(source.len(), source.len() + 5), "m", "here");
        let out = d.render("f.arl", source);
        assert!(out.contains("f.arl:1:9"), "{out}");
        let inside = Diagnostic::new(Span::new(2, 3), "m", "");
        assert!(inside.render("f.arl", source).contains("f.arl:1:2"));
        assert_eq!(line_col("", 10), (1, 1));
    }

    #[test]
    fn line_col_and_offset_of_are_inverse() {
        let source = "ab\nçd\n\nx";
        for offset in [0, 1, 3, 5, 6, 7, 8] {
            let (line, col) = line_col(source, offset);
            assert_eq!(offset_of(source, line, col), Some(offset));
        }
    }

    #[test]
    fn suggestions_are_close_words_only() {
        let keys = ["group_size", "gamma", "epochs"];
        assert_eq!(did_you_mean("group_sise", keys), Some("group_size"));
        assert_eq!(did_you_mean("epohcs", keys), Some("epochs"));
        assert_eq!(did_you_mean("temperature", keys), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(one_of(&["a", "b", "c"]), "`a`, `b` or `c`");
    }
}
