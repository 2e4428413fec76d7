//! Reading a block as a table of keys, and reading values as typed data.
//!
//! Every reader reports its own error and returns `None`, so callers simply carry on: the
//! checker collects all errors of a file instead of stopping at the first.

use std::borrow::Cow;

use crate::ast::{Arg, Block, Ident, ItemKind, Span, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::Split;

use super::Checker;

/// The keys of one block, after unknown and duplicate keys were reported.
pub(super) struct Table<'a> {
    entries: Vec<(&'a Ident, &'a Value)>,
}

impl<'a> Table<'a> {
    /// The value of `key`, if the block sets it.
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.entries
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(_, v)| *v)
    }
}

/// An interval of allowed numbers; its `Display` is the mathematical notation.
#[derive(Clone, Copy)]
pub(super) struct Interval {
    lo: f64,
    lo_open: bool,
    hi: f64,
    hi_open: bool,
}

impl Interval {
    /// `[lo, hi]` with the given openness at each end.
    pub(super) const fn new(lo: f64, lo_open: bool, hi: f64, hi_open: bool) -> Interval {
        Interval {
            lo,
            lo_open,
            hi,
            hi_open,
        }
    }

    /// `> lo`.
    pub(super) const fn above(lo: f64) -> Interval {
        Interval::new(lo, true, f64::INFINITY, true)
    }

    /// `>= lo`.
    pub(super) const fn at_least(lo: f64) -> Interval {
        Interval::new(lo, false, f64::INFINITY, true)
    }

    pub(super) fn contains(self, x: f64) -> bool {
        let above = if self.lo_open {
            x > self.lo
        } else {
            x >= self.lo
        };
        let below = if self.hi_open {
            x < self.hi
        } else {
            x <= self.hi
        };
        above && below
    }

    fn describe(self) -> String {
        if self.hi.is_infinite() {
            let word = if self.lo_open {
                "greater than"
            } else {
                "at least"
            };
            format!("{word} {}", self.lo)
        } else {
            format!(
                "in {}{}, {}{}",
                if self.lo_open { "(" } else { "[" },
                self.lo,
                self.hi,
                if self.hi_open { ")" } else { "]" }
            )
        }
    }
}

/// Positional and named arguments of a call, after arity and names were checked.
pub(super) struct Args<'a> {
    pub(super) positional: Vec<&'a Value>,
    named: Vec<(&'a Ident, &'a Value)>,
}

impl<'a> Args<'a> {
    /// The value of a named argument.
    pub(super) fn named(&self, name: &str) -> Option<&'a Value> {
        self.named
            .iter()
            .find(|(n, _)| n.name == name)
            .map(|(_, v)| *v)
    }
}

/// Keys the language had and replaced, `(block, key, hint)`: a file that still sets one is told
/// what replaced it rather than only that the key is unknown.
const RETIRED: &[(&str, &str, &str)] = &[(
    "eval",
    "greedy",
    "`greedy` was replaced by `decoding = greedy | sampled | both`",
)];

impl Checker {
    /// Reads `block` as `key = value` items, reporting unknown keys (with a suggestion),
    /// duplicates, nested blocks and stray `ablate` items.
    pub(super) fn table<'a>(&mut self, block: &'a Block, ctx: &str, keys: &[&str]) -> Table<'a> {
        let mut entries: Vec<(&'a Ident, &'a Value)> = Vec::new();
        for item in &block.items {
            match &item.kind {
                ItemKind::Assign { key, value } => {
                    if !keys.contains(&key.name.as_str()) {
                        self.unknown_key(key, ctx, keys);
                    } else if entries.iter().any(|(k, _)| k.name == key.name) {
                        self.duplicate_key(key, ctx);
                    } else {
                        entries.push((key, value));
                    }
                }
                ItemKind::Section { keyword, .. } => self.unexpected_block(keyword, ctx, keys),
                ItemKind::Ablate { .. } => self.stray_ablate(item.span),
            }
        }
        Table { entries }
    }

    pub(super) fn unknown_key(&mut self, key: &Ident, ctx: &str, keys: &[&str]) {
        if let Some((_, _, hint)) = RETIRED
            .iter()
            .find(|(block, name, _)| *block == ctx && *name == key.name)
        {
            self.error(
                Diagnostic::new(
                    key.span,
                    format!("`{}` is no longer a key of `{ctx}`", key.name),
                    "retired key",
                )
                .with_hint(*hint),
            );
            return;
        }
        let hint = suggest(&key.name, keys.iter().copied()).or_else(|| {
            (!keys.is_empty()).then(|| format!("the keys of `{ctx}` are {}", one_of(keys)))
        });
        self.error(
            Diagnostic::new(
                key.span,
                format!("unknown key `{}` in `{ctx}`", key.name),
                "unknown key",
            )
            .with_hint_opt(hint),
        );
    }

    pub(super) fn duplicate_key(&mut self, key: &Ident, ctx: &str) {
        self.error(
            Diagnostic::new(
                key.span,
                format!("`{}` is set twice in `{ctx}`", key.name),
                "set again here",
            )
            .with_hint(format!("remove one of the two `{}`", key.name)),
        );
    }

    pub(super) fn unexpected_block(&mut self, keyword: &Ident, ctx: &str, keys: &[&str]) {
        let hint = if keys.contains(&keyword.name.as_str()) {
            Some(format!(
                "`{}` is a key: write `{} = ...`",
                keyword.name, keyword.name
            ))
        } else {
            suggest(&keyword.name, keys.iter().copied())
        };
        self.error(
            Diagnostic::new(
                keyword.span,
                format!("unexpected block `{}` in `{ctx}`", keyword.name),
                "not allowed here",
            )
            .with_hint_opt(hint),
        );
    }

    pub(super) fn stray_ablate(&mut self, span: Span) {
        self.error(
            Diagnostic::new(
                span,
                "`ablate` is only allowed in `sweep`",
                "outside `sweep`",
            )
            .with_hint("move it into `sweep { ... }`"),
        );
    }

    /// Reports that `value` has the wrong type.
    pub(super) fn wrong_type(&mut self, key: &str, value: &Value, expected: &str) {
        let hint = match &value.kind {
            ValueKind::Str(s) if s.parse::<f64>().is_ok() => {
                Some(format!("remove the quotes: `{key} = {s}`"))
            }
            ValueKind::Float(f) if expected == "an integer" && f.fract() == 0.0 => {
                Some(format!("write `{key} = {f:.0}` without a decimal point"))
            }
            ValueKind::Range(..) if expected.contains("number") => {
                Some(format!("`{key}` takes a single value"))
            }
            _ => None,
        };
        self.error(
            Diagnostic::new(
                value.span,
                format!(
                    "expected {expected} for `{key}`, found {}",
                    value.describe()
                ),
                format!("expected {expected}"),
            )
            .with_hint_opt(hint),
        );
    }

    /// Reports an out-of-range value.
    pub(super) fn out_of_range(
        &mut self,
        key: &str,
        span: Span,
        requirement: String,
        hint: Option<String>,
    ) {
        self.error(
            Diagnostic::new(
                span,
                format!("`{key}` must be {requirement}"),
                "out of range",
            )
            .with_hint_opt(hint),
        );
    }

    /// An integer in `[min, max]`.
    pub(super) fn int_in(
        &mut self,
        key: &str,
        value: &Value,
        min: i128,
        max: i128,
    ) -> Option<i128> {
        let ValueKind::Int(i) = value.kind else {
            self.wrong_type(key, value, "an integer");
            return None;
        };
        if i < min {
            self.out_of_range(key, value.span, format!("at least {min}"), None);
            None
        } else if i > max {
            self.out_of_range(key, value.span, format!("at most {max}"), None);
            None
        } else {
            Some(i)
        }
    }

    /// A `u64` of at least `min`.
    pub(super) fn uint(&mut self, key: &str, value: &Value, min: u64) -> Option<u64> {
        self.int_in(key, value, i128::from(min), i128::from(u64::MAX))
            .and_then(|i| u64::try_from(i).ok())
    }

    /// A `u32` of at least `min`.
    pub(super) fn uint32(&mut self, key: &str, value: &Value, min: u32) -> Option<u32> {
        self.int_in(key, value, i128::from(min), i128::from(u32::MAX))
            .and_then(|i| u32::try_from(i).ok())
    }

    /// A `usize` of at least `min` (at most `u32::MAX`, so it fits everywhere).
    pub(super) fn size(&mut self, key: &str, value: &Value, min: usize) -> Option<usize> {
        let min = u32::try_from(min).unwrap_or(u32::MAX);
        self.uint32(key, value, min)
            .and_then(|i| usize::try_from(i).ok())
    }

    /// A finite number (integers allowed).
    pub(super) fn number(&mut self, key: &str, value: &Value) -> Option<f64> {
        let x = match value.kind {
            ValueKind::Int(i) => i as f64,
            ValueKind::Float(f) => f,
            _ => {
                self.wrong_type(key, value, "a number");
                return None;
            }
        };
        if x.is_finite() {
            Some(x)
        } else {
            self.error(Diagnostic::new(
                value.span,
                format!("the number for `{key}` is too large"),
                "not a finite number",
            ));
            None
        }
    }

    /// A number within `interval`.
    pub(super) fn number_in(
        &mut self,
        key: &str,
        value: &Value,
        interval: Interval,
    ) -> Option<f64> {
        let x = self.number(key, value)?;
        if interval.contains(x) {
            Some(x)
        } else {
            self.out_of_range(
                key,
                value.span,
                interval.describe(),
                Some(format!("got {x}")),
            );
            None
        }
    }

    /// `true` or `false`.
    pub(super) fn boolean(&mut self, key: &str, value: &Value) -> Option<bool> {
        match value.kind {
            ValueKind::Bool(b) => Some(b),
            _ => {
                self.wrong_type(key, value, "`true` or `false`");
                None
            }
        }
    }

    /// `train` or `test`.
    pub(super) fn split(&mut self, value: &Value) -> Option<Split> {
        self.choice(
            "split",
            value,
            &[("train", Split::Train), ("test", Split::Test)],
        )
    }

    /// A bare name among `choices`.
    pub(super) fn choice<T: Copy>(
        &mut self,
        key: &str,
        value: &Value,
        choices: &[(&str, T)],
    ) -> Option<T> {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let ValueKind::Ident(name) = &value.kind else {
            self.wrong_type(key, value, &format!("one of {}", one_of(&names)));
            return None;
        };
        if let Some((_, v)) = choices.iter().find(|(n, _)| n == name) {
            return Some(*v);
        }
        let hint = suggest(name, names.iter().copied())
            .unwrap_or_else(|| format!("`{key}` is one of {}", one_of(&names)));
        self.error(
            Diagnostic::new(
                value.span,
                format!("unknown value `{name}` for `{key}`"),
                "not one of the choices",
            )
            .with_hint(hint),
        );
        None
    }

    /// A constructor value, `name` or `name { ... }`: its head and its settings (empty for a
    /// bare name). Anything else is reported as a wrong type for `key` (`expected` says what
    /// would do).
    pub(super) fn constructor<'a>(
        &mut self,
        key: &str,
        value: &'a Value,
        expected: &str,
    ) -> Option<(&'a Value, Cow<'a, Block>)> {
        match &value.kind {
            ValueKind::Ident(_) => Some((
                value,
                Cow::Owned(Block {
                    items: Vec::new(),
                    span: value.span,
                }),
            )),
            ValueKind::Ctor { head, body } => Some((head.as_ref(), Cow::Borrowed(body))),
            _ => {
                self.wrong_type(key, value, expected);
                None
            }
        }
    }

    /// Whether `value` is the bare name `none`.
    pub(super) fn is_none(value: &Value) -> bool {
        matches!(&value.kind, ValueKind::Ident(n) if n == "none")
    }

    /// Checks a call's arguments: at most `positional` positional ones, named ones among
    /// `named`, none twice.
    pub(super) fn args<'a>(
        &mut self,
        call: &Ident,
        args: &'a [Arg],
        positional: usize,
        named: &[&str],
    ) -> Option<Args<'a>> {
        let mut out = Args {
            positional: Vec::new(),
            named: Vec::new(),
        };
        let mut ok = true;
        for arg in args {
            match &arg.name {
                None if out.named.is_empty() && out.positional.len() < positional => {
                    out.positional.push(&arg.value);
                }
                None if !out.named.is_empty() => {
                    ok = false;
                    self.error(
                        Diagnostic::new(
                            arg.span,
                            format!(
                                "positional argument after a named one in `{}(...)`",
                                call.name
                            ),
                            "positional argument",
                        )
                        .with_hint("put positional arguments first"),
                    );
                }
                None => {
                    ok = false;
                    self.error(Diagnostic::new(
                        arg.span,
                        format!(
                            "too many arguments to `{}`: it takes {positional} positional argument{}",
                            call.name,
                            if positional == 1 { "" } else { "s" }
                        ),
                        "unexpected argument",
                    ));
                }
                Some(name) if !named.contains(&name.name.as_str()) => {
                    ok = false;
                    let hint = suggest(&name.name, named.iter().copied()).or_else(|| {
                        Some(if named.is_empty() {
                            format!("`{}` takes no named arguments", call.name)
                        } else {
                            format!("`{}` takes {}", call.name, one_of(named))
                        })
                    });
                    self.error(
                        Diagnostic::new(
                            name.span,
                            format!("unknown argument `{}` to `{}`", name.name, call.name),
                            "unknown argument",
                        )
                        .with_hint_opt(hint),
                    );
                }
                Some(name) if out.named.iter().any(|(n, _)| n.name == name.name) => {
                    ok = false;
                    self.error(Diagnostic::new(
                        name.span,
                        format!("argument `{}` is given twice", name.name),
                        "given again here",
                    ));
                }
                Some(name) => out.named.push((name, &arg.value)),
            }
        }
        ok.then_some(out)
    }
}
