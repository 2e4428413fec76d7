//! What generated code implements: an experiment the runtime can run.

use agentry_dsl::{Checked, spec};
use agentry_env::TaskGenerator;

/// An experiment: its checked spec, and the user's own task types.
///
/// The spec is [`Checked`]: only the checker makes one (for generated code, at compile time),
/// so no spec reaches a run without passing it.
///
/// `agentry::experiment!("experiments/NAME.arl")` generates one type implementing this trait;
/// [`Interpreted`] implements it for a spec read at run time (`agentry run FILE`).
pub trait Experiment {
    /// The checked experiment, with every default resolved.
    fn spec(&self) -> Checked<spec::Experiment>;
    /// An instance of the user's type for a task whose `env` is a Rust path; `None` for built-in
    /// tasks and unknown names.
    fn user_task(&self, name: &str) -> Option<Box<dyn TaskGenerator>>;
}

/// An experiment checked at run time rather than compiled; it cannot name user types.
#[derive(Clone, Debug)]
pub struct Interpreted(pub Checked<spec::Experiment>);

impl Experiment for Interpreted {
    fn spec(&self) -> Checked<spec::Experiment> {
        self.0.clone()
    }

    fn user_task(&self, _name: &str) -> Option<Box<dyn TaskGenerator>> {
        None
    }
}
