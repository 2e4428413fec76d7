//! The grammar: every value form, separators, comments, and syntax errors with positions.

mod common;

use agentry_dsl::ast::{ItemKind, Value, ValueKind};
use agentry_dsl::parse;
use common::{MULTITASK, at, text};

/// The value of the single `key = value` item in `experiment e { ... }`.
fn value_of(item: &str) -> Value {
    let source = format!("experiment e {{ {item} }}");
    let file = parse(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    match file
        .experiment
        .body
        .items
        .into_iter()
        .next()
        .map(|i| i.kind)
    {
        Some(ItemKind::Assign { value, .. }) => value,
        other => panic!("expected an assignment, got {other:?}"),
    }
}

fn syntax_error(source: &str) -> agentry_dsl::Diagnostic {
    let errors = parse(source).expect_err("expected a syntax error").0;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors.into_iter().next().unwrap()
}

#[test]
fn the_design_example_parses() {
    let file = parse(MULTITASK).unwrap_or_else(|d| panic!("{}", d.render("m.arl", MULTITASK)));
    assert_eq!(file.experiment.name.name, "multitask");
    assert_eq!(file.experiment.body.items.len(), 11);
}

#[test]
fn scalars() {
    assert_eq!(value_of("a = 42").kind, ValueKind::Int(42));
    assert_eq!(value_of("a = -3").kind, ValueKind::Int(-3));
    assert_eq!(value_of("a = 1_000").kind, ValueKind::Int(1000));
    assert_eq!(value_of("a = 3.0").kind, ValueKind::Float(3.0));
    assert_eq!(value_of("a = 1e-4").kind, ValueKind::Float(1e-4));
    assert_eq!(value_of("a = -2.5E3").kind, ValueKind::Float(-2500.0));
    assert_eq!(value_of("a = true").kind, ValueKind::Bool(true));
    assert_eq!(value_of("a = false").kind, ValueKind::Bool(false));
    assert_eq!(
        value_of("a = truely").kind,
        ValueKind::Ident("truely".into())
    );
    assert_eq!(value_of("a = none").kind, ValueKind::Ident("none".into()));
    assert_eq!(
        value_of(r#"a = "x\n\"y\" \u{e9}""#).kind,
        ValueKind::Str("x\n\"y\" é".into())
    );
}

#[test]
fn paths() {
    for path in [
        "crate::envs::Maze",
        "::x::Y",
        "self::a",
        "super::b",
        "::top",
    ] {
        assert_eq!(
            value_of(&format!("a = {path}")).kind,
            ValueKind::Path(path.into())
        );
    }
}

#[test]
fn lists_ranges_arrows() {
    let ValueKind::List(items) = value_of("a = [1, b, [2],\n  3,\n]").kind else {
        panic!()
    };
    assert_eq!(items.len(), 4);
    assert_eq!(value_of("a = []").kind, ValueKind::List(vec![]));
    let ValueKind::Range(lo, hi) = value_of("a = 1..3").kind else {
        panic!()
    };
    assert_eq!((lo.kind, hi.kind), (ValueKind::Int(1), ValueKind::Int(3)));
    let ValueKind::Range(lo, _) = value_of("a = 0.2 .. 0.28").kind else {
        panic!()
    };
    assert_eq!(lo.kind, ValueKind::Float(0.2));
    assert!(matches!(
        value_of("a = 0.5 -> 0").kind,
        ValueKind::Arrow(..)
    ));
}

#[test]
fn calls_and_values_with_blocks() {
    let ValueKind::Call { name, args } = value_of("a = linear(0.5 -> 0.0, over = 200)").kind else {
        panic!()
    };
    assert_eq!(name.name, "linear");
    assert!(args[0].name.is_none() && matches!(args[0].value.kind, ValueKind::Arrow(..)));
    assert_eq!(args[1].name.as_ref().map(|n| n.name.as_str()), Some("over"));
    let ValueKind::Ctor { head, body } = value_of("a = 1 { refresh_every = 25 }").kind else {
        panic!()
    };
    assert_eq!(head.kind, ValueKind::Int(1));
    assert_eq!(body.items.len(), 1);
    let ValueKind::Ctor { head, .. } = value_of("a = adamw {}").kind else {
        panic!()
    };
    assert_eq!(head.kind, ValueKind::Ident("adamw".into()));
}

#[test]
fn separators_and_comments() {
    let source = "/* head */ experiment e { // trailing\n  a = 1, b = 2\n\n  c = 3 /* mid */ , d = 4,\n}\n// end";
    let file = parse(source).unwrap();
    assert_eq!(file.experiment.body.items.len(), 4);
}

#[test]
fn spans_cover_the_source_text() {
    let source = "experiment e {\n  a = [1, 2]\n}";
    let file = parse(source).unwrap();
    let item = &file.experiment.body.items[0];
    assert_eq!(&source[item.span.start..item.span.end], "a = [1, 2]");
    let ItemKind::Assign { key, value } = &item.kind else {
        panic!()
    };
    assert_eq!(&source[key.span.start..key.span.end], "a");
    assert_eq!(&source[value.span.start..value.span.end], "[1, 2]");
}

#[test]
fn two_items_on_one_line_need_a_separator() {
    let source = "experiment e {\n  a = 1 b = 2\n}";
    let d = syntax_error(source);
    assert_eq!(d.message, "expected a newline, `,`, or `}`, found `b`");
    assert_eq!(at(source, &d), "2:9");
}

#[test]
fn missing_value() {
    let source = "experiment e {\n  seed =\n}";
    let d = syntax_error(source);
    assert_eq!(d.message, "expected a value, found end of line");
    assert_eq!(at(source, &d), "2:9");
    assert!(d.hint.is_some());
}

#[test]
fn missing_equals() {
    let source = "experiment e {\n  seed 7\n}";
    let d = syntax_error(source);
    assert_eq!(d.message, "expected a name or `=`, found `7`");
    assert_eq!(at(source, &d), "2:8");
}

#[test]
fn missing_experiment_keyword() {
    let d = syntax_error("experimnt e {}");
    assert_eq!(
        d.message,
        "expected `experiment NAME { ... }`, found `experimnt`"
    );
}

#[test]
fn unclosed_and_mismatched_brackets() {
    let source = "experiment e {\n  model p {\n}";
    let d = syntax_error(source);
    assert_eq!(d.message, "unclosed `{`");
    assert_eq!(at(source, &d), "1:14");
    let source = "experiment e { a = [1, 2) }";
    let d = syntax_error(source);
    assert_eq!(d.message, "mismatched `)`");
    assert_eq!(text(source, &d), ")");
    let d = syntax_error("experiment e { } }");
    assert_eq!(d.message, "unexpected `}`");
}

#[test]
fn unterminated_string_and_comment() {
    let source = "experiment e {\n  a = \"abc\n}";
    let d = syntax_error(source);
    assert_eq!(d.message, "unterminated string");
    assert_eq!(at(source, &d), "2:7");
    let d = syntax_error("experiment e { /* }");
    assert_eq!(d.message, "unterminated block comment");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let source = format!(
        "experiment e {{ a = {}{} }}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let d = syntax_error(&source);
    assert!(
        d.message.starts_with("nesting is too deep"),
        "{}",
        d.message
    );
    let ok = format!(
        "experiment e {{ a = {}{} }}",
        "[".repeat(20),
        "]".repeat(20)
    );
    assert!(parse(&ok).is_ok());
}

#[test]
fn errors_at_end_of_file() {
    let source = "experiment e {} extra";
    let d = syntax_error(source);
    assert_eq!(d.message, "expected end of file, found `extra`");
    let d = syntax_error("");
    assert_eq!(
        d.message,
        "expected `experiment NAME { ... }`, found end of file"
    );
}
