//! Resolves an experiment's tasks to environment generators.
//!
//! A `remote = "URL"` task is connected through a [`RemoteTasks`] the caller supplies
//! ([`crate::train::RunOptions::remote_tasks`]): the runtime has no HTTP client of its own, so a
//! training binary links one only when it asks for it (the `agentry` crate passes
//! `agentry_serve::HttpRemoteTasks`).

use agentry_dsl::spec::{BuiltinEnv, EnvRef, Experiment as Spec};
pub use agentry_env::RemoteTasks;
use agentry_env::TaskGenerator;
use agentry_env::controller::{Controller, ControllerConfig};

/// A task of the spec that this build or this caller cannot provide a generator for.
/// [`crate::RunError`] wraps it.
#[derive(Debug, thiserror::Error)]
#[error("task `{task}`: {reason}")]
pub struct ResolveError {
    /// The task's name in the file.
    pub task: String,
    /// What is missing and what to do.
    pub reason: String,
}

/// The controller that runs the experiment's environment calls: `pool.env_workers` at once
/// (one per CPU core when unset).
pub fn controller(spec: &Spec) -> std::io::Result<Controller> {
    let mut config = ControllerConfig::default();
    config.workers = spec.pool.env_workers.unwrap_or(config.workers);
    Controller::new(config)
}

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
/// ([`crate::Experiment::user_task`]), `remote` connects the remote ones (without it, a remote
/// task is an error that says how to supply one).
pub fn resolve(
    user_task: &dyn Fn(&str) -> Option<Box<dyn TaskGenerator>>,
    remote: Option<&dyn RemoteTasks>,
    spec: &Spec,
) -> Result<Vec<Box<dyn TaskGenerator>>, ResolveError> {
    spec.tasks
        .iter()
        .map(|task| match &task.env {
            EnvRef::Builtin(env) => Ok(builtin(*env)),
            // Connecting reads the task's indices, so a controller that is down or does not
            // know the task is an error before any work.
            EnvRef::Remote { url, name } => match remote {
                Some(remote) => remote.connect(url, name).map_err(|e| ResolveError {
                    task: task.name.clone(),
                    reason: format!("remote task `{name}` at {url}: {e}"),
                }),
                None => Err(ResolveError {
                    task: task.name.clone(),
                    reason: format!(
                        "remote task `{name}` at {url}: nothing to connect it with; remote \
                         tasks need an HTTP client: run through the `agentry` crate (its CLI \
                         and `agentry::main` supply one), or set `RunOptions::remote_tasks` \
                         (e.g. to `agentry::serve::HttpRemoteTasks`)"
                    ),
                }),
            },
            EnvRef::Path(path) => user_task(&task.name).ok_or_else(|| ResolveError {
                task: task.name.clone(),
                reason: format!(
                    "`{path}` is a Rust type: run this experiment through \
                     `agentry::experiment!` (cargo run --example), not the interpreter"
                ),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(task: &str) -> Spec {
        let source = format!(
            "experiment e {{
                model policy {{ arch = transformer }}
                task {task}
                algorithm grpo {{ group_size = 4 }}
                train {{ steps = 10, batch = 8 }}
            }}"
        );
        agentry_dsl::check(&source)
            .unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)))
            .into_inner()
    }

    #[test]
    fn the_controller_runs_env_workers_calls_at_once() {
        let mut spec = spec("kg { env = kg }");
        let cores = ControllerConfig::default().workers;
        assert_eq!(controller(&spec).unwrap().stats().workers, cores);
        spec.pool.env_workers = Some(cores + 5);
        assert_eq!(controller(&spec).unwrap().stats().workers, cores + 5);
    }

    /// The message as users saw it, from the error and from the `RunError` that wraps it.
    fn message(spec: &Spec) -> String {
        let Err(e) = resolve(&|_| None, None, spec) else {
            panic!("resolved a task it cannot provide");
        };
        let message = e.to_string();
        assert_eq!(
            crate::RunError::from(e).to_string(),
            message,
            "RunError adds nothing"
        );
        message
    }

    #[test]
    fn a_rust_type_outside_its_recipe_says_to_run_the_recipe() {
        assert_eq!(
            message(&spec("lights { env = crate::envs::Lights }")),
            "task `lights`: `crate::envs::Lights` is a Rust type: run this experiment through \
             `agentry::experiment!` (cargo run --example), not the interpreter"
        );
    }

    #[test]
    fn a_remote_task_without_a_client_says_how_to_supply_one() {
        assert_eq!(
            message(&spec(
                "kg { remote = \"http://127.0.0.1:1/api\", name = \"kg-test\" }"
            )),
            "task `kg`: remote task `kg-test` at http://127.0.0.1:1/api: nothing to connect it \
             with; remote tasks need an HTTP client: run through the `agentry` crate (its CLI and \
             `agentry::main` supply one), or set `RunOptions::remote_tasks` (e.g. to \
             `agentry::serve::HttpRemoteTasks`)"
        );
    }
}
