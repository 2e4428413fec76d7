//! Resolves an experiment's tasks to environment generators.

use agentry_dsl::spec::{BuiltinEnv, EnvRef, Experiment as Spec};
use agentry_env::TaskGenerator;

use crate::error::RunError;
use crate::experiment::Experiment;

/// The generator of a built-in task, or `None` for one this version does not provide yet.
pub fn builtin(env: BuiltinEnv) -> Option<Box<dyn TaskGenerator>> {
    match env {
        BuiltinEnv::Alfworld => Some(Box::new(agentry_env::alfworld::Alfworld::default())),
        BuiltinEnv::Kg => Some(Box::new(agentry_env::kg::Kg::default())),
        BuiltinEnv::Webshop => Some(Box::new(agentry_env::webshop::Webshop::default())),
        BuiltinEnv::Db => Some(Box::new(agentry_env::db::Db::default())),
        BuiltinEnv::Os => Some(Box::new(agentry_env::os::Os::default())),
    }
}

/// One generator per task of the spec, in order.
pub fn resolve(
    experiment: &dyn Experiment,
    spec: &Spec,
) -> Result<Vec<Box<dyn TaskGenerator>>, RunError> {
    spec.tasks
        .iter()
        .map(|task| {
            let generator = match &task.env {
                EnvRef::Builtin(env) => builtin(*env).ok_or_else(|| {
                    let available: Vec<&str> = BuiltinEnv::ALL
                        .iter()
                        .filter(|e| builtin(**e).is_some())
                        .map(|e| e.name())
                        .collect();
                    format!(
                        "the built-in environment `{}` is not implemented in this version; \
                         available: {}",
                        env.name(),
                        available.join(", ")
                    )
                }),
                EnvRef::Path(path) => experiment.user_task(&task.name).ok_or_else(|| {
                    format!(
                        "`{path}` is a Rust type: run this experiment through \
                         `agentry::experiment!` (cargo run --example), not the interpreter"
                    )
                }),
            };
            generator.map_err(|reason| RunError::Task {
                task: task.name.clone(),
                reason,
            })
        })
        .collect()
}
