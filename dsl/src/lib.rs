//! The Agentry experiment language: grammar, syntax tree, checker, diagnostics and code
//! generation.
//!
//! A researcher describes an experiment in a small `.arl` file: the tasks an agent trains on,
//! the curriculum over training steps, the RL algorithm and its loss, the rollout engine pool,
//! training and evaluation settings, and a sweep of seeds and ablations. This crate turns that
//! file into a checked [`spec::Experiment`] and into Rust code, in four steps that each have
//! their own module:
//!
//! 1. **Parse** ([`parse`], `grammar.pest`, [`ast`]): one `experiment NAME { ... }` per file.
//!    Blocks hold `key = value` items, nested `keyword [name] { ... }` blocks and (in `sweep`)
//!    `ablate key.path = value`, separated by newlines or commas. Values are integers, floats,
//!    booleans, strings, names, Rust paths, lists, ranges `lo .. hi`, arrows `a -> b`, calls
//!    `f(x, name = y)` and values with a block (`transformer { layers = 2 }`). The tree is
//!    untyped and every node carries its byte [`ast::Span`].
//! 2. **Check** ([`check()`], module [`mod@check`]): the tree becomes a [`spec::Experiment`] with
//!    every default of [`spec`] filled in, every range and cross-field rule enforced, and
//!    every ablation re-checked as a whole experiment. All errors of a file are reported
//!    together.
//! 3. **Report** ([`diagnostics`]): each error has a span, a message, a label and often a hint
//!    ("did you mean `group_size`?"); [`diagnostics::Diagnostics::render`] prints them like
//!    rustc, with `file:line:col` and the offending line.
//! 4. **Generate** ([`codegen`], [`expand_source`]): a unit struct implementing
//!    `::agentry::Experiment`, whose `spec()` is the checked experiment as a struct literal
//!    and whose `user_task()` constructs the user's own environment types by path.
//!
//! The `agentry-macros` crate is a thin adapter over [`expand_source`]; the CLI uses
//! [`check()`] to run an experiment without compiling it.
//!
//! # Invariants
//!
//! - **Nothing here panics on any input.** Literals beyond range saturate and are rejected by
//!   range checks, bracket nesting is capped at [`MAX_DEPTH`] before the recursive parser
//!   runs, and every span lies on a character boundary of the source.
//! - **The crate is pure**: no I/O, no global state; checking a file takes milliseconds.
//! - **The generated code uses absolute paths only**, so it compiles wherever it expands.
//!
//! ```
//! let source = r#"
//! experiment quickstart {
//!     model policy { arch = transformer { layers = 2, d_model = 64, heads = 4 } }
//!     task kg { env = kg }
//!     algorithm grpo { group_size = 4 }
//!     train { steps = 100, batch = 16 }
//! }
//! "#;
//! let spec = agentry_dsl::check(source).unwrap();
//! assert_eq!(spec.tasks[0].max_turns, 15);
//! assert_eq!(agentry_dsl::type_name(&spec.name), "Quickstart");
//! ```

pub mod ast;
pub mod check;
mod checked;
pub mod codegen;
pub mod diagnostics;
mod parser;
pub mod spec;

pub use checked::{Checked, OverrideError};
pub use codegen::{expand, type_name};
pub use diagnostics::{Diagnostic, Diagnostics};
pub use parser::MAX_DEPTH;

/// Parses a file into its syntax tree, or returns its syntax errors.
pub fn parse(source: &str) -> Result<ast::File, Diagnostics> {
    match parser::parse_file(source) {
        (Some(file), errors) if errors.is_empty() => Ok(file),
        (_, errors) => Err(errors.into()),
    }
}

/// Parses and checks a file: the resolved experiment, or every error the file has.
///
/// This is how a spec becomes [`Checked`], the form the runtime takes.
pub fn check(source: &str) -> Result<Checked<spec::Experiment>, Diagnostics> {
    let (file, mut errors) = parser::parse_file(source);
    let Some(file) = file else {
        return Err(errors.into());
    };
    match check::check_file(&file) {
        Ok(experiment) if errors.is_empty() => Ok(experiment),
        Ok(_) => Err(errors.into()),
        Err(more) => {
            errors.extend(more);
            errors.sort_by_key(|d| d.span.start);
            Err(errors.into())
        }
    }
}

/// Checks a file and generates its Rust items; `path` is named in the generated docs.
///
/// The caller (the macro, the CLI) renders the errors with
/// [`Diagnostics::render`] and the same `path`.
pub fn expand_source(source: &str, path: &str) -> Result<proc_macro2::TokenStream, Diagnostics> {
    check(source).map(|spec| codegen::expand_with_origin(&spec, Some(path)))
}
