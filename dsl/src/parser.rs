//! Source text to [`ast::File`]: a lexical pre-scan, the pest grammar, and the tree builder.
//!
//! The pre-scan runs first and catches the mistakes a PEG parser reports badly: unterminated
//! strings and block comments, unbalanced brackets (reported at the opening bracket, which is
//! where the fix goes), and nesting deeper than [`MAX_DEPTH`], which bounds the recursion of
//! the parser, the builder and the checker so that no input can overflow the stack.

use pest::Parser as _;
use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::Pair;

use crate::ast::{Arg, Block, ExperimentDecl, File, Ident, Item, ItemKind, Span, Value, ValueKind};
use crate::diagnostics::Diagnostic;

/// The deepest nesting of brackets (`{`, `[`, `(`) a file may use.
pub const MAX_DEPTH: usize = 32;

mod grammar {
    #![allow(missing_docs)]
    #[derive(pest_derive::Parser)]
    #[grammar = "grammar.pest"]
    pub struct ArlParser;
}

use grammar::{ArlParser, Rule};

/// Parses a file, returning the tree (when the syntax is valid) and any errors.
///
/// Errors inside literals (a bad string escape) still yield a tree, so the checker can go on
/// and report the file's other mistakes together with them.
pub(crate) fn parse_file(source: &str) -> (Option<File>, Vec<Diagnostic>) {
    let lexical = prescan(source);
    if !lexical.is_empty() {
        return (None, lexical);
    }
    match ArlParser::parse(Rule::file, source) {
        Ok(mut pairs) => {
            let mut builder = Builder { errors: Vec::new() };
            let file = pairs
                .next()
                .and_then(|file| file.into_inner().find(|p| p.as_rule() == Rule::experiment))
                .map(|experiment| File {
                    experiment: builder.experiment(experiment),
                });
            (file, builder.errors)
        }
        Err(error) => (None, vec![syntax_error(source, &error)]),
    }
}

/// Checks strings, comments and bracket balance without the grammar.
fn prescan(source: &str) -> Vec<Diagnostic> {
    let mut open: Vec<(char, usize)> = Vec::new();
    let mut chars = source.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '/' if chars.peek().map(|&(_, n)| n) == Some('/') => {
                while chars.next_if(|&(_, n)| n != '\n').is_some() {}
            }
            '/' if chars.peek().map(|&(_, n)| n) == Some('*') => {
                let Some(close) = source[i + 2..].find("*/") else {
                    return vec![
                        Diagnostic::new(
                            Span::new(i, i + 2),
                            "unterminated block comment",
                            "this comment is never closed",
                        )
                        .with_hint("close it with `*/`"),
                    ];
                };
                let end = i + 2 + close + 2;
                while chars.next_if(|&(j, _)| j < end).is_some() {}
            }
            '"' => {
                let mut closed = false;
                while let Some((_, n)) = chars.next_if(|&(_, n)| n != '\n') {
                    match n {
                        '\\' => {
                            chars.next_if(|&(_, n)| n != '\n');
                        }
                        '"' => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                }
                if !closed {
                    let end = source[i..].find('\n').map_or(source.len(), |n| i + n);
                    return vec![
                        Diagnostic::new(
                            Span::new(i, end),
                            "unterminated string",
                            "this string is never closed",
                        )
                        .with_hint("close it with `\"` on the same line"),
                    ];
                }
            }
            '{' | '[' | '(' => {
                if open.len() >= MAX_DEPTH {
                    return vec![
                        Diagnostic::new(
                            Span::new(i, i + 1),
                            format!("nesting is too deep (more than {MAX_DEPTH} levels)"),
                            "too deep",
                        )
                        .with_hint("an experiment never needs this much nesting; flatten it"),
                    ];
                }
                open.push((c, i));
            }
            '}' | ']' | ')' => {
                let expected = match c {
                    '}' => '{',
                    ']' => '[',
                    _ => '(',
                };
                match open.pop() {
                    Some((opener, _)) if opener == expected => {}
                    Some((opener, at)) => {
                        let (line, col) = crate::diagnostics::line_col(source, at);
                        return vec![
                            Diagnostic::new(
                                Span::new(i, i + 1),
                                format!("mismatched `{c}`"),
                                format!("expected `{}`", closer(opener)),
                            )
                            .with_hint(format!(
                                "the `{opener}` at line {line}, column {col} is closed by `{}`",
                                closer(opener)
                            )),
                        ];
                    }
                    None => {
                        return vec![Diagnostic::new(
                            Span::new(i, i + 1),
                            format!("unexpected `{c}`"),
                            format!("no `{expected}` to close"),
                        )];
                    }
                }
            }
            _ => {}
        }
    }
    match open.pop() {
        Some((opener, at)) => vec![
            Diagnostic::new(
                Span::new(at, at + 1),
                format!("unclosed `{opener}`"),
                "opened here and never closed",
            )
            .with_hint(format!("add `{}` where this block ends", closer(opener))),
        ],
        None => Vec::new(),
    }
}

fn closer(opener: char) -> char {
    match opener {
        '{' => '}',
        '[' => ']',
        _ => ')',
    }
}

/// Turns pest's error into ours: "expected `=`, found `8`".
fn syntax_error(source: &str, error: &pest::error::Error<Rule>) -> Diagnostic {
    let at = match error.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((start, _)) => start,
    }
    .min(source.len());
    let (found, span) = found_at(source, at);
    let expected = match &error.variant {
        ErrorVariant::ParsingError { positives, .. } => expected_list(positives),
        ErrorVariant::CustomError { message } => message.clone(),
    };
    let hint = (found == "end of line" && expected.contains("a value"))
        .then(|| "every key needs a value on the same line, e.g. `seed = 7`".to_string());
    if expected.is_empty() {
        return Diagnostic::new(span, format!("unexpected {found}"), "unexpected");
    }
    Diagnostic::new(
        span,
        format!("expected {expected}, found {found}"),
        format!("expected {expected}"),
    )
    .with_hint_opt(hint)
}

/// What stands at `at`, for "found ...", and its span.
fn found_at(source: &str, at: usize) -> (String, Span) {
    let rest = &source[at..];
    let Some(first) = rest.chars().next() else {
        return ("end of file".to_string(), Span::new(at, at));
    };
    if first == '\n' || rest.starts_with("\r\n") {
        return ("end of line".to_string(), Span::new(at, at));
    }
    let word_len = if first.is_alphanumeric() || first == '_' || first == '-' {
        rest.char_indices()
            .skip(1)
            .find(|&(_, c)| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .map_or(rest.len(), |(i, _)| i)
    } else {
        first.len_utf8()
    };
    let word = &rest[..word_len];
    (format!("`{word}`"), Span::new(at, at + word_len))
}

/// The human names of what the grammar would have accepted.
fn expected_list(positives: &[Rule]) -> String {
    let mut names: Vec<&str> = Vec::new();
    let continuation = |r: &Rule| matches!(r, Rule::op | Rule::lparen | Rule::lbrace | Rule::block);
    let only_continuations = positives.iter().all(continuation);
    for rule in positives {
        if continuation(rule) && !only_continuations {
            continue;
        }
        let name = match rule {
            Rule::ident => "a name",
            Rule::value
            | Rule::call
            | Rule::ctor
            | Rule::list
            | Rule::string
            | Rule::float
            | Rule::int
            | Rule::boolean
            | Rule::path => "a value",
            Rule::item | Rule::section | Rule::assign | Rule::ablation => "a key or block",
            Rule::key_path => "a key path such as `pool.cross_policy`",
            Rule::experiment | Rule::kw_experiment => "`experiment NAME { ... }`",
            Rule::kw_ablate => "`ablate`",
            Rule::arg | Rule::named_arg => "an argument",
            Rule::block | Rule::lbrace => "`{`",
            Rule::rbrace => "`}`",
            Rule::lbracket => "`[`",
            Rule::rbracket => "`]`",
            Rule::lparen => "`(`",
            Rule::rparen => "`)`",
            Rule::comma => "`,`",
            Rule::eq => "`=`",
            Rule::op => "`..` or `->`",
            Rule::sep => "a newline",
            Rule::EOI => "end of file",
            _ => "more input",
        };
        let extra = (*rule == Rule::sep).then_some("`,`");
        for name in std::iter::once(name).chain(extra) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_string(),
        Some((last, [first])) => format!("{first} or {last}"),
        Some((last, rest)) => format!("{}, or {last}", rest.join(", ")),
    }
}

/// Builds the tree from pest's pairs; collects errors inside literals.
struct Builder {
    errors: Vec<Diagnostic>,
}

fn span_of(pair: &Pair<'_, Rule>) -> Span {
    let span = pair.as_span();
    Span::new(span.start(), span.end())
}

fn ident(pair: Pair<'_, Rule>) -> Ident {
    Ident {
        name: pair.as_str().to_string(),
        span: span_of(&pair),
    }
}

impl Builder {
    fn experiment(&mut self, pair: Pair<'_, Rule>) -> ExperimentDecl {
        let span = span_of(&pair);
        let mut name = Ident {
            name: String::new(),
            span,
        };
        let mut body = Block {
            items: Vec::new(),
            span,
        };
        for inner in pair.into_inner() {
            match inner.as_rule() {
                Rule::ident => name = ident(inner),
                Rule::block => body = self.block(inner),
                _ => {}
            }
        }
        ExperimentDecl { name, body, span }
    }

    fn block(&mut self, pair: Pair<'_, Rule>) -> Block {
        let span = span_of(&pair);
        let items = pair
            .into_inner()
            .filter(|p| p.as_rule() == Rule::item)
            .filter_map(|p| p.into_inner().next())
            .map(|p| self.item(p))
            .collect();
        Block { items, span }
    }

    fn item(&mut self, pair: Pair<'_, Rule>) -> Item {
        let span = span_of(&pair);
        let rule = pair.as_rule();
        let mut idents = Vec::new();
        let mut path = Vec::new();
        let mut value = None;
        let mut body = None;
        for inner in pair.into_inner() {
            match inner.as_rule() {
                Rule::ident => idents.push(ident(inner)),
                Rule::key_path => path = inner.into_inner().map(ident).collect(),
                Rule::value => value = Some(self.value(inner)),
                Rule::block => body = Some(self.block(inner)),
                _ => {}
            }
        }
        let placeholder = || Value {
            kind: ValueKind::Ident(String::new()),
            span,
        };
        let mut idents = idents.into_iter();
        let first = idents.next().unwrap_or(Ident {
            name: String::new(),
            span,
        });
        let kind = match rule {
            Rule::ablation => ItemKind::Ablate {
                path,
                value: value.unwrap_or_else(placeholder),
            },
            Rule::section => ItemKind::Section {
                keyword: first,
                name: idents.next(),
                body: body.unwrap_or(Block {
                    items: Vec::new(),
                    span,
                }),
            },
            _ => ItemKind::Assign {
                key: first,
                value: value.unwrap_or_else(placeholder),
            },
        };
        Item { kind, span }
    }

    fn value(&mut self, pair: Pair<'_, Rule>) -> Value {
        let span = span_of(&pair);
        let mut operands = Vec::new();
        let mut op = "";
        for inner in pair.into_inner() {
            if inner.as_rule() == Rule::op {
                op = inner.as_str();
            } else {
                operands.push(self.operand(inner));
            }
        }
        let mut operands = operands.into_iter();
        let first = operands.next().unwrap_or(Value {
            kind: ValueKind::Ident(String::new()),
            span,
        });
        match operands.next() {
            None => first,
            Some(second) => {
                let (a, b) = (Box::new(first), Box::new(second));
                let kind = if op == ".." {
                    ValueKind::Range(a, b)
                } else {
                    ValueKind::Arrow(a, b)
                };
                Value { kind, span }
            }
        }
    }

    fn operand(&mut self, pair: Pair<'_, Rule>) -> Value {
        let span = span_of(&pair);
        let text = pair.as_str();
        let kind = match pair.as_rule() {
            Rule::int => ValueKind::Int(parse_int(text)),
            Rule::float => ValueKind::Float(text.replace('_', "").parse().unwrap_or(f64::NAN)),
            Rule::boolean => ValueKind::Bool(text == "true"),
            Rule::path => ValueKind::Path(text.to_string()),
            Rule::string => {
                let inner = pair.into_inner().next();
                let (raw, start) = inner
                    .map(|p| (p.as_str(), p.as_span().start()))
                    .unwrap_or(("", span.start));
                ValueKind::Str(self.unescape(raw, start))
            }
            Rule::list => ValueKind::List(
                pair.into_inner()
                    .filter(|p| p.as_rule() == Rule::value)
                    .map(|p| self.value(p))
                    .collect(),
            ),
            Rule::call => {
                let mut name = Ident {
                    name: String::new(),
                    span,
                };
                let mut args = Vec::new();
                for inner in pair.into_inner() {
                    match inner.as_rule() {
                        Rule::ident => name = ident(inner),
                        Rule::arg => args.push(self.arg(inner)),
                        _ => {}
                    }
                }
                ValueKind::Call { name, args }
            }
            Rule::ctor => {
                let mut head = None;
                let mut body = Block {
                    items: Vec::new(),
                    span,
                };
                for inner in pair.into_inner() {
                    match inner.as_rule() {
                        Rule::block => body = self.block(inner),
                        _ => head = Some(self.operand(inner)),
                    }
                }
                let head = head.unwrap_or(Value {
                    kind: ValueKind::Ident(String::new()),
                    span,
                });
                ValueKind::Ctor {
                    head: Box::new(head),
                    body,
                }
            }
            _ => ValueKind::Ident(text.to_string()),
        };
        Value { kind, span }
    }

    fn arg(&mut self, pair: Pair<'_, Rule>) -> Arg {
        let span = span_of(&pair);
        let Some(inner) = pair.into_inner().next() else {
            return Arg {
                name: None,
                value: Value {
                    kind: ValueKind::Ident(String::new()),
                    span,
                },
                span,
            };
        };
        if inner.as_rule() == Rule::named_arg {
            let mut name = None;
            let mut value = None;
            for part in inner.into_inner() {
                match part.as_rule() {
                    Rule::ident => name = Some(ident(part)),
                    Rule::value => value = Some(self.value(part)),
                    _ => {}
                }
            }
            let value = value.unwrap_or(Value {
                kind: ValueKind::Ident(String::new()),
                span,
            });
            Arg { name, value, span }
        } else {
            Arg {
                name: None,
                value: self.value(inner),
                span,
            }
        }
    }

    /// Resolves `\n`, `\t`, `\r`, `\0`, `\\`, `\"`, `\'` and `\u{...}`; reports anything else.
    fn unescape(&mut self, raw: &str, start: usize) -> String {
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.char_indices();
        while let Some((i, c)) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some((j, e)) = chars.next() else {
                break;
            };
            let escape_end = start + j + e.len_utf8();
            match e {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                '\\' | '"' | '\'' => out.push(e),
                'u' => {
                    let rest = &raw[j + 1..];
                    let code = rest
                        .strip_prefix('{')
                        .and_then(|r| r.find('}').map(|close| &r[..close]))
                        .filter(|hex| !hex.is_empty() && hex.len() <= 6);
                    let decoded = code
                        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                        .and_then(char::from_u32);
                    match (code, decoded) {
                        (Some(hex), Some(ch)) => {
                            out.push(ch);
                            let skip = hex.len() + 2;
                            for _ in 0..skip {
                                chars.next();
                            }
                        }
                        _ => self.errors.push(
                            Diagnostic::new(
                                Span::new(start + i, escape_end),
                                "invalid unicode escape",
                                "expected `\\u{XXXX}` with 1 to 6 hex digits of a valid character",
                            )
                            .with_hint("write a character as `\\u{e9}`"),
                        ),
                    }
                }
                other => self.errors.push(
                    Diagnostic::new(
                        Span::new(start + i, escape_end),
                        format!("unknown escape `\\{other}` in string"),
                        "unknown escape",
                    )
                    .with_hint(
                        "the escapes are `\\n`, `\\t`, `\\r`, `\\0`, `\\\\`, `\\\"` and `\\u{...}`",
                    ),
                ),
            }
        }
        out
    }
}

/// An integer literal; values beyond `i128` saturate, which every range check then rejects.
fn parse_int(text: &str) -> i128 {
    let digits = text.replace('_', "");
    digits.parse().unwrap_or(if digits.starts_with('-') {
        i128::MIN
    } else {
        i128::MAX
    })
}
