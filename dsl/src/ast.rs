//! The syntax tree of an `.arl` file, as written, with the byte span of every node.
//!
//! The tree is deliberately untyped: a key's value is whatever the file says (`group_size =
//! "8"` parses fine). Giving values meaning, and reporting what is wrong with them, is the
//! checker's job, which keeps the grammar small and lets the checker report every mistake of a
//! file at once instead of stopping at the first.

/// A byte range `start..end` of the source. Both ends lie on UTF-8 character boundaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// Offset of the first byte.
    pub start: usize,
    /// Offset one past the last byte; equal to `start` for a position.
    pub end: usize,
}

impl Span {
    /// A span from `start` to `end`.
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// A whole file: exactly one experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct File {
    /// The experiment the file declares.
    pub experiment: ExperimentDecl,
}

/// `experiment NAME { ... }`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentDecl {
    /// The experiment's name.
    pub name: Ident,
    /// Its top-level items.
    pub body: Block,
    /// From `experiment` to the closing brace.
    pub span: Span,
}

/// An identifier with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    /// The text.
    pub name: String,
    /// Where it is written.
    pub span: Span,
}

/// `{ item, item ... }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// The items, in file order.
    pub items: Vec<Item>,
    /// From `{` to `}`.
    pub span: Span,
}

/// One entry of a block.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// What the entry is.
    pub kind: ItemKind,
    /// The whole entry.
    pub span: Span,
}

/// The three forms an item takes.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemKind {
    /// `key = value`.
    Assign {
        /// The key.
        key: Ident,
        /// The value.
        value: Value,
    },
    /// `keyword [name] { ... }`, e.g. `task kg { ... }` or `pool { ... }`.
    Section {
        /// The block's kind (`task`, `pool`, ...).
        keyword: Ident,
        /// The name after the keyword, if any (`kg`).
        name: Option<Ident>,
        /// The contents.
        body: Block,
    },
    /// `ablate a.b.c = value` (only meaningful in `sweep`).
    Ablate {
        /// The key path, one identifier per segment.
        path: Vec<Ident>,
        /// The replacement value.
        value: Value,
    },
}

/// A value with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// What the value is.
    pub kind: ValueKind,
    /// Where it is written.
    pub span: Span,
}

/// Every value form of the language.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    /// `42`, `-3`, `1_000`; literals beyond `i128` are reported by the parser.
    Int(i128),
    /// `0.2`, `1e-4`, `-3.0`.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// `"text"`, with escapes resolved.
    Str(String),
    /// A bare identifier: `auto`, `none`, `kg`.
    Ident(String),
    /// A Rust path: `crate::envs::Maze`, `::x::Y`.
    Path(String),
    /// `[a, b, c]`.
    List(Vec<Value>),
    /// `lo .. hi`.
    Range(Box<Value>, Box<Value>),
    /// `a -> b` (schedules).
    Arrow(Box<Value>, Box<Value>),
    /// `f(arg, name = arg)`.
    Call {
        /// The function name.
        name: Ident,
        /// Positional and named arguments in order.
        args: Vec<Arg>,
    },
    /// A value followed by a block: `transformer { layers = 2 }`, `1 { refresh_every = 25 }`.
    Ctor {
        /// The value before the block.
        head: Box<Value>,
        /// The block.
        body: Block,
    },
}

/// One argument of a call.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// `Some` for `name = value`.
    pub name: Option<Ident>,
    /// The argument's value.
    pub value: Value,
    /// The whole argument.
    pub span: Span,
}

impl Value {
    /// A short description for error messages: "an integer", "a string `\"x\"`", ...
    pub fn describe(&self) -> String {
        match &self.kind {
            ValueKind::Int(i) => format!("the integer `{i}`"),
            ValueKind::Float(f) => format!("the number `{f:?}`"),
            ValueKind::Bool(b) => format!("the boolean `{b}`"),
            ValueKind::Str(_) => "a string".to_string(),
            ValueKind::Ident(name) => format!("the name `{name}`"),
            ValueKind::Path(path) => format!("the path `{path}`"),
            ValueKind::List(_) => "a list".to_string(),
            ValueKind::Range(..) => "a range".to_string(),
            ValueKind::Arrow(..) => "an arrow `a -> b`".to_string(),
            ValueKind::Call { name, .. } => format!("the call `{}(...)`", name.name),
            ValueKind::Ctor { .. } => "a value with a block".to_string(),
        }
    }
}

impl std::fmt::Display for Value {
    /// The value in canonical `.arl` syntax (how an ablation's value is recorded).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ValueKind::Int(i) => write!(f, "{i}"),
            ValueKind::Float(x) => write!(f, "{x:?}"),
            ValueKind::Bool(b) => write!(f, "{b}"),
            ValueKind::Str(s) => write!(f, "{s:?}"),
            ValueKind::Ident(s) | ValueKind::Path(s) => f.write_str(s),
            ValueKind::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            ValueKind::Range(a, b) => write!(f, "{a} .. {b}"),
            ValueKind::Arrow(a, b) => write!(f, "{a} -> {b}"),
            ValueKind::Call { name, args } => {
                write!(f, "{}(", name.name)?;
                for (i, arg) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if let Some(name) = &arg.name {
                        write!(f, "{} = ", name.name)?;
                    }
                    write!(f, "{}", arg.value)?;
                }
                f.write_str(")")
            }
            ValueKind::Ctor { head, body } => {
                write!(f, "{head} {{")?;
                for (i, item) in body.items.iter().enumerate() {
                    f.write_str(if i > 0 { ", " } else { " " })?;
                    write!(f, "{item}")?;
                }
                f.write_str(if body.items.is_empty() { "}" } else { " }" })
            }
        }
    }
}

impl std::fmt::Display for Item {
    /// The item in canonical `.arl` syntax, on one line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            ItemKind::Assign { key, value } => write!(f, "{} = {value}", key.name),
            ItemKind::Ablate { path, value } => {
                let path: Vec<&str> = path.iter().map(|p| p.name.as_str()).collect();
                write!(f, "ablate {} = {value}", path.join("."))
            }
            ItemKind::Section {
                keyword,
                name,
                body,
            } => {
                write!(f, "{}", keyword.name)?;
                if let Some(name) = name {
                    write!(f, " {}", name.name)?;
                }
                f.write_str(" {")?;
                for (i, item) in body.items.iter().enumerate() {
                    f.write_str(if i > 0 { ", " } else { " " })?;
                    write!(f, "{item}")?;
                }
                f.write_str(if body.items.is_empty() { "}" } else { " }" })
            }
        }
    }
}
