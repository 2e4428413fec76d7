//! `sweep { seeds = [...], ablate key.path = value, specialists = true, base = false }`.
//!
//! An ablation (or a specialist: the experiment with one task alone) is applied to the syntax tree (the key is replaced, or added when the base
//! leaves it at its default) and the changed experiment goes through the whole checker again,
//! so an ablation can never produce an experiment that would not have checked as a file.

use crate::ast::{Block, ExperimentDecl, Ident, Item, ItemKind, Span, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{Ablation, Experiment, Specialist, Sweep};

use super::{Checker, Section};

/// What the first segment of an ablation path may be.
const ROOTS: &[&str] = &[
    "seed",
    "device",
    "matmul_precision",
    "model",
    "task",
    "curriculum",
    "algorithm",
    "pool",
    "train",
    "eval",
];

impl Checker {
    pub(super) fn sweep(
        &mut self,
        section: Section<'_>,
        decl: &ExperimentDecl,
        base_ok: bool,
    ) -> Option<Sweep> {
        let mut seeds = Vec::new();
        let mut seeds_ok = true;
        let mut ablations: Vec<Ablation> = Vec::new();
        let mut ok = true;
        // `specialists` and `base`: the value and the key (for errors about it), once each.
        let mut flags: [Option<(bool, &Ident)>; 2] = [None, None];
        let mut seeds_set = false;
        for item in &section.body.items {
            match &item.kind {
                ItemKind::Assign { key, value } if key.name == "seeds" => {
                    if seeds_set {
                        self.duplicate_key(key, "sweep");
                        seeds_ok = false;
                        continue;
                    }
                    seeds_set = true;
                    match self.seeds(value) {
                        Some(s) => seeds = s,
                        None => seeds_ok = false,
                    }
                }
                ItemKind::Assign { key, value }
                    if key.name == "specialists" || key.name == "base" =>
                {
                    let slot = usize::from(key.name == "base");
                    if flags[slot].is_some() {
                        self.duplicate_key(key, "sweep");
                        ok = false;
                        continue;
                    }
                    match self.boolean(&key.name, value) {
                        Some(b) => flags[slot] = Some((b, key)),
                        None => ok = false,
                    }
                }
                ItemKind::Assign { key, .. } => {
                    let hint = if key.name == "ablate" {
                        "write `ablate KEY.PATH = VALUE`, e.g. `ablate pool.cross_policy = 0`"
                            .into()
                    } else {
                        suggest(&key.name, ["seeds", "specialists", "base"]).unwrap_or_else(|| {
                            "a sweep holds `seeds = [...]`, `specialists = true`, `base = false` \
                             and `ablate KEY.PATH = VALUE` items"
                                .into()
                        })
                    };
                    self.error(
                        Diagnostic::new(
                            key.span,
                            format!("unknown key `{}` in `sweep`", key.name),
                            "unknown key",
                        )
                        .with_hint(hint),
                    );
                    ok = false;
                }
                ItemKind::Section { keyword, .. } => {
                    self.unexpected_block(keyword, "sweep", &["seeds", "specialists", "base"]);
                    ok = false;
                }
                ItemKind::Ablate { path, value } => {
                    match self.ablation(decl, item, path, value, base_ok) {
                        Some(a) => {
                            if ablations.iter().any(|b| b.label() == a.label()) {
                                self.error(
                                    Diagnostic::new(
                                        item.span,
                                        format!(
                                            "the sweep already has the configuration `{}`",
                                            a.label()
                                        ),
                                        "the same ablation again",
                                    )
                                    .with_hint(
                                        "each ablation is one configuration; remove this one",
                                    ),
                                );
                                ok = false;
                            }
                            ablations.push(a);
                        }
                        None => ok = false,
                    }
                }
            }
        }
        let specialists = match flags[0] {
            Some((true, key)) if base_ok => self.specialists(decl, key),
            _ => Some(Vec::new()),
        };
        let base = flags[1].map_or(Sweep::DEFAULT_BASE, |(b, _)| b);
        if let Some((false, key)) = flags[1] {
            let others = ablations.len() + usize::from(matches!(flags[0], Some((true, _))));
            if others == 0 && base_ok {
                self.error(
                    Diagnostic::new(
                        key.span,
                        "`base = false` leaves the sweep with no configuration to run",
                        "the only configuration is left out",
                    )
                    .with_hint("add an `ablate KEY.PATH = VALUE` or `specialists = true`"),
                );
                ok = false;
            }
        }
        let specialists = specialists?;
        (ok && seeds_ok).then_some(Sweep {
            seeds,
            ablations,
            specialists,
            base,
        })
    }

    fn seeds(&mut self, value: &Value) -> Option<Vec<u64>> {
        let ValueKind::List(items) = &value.kind else {
            self.wrong_type("seeds", value, "a list of seeds such as `[1, 2, 3]`");
            return None;
        };
        let mut seeds = Vec::new();
        let mut ok = true;
        for item in items {
            match self.uint("seeds", item, 0) {
                Some(s) if seeds.contains(&s) => {
                    self.error(Diagnostic::new(
                        item.span,
                        format!("seed {s} is listed twice"),
                        "listed again here",
                    ));
                    ok = false;
                }
                Some(s) => seeds.push(s),
                None => ok = false,
            }
        }
        ok.then_some(seeds)
    }

    fn ablation(
        &mut self,
        decl: &ExperimentDecl,
        item: &Item,
        path: &[Ident],
        value: &Value,
        base_ok: bool,
    ) -> Option<Ablation> {
        let text: Vec<&str> = path.iter().map(|p| p.name.as_str()).collect();
        let path_text = text.join(".");
        let changed = match apply(decl, path, value) {
            Ok(changed) => changed,
            Err(diagnostic) => {
                self.error(diagnostic);
                return None;
            }
        };
        if !base_ok {
            return None;
        }
        let experiment = self.recheck(
            &changed,
            item.span,
            &format!("with `ablate {path_text} = {value}`"),
            "the ablated experiment does not check",
        )?;
        Some(Ablation {
            path: path_text,
            value: value.to_string(),
            experiment: Box::new(experiment),
        })
    }

    /// `specialists = true`: one experiment per task, with that task alone. Curriculum stages
    /// that list tasks keep only this one; a stage that lists only other tasks would have
    /// nothing to sample, which is an error (at the `specialists` key) rather than a silent
    /// change of what the stage trains on.
    fn specialists(&mut self, decl: &ExperimentDecl, key: &Ident) -> Option<Vec<Specialist>> {
        let tasks: Vec<&Ident> = decl
            .body
            .items
            .iter()
            .filter_map(|item| match &item.kind {
                ItemKind::Section {
                    keyword,
                    name: Some(name),
                    ..
                } if keyword.name == "task" => Some(name),
                _ => None,
            })
            .collect();
        let mut specialists = Vec::new();
        let mut ok = true;
        for task in tasks {
            let changed = match alone(decl, &task.name) {
                Ok(changed) => changed,
                Err(stage) => {
                    self.error(
                        Diagnostic::new(
                            key.span,
                            format!(
                                "specialist `{}`: curriculum stage `{stage}` lists only other \
                                 tasks, so with `{}` alone it has nothing to train on",
                                task.name, task.name
                            ),
                            "specialists are asked for here",
                        )
                        .with_hint(format!(
                            "add `{}` to the `tasks` of stage `{stage}`, or write the \
                             specialists as their own experiments",
                            task.name
                        )),
                    );
                    ok = false;
                    continue;
                }
            };
            match self.recheck(
                &changed,
                key.span,
                &format!("specialist `{}`", task.name),
                "the single-task experiment does not check",
            ) {
                Some(experiment) => specialists.push(Specialist {
                    task: task.name.clone(),
                    experiment: Box::new(experiment),
                }),
                None => ok = false,
            }
        }
        ok.then_some(specialists)
    }

    /// Checks a changed experiment (its sweep removed) as a whole; its errors are reported
    /// with `prefix`, at their own place when that lies inside `at`, else at `at`.
    fn recheck(
        &mut self,
        changed: &ExperimentDecl,
        at: Span,
        prefix: &str,
        label: &str,
    ) -> Option<Experiment> {
        let mut inner = Checker::default();
        let experiment = inner.experiment(changed, false);
        if !inner.errors.is_empty() {
            for d in inner.errors {
                let within = d.span.start >= at.start && d.span.end <= at.end;
                let message = format!("{prefix}: {}", d.message);
                self.error(if within {
                    Diagnostic { message, ..d }
                } else {
                    Diagnostic {
                        span: at,
                        message,
                        label: label.into(),
                        hint: d.hint,
                    }
                });
            }
            return None;
        }
        experiment
    }
}

/// The experiment without its `sweep`, with `task` its only task: other `task` blocks are
/// removed, and curriculum stages' `tasks = [...]` lists keep only `task`. `Err(stage)` names
/// a stage whose list held only other tasks.
fn alone(decl: &ExperimentDecl, task: &str) -> Result<ExperimentDecl, String> {
    let mut changed = without_sweep(decl);
    changed.body.items.retain(|item| match &item.kind {
        ItemKind::Section {
            keyword,
            name: Some(name),
            ..
        } if keyword.name == "task" => name.name == task,
        _ => true,
    });
    for item in &mut changed.body.items {
        let ItemKind::Section { keyword, body, .. } = &mut item.kind else {
            continue;
        };
        if keyword.name != "curriculum" {
            continue;
        }
        for stage in &mut body.items {
            let ItemKind::Section {
                name,
                body: stage_body,
                ..
            } = &mut stage.kind
            else {
                continue;
            };
            for key in &mut stage_body.items {
                let ItemKind::Assign { key, value } = &mut key.kind else {
                    continue;
                };
                let ValueKind::List(names) = &mut value.kind else {
                    continue;
                };
                if key.name != "tasks" || names.is_empty() {
                    continue;
                }
                names.retain(|n| matches!(&n.kind, ValueKind::Ident(n) if n == task));
                if names.is_empty() {
                    return Err(name.as_ref().map_or_else(String::new, |n| n.name.clone()));
                }
            }
        }
    }
    Ok(changed)
}

/// The experiment without its `sweep` block: what an ablation or a specialist changes.
fn without_sweep(decl: &ExperimentDecl) -> ExperimentDecl {
    let mut changed = decl.clone();
    changed.body.items.retain(
        |item| !matches!(&item.kind, ItemKind::Section { keyword, .. } if keyword.name == "sweep"),
    );
    changed
}

/// The experiment with the ablation applied and its `sweep` removed.
fn apply(
    decl: &ExperimentDecl,
    path: &[Ident],
    value: &Value,
) -> Result<ExperimentDecl, Diagnostic> {
    let mut changed = without_sweep(decl);
    let Some((root, rest)) = path.split_first() else {
        return Err(Diagnostic::new(value.span, "empty ablation path", "no key"));
    };
    let full = path
        .first()
        .map_or(root.span, |f| f.span.to(path[path.len() - 1].span));
    match root.name.as_str() {
        "seed" | "device" | "matmul_precision" => {
            if let Some(extra) = rest.first() {
                return Err(Diagnostic::new(
                    extra.span,
                    format!("`{}` has no keys inside it", root.name),
                    "nothing to look up here",
                )
                .with_hint(format!("write `ablate {} = ...`", root.name)));
            }
            set(&mut changed.body, path, value, full, &root.name)
        }
        "model" | "algorithm" | "pool" | "train" | "eval" => {
            let body = section_body(&mut changed.body, &root.name, None, root, full)?;
            set(body, rest, value, full, &root.name)
        }
        "task" | "curriculum" => {
            let (container, inner_kw) = if root.name == "task" {
                (&mut changed.body, "task")
            } else {
                let curriculum = section_body(&mut changed.body, "curriculum", None, root, full)?;
                (curriculum, "stage")
            };
            let Some((name, rest)) = rest.split_first() else {
                return Err(Diagnostic::new(
                    full,
                    format!("name the {inner_kw} to change"),
                    "incomplete path",
                )
                .with_hint(format!("write e.g. `ablate {}.NAME.KEY = ...`", root.name)));
            };
            let body = section_body(container, inner_kw, Some(name), root, full)?;
            set(body, rest, value, full, inner_kw)
        }
        other => Err(Diagnostic::new(
            root.span,
            format!("unknown ablation target `{other}`"),
            "not a key or block of the experiment",
        )
        .with_hint(
            suggest(other, ROOTS.iter().copied())
                .unwrap_or_else(|| format!("a path starts with {}", one_of(ROOTS))),
        )),
    }?;
    Ok(changed)
}

/// The body of `keyword [name] { ... }` in `block`; `pool` and `eval` are created when absent,
/// since a file may leave them at their defaults.
fn section_body<'a>(
    block: &'a mut Block,
    keyword: &str,
    name: Option<&Ident>,
    root: &Ident,
    full: Span,
) -> Result<&'a mut Block, Diagnostic> {
    let names: Vec<String> = block
        .items
        .iter()
        .filter_map(|item| match &item.kind {
            ItemKind::Section {
                keyword: k,
                name: Some(n),
                ..
            } if k.name == keyword => Some(n.name.clone()),
            _ => None,
        })
        .collect();
    let position = block.items.iter().position(|item| match &item.kind {
        ItemKind::Section {
            keyword: k,
            name: n,
            ..
        } => {
            k.name == keyword
                && name.is_none_or(|want| n.as_ref().is_some_and(|n| n.name == want.name))
        }
        _ => false,
    });
    let index = match position {
        Some(i) => i,
        None if matches!(keyword, "pool" | "eval" | "curriculum") && name.is_none() => {
            block.items.push(Item {
                kind: ItemKind::Section {
                    keyword: Ident {
                        name: keyword.to_string(),
                        span: root.span,
                    },
                    name: None,
                    body: Block {
                        items: Vec::new(),
                        span: full,
                    },
                },
                span: full,
            });
            block.items.len() - 1
        }
        None => {
            return Err(match name {
                Some(name) => {
                    let hint =
                        suggest(&name.name, names.iter().map(String::as_str)).or_else(|| {
                            (!names.is_empty()).then(|| {
                                let list: Vec<&str> = names.iter().map(String::as_str).collect();
                                format!("the {keyword}s are {}", one_of(&list))
                            })
                        });
                    Diagnostic::new(
                        name.span,
                        format!("no {keyword} `{}` to ablate", name.name),
                        format!("no such {keyword}"),
                    )
                    .with_hint_opt(hint)
                }
                None => Diagnostic::new(
                    root.span,
                    format!("no `{keyword}` block to ablate"),
                    "not in the experiment",
                ),
            });
        }
    };
    match &mut block.items[index].kind {
        ItemKind::Section { body, .. } => Ok(body),
        _ => Err(Diagnostic::new(root.span, "not a block", "not a block")),
    }
}

/// Sets `path` (relative to `block`) to `value`, walking into values with blocks
/// (`arch = transformer { ... }`, `stale = 1 { ... }`, `optimizer = adamw`).
fn set(
    block: &mut Block,
    path: &[Ident],
    value: &Value,
    full: Span,
    ctx: &str,
) -> Result<(), Diagnostic> {
    let Some((key, rest)) = path.split_first() else {
        return Err(Diagnostic::new(
            full,
            format!("`{ctx}` is a block; name a key inside it"),
            "not a key",
        )
        .with_hint(format!("write e.g. `ablate {ctx}.KEY = ...`")));
    };
    let existing = block
        .items
        .iter_mut()
        .rev()
        .find_map(|item| match &mut item.kind {
            ItemKind::Assign { key: k, value } if k.name == key.name => Some(value),
            _ => None,
        });
    match (existing, rest.is_empty()) {
        (Some(slot), true) => {
            *slot = value.clone();
            Ok(())
        }
        (None, true) => {
            block.items.push(Item {
                kind: ItemKind::Assign {
                    key: key.clone(),
                    value: value.clone(),
                },
                span: full.to(value.span),
            });
            Ok(())
        }
        (Some(slot), false) => {
            if !matches!(slot.kind, ValueKind::Ctor { .. }) {
                let head = slot.clone();
                *slot = Value {
                    kind: ValueKind::Ctor {
                        head: Box::new(head),
                        body: Block {
                            items: Vec::new(),
                            span: full,
                        },
                    },
                    span: slot.span,
                };
            }
            match &mut slot.kind {
                ValueKind::Ctor { body, .. } => set(body, rest, value, full, &key.name),
                _ => Err(Diagnostic::new(key.span, "not a block", "not a block")),
            }
        }
        (None, false) => Err(Diagnostic::new(
            key.span,
            format!(
                "`{ctx}.{}` is not set, so it has no `{}` to change",
                key.name, rest[0].name
            ),
            "not set in the experiment",
        )
        .with_hint(format!(
            "set `{}` in `{ctx}` first, then ablate the key inside it",
            key.name
        ))),
    }
}
