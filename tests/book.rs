//! The book's examples: every ```arl block in `book/src/**/*.md` is checked.
//!
//! A block that starts with `experiment` (after blank lines and `//` comments) must pass the
//! checker, so the book never shows an experiment that would not build. A block fenced as
//! ```arl,error must fail it, so an error example stays an error when the checker changes.
//! Other ```arl blocks (fragments of a file) are not checked. A failure is reported at the
//! page's own line numbers.

use std::path::{Path, PathBuf};

/// One fenced ```arl block of a page.
struct Block {
    /// The page, relative to the repository root.
    page: String,
    /// Whether the fence says `arl,error`.
    error: bool,
    /// The text between the fences, preceded by one blank line per line of the page above it,
    /// so that line numbers in diagnostics are the page's.
    source: String,
}

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read `{}`: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            pages(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            out.push(path);
        }
    }
}

/// The ```arl blocks of one page, in order.
fn blocks(page: &Path, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    // The opening fence's line (1-based), whether it says `error`, and the source so far.
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        match &mut open {
            None => {
                let Some(info) = trimmed.strip_prefix("```") else {
                    continue;
                };
                let attributes: Vec<&str> = info.split(',').map(str::trim).collect();
                if attributes.first() == Some(&"arl") {
                    open = Some((i + 1, attributes.contains(&"error"), "\n".repeat(i + 1)));
                }
            }
            Some((_, error, source)) => {
                if trimmed == "```" {
                    out.push(Block {
                        page: page.display().to_string(),
                        error: *error,
                        source: std::mem::take(source),
                    });
                    open = None;
                } else {
                    source.push_str(line);
                    source.push('\n');
                }
            }
        }
    }
    if let Some((line, ..)) = open {
        panic!("{}:{line}: an ```arl block is never closed", page.display());
    }
    out
}

/// Whether a block is a whole experiment: its first line that is neither blank nor a `//`
/// comment starts with `experiment`.
fn is_experiment(source: &str) -> bool {
    source
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with("//"))
        .is_some_and(|line| line.starts_with("experiment"))
}

#[test]
fn every_experiment_in_the_book_checks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("book/src");
    let mut files = Vec::new();
    pages(&root, &mut files);
    assert!(!files.is_empty(), "no pages under `{}`", root.display());

    let mut checked = 0;
    let mut failures = Vec::new();
    for page in &files {
        let text = std::fs::read_to_string(page).expect("a readable page");
        let relative = page
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(page);
        for block in blocks(relative, &text) {
            let result = agentry::dsl::check(&block.source);
            if block.error {
                checked += 1;
                if result.is_ok() {
                    let line = block.source.len() - block.source.trim_start_matches('\n').len();
                    failures.push(format!(
                        "{}:{line}: fenced as `arl,error`, but it checks without errors\n",
                        block.page
                    ));
                }
            } else if is_experiment(&block.source) {
                checked += 1;
                if let Err(d) = result {
                    failures.push(d.render(&block.page, &block.source));
                }
            }
        }
    }
    assert!(checked > 0, "no ```arl experiment found in the book");
    assert!(
        failures.is_empty(),
        "{} of {checked} book examples are wrong:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}
