//! `sweep { seeds = [...], ablate key.path = value, specialists = true | by_weight, base = false }`.
//!
//! An ablation (or a specialist: the experiment with one task alone) is applied to the syntax
//! tree (the key is replaced, or added when the base leaves it at its default) and the changed
//! experiment goes through the whole checker again, so an ablation can never produce an
//! experiment that would not have checked as a file. `specialists = by_weight` resizes each
//! specialist the same way (its warm-up and RL batch set in the tree, then checked again).

use crate::ast::{Arg, Block, ExperimentDecl, Ident, Item, ItemKind, Span, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{Ablation, Experiment, Schedule, Specialist, Sweep};

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
        // `specialists` (`None` for `false`) and `base`: the value and the key (for errors
        // about it), once each.
        let mut specialists_flag: Option<(Option<Sizing>, &Ident)> = None;
        let mut base_flag: Option<(bool, &Ident)> = None;
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
                ItemKind::Assign { key, value } if key.name == "specialists" => {
                    if specialists_flag.is_some() {
                        self.duplicate_key(key, "sweep");
                        ok = false;
                        continue;
                    }
                    match self.sizing(value) {
                        Some(sizing) => specialists_flag = Some((sizing, key)),
                        None => ok = false,
                    }
                }
                ItemKind::Assign { key, value } if key.name == "base" => {
                    if base_flag.is_some() {
                        self.duplicate_key(key, "sweep");
                        ok = false;
                        continue;
                    }
                    match self.boolean(&key.name, value) {
                        Some(b) => base_flag = Some((b, key)),
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
        let specialists = match specialists_flag {
            Some((Some(sizing), key)) if base_ok => self.specialists(decl, key, sizing),
            _ => Some(Vec::new()),
        };
        let base = base_flag.map_or(Sweep::DEFAULT_BASE, |(b, _)| b);
        if let Some((false, key)) = base_flag {
            let others =
                ablations.len() + usize::from(matches!(specialists_flag, Some((Some(_), _))));
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

    /// `specialists = true | false | by_weight`: how each specialist is sized, `None` for none.
    fn sizing(&mut self, value: &Value) -> Option<Option<Sizing>> {
        match &value.kind {
            ValueKind::Bool(b) => Some(b.then_some(Sizing::AsWritten)),
            ValueKind::Ident(name) if name == "by_weight" => Some(Some(Sizing::ByWeight)),
            ValueKind::Ident(name) => {
                let hint = suggest(name, ["by_weight", "true", "false"]).unwrap_or_else(|| {
                    "`specialists` is `true`, `false` or `by_weight`".to_string()
                });
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("unknown value `{name}` for `specialists`"),
                        "not one of the choices",
                    )
                    .with_hint(hint),
                );
                None
            }
            _ => {
                self.wrong_type("specialists", value, "`true`, `false` or `by_weight`");
                None
            }
        }
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
    /// nothing to train on, which is an error (at the `specialists` key) rather than a silent
    /// change of what the stage trains on. `by_weight` then resizes each specialist by its
    /// task's share of the weights ([`by_weight`]) and checks it again.
    fn specialists(
        &mut self,
        decl: &ExperimentDecl,
        key: &Ident,
        sizing: Sizing,
    ) -> Option<Vec<Specialist>> {
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
        let mut alone_decls = Vec::new();
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
                Some(experiment) => {
                    specialists.push(Specialist {
                        task: task.name.clone(),
                        experiment: Box::new(experiment),
                    });
                    alone_decls.push(changed);
                }
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        if let Sizing::ByWeight = sizing {
            let weights: Vec<f64> = specialists
                .iter()
                .map(|s| s.experiment.tasks[0].weight)
                .collect();
            let shares = WeightShares::new(&weights);
            if let Err(d) = shares.whole_batches(&specialists, key) {
                self.error(d);
                return None;
            }
            for ((specialist, changed), factor) in specialists
                .iter_mut()
                .zip(&alone_decls)
                .zip(shares.factors())
            {
                let prefix = format!("specialist `{}` (by weight, x{factor:.3})", specialist.task);
                let resized = match by_weight(changed, &specialist.experiment, factor, key) {
                    Ok(resized) => resized,
                    Err(d) => {
                        self.error(d);
                        ok = false;
                        continue;
                    }
                };
                match self.recheck(
                    &resized,
                    key.span,
                    &prefix,
                    "the specialist resized by its weight does not check",
                ) {
                    Some(experiment) => *specialist.experiment = experiment,
                    None => ok = false,
                }
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

/// How `specialists` sizes each specialist.
#[derive(Clone, Copy, Debug)]
enum Sizing {
    /// `true`: the file's sizes as written.
    AsWritten,
    /// `by_weight`: the file's sizes times the task's [`WeightShares`] factor.
    ByWeight,
}

/// Each task's weight against an equal split, `weight × tasks / Σ weights` (1 for every task
/// when the weights are equal): a file sized for one task in `n` (the multi-task run's batches
/// divided by the number of tasks, say) is sized for task `i` when multiplied by factor `i`,
/// since the multi-task run draws task `i` with probability `weight_i / Σ weights`.
struct WeightShares(Vec<f64>);

impl WeightShares {
    fn new(weights: &[f64]) -> Self {
        let total: f64 = weights.iter().sum();
        let n = weights.len() as f64;
        Self(weights.iter().map(|w| w * n / total).collect())
    }

    fn factors(&self) -> impl Iterator<Item = f64> + '_ {
        self.0.iter().copied()
    }

    /// An error at `key` unless every specialist's RL batch, `batch × factor`, is a whole
    /// number of groups; its hint names the smallest `batch` for which all of them are. A
    /// specialist with no RL steps has no batch to divide.
    fn whole_batches(&self, specialists: &[Specialist], key: &Ident) -> Result<(), Diagnostic> {
        for (specialist, factor) in specialists.iter().zip(self.factors()) {
            let experiment = &specialist.experiment;
            let (batch, group) = (experiment.train.batch, experiment.algorithm.group_size);
            if experiment.train.steps == 0 || scaled_batch(batch, factor, group).is_some() {
                continue;
            }
            let exact = batch as f64 * factor;
            let groups = if group > 1 {
                format!("a whole number of groups of {group}")
            } else {
                "a whole number".to_string()
            };
            let hint = match self.smallest_whole_batch(group) {
                Some((base, each)) => {
                    let each: Vec<String> = specialists
                        .iter()
                        .zip(each)
                        .map(|(s, b)| format!("{} {b}", s.task))
                        .collect();
                    format!(
                        "with `batch = {base}` in `train` every specialist's batch is {groups} \
                         ({})",
                        each.join(", ")
                    )
                }
                None => "give the tasks weights in simple ratios (1 and 2, say), so that \
                         some batch divides among them"
                    .to_string(),
            };
            return Err(Diagnostic::new(
                key.span,
                format!(
                    "specialist `{}`: `specialists = by_weight` makes its RL batch {} \
                     (`batch = {batch}` x {factor:.3}), not {groups}",
                    specialist.task,
                    trimmed(exact)
                ),
                "specialists sized by weight are asked for here",
            )
            .with_hint(hint));
        }
        Ok(())
    }

    /// The smallest base batch (a multiple of `group`, up to 4096 groups) whose every scaled
    /// batch is whole, with those batches.
    fn smallest_whole_batch(&self, group: usize) -> Option<(usize, Vec<usize>)> {
        (1..=4096).map(|k| k * group).find_map(|base| {
            let each: Option<Vec<usize>> = self
                .factors()
                .map(|f| scaled_batch(base, f, group))
                .collect();
            each.map(|each| (base, each))
        })
    }
}

/// `batch × factor` when it is a whole, positive number of groups of `group`.
fn scaled_batch(batch: usize, factor: f64, group: usize) -> Option<usize> {
    let exact = batch as f64 * factor;
    let whole = exact.round();
    let scaled = whole as usize;
    ((exact - whole).abs() <= 1e-9 * exact.max(1.0)
        && scaled >= 1
        && scaled.is_multiple_of(group.max(1)))
    .then_some(scaled)
}

/// `x` with at most two decimals and no trailing zeros: `13.33`, `6`.
fn trimmed(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `specialists = by_weight`: the single-task `decl` (checked as `experiment`) with its data
/// scaled by `factor`: the warm-up's steps, its demonstrations and its rate schedule's step
/// counts (rounded; at least 1 step and demonstration), and, when it has RL steps, its RL
/// batch (already known to be whole, [`WeightShares::whole_batches`]). The batches of the
/// warm-up and the RL step count stay as written, so every optimizer step is the same size
/// and the RL schedules (curriculum stages, refreshes, evaluations) keep their meaning.
fn by_weight(
    decl: &ExperimentDecl,
    experiment: &Experiment,
    factor: f64,
    key: &Ident,
) -> Result<ExperimentDecl, Diagnostic> {
    let span = key.span;
    let path = |names: &[&str]| -> Vec<Ident> {
        names
            .iter()
            .map(|name| Ident {
                name: (*name).to_string(),
                span,
            })
            .collect()
    };
    let int = |n: u64| Value {
        kind: ValueKind::Int(n.into()),
        span,
    };
    let scale = |n: u64| (n as f64 * factor).round() as u64;
    let mut resized = decl.clone();
    let train = section_body(&mut resized.body, "train", None, key, span)?;
    if let Some(warmup) = &experiment.train.warmup {
        let steps = scale(warmup.steps).max(1);
        set(
            train,
            &path(&["warmup", "steps"]),
            &int(steps),
            span,
            "train",
        )?;
        let demonstrations = scale(warmup.demonstrations as u64).max(1);
        set(
            train,
            &path(&["warmup", "demonstrations"]),
            &int(demonstrations),
            span,
            "train",
        )?;
        let lr = match warmup.lr {
            Schedule::Constant(_) => None,
            Schedule::Linear { from, to, over } => {
                Some(("linear", from, to, "over", scale(over).max(1)))
            }
            Schedule::Cosine { from, to, over } => {
                Some(("cosine", from, to, "over", scale(over).max(1)))
            }
            Schedule::Step { from, to, at } => Some(("step", from, to, "at", scale(at))),
        };
        if let Some((shape, from, to, ramp, steps)) = lr {
            let schedule = schedule_value(shape, (from, to), (ramp, steps), span);
            set(train, &path(&["warmup", "lr"]), &schedule, span, "train")?;
        }
    }
    if experiment.train.steps > 0 {
        let (batch, group) = (experiment.train.batch, experiment.algorithm.group_size);
        if let Some(batch) = scaled_batch(batch, factor, group) {
            set(train, &path(&["batch"]), &int(batch as u64), span, "train")?;
        }
    }
    Ok(resized)
}

/// The syntax of a rate schedule `shape(from -> to, ramp = steps)` (`cosine(3e-3 -> 3e-4, over =
/// 8000)`), all of it at `span`.
fn schedule_value(
    shape: &str,
    (from, to): (f64, f64),
    (ramp, steps): (&str, u64),
    span: Span,
) -> Value {
    let ident = |name: &str| Ident {
        name: name.to_string(),
        span,
    };
    let value = |kind| Value { kind, span };
    let float = |x| Box::new(value(ValueKind::Float(x)));
    value(ValueKind::Call {
        name: ident(shape),
        args: vec![
            Arg {
                name: None,
                value: value(ValueKind::Arrow(float(from), float(to))),
                span,
            },
            Arg {
                name: Some(ident(ramp)),
                value: value(ValueKind::Int(steps.into())),
                span,
            },
        ],
    })
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
