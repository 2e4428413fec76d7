//! `algorithm KIND { ... }`: the advantage estimator and the loss.

use crate::ast::{Ident, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{
    AdvantageNorm, Aggregation, Algorithm, AlgorithmKind, Clip, Credit, Filter, Kl, KlEstimator,
    KlPlacement, Model, Schedule, SftSource, ValueHead,
};

use super::table::Interval;
use super::{Checker, Section};

const KINDS: [(&str, AlgorithmKind); 6] = [
    ("grpo", AlgorithmKind::Grpo),
    ("dr_grpo", AlgorithmKind::DrGrpo),
    ("rloo", AlgorithmKind::Rloo),
    ("reinforce_pp", AlgorithmKind::ReinforcePp),
    ("reinforce_pp_baseline", AlgorithmKind::ReinforcePpBaseline),
    ("ppo", AlgorithmKind::Ppo),
];

const KEYS: &[&str] = &[
    "group_size",
    "clip",
    "dual_clip",
    "kl",
    "entropy",
    "advantage_norm",
    "aggregation",
    "sft",
    "sft_from",
    "is_cap",
    "filter",
    "negative_weight",
    "credit",
    "gamma",
    "lambda",
    "epochs",
    "grad_clip",
    "value_clip",
    "value_coef",
];

const KL_ESTIMATORS: [(&str, KlEstimator); 5] = [
    ("k1", KlEstimator::K1),
    ("k2", KlEstimator::K2),
    ("k3", KlEstimator::K3),
    ("low_var_kl", KlEstimator::K3),
    ("abs", KlEstimator::Abs),
];

impl Checker {
    pub(super) fn algorithm(
        &mut self,
        section: Section<'_>,
        model: Option<&Model>,
    ) -> Option<Algorithm> {
        let kind_ident = section.name?;
        let kind = self.algorithm_kind(kind_ident);
        let table = self.table(section.body, "algorithm", KEYS);
        let grouped = kind.is_some_and(AlgorithmKind::is_grouped);
        // An unknown kind is already an error; GRPO's defaults (a group of 8) still let the
        // keys be checked against each other.
        let defaults = Algorithm::defaults(kind.unwrap_or(AlgorithmKind::Grpo));

        if let (Some(AlgorithmKind::Ppo), Some(model)) = (kind, model)
            && model.value_head == ValueHead::None
        {
            self.error(
                Diagnostic::new(kind_ident.span, "PPO needs a value head", "needs a critic")
                    .with_hint(format!(
                        "add `value_head = shared` (or `separate`) to `model {}`",
                        model.name
                    )),
            );
        }

        let group_size = match table.get("group_size") {
            Some(v) => {
                let size = self.size("group_size", v, 1);
                match (size, kind) {
                    (Some(n), Some(k)) if grouped && n < 2 => {
                        self.out_of_range(
                            "group_size",
                            v.span,
                            format!("at least 2 for {}", k.name()),
                            Some(format!(
                                "{} compares the trajectories of a group with each other; a group \
                                 of {n} has nothing to compare with",
                                k.name().to_uppercase()
                            )),
                        );
                        None
                    }
                    _ => size,
                }
            }
            None => Some(defaults.group_size),
        };
        let clip = match table.get("clip") {
            Some(v) => self.clip(v),
            None => Some(defaults.clip),
        };
        let dual_clip = match table.get("dual_clip") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self
                .number_in("dual_clip", v, Interval::above(1.0))
                .map(Some),
            None => Some(defaults.dual_clip),
        };
        let kl = match table.get("kl") {
            Some(v) => self.kl(v),
            None => Some(defaults.kl),
        };
        let entropy = match table.get("entropy") {
            Some(v) => self.number_in("entropy", v, Interval::at_least(0.0)),
            None => Some(defaults.entropy),
        };
        let advantage_norm = match table.get("advantage_norm") {
            Some(v) => self.choice(
                "advantage_norm",
                v,
                &[
                    ("none", AdvantageNorm::None),
                    ("group", AdvantageNorm::Group),
                    ("batch", AdvantageNorm::Batch),
                    ("per_task", AdvantageNorm::PerTask),
                ],
            ),
            None => Some(defaults.advantage_norm),
        };
        if let (Some(AlgorithmKind::DrGrpo), Some(v), Some(AdvantageNorm::Group)) =
            (kind, table.get("advantage_norm"), advantage_norm)
        {
            self.error(
                Diagnostic::new(
                    v.span,
                    "`advantage_norm = group` undoes Dr. GRPO",
                    "divides by the group's std again",
                )
                .with_hint(
                    "Dr. GRPO is GRPO without the division by the group's std; use `algorithm \
                     grpo` for that, or `none`, `batch` or `per_task` here",
                ),
            );
        }
        let aggregation = match table.get("aggregation") {
            Some(v) => self.choice(
                "aggregation",
                v,
                &[
                    ("token_mean", Aggregation::TokenMean),
                    ("seq_mean_token_sum", Aggregation::SeqMeanTokenSum),
                    ("seq_mean_token_mean", Aggregation::SeqMeanTokenMean),
                ],
            ),
            None => Some(defaults.aggregation),
        };
        let sft = match table.get("sft") {
            Some(v) => self.schedule("sft", v),
            None => Some(defaults.sft),
        };
        let sft_from = match table.get("sft_from") {
            Some(v) => self.sft_source(v),
            None => Some(defaults.sft_from),
        };
        let is_cap = match table.get("is_cap") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self
                .number_in("is_cap", v, Interval::at_least(1.0))
                .map(Some),
            None => Some(defaults.is_cap),
        };
        let filter = match table.get("filter") {
            Some(v) => self.filter(v),
            None => Some(defaults.filter),
        };
        let negative_weight = match table.get("negative_weight") {
            Some(v) => self.number_in("negative_weight", v, Interval::new(0.0, false, 1.0, false)),
            None => Some(defaults.negative_weight),
        };
        let credit = match table.get("credit") {
            Some(v) => self.credit(v, kind),
            None => Some(defaults.credit),
        };
        let gamma = match table.get("gamma") {
            Some(v) => self.number_in("gamma", v, Interval::new(0.0, true, 1.0, false)),
            None => Some(defaults.gamma),
        };
        let lambda = match table.get("lambda") {
            Some(v) => self.number_in("lambda", v, Interval::new(0.0, false, 1.0, false)),
            None => Some(defaults.lambda),
        };
        let epochs = match table.get("epochs") {
            Some(v) => self.size("epochs", v, 1),
            None => Some(defaults.epochs),
        };
        let value_clip = match table.get("value_clip") {
            Some(v) => self.ppo_only("value_clip", v, kind, Interval::above(0.0)),
            None => Some(defaults.value_clip),
        };
        let value_coef = match table.get("value_coef") {
            Some(v) if model.is_some_and(|m| m.value_head == ValueHead::Separate) => {
                self.error(
                    Diagnostic::new(
                        v.span,
                        "`value_coef` does not apply to a separate critic",
                        "not used with `value_head = separate`",
                    )
                    .with_hint(
                        "a separate critic has its own optimizer, so its loss is not added to \
                         the policy's; remove `value_coef` (or use `value_head = shared`)",
                    ),
                );
                None
            }
            Some(v) => self.ppo_only("value_coef", v, kind, Interval::at_least(0.0)),
            None => Some(defaults.value_coef),
        };
        let grad_clip = match table.get("grad_clip") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self
                .number_in("grad_clip", v, Interval::above(0.0))
                .map(Some),
            None => Some(defaults.grad_clip),
        };
        // Keys that cannot work with groups of one episode.
        if group_size == Some(1) {
            if let (Some(v), Some(AdvantageNorm::Group)) =
                (table.get("advantage_norm"), advantage_norm)
            {
                self.error(
                    Diagnostic::new(
                        v.span,
                        "`advantage_norm = group` needs groups",
                        "every group has one episode",
                    )
                    .with_hint(
                        "normalizing a group of one episode sets all its advantages to 0; use \
                         `batch` or `per_task`, or a `group_size` of 2 or more",
                    ),
                );
            }
            if let (Some(v), Some(Filter::RewardStd { .. })) = (table.get("filter"), filter) {
                self.error(
                    Diagnostic::new(
                        v.span,
                        "`filter = reward_std(...)` needs groups",
                        "every group has one episode",
                    )
                    .with_hint(
                        "a group of one has no reward spread to rank by; remove the filter, or \
                         set `group_size` to 2 or more",
                    ),
                );
            }
        }
        if let (Some(kind), Some(model)) = (kind, model)
            && kind != AlgorithmKind::Ppo
            && model.value_head != ValueHead::None
        {
            self.error(
                Diagnostic::new(
                    kind_ident.span,
                    format!("{} does not use a value head", kind.name()),
                    "no critic here",
                )
                .with_hint(format!(
                    "only PPO trains a critic; remove `value_head` from `model {}`, or use \
                     `algorithm ppo`",
                    model.name
                )),
            );
        }
        Some(Algorithm {
            kind: kind?,
            group_size: group_size?,
            clip: clip?,
            dual_clip: dual_clip?,
            kl: kl?,
            entropy: entropy?,
            advantage_norm: advantage_norm?,
            aggregation: aggregation?,
            sft: sft?,
            sft_from: sft_from?,
            is_cap: is_cap?,
            filter: filter?,
            negative_weight: negative_weight?,
            credit: credit?,
            gamma: gamma?,
            lambda: lambda?,
            epochs: epochs?,
            grad_clip: grad_clip?,
            value_clip: value_clip?,
            value_coef: value_coef?,
        })
    }

    /// A number in `interval` for a key only PPO's critic reads; an error for other algorithms.
    fn ppo_only(
        &mut self,
        key: &str,
        value: &Value,
        kind: Option<AlgorithmKind>,
        interval: Interval,
    ) -> Option<f64> {
        let x = self.number_in(key, value, interval)?;
        match kind {
            Some(AlgorithmKind::Ppo) | None => Some(x),
            Some(other) => {
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("`{key}` is only used by PPO"),
                        format!("{} has no critic", other.name()),
                    )
                    .with_hint(format!(
                        "`{key}` tunes PPO's value loss; remove it, or use `algorithm ppo` with \
                         a `value_head`"
                    )),
                );
                None
            }
        }
    }

    fn algorithm_kind(&mut self, ident: &Ident) -> Option<AlgorithmKind> {
        if let Some((_, kind)) = KINDS.iter().find(|(n, _)| *n == ident.name) {
            return Some(*kind);
        }
        let names: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
        let hint = suggest(&ident.name, names.iter().copied())
            .unwrap_or_else(|| format!("the algorithms are {}", one_of(&names)));
        self.error(
            Diagnostic::new(
                ident.span,
                format!("unknown algorithm `{}`", ident.name),
                "unknown algorithm",
            )
            .with_hint(hint),
        );
        None
    }

    /// `clip = e` or `clip = low .. high`, both in (0, 1), low <= high.
    fn clip(&mut self, value: &Value) -> Option<Clip> {
        let open_unit = Interval::new(0.0, true, 1.0, true);
        let (low, high) = match &value.kind {
            ValueKind::Range(lo, hi) => (
                self.number_in("clip", lo, open_unit),
                self.number_in("clip", hi, open_unit),
            ),
            _ => {
                let e = self.number_in("clip", value, open_unit);
                (e, e)
            }
        };
        let (low, high) = (low?, high?);
        if low > high {
            self.error(
                Diagnostic::new(
                    value.span,
                    format!("`clip` low ({low}) is above high ({high})"),
                    "low bound first",
                )
                .with_hint(format!(
                    "ratios are kept in [1 - low, 1 + high]; write `clip = {high} .. {low}`"
                )),
            );
            return None;
        }
        Some(Clip { low, high })
    }

    /// `kl = none | k1(c) | k2(c) | k3(c) | low_var_kl(c) | abs(c)`, optional `as = reward`.
    fn kl(&mut self, value: &Value) -> Option<Kl> {
        let names: Vec<&str> = KL_ESTIMATORS.iter().map(|(n, _)| *n).collect();
        match &value.kind {
            ValueKind::Ident(n) if n == "none" => Some(Kl::NONE),
            ValueKind::Ident(n) if names.contains(&n.as_str()) => {
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("`{n}` needs a coefficient"),
                        "no coefficient",
                    )
                    .with_hint(format!("write `kl = {n}(0.001)`")),
                );
                None
            }
            ValueKind::Call { name, args } => {
                let Some((_, estimator)) = KL_ESTIMATORS.iter().find(|(n, _)| *n == name.name)
                else {
                    let hint = suggest(&name.name, names.iter().copied()).unwrap_or_else(|| {
                        format!("the estimators are {}, or `none`", one_of(&names))
                    });
                    self.error(
                        Diagnostic::new(
                            name.span,
                            format!("unknown KL estimator `{}`", name.name),
                            "unknown estimator",
                        )
                        .with_hint(hint),
                    );
                    return None;
                };
                let args = self.args(name, args, 1, &["as"])?;
                let coef = match args.positional.first() {
                    Some(v) => self.number_in("kl", v, Interval::at_least(0.0)),
                    None => {
                        self.error(
                            Diagnostic::new(
                                value.span,
                                format!("`{}` needs a coefficient", name.name),
                                "no coefficient",
                            )
                            .with_hint(format!("write `kl = {}(0.001)`", name.name)),
                        );
                        None
                    }
                };
                let placement = match args.named("as") {
                    Some(v) => self.choice(
                        "as",
                        v,
                        &[("loss", KlPlacement::Loss), ("reward", KlPlacement::Reward)],
                    ),
                    None => Some(KlPlacement::default()),
                };
                Some(Kl {
                    estimator: Some(*estimator),
                    coef: coef?,
                    placement: placement?,
                })
            }
            _ => {
                self.wrong_type(
                    "kl",
                    value,
                    "`none` or an estimator such as `low_var_kl(0.001)`",
                );
                None
            }
        }
    }

    /// `credit = outcome | turn | monte_carlo(k = K, turns = a .. b)`.
    fn credit(&mut self, value: &Value, kind: Option<AlgorithmKind>) -> Option<Credit> {
        let ValueKind::Call { name, args } = &value.kind else {
            return self.choice(
                "credit",
                value,
                &[("outcome", Credit::Outcome), ("turn", Credit::Turn)],
            );
        };
        if name.name != "monte_carlo" {
            let names = ["outcome", "turn", "monte_carlo"];
            let hint = suggest(&name.name, names).unwrap_or_else(|| {
                "credit is `outcome`, `turn` or `monte_carlo(k = 4, turns = 0 .. 2)`".into()
            });
            self.error(
                Diagnostic::new(
                    name.span,
                    format!("unknown credit `{}`", name.name),
                    "unknown credit",
                )
                .with_hint(hint),
            );
            return None;
        }
        let args = self.args(name, args, 0, &["k", "turns"])?;
        let k = match args.named("k") {
            Some(v) => self.size("k", v, 1),
            None => {
                self.error(
                    Diagnostic::new(value.span, "`monte_carlo` needs `k`", "no `k`")
                        .with_hint("write `credit = monte_carlo(k = 4)`: continuations per state"),
                );
                None
            }
        };
        let (first, last) = match args.named("turns").map(|v| (v, &v.kind)) {
            None => {
                let (first, last) = Credit::DEFAULT_TURNS;
                (Some(first), Some(last))
            }
            Some((_, ValueKind::Range(lo, hi))) => {
                let lo_span = lo.span;
                let (first, last) = (self.uint32("turns", lo, 0), self.uint32("turns", hi, 0));
                match (first, last) {
                    (Some(a), Some(b)) if a > b => {
                        self.error(
                            Diagnostic::new(
                                lo_span.to(hi.span),
                                format!("`turns` range `{a} .. {b}` is reversed"),
                                "first boundary first",
                            )
                            .with_hint(format!("write `turns = {b} .. {a}`")),
                        );
                        (None, None)
                    }
                    (a, b) => (a, b.map(Some)),
                }
            }
            Some((v, _)) => {
                let at = self.uint32("turns", v, 0);
                (at, at.map(Some))
            }
        };
        if let Some(other) = kind.filter(|k| *k != AlgorithmKind::ReinforcePp) {
            self.error(
                Diagnostic::new(
                    value.span,
                    format!("Monte-Carlo credit does not combine with {}", other.name()),
                    "its estimates are the baseline",
                )
                .with_hint(
                    "the Monte-Carlo values replace the estimator's baseline; use `algorithm \
                     reinforce_pp`, whose only normalization is whitening over the batch",
                ),
            );
            return None;
        }
        Some(Credit::MonteCarlo {
            k: k?,
            first: first?,
            last: last?,
        })
    }

    /// `sft_from = oracle | successes | successes(keep = n)`.
    fn sft_source(&mut self, value: &Value) -> Option<SftSource> {
        let source = match &value.kind {
            ValueKind::Ident(n) if n == "oracle" => SftSource::Oracle,
            ValueKind::Ident(n) if n == "successes" => SftSource::Successes {
                keep: SftSource::DEFAULT_KEEP,
            },
            ValueKind::Call { name, args } if name.name == "successes" => {
                let args = self.args(name, args, 0, &["keep"])?;
                let keep = match args.named("keep") {
                    Some(v) => self.size("keep", v, 1)?,
                    None => SftSource::DEFAULT_KEEP,
                };
                SftSource::Successes { keep }
            }
            ValueKind::Ident(n)
            | ValueKind::Call {
                name: Ident { name: n, .. },
                ..
            } => {
                let hint = suggest(n, ["oracle", "successes"])
                    .unwrap_or_else(|| "the sources are `oracle` and `successes(keep = n)`".into());
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("unknown SFT source `{n}`"),
                        "unknown source",
                    )
                    .with_hint(hint),
                );
                return None;
            }
            _ => {
                self.wrong_type("sft_from", value, "`oracle` or `successes(keep = n)`");
                return None;
            }
        };
        Some(source)
    }

    /// `filter = none | reward_std(keep = f)`.
    fn filter(&mut self, value: &Value) -> Option<Filter> {
        match &value.kind {
            ValueKind::Ident(n) if n == "none" => Some(Filter::None),
            ValueKind::Call { name, args } if name.name == "reward_std" => {
                let args = self.args(name, args, 1, &["keep"])?;
                let keep = match (args.positional.first().copied(), args.named("keep")) {
                    (Some(v), None) | (None, Some(v)) => v,
                    (Some(_), Some(v)) => {
                        self.error(Diagnostic::new(
                            v.span,
                            "`keep` is given twice",
                            "given again here",
                        ));
                        return None;
                    }
                    (None, None) => {
                        self.error(
                            Diagnostic::new(value.span, "`reward_std` needs `keep`", "no `keep`")
                                .with_hint("write `filter = reward_std(keep = 0.75)`"),
                        );
                        return None;
                    }
                };
                let keep = self.number_in("keep", keep, Interval::new(0.0, true, 1.0, false))?;
                Some(Filter::RewardStd { keep })
            }
            ValueKind::Call { name, .. } => {
                let hint = suggest(&name.name, ["reward_std"])
                    .unwrap_or_else(|| "the filters are `none` and `reward_std(keep = f)`".into());
                self.error(
                    Diagnostic::new(
                        name.span,
                        format!("unknown filter `{}`", name.name),
                        "unknown filter",
                    )
                    .with_hint(hint),
                );
                None
            }
            _ => {
                self.wrong_type("filter", value, "`none` or `reward_std(keep = f)`");
                None
            }
        }
    }

    /// A number, `constant(a)`, `linear(a -> b, over = n)`, `cosine(a -> b, over = n)` or
    /// `step(a -> b, at = n)`; every value at least 0.
    pub(super) fn schedule(&mut self, key: &str, value: &Value) -> Option<Schedule> {
        self.schedule_in(key, value, Interval::at_least(0.0))
    }

    /// [`Self::schedule`] with every value in `weight`.
    pub(super) fn schedule_in(
        &mut self,
        key: &str,
        value: &Value,
        weight: Interval,
    ) -> Option<Schedule> {
        let ValueKind::Call { name, args } = &value.kind else {
            if matches!(value.kind, ValueKind::Int(_) | ValueKind::Float(_)) {
                return self.number_in(key, value, weight).map(Schedule::Constant);
            }
            self.wrong_type(
                key,
                value,
                "a number or a schedule (`constant`, `linear`, `cosine`, `step`)",
            );
            return None;
        };
        let shapes = ["constant", "linear", "cosine", "step"];
        let ramp_key = match name.name.as_str() {
            "constant" => {
                let args = self.args(name, args, 1, &[])?;
                let Some(v) = args.positional.first() else {
                    self.error(
                        Diagnostic::new(value.span, "`constant` needs a value", "no value")
                            .with_hint(format!(
                                "write `{key} = constant(0.5)` or just `{key} = 0.5`"
                            )),
                    );
                    return None;
                };
                return self.number_in(key, v, weight).map(Schedule::Constant);
            }
            "linear" | "cosine" => "over",
            "step" => "at",
            other => {
                let hint = suggest(other, shapes).unwrap_or_else(|| {
                    format!("a schedule is a number or one of {}", one_of(&shapes))
                });
                self.error(
                    Diagnostic::new(
                        name.span,
                        format!("unknown schedule `{other}`"),
                        "unknown schedule",
                    )
                    .with_hint(hint),
                );
                return None;
            }
        };
        // A weight ramps down to 0; a learning rate, which cannot be 0, to a tenth.
        let example_ends = if weight.contains(0.0) {
            "0.5 -> 0.0"
        } else {
            "3e-3 -> 3e-4"
        };
        let example = format!("{}({example_ends}, {ramp_key} = 200)", name.name);
        let args = self.args(name, args, 1, &[ramp_key])?;
        let ends = match args.positional.first().map(|v| (v, &v.kind)) {
            Some((_, ValueKind::Arrow(a, b))) => {
                let from = self.number_in(key, a, weight);
                let to = self.number_in(key, b, weight);
                from.zip(to)
            }
            Some((v, _)) => {
                self.wrong_type(key, v, "`from -> to`");
                if let Some(last) = self.errors.last_mut() {
                    last.hint = Some(format!("write `{key} = {example}`"));
                }
                None
            }
            None => {
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("`{}` needs `from -> to`", name.name),
                        "no values",
                    )
                    .with_hint(format!("write `{key} = {example}`")),
                );
                None
            }
        };
        let steps = match args.named(ramp_key) {
            Some(v) => self.uint(ramp_key, v, u64::from(ramp_key == "over")),
            None => {
                self.error(
                    Diagnostic::new(
                        value.span,
                        format!("`{}` needs `{ramp_key} = STEPS`", name.name),
                        format!("no `{ramp_key}`"),
                    )
                    .with_hint(format!("write `{key} = {example}`")),
                );
                None
            }
        };
        let ((from, to), steps) = (ends?, steps?);
        Some(match name.name.as_str() {
            "linear" => Schedule::Linear {
                from,
                to,
                over: steps,
            },
            "cosine" => Schedule::Cosine {
                from,
                to,
                over: steps,
            },
            _ => Schedule::Step {
                from,
                to,
                at: steps,
            },
        })
    }
}
