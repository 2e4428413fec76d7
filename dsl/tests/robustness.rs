//! No input makes the parser or checker panic, and every span it reports is valid.

mod common;

use agentry_dsl::Diagnostics;
use proptest::prelude::*;

/// Every span lies within the source and on character boundaries, and renders.
fn assert_spans_valid(source: &str, result: Result<(), Diagnostics>) {
    if let Err(diagnostics) = result {
        assert!(!diagnostics.is_empty());
        for d in diagnostics.iter() {
            assert!(d.span.start <= d.span.end, "{d:?}");
            assert!(d.span.end <= source.len(), "{d:?} beyond {}", source.len());
            assert!(source.is_char_boundary(d.span.start), "{d:?}");
            assert!(source.is_char_boundary(d.span.end), "{d:?}");
            assert!(!d.message.is_empty());
        }
        let _ = diagnostics.render("p.arl", source);
    }
}

fn check_all(source: &str) {
    assert_spans_valid(source, agentry_dsl::parse(source).map(|_| ()));
    assert_spans_valid(source, agentry_dsl::check(source).map(|_| ()));
    let _ = agentry_dsl::expand_source(source, "p.arl");
}

/// Tokens of the language, for shuffles and insertions that stay close to valid input.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    "\n",
    "=",
    "..",
    "->",
    "::",
    "experiment",
    "ablate",
    "task",
    "stage",
    "none",
    "1",
    "-1",
    "0.5",
    "1e-4",
    "\"s\"",
    "true",
    "x",
    "/*",
    "*/",
    "//",
    "é",
    "\t",
    "99999999999999999999999999999999999999999999",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_strings_never_panic(source in any::<String>()) {
        check_all(&source);
    }

    #[test]
    fn token_soup_never_panics(tokens in prop::collection::vec(prop::sample::select(TOKENS), 0..60)) {
        check_all(&tokens.join(" "));
    }

    #[test]
    fn byte_mutations_of_a_valid_file_never_panic(
        edits in prop::collection::vec((0usize..2000, 0u8..3, any::<char>()), 1..6)
    ) {
        let mut source = common::MULTITASK.to_string();
        for (position, kind, c) in edits {
            let mut at = position % (source.len() + 1);
            while !source.is_char_boundary(at) {
                at -= 1;
            }
            match kind {
                0 => source.insert(at, c),
                1 if at < source.len() => {
                    source.remove(at);
                }
                _ if at < source.len() => {
                    source.remove(at);
                    source.insert(at, c);
                }
                _ => {}
            }
        }
        check_all(&source);
    }

    #[test]
    fn token_shuffles_of_a_valid_file_never_panic(
        swaps in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..5),
        insert in prop::sample::select(TOKENS),
        at in any::<prop::sample::Index>(),
    ) {
        let mut tokens: Vec<&str> = common::MULTITASK.split(' ').collect();
        for (a, b) in swaps {
            let (a, b) = (a.index(tokens.len()), b.index(tokens.len()));
            tokens.swap(a, b);
        }
        let at = at.index(tokens.len());
        tokens.insert(at, insert);
        check_all(&tokens.join(" "));
    }

    #[test]
    fn minimal_variants_check_or_report(value in prop::sample::select(TOKENS)) {
        for key in ["seed", "device", "matmul_precision"] {
            let source = common::MINIMAL.replace("experiment tiny {", &format!("experiment tiny {{\n {key} = {value}"));
            check_all(&source);
        }
    }
}

#[test]
fn valid_files_stay_valid_through_the_checker() {
    assert!(agentry_dsl::check(common::MULTITASK).is_ok());
    assert!(agentry_dsl::check(common::MINIMAL).is_ok());
}
