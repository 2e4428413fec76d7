//! The checker: [`ast::File`](crate::ast::File) to [`spec::Experiment`](crate::spec::Experiment).
//!
//! It reads each block as a table of keys (module `table`), turns values into typed data with
//! ranges checked, fills in the defaults documented in [`spec`](crate::spec), and then checks
//! the rules that relate several keys (PPO needs a value head, `batch` is a multiple of
//! `group_size`, stale engines and staleness bounds agree, ...). It never stops at the first
//! error: every mistake of a file is reported at once, each at the span a researcher has to
//! edit, with a hint where one can be given.
//!
//! One private module per concept, in the order of a file: `model`, `tasks` (tasks and the
//! curriculum), `algorithm`, `pool`, `train` (training and evaluation), `sweep`.

mod algorithm;
mod model;
mod overrides;
mod pool;
mod sweep;
mod table;
mod tasks;
mod train;

use crate::ast::{Block, ExperimentDecl, File, Ident, ItemKind};
use crate::checked::Checked;
use crate::diagnostics::{Diagnostic, Diagnostics, one_of, suggest};
use crate::spec::{Device, Eval, Experiment, MatmulPrecision, Pool};

/// The top-level keys of an experiment.
const TOP_KEYS: &[&str] = &["seed", "device", "matmul_precision"];

/// The blocks an experiment may contain.
const SECTIONS: &[&str] = &[
    "model",
    "task",
    "curriculum",
    "algorithm",
    "pool",
    "train",
    "eval",
    "sweep",
];

/// Checks a parsed file.
pub fn check_file(file: &File) -> Result<Checked<Experiment>, Diagnostics> {
    let mut checker = Checker::default();
    let experiment = checker.experiment(&file.experiment, true);
    match experiment {
        Some(experiment) if checker.errors.is_empty() => Ok(Checked::new(experiment)),
        _ => Err(checker.errors.into()),
    }
}

/// Collects errors while the blocks are checked.
#[derive(Default)]
pub(crate) struct Checker {
    errors: Vec<Diagnostic>,
}

/// A `keyword [name] { ... }` item, borrowed from the tree.
#[derive(Clone, Copy)]
struct Section<'a> {
    keyword: &'a Ident,
    name: Option<&'a Ident>,
    body: &'a Block,
}

impl Checker {
    fn error(&mut self, diagnostic: Diagnostic) {
        self.errors.push(diagnostic);
    }

    /// Checks one experiment; `with_sweep` is false when re-checking an ablation or a specialist.
    fn experiment(&mut self, decl: &ExperimentDecl, with_sweep: bool) -> Option<Experiment> {
        let mut keys: Vec<(&Ident, &crate::ast::Value)> = Vec::new();
        let mut sections: Vec<Section<'_>> = Vec::new();
        for item in &decl.body.items {
            match &item.kind {
                ItemKind::Assign { key, value } => {
                    if TOP_KEYS.contains(&key.name.as_str()) {
                        if keys.iter().any(|(k, _)| k.name == key.name) {
                            self.duplicate_key(key, &decl.name.name);
                        } else {
                            keys.push((key, value));
                        }
                    } else if SECTIONS.contains(&key.name.as_str()) {
                        self.error(
                            Diagnostic::new(
                                key.span,
                                format!("`{}` is a block, not a key", key.name),
                                "expected a block",
                            )
                            .with_hint(format!("write `{} {{ ... }}`", key.name)),
                        );
                    } else {
                        let all = TOP_KEYS.iter().chain(SECTIONS).copied();
                        let hint = suggest(&key.name, all).unwrap_or_else(|| {
                            format!(
                                "an experiment holds {} and the blocks {}",
                                one_of(TOP_KEYS),
                                one_of(SECTIONS)
                            )
                        });
                        self.error(
                            Diagnostic::new(
                                key.span,
                                format!("unknown key `{}` in `experiment`", key.name),
                                "unknown key",
                            )
                            .with_hint(hint),
                        );
                    }
                }
                ItemKind::Section {
                    keyword,
                    name,
                    body,
                } => {
                    if SECTIONS.contains(&keyword.name.as_str()) {
                        sections.push(Section {
                            keyword,
                            name: name.as_ref(),
                            body,
                        });
                    } else {
                        let hint = suggest(&keyword.name, SECTIONS.iter().copied())
                            .unwrap_or_else(|| format!("the blocks are {}", one_of(SECTIONS)));
                        self.error(
                            Diagnostic::new(
                                keyword.span,
                                format!("unknown block `{}`", keyword.name),
                                "unknown block",
                            )
                            .with_hint(hint),
                        );
                    }
                }
                ItemKind::Ablate { .. } => self.stray_ablate(item.span),
            }
        }
        let get = |key: &str| keys.iter().find(|(k, _)| k.name == key).map(|(_, v)| *v);

        let seed = match get("seed") {
            Some(v) => self.uint("seed", v, 0),
            None => Some(Experiment::DEFAULT_SEED),
        };
        let device = match get("device") {
            Some(v) => self.choice(
                "device",
                v,
                &[
                    ("auto", Device::Auto),
                    ("flex", Device::Flex),
                    ("wgpu", Device::Wgpu),
                    ("vulkan", Device::Vulkan),
                    ("cuda", Device::Cuda),
                ],
            ),
            None => Some(Device::default()),
        };
        let matmul_precision = match get("matmul_precision") {
            Some(v) => self.choice(
                "matmul_precision",
                v,
                &[
                    ("highest", MatmulPrecision::Highest),
                    ("medium", MatmulPrecision::Medium),
                ],
            ),
            None => Some(MatmulPrecision::default()),
        };

        let model = self
            .single(&sections, "model", &decl.name, true)
            .and_then(|s| self.model(s));
        let task_sections: Vec<Section<'_>> = sections
            .iter()
            .copied()
            .filter(|s| s.keyword.name == "task")
            .collect();
        if task_sections.is_empty() {
            self.error(
                Diagnostic::new(
                    decl.name.span,
                    "no `task` declared",
                    "this experiment has no task",
                )
                .with_hint("add one, e.g. `task kg { env = kg }`"),
            );
        }
        let tasks = self.tasks(&task_sections);
        let algorithm = self
            .single(&sections, "algorithm", &decl.name, true)
            .and_then(|s| self.algorithm(s, model.as_ref()));
        let lora_dropout = model.as_ref().and_then(|m| match &m.finetune {
            crate::spec::Finetune::Lora(lora) if lora.dropout > 0.0 => Some(lora.dropout),
            _ => None,
        });
        let train = self
            .single(&sections, "train", &decl.name, true)
            .and_then(|s| self.train(s, algorithm.as_ref().map(|a| a.group_size), lora_dropout));
        let curriculum = match self.single(&sections, "curriculum", &decl.name, false) {
            Some(s) => self.curriculum(s, &tasks, train.as_ref().map(|t| t.steps)),
            None => Some(Vec::new()),
        };
        let pool = match self.single(&sections, "pool", &decl.name, false) {
            Some(s) => self.pool(s),
            None => Some(Pool::default()),
        };
        let eval = match self.single(&sections, "eval", &decl.name, false) {
            Some(s) => self.eval(s),
            None => Some(Eval::default()),
        };
        let sweep_section = self.single(&sections, "sweep", &decl.name, false);
        if let (Some(tasks), Some(algorithm), Some(train)) = (&tasks, &algorithm, &train) {
            self.remote_tasks_need_no_oracle(tasks, &task_sections, algorithm, train);
        }

        let base = Experiment {
            name: decl.name.name.clone(),
            seed: seed?,
            device: device?,
            matmul_precision: matmul_precision?,
            model: model?,
            tasks: tasks?,
            curriculum: curriculum?,
            algorithm: algorithm?,
            pool: pool?,
            train: train?,
            eval: eval?,
            sweep: None,
        };
        match sweep_section {
            Some(s) if with_sweep => {
                // Ablations are re-checked only against a valid base, so that the base's own
                // errors are not reported again once per ablation.
                let base_ok = self.errors.is_empty();
                let sweep = self.sweep(s, decl, base_ok)?;
                Some(Experiment {
                    sweep: Some(sweep),
                    ..base
                })
            }
            _ => Some(base),
        }
    }

    /// A remote task has no oracle, so when every task is remote nothing can give the
    /// demonstrations of a warm-up or of an oracle SFT term; refuse that. (With an in-process
    /// task the demonstrations are its; `sft_from = successes` needs no oracle.)
    fn remote_tasks_need_no_oracle(
        &mut self,
        tasks: &[crate::spec::Task],
        sections: &[Section<'_>],
        algorithm: &crate::spec::Algorithm,
        train: &crate::spec::Train,
    ) {
        use crate::spec::{EnvRef, Schedule, SftSource};
        // Demonstrations come from the tasks with oracles: one in-process task is enough.
        if tasks
            .iter()
            .any(|t| !matches!(t.env, EnvRef::Remote { .. }))
        {
            return;
        }
        let sft = algorithm.sft_from == SftSource::Oracle
            && match algorithm.sft {
                Schedule::Constant(v) => v != 0.0,
                Schedule::Linear { from, to, .. }
                | Schedule::Cosine { from, to, .. }
                | Schedule::Step { from, to, .. } => from != 0.0 || to != 0.0,
            };
        let needs = match (train.warmup.is_some(), sft) {
            (false, false) => return,
            (true, _) => "`train { warmup = sft { ... } }`",
            (false, true) => "`algorithm { sft = ... }`",
        };
        for task in tasks
            .iter()
            .filter(|t| matches!(t.env, EnvRef::Remote { .. }))
        {
            let span = sections
                .iter()
                .filter_map(|s| s.name)
                .find(|n| n.name == task.name)
                .map(|n| n.span);
            if let Some(span) = span {
                self.error(
                    Diagnostic::new(
                        span,
                        format!(
                            "task `{}` is remote: it has no oracle demonstrations",
                            task.name
                        ),
                        "a remote task",
                    )
                    .with_hint(format!(
                        "{needs} learns from oracle demonstrations; remove it, or serve this \
                         task in process (`env = ...`)"
                    )),
                );
            }
        }
    }

    /// The one block named `keyword`: reports duplicates, a missing required block and a
    /// missing or unexpected name after the keyword.
    fn single<'a>(
        &mut self,
        sections: &[Section<'a>],
        keyword: &str,
        experiment: &Ident,
        required: bool,
    ) -> Option<Section<'a>> {
        let mut found = sections.iter().filter(|s| s.keyword.name == keyword);
        let first = found.next().copied();
        for extra in found {
            self.error(
                Diagnostic::new(
                    extra.keyword.span,
                    format!("duplicate `{keyword}` block"),
                    "second block",
                )
                .with_hint(format!(
                    "an experiment has one `{keyword}` block; merge the two"
                )),
            );
        }
        let Some(section) = first else {
            if required {
                let example = match keyword {
                    "model" => {
                        "model policy { arch = transformer { layers = 2, d_model = 128, heads = 4 } }"
                    }
                    "algorithm" => "algorithm grpo { group_size = 8 }",
                    _ => "train { steps = 500 }",
                };
                self.error(
                    Diagnostic::new(
                        experiment.span,
                        format!("missing `{keyword}` block"),
                        format!("this experiment has no `{keyword}`"),
                    )
                    .with_hint(format!("add one, e.g. `{example}`")),
                );
            }
            return None;
        };
        let named = matches!(keyword, "model" | "algorithm");
        match (named, section.name) {
            (true, None) => {
                let example = if keyword == "model" {
                    "model policy { ... }"
                } else {
                    "algorithm grpo { ... } (grpo, rloo, reinforce_pp or ppo)"
                };
                let what = if keyword == "model" {
                    "a name"
                } else {
                    "a kind"
                };
                self.error(
                    Diagnostic::new(
                        section.keyword.span,
                        format!("`{keyword}` needs {what}"),
                        format!("{what} goes after `{keyword}`"),
                    )
                    .with_hint(format!("write `{example}`")),
                );
                None
            }
            (false, Some(name)) => {
                self.error(
                    Diagnostic::new(
                        name.span,
                        format!("`{keyword}` takes no name"),
                        "unexpected name",
                    )
                    .with_hint(format!("write `{keyword} {{ ... }}`")),
                );
                None
            }
            _ => Some(section),
        }
    }
}
