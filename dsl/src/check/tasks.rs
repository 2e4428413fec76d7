//! `task NAME { ... }` and `curriculum { stage NAME { ... } ... }`.

use crate::ast::{Ident, ItemKind, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{BuiltinEnv, Difficulty, EnvRef, Stage, Task};

use super::table::Interval;
use super::{Checker, Section};

impl Checker {
    /// Every task, in file order; `None` if any of them has an error.
    pub(super) fn tasks(&mut self, sections: &[Section<'_>]) -> Option<Vec<Task>> {
        let mut tasks = Vec::new();
        let mut ok = true;
        let mut seen: Vec<&Ident> = Vec::new();
        for section in sections {
            let Some(name) = section.name else {
                self.error(
                    Diagnostic::new(section.keyword.span, "`task` needs a name", "unnamed task")
                        .with_hint("write `task kg { env = kg }`"),
                );
                ok = false;
                continue;
            };
            if seen.iter().any(|s| s.name == name.name) {
                self.error(
                    Diagnostic::new(
                        name.span,
                        format!("duplicate task `{}`", name.name),
                        "declared again here",
                    )
                    .with_hint("task names must be unique; rename one of them"),
                );
                ok = false;
            }
            seen.push(name);
            match self.task(*section, name) {
                Some(task) => tasks.push(task),
                None => ok = false,
            }
        }
        ok.then_some(tasks)
    }

    fn task(&mut self, section: Section<'_>, name: &Ident) -> Option<Task> {
        let keys = [
            "env",
            "remote",
            "name",
            "weight",
            "max_turns",
            "difficulty",
            "split",
        ];
        let table = self.table(section.body, "task", &keys);
        let env = match (table.get("env"), table.get("remote")) {
            (Some(_), Some(remote)) => {
                self.error(
                    Diagnostic::new(
                        remote.span,
                        format!("task `{}` has both `env` and `remote`", name.name),
                        "a second environment",
                    )
                    .with_hint(
                        "a task is served either in process (`env`) or by a controller (`remote`)",
                    ),
                );
                None
            }
            (None, Some(remote)) => self.remote(remote, table.get("name"), &name.name),
            (Some(value), None) => self.env(value),
            (None, None) => {
                self.error(
                    Diagnostic::new(
                        name.span,
                        format!("task `{}` has no `env`", name.name),
                        "no environment",
                    )
                    .with_hint(format!(
                        "add `env = {}` (a built-in: {}), the path of your own type, e.g. \
                         `env = crate::envs::Maze`, or `remote = \"http://host:5020/api\"`",
                        builtin_for(&name.name).unwrap_or("kg"),
                        one_of(&builtin_names())
                    )),
                );
                None
            }
        };
        let weight = match table.get("weight") {
            Some(v) => self.number_in("weight", v, Interval::above(0.0)),
            None => Some(Task::DEFAULT_WEIGHT),
        };
        let max_turns = match table.get("max_turns") {
            Some(v) => self.uint32("max_turns", v, 1),
            None => Some(
                env.as_ref()
                    .map_or(EnvRef::OTHER_MAX_TURNS, EnvRef::default_max_turns),
            ),
        };
        if table.get("remote").is_some() {
            // The workers decide what they serve; a key here would be silently ignored.
            for key in ["difficulty", "split"] {
                if let Some(value) = table.get(key) {
                    self.error(
                        Diagnostic::new(
                            value.span,
                            format!("a remote task has no `{key}`"),
                            "decided by the workers",
                        )
                        .with_hint(format!(
                            "the workers serving the task choose it: `agentry worker --{key} ...`"
                        )),
                    );
                }
            }
        } else if let Some(value) = table.get("name") {
            self.error(
                Diagnostic::new(
                    value.span,
                    "`name` is only for remote tasks",
                    "not a remote task",
                )
                .with_hint("`name` is the task's name on a controller, with `remote = \"URL\"`"),
            );
        }
        let difficulty = match table.get("difficulty") {
            Some(v) => self.difficulty(v),
            None => Some(Difficulty::default()),
        };
        let split = match table.get("split") {
            Some(v) => self.split(v),
            None => Some(Task::DEFAULT_SPLIT),
        };
        Some(Task {
            split: split?,
            name: name.name.clone(),
            env: env?,
            weight: weight?,
            max_turns: max_turns?,
            difficulty: difficulty?,
        })
    }

    /// `remote = "http://host:5020/api"` and the optional `name = "..."`.
    fn remote(&mut self, url: &Value, name: Option<&Value>, task: &str) -> Option<EnvRef> {
        let url = match &url.kind {
            ValueKind::Str(s) if s.starts_with("http://") || s.starts_with("https://") => s.clone(),
            ValueKind::Str(_) => {
                self.error(
                    Diagnostic::new(
                        url.span,
                        "`remote` must be an http:// or https:// URL",
                        "not a URL",
                    )
                    .with_hint(
                        "the controller's API base, e.g. `remote = \"http://127.0.0.1:5020/api\"`",
                    ),
                );
                return None;
            }
            _ => {
                self.wrong_type("remote", url, "the controller's URL, a string");
                return None;
            }
        };
        let name = match name.map(|v| (v, &v.kind)) {
            None => task.to_string(),
            Some((_, ValueKind::Str(s))) if !s.is_empty() => s.clone(),
            Some((value, _)) => {
                self.wrong_type(
                    "name",
                    value,
                    "the task's name on the controller, a non-empty string",
                );
                return None;
            }
        };
        Some(EnvRef::Remote { url, name })
    }

    fn env(&mut self, value: &Value) -> Option<EnvRef> {
        match &value.kind {
            ValueKind::Path(path) => Some(EnvRef::Path(path.clone())),
            ValueKind::Ident(name) => {
                if let Some(b) = BuiltinEnv::ALL.iter().find(|b| b.name() == name) {
                    return Some(EnvRef::Builtin(*b));
                }
                let names = builtin_names();
                let hint = suggest(name, names.iter().copied()).unwrap_or_else(|| {
                    format!(
                        "the built-in environments are {}; for your own type write its path, \
                         e.g. `crate::envs::{}`",
                        one_of(&names),
                        upper_camel(name)
                    )
                });
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("unknown environment `{name}`"),
                        "not a built-in environment",
                    )
                    .with_hint(hint),
                );
                None
            }
            _ => {
                self.wrong_type("env", value, "an environment name or a Rust path");
                None
            }
        }
    }

    /// `n` or `lo .. hi`, within 1..=3.
    fn difficulty(&mut self, value: &Value) -> Option<Difficulty> {
        let (lo, hi) = match &value.kind {
            ValueKind::Int(_) => (value, value),
            ValueKind::Range(lo, hi) => (lo.as_ref(), hi.as_ref()),
            _ => {
                self.wrong_type("difficulty", value, "a level or a range such as `1 .. 2`");
                return None;
            }
        };
        let level = |checker: &mut Checker, v: &Value| -> Option<u8> {
            let ValueKind::Int(i) = v.kind else {
                checker.wrong_type("difficulty", v, "an integer");
                return None;
            };
            match u8::try_from(i) {
                Ok(l @ 1..=3) => Some(l),
                _ => {
                    checker.error(
                        Diagnostic::new(
                            v.span,
                            format!("difficulty level {i} does not exist"),
                            "expected 1, 2 or 3",
                        )
                        .with_hint("levels run from 1 (easiest) to 3 (hardest)"),
                    );
                    None
                }
            }
        };
        let min = level(self, lo);
        let max = if std::ptr::eq(lo, hi) {
            min
        } else {
            level(self, hi)
        };
        let (min, max) = (min?, max?);
        if min > max {
            self.error(
                Diagnostic::new(
                    value.span,
                    format!("difficulty range `{min} .. {max}` is reversed"),
                    "lowest level first",
                )
                .with_hint(format!("write `difficulty = {max} .. {min}`")),
            );
            return None;
        }
        Some(Difficulty { min, max })
    }

    /// The stages, checked against the declared tasks and `train.steps`.
    pub(super) fn curriculum(
        &mut self,
        section: Section<'_>,
        tasks: &Option<Vec<Task>>,
        steps: Option<u64>,
    ) -> Option<Vec<Stage>> {
        let mut stages: Vec<(Stage, Section<'_>)> = Vec::new();
        let mut ok = true;
        for item in &section.body.items {
            match &item.kind {
                ItemKind::Section {
                    keyword,
                    name,
                    body,
                } if keyword.name == "stage" => {
                    let Some(name) = name else {
                        self.error(
                            Diagnostic::new(keyword.span, "`stage` needs a name", "unnamed stage")
                                .with_hint("write `stage warmup { until = 100 }`"),
                        );
                        ok = false;
                        continue;
                    };
                    if stages.iter().any(|(s, _)| s.name == name.name) {
                        self.error(
                            Diagnostic::new(
                                name.span,
                                format!("duplicate stage `{}`", name.name),
                                "declared again here",
                            )
                            .with_hint("stage names must be unique; rename one of them"),
                        );
                        ok = false;
                    }
                    let section = Section {
                        keyword,
                        name: Some(name),
                        body,
                    };
                    match self.stage(section, name, tasks) {
                        Some(stage) => stages.push((stage, section)),
                        None => ok = false,
                    }
                }
                ItemKind::Section { keyword, .. } => {
                    let hint = suggest(&keyword.name, ["stage"])
                        .unwrap_or_else(|| "a curriculum holds `stage NAME { ... }` blocks".into());
                    self.error(
                        Diagnostic::new(
                            keyword.span,
                            format!("unexpected block `{}` in `curriculum`", keyword.name),
                            "not a stage",
                        )
                        .with_hint(hint),
                    );
                    ok = false;
                }
                ItemKind::Assign { key, .. } => {
                    self.error(
                        Diagnostic::new(
                            key.span,
                            format!("unknown key `{}` in `curriculum`", key.name),
                            "unknown key",
                        )
                        .with_hint(format!(
                            "a curriculum holds only stages; put `{}` inside a `stage NAME {{ ... }}`",
                            key.name
                        )),
                    );
                    ok = false;
                }
                ItemKind::Ablate { .. } => {
                    self.stray_ablate(item.span);
                    ok = false;
                }
            }
        }
        self.stage_order(&stages, steps);
        ok.then(|| stages.into_iter().map(|(s, _)| s).collect())
    }

    fn stage(
        &mut self,
        section: Section<'_>,
        name: &Ident,
        tasks: &Option<Vec<Task>>,
    ) -> Option<Stage> {
        let keys = ["until", "max_turns", "tasks", "difficulty"];
        let table = self.table(section.body, "stage", &keys);
        let until = table.get("until").map(|v| self.uint("until", v, 1));
        let max_turns = table
            .get("max_turns")
            .map(|v| self.uint32("max_turns", v, 1));
        let difficulty = table.get("difficulty").map(|v| self.difficulty(v));
        let names = match table.get("tasks") {
            Some(v) => self.stage_tasks(v, name, tasks),
            None => Some(Vec::new()),
        };
        Some(Stage {
            name: name.name.clone(),
            until: until.map_or(Some(None), |u| u.map(Some))?,
            max_turns: max_turns.map_or(Some(None), |m| m.map(Some))?,
            tasks: names?,
            difficulty: difficulty.map_or(Some(None), |d| d.map(Some))?,
        })
    }

    /// `tasks = [a, b]`: declared names, each once.
    fn stage_tasks(
        &mut self,
        value: &Value,
        stage: &Ident,
        tasks: &Option<Vec<Task>>,
    ) -> Option<Vec<String>> {
        let ValueKind::List(items) = &value.kind else {
            let hint = matches!(value.kind, ValueKind::Ident(_))
                .then(|| format!("write a list: `tasks = [{value}]`"));
            self.wrong_type("tasks", value, "a list of task names");
            if let (Some(hint), Some(last)) = (hint, self.errors.last_mut()) {
                last.hint = Some(hint);
            }
            return None;
        };
        let declared: Vec<&str> = tasks
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        let mut names: Vec<String> = Vec::new();
        let mut ok = true;
        for item in items {
            let ValueKind::Ident(name) = &item.kind else {
                self.wrong_type("tasks", item, "a task name");
                ok = false;
                continue;
            };
            if names.contains(name) {
                self.error(Diagnostic::new(
                    item.span,
                    format!("task `{name}` is listed twice in stage `{}`", stage.name),
                    "listed again here",
                ));
                ok = false;
            } else if tasks.is_some() && !declared.contains(&name.as_str()) {
                let hint = suggest(name, declared.iter().copied()).unwrap_or_else(|| {
                    format!(
                        "the declared tasks are {}; declare it with `task {name} {{ env = ... }}`",
                        one_of(&declared)
                    )
                });
                self.error(
                    Diagnostic::new(
                        item.span,
                        format!("stage `{}` names undeclared task `{name}`", stage.name),
                        "no such task",
                    )
                    .with_hint(hint),
                );
                ok = false;
            }
            names.push(name.clone());
        }
        ok.then_some(names)
    }

    /// `until` is set on every stage but the last, increases, and stays within training.
    fn stage_order(&mut self, stages: &[(Stage, Section<'_>)], steps: Option<u64>) {
        let mut previous: Option<(u64, &str)> = None;
        for (i, (stage, section)) in stages.iter().enumerate() {
            let until_span = section
                .body
                .items
                .iter()
                .find_map(|item| match &item.kind {
                    ItemKind::Assign { key, value } if key.name == "until" => Some(value.span),
                    _ => None,
                })
                .unwrap_or(section.keyword.span);
            let Some(until) = stage.until else {
                if i + 1 < stages.len() {
                    let name_span = section.name.map_or(section.keyword.span, |n| n.span);
                    self.error(
                        Diagnostic::new(
                            name_span,
                            format!("stage `{}` has no `until`", stage.name),
                            "needs `until`",
                        )
                        .with_hint(
                            "only the last stage may leave `until` out (it then runs to the end \
                             of training); add e.g. `until = 200`",
                        ),
                    );
                }
                continue;
            };
            if let Some((before, name)) = previous
                && until <= before
            {
                self.error(
                    Diagnostic::new(
                        until_span,
                        format!("`until` must increase from stage to stage, but stage `{}` ends at {until}", stage.name),
                        format!("not after {before}"),
                    )
                    .with_hint(format!(
                        "stage `{name}` already ends at step {before}; stages run in file order"
                    )),
                );
            }
            if let Some(message) = steps.and_then(|steps| stage_beyond_training(stage, steps)) {
                self.error(
                    Diagnostic::new(until_span, message, "beyond `train.steps`")
                        .with_hint("lower `until` or raise `steps` in `train`"),
                );
            }
            previous = Some((until, stage.name.as_str()));
        }
    }
}

/// The rule `until <= train.steps`: a stage ends within training. What is wrong when `stage`
/// breaks it with `steps` RL steps; shared by the file's check and by `--steps`
/// ([`Checked::with_steps`](crate::Checked::with_steps)). A run of `0` steps (evaluation, or a
/// warm-up alone) reaches no stage, so the rule does not apply to it.
pub(super) fn stage_beyond_training(stage: &Stage, steps: u64) -> Option<String> {
    let until = stage.until?;
    (steps > 0 && until > steps).then(|| {
        format!(
            "stage `{}` ends at step {until}, after training ends (`steps = {steps}`)",
            stage.name
        )
    })
}

fn builtin_names() -> Vec<&'static str> {
    BuiltinEnv::ALL.iter().map(|b| b.name()).collect()
}

/// The built-in whose name matches a task's name, for the "add `env = ...`" hint.
fn builtin_for(task: &str) -> Option<&'static str> {
    BuiltinEnv::ALL
        .iter()
        .map(|b| b.name())
        .find(|n| *n == task)
}

fn upper_camel(name: &str) -> String {
    crate::codegen::type_name(name)
}
