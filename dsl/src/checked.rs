//! [`Checked`]: a value that passed the checker, so whoever holds one may trust it.

use std::fmt;
use std::ops::Deref;

/// A value the checker produced: [`crate::check`](fn@crate::check) returns one, and the overrides
/// ([`Checked::with_steps`]) re-check before they return another. The field is private, so a
/// function taking `Checked<Experiment>` (the runtime's entry points) cannot be handed a spec
/// that skipped a rule: a spec edited after checking has to go through the checker again.
///
/// Read it through `Deref`; [`Checked::into_inner`] gives the plain value back (which is then
/// no longer known to be checked).
#[derive(Clone, Debug, PartialEq)]
pub struct Checked<T>(T);

impl<T> Checked<T> {
    /// Only the checker vouches for a value.
    pub(crate) fn new(value: T) -> Self {
        Checked(value)
    }

    /// The plain value.
    pub fn into_inner(self) -> T {
        self.0
    }

    /// For the code `agentry::experiment!` generates, and nothing else.
    ///
    /// The generated code spells out the experiment the checker returned at compile time as a
    /// struct literal ([`crate::codegen`]), so it builds the spec without running the checker
    /// again; `tests/snapshots.rs` proves, for every recipe, that the literal equals the
    /// checker's output. Anything else calling this bypasses the checker.
    #[doc(hidden)]
    pub fn from_generated_code(value: T) -> Self {
        Checked(value)
    }
}

impl<T> Deref for Checked<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A command-line override that breaks a rule of the checker, e.g. `--steps` below a curriculum
/// stage's `until`. It has no span: the value is not in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct OverrideError {
    /// The rule broken, as the checker words it for a file.
    pub message: String,
    /// What to change.
    pub hint: String,
}

impl fmt::Display for OverrideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.message, self.hint)
    }
}

impl std::error::Error for OverrideError {}
