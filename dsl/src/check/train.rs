//! `train { ... }` and `eval { ... }`.

use crate::ast::{Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{Eval, EvalDecoding, Optimizer, Schedule, Train, Warmup};

use super::table::Interval;
use super::{Checker, Section};

const OPTIMIZERS: &[&str] = &["adamw", "adam", "sgd"];

impl Checker {
    pub(super) fn train(
        &mut self,
        section: Section<'_>,
        group_size: Option<usize>,
        lora_dropout: Option<f64>,
    ) -> Option<Train> {
        let keys = [
            "steps",
            "batch",
            "lr",
            "optimizer",
            "temperature",
            "top_p",
            "top_k",
            "stop",
            "max_new_tokens",
            "warmup",
            "checkpoint_every",
            "max_nonfinite_skips",
            "recompute",
            "data_parallel",
        ];
        let table = self.table(section.body, "train", &keys);
        let steps = match table.get("steps") {
            Some(v) => self.uint("steps", v, 0),
            None => {
                self.error(
                    Diagnostic::new(
                        section.keyword.span,
                        "missing `steps` in `train`",
                        "no `steps`",
                    )
                    .with_hint("add the number of RL steps, e.g. `steps = 500`"),
                );
                None
            }
        };
        let batch = match table.get("batch") {
            Some(v) => self.size("batch", v, 1),
            None => Some(Train::DEFAULT_BATCH),
        };
        if let (Some(b), Some(g)) = (batch, group_size)
            && g > 0
            && b % g != 0
        {
            let up = b.div_ceil(g) * g;
            let down = (b / g) * g;
            let nearest = if down >= g && b - down <= up - b {
                down
            } else {
                up
            };
            let span = table.get("batch").map_or(section.keyword.span, |v| v.span);
            self.error(
                Diagnostic::new(
                    span,
                    format!("`batch` ({b}) must be a multiple of `group_size` ({g})"),
                    "not a multiple of `group_size`",
                )
                .with_hint(format!(
                    "a batch holds whole groups; try `batch = {nearest}`"
                )),
            );
        }
        let lr = match table.get("lr") {
            Some(v) => self.number_in("lr", v, Interval::above(0.0)),
            None => Some(Train::DEFAULT_LR),
        };
        let optimizer = match table.get("optimizer") {
            Some(v) => self.optimizer(v),
            None => Some(Optimizer::default()),
        };
        let temperature = match table.get("temperature") {
            Some(v) => self.number_in("temperature", v, Interval::above(0.0)),
            None => Some(Train::DEFAULT_TEMPERATURE),
        };
        let top_p = match table.get("top_p") {
            Some(v) => self.number_in("top_p", v, Interval::new(0.0, true, 1.0, false)),
            None => Some(Train::DEFAULT_TOP_P),
        };
        let top_k = match table.get("top_k") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(
                v @ Value {
                    kind: ValueKind::Int(0),
                    ..
                },
            ) => {
                self.out_of_range(
                    "top_k",
                    v.span,
                    "at least 1".into(),
                    Some(
                        "to sample from the whole vocabulary, write `top_k = none` or leave it out"
                            .into(),
                    ),
                );
                None
            }
            Some(v) => self.size("top_k", v, 1).map(Some),
            None => Some(None),
        };
        let stop = match table.get("stop") {
            Some(v) => self.stop_strings(v),
            None => Some(Vec::new()),
        };
        let max_new_tokens = match table.get("max_new_tokens") {
            Some(v) => self.size("max_new_tokens", v, 1),
            None => Some(Train::DEFAULT_MAX_NEW_TOKENS),
        };
        let warmup = match table.get("warmup") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self.warmup(v, lr).map(Some),
            None => Some(None),
        };
        let checkpoint_every = match table.get("checkpoint_every") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self.uint("checkpoint_every", v, 1).map(Some),
            None => Some(None),
        };
        let max_nonfinite_skips = match table.get("max_nonfinite_skips") {
            Some(v) => self.uint32("max_nonfinite_skips", v, 1),
            None => Some(Train::DEFAULT_MAX_NONFINITE_SKIPS),
        };
        let recompute = match table.get("recompute") {
            Some(v) => self.boolean("recompute", v),
            None => Some(false),
        };
        let data_parallel = match table.get("data_parallel") {
            Some(v) => self
                .int_in("data_parallel", v, 1, Train::MAX_DATA_PARALLEL as i128)
                .and_then(|n| usize::try_from(n).ok()),
            None => Some(Train::DEFAULT_DATA_PARALLEL),
        };
        if let (Some(replicas @ 2..), Some(dropout), Some(value)) =
            (data_parallel, lora_dropout, table.get("data_parallel"))
        {
            // Dropout draws its masks from the backend's one random stream, which replicas on
            // one device would draw from in no fixed order: runs would stop repeating.
            self.error(
                Diagnostic::new(
                    value.span,
                    format!(
                        "`data_parallel = {replicas}` cannot train LoRA with dropout \
                         ({dropout}): the replicas would draw their dropout masks from one \
                         random stream in no fixed order, so a seed would no longer repeat its run"
                    ),
                    "replicas with LoRA dropout",
                )
                .with_hint("set `lora { dropout = 0 }`, or train with `data_parallel = 1`"),
            );
        }
        Some(Train {
            steps: steps?,
            batch: batch?,
            lr: lr?,
            optimizer: optimizer?,
            temperature: temperature?,
            top_p: top_p?,
            top_k: top_k?,
            stop: stop?,
            max_new_tokens: max_new_tokens?,
            warmup: warmup?,
            checkpoint_every: checkpoint_every?,
            max_nonfinite_skips: max_nonfinite_skips?,
            recompute: recompute?,
            data_parallel: data_parallel?,
        })
    }

    /// `stop = ["text", ...]`: non-empty, distinct strings.
    fn stop_strings(&mut self, value: &Value) -> Option<Vec<String>> {
        let ValueKind::List(items) = &value.kind else {
            let hint = match &value.kind {
                ValueKind::Str(s) => Some(format!("write a list: `stop = [{s:?}]`")),
                _ => None,
            };
            self.error(
                Diagnostic::new(
                    value.span,
                    format!(
                        "expected a list of strings for `stop`, found {}",
                        value.describe()
                    ),
                    "expected a list of strings",
                )
                .with_hint_opt(hint),
            );
            return None;
        };
        let mut stop: Vec<String> = Vec::new();
        let mut ok = true;
        for item in items {
            match &item.kind {
                ValueKind::Str(s) if s.is_empty() => {
                    self.error(Diagnostic::new(
                        item.span,
                        "a stop string is empty",
                        "would stop before any token",
                    ));
                    ok = false;
                }
                ValueKind::Str(s) if stop.contains(s) => {
                    self.error(Diagnostic::new(
                        item.span,
                        format!("stop string {s:?} is listed twice"),
                        "listed again here",
                    ));
                    ok = false;
                }
                ValueKind::Str(s) => stop.push(s.clone()),
                _ => {
                    self.wrong_type("stop", item, "a string");
                    ok = false;
                }
            }
        }
        ok.then_some(stop)
    }

    /// `adamw`, `adamw { weight_decay, beta1, beta2 }`, `adam { beta1, beta2 }`,
    /// `sgd { momentum }`.
    fn optimizer(&mut self, value: &Value) -> Option<Optimizer> {
        let (head, body) = self.constructor(
            "optimizer",
            value,
            &format!("an optimizer ({})", one_of(OPTIMIZERS)),
        )?;
        let body = body.as_ref();
        let ValueKind::Ident(kind) = &head.kind else {
            self.wrong_type(
                "optimizer",
                head,
                &format!("an optimizer ({})", one_of(OPTIMIZERS)),
            );
            return None;
        };
        let unit = Interval::new(0.0, false, 1.0, true);
        match kind.as_str() {
            "adamw" | "adam" => {
                let keys: &[&str] = if kind == "adamw" {
                    &["weight_decay", "beta1", "beta2"]
                } else {
                    &["beta1", "beta2"]
                };
                let table = self.table(body, kind, keys);
                let weight_decay = match table.get("weight_decay") {
                    Some(v) => self.number_in("weight_decay", v, Interval::at_least(0.0)),
                    None => Some(Optimizer::DEFAULT_WEIGHT_DECAY),
                };
                let beta1 = match table.get("beta1") {
                    Some(v) => self.number_in("beta1", v, unit),
                    None => Some(Optimizer::DEFAULT_BETA1),
                };
                let beta2 = match table.get("beta2") {
                    Some(v) => self.number_in("beta2", v, unit),
                    None => Some(Optimizer::DEFAULT_BETA2),
                };
                let (beta1, beta2) = (beta1?, beta2?);
                Some(if kind == "adamw" {
                    Optimizer::AdamW {
                        weight_decay: weight_decay?,
                        beta1,
                        beta2,
                    }
                } else {
                    Optimizer::Adam { beta1, beta2 }
                })
            }
            "sgd" => {
                let table = self.table(body, "sgd", &["momentum"]);
                let momentum = match table.get("momentum") {
                    Some(v) => self.number_in("momentum", v, unit),
                    None => Some(Optimizer::DEFAULT_MOMENTUM),
                };
                Some(Optimizer::Sgd {
                    momentum: momentum?,
                })
            }
            other => {
                let hint = suggest(other, OPTIMIZERS.iter().copied())
                    .unwrap_or_else(|| format!("the optimizers are {}", one_of(OPTIMIZERS)));
                self.error(
                    Diagnostic::new(
                        head.span,
                        format!("unknown optimizer `{other}`"),
                        "unknown optimizer",
                    )
                    .with_hint(hint),
                );
                None
            }
        }
    }

    /// `warmup = sft { steps = n, lr, demonstrations, batch, instances }`.
    fn warmup(&mut self, value: &Value, train_lr: Option<f64>) -> Option<Warmup> {
        let (head, body) = self.constructor("warmup", value, "`none` or `sft { steps = ... }`")?;
        let body = body.as_ref();
        match &head.kind {
            ValueKind::Ident(n) if n == "sft" => {}
            ValueKind::Ident(n) => {
                self.error(
                    Diagnostic::new(
                        head.span,
                        format!("unknown warm-up `{n}`"),
                        "unknown warm-up",
                    )
                    .with_hint_opt(
                        suggest(n, ["sft", "none"]).or_else(|| {
                            Some("the warm-up is `sft { steps = ... }` or `none`".into())
                        }),
                    ),
                );
                return None;
            }
            _ => {
                self.wrong_type("warmup", head, "`none` or `sft { steps = ... }`");
                return None;
            }
        }
        let table = self.table(
            body,
            "sft",
            &["steps", "lr", "demonstrations", "batch", "instances"],
        );
        let steps = match table.get("steps") {
            Some(v) => self.uint("steps", v, 1),
            None => {
                self.error(
                    Diagnostic::new(head.span, "`sft` warm-up needs `steps`", "no `steps`")
                        .with_hint("write `warmup = sft { steps = 100 }`"),
                );
                None
            }
        };
        let lr = match table.get("lr") {
            Some(v) => self.schedule_in("lr", v, Interval::above(0.0)),
            None => train_lr.map(Schedule::Constant),
        };
        let demonstrations = match table.get("demonstrations") {
            Some(v) => self.size("demonstrations", v, 1),
            None => Some(Warmup::DEFAULT_DEMONSTRATIONS),
        };
        let batch = match table.get("batch") {
            Some(v) => self.size("batch", v, 1),
            None => Some(Warmup::DEFAULT_BATCH),
        };
        let instances = match table.get("instances") {
            Some(v) => self.uint("instances", v, 1).map(Some),
            None => Some(None),
        };
        Some(Warmup {
            steps: steps?,
            lr: lr?,
            demonstrations: demonstrations?,
            batch: batch?,
            instances: instances?,
        })
    }

    pub(super) fn eval(&mut self, section: Section<'_>) -> Option<Eval> {
        let table = self.table(
            section.body,
            "eval",
            &["every", "split", "episodes", "decoding"],
        );
        let defaults = Eval::default();
        let every = match table.get("every") {
            Some(v) if Self::is_none(v) => Some(None),
            Some(v) => self.uint("every", v, 1).map(Some),
            None => Some(defaults.every),
        };
        let split = match table.get("split") {
            Some(v) => self.split(v),
            None => Some(defaults.split),
        };
        let episodes = match table.get("episodes") {
            Some(v) => self.size("episodes", v, 1),
            None => Some(defaults.episodes),
        };
        let decoding = match table.get("decoding") {
            Some(v) => self.choice(
                "decoding",
                v,
                &[
                    ("greedy", EvalDecoding::Greedy),
                    ("sampled", EvalDecoding::Sampled),
                    ("both", EvalDecoding::Both),
                ],
            ),
            None => Some(defaults.decoding),
        };
        Some(Eval {
            every: every?,
            split: split?,
            episodes: episodes?,
            decoding: decoding?,
        })
    }
}
