//! Resolves an experiment's tasks to environment generators.

use agentry_dsl::spec::{BuiltinEnv, EnvRef, Experiment as Spec};
use agentry_env::TaskGenerator;

use crate::error::RunError;

/// The generator of a built-in task (its standard seed).
pub fn builtin(env: BuiltinEnv) -> Box<dyn TaskGenerator> {
    match env {
        BuiltinEnv::Alfworld => Box::new(agentry_env::alfworld::Alfworld::default()),
        BuiltinEnv::Db => Box::new(agentry_env::db::Db::default()),
        BuiltinEnv::Kg => Box::new(agentry_env::kg::Kg::default()),
        BuiltinEnv::Os => Box::new(agentry_env::os::Os::default()),
        BuiltinEnv::Webshop => Box::new(agentry_env::webshop::Webshop::default()),
    }
}

/// One generator per task of the spec, in order; `user_task` gives the user's own types
/// ([`crate::Experiment::user_task`]).
pub fn resolve(
    user_task: &dyn Fn(&str) -> Option<Box<dyn TaskGenerator>>,
    spec: &Spec,
) -> Result<Vec<Box<dyn TaskGenerator>>, RunError> {
    spec.tasks
        .iter()
        .map(|task| match &task.env {
            EnvRef::Builtin(env) => Ok(builtin(*env)),
            // Connecting reads the task's indices, so a controller that is down or does not
            // know the task is an error before any work.
            EnvRef::Remote { url, name } => agentry_serve::RemoteTask::connect(url, name)
                .map(|task| Box::new(task) as Box<dyn TaskGenerator>)
                .map_err(|e| RunError::Task {
                    task: task.name.clone(),
                    reason: format!("remote task `{name}` at {url}: {e}"),
                }),
            EnvRef::Path(path) => user_task(&task.name).ok_or_else(|| RunError::Task {
                task: task.name.clone(),
                reason: format!(
                    "`{path}` is a Rust type: run this experiment through \
                     `agentry::experiment!` (cargo run --example), not the interpreter"
                ),
            }),
        })
        .collect()
}
