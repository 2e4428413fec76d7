//! `model NAME { arch = ..., value_head = ..., finetune = ... }`.

use crate::ast::{Block, Value, ValueKind};
use crate::diagnostics::{Diagnostic, one_of, suggest};
use crate::spec::{Arch, Finetune, Lora, LoraTarget, Model, TransformerArch, ValueHead};

use super::table::Interval;

use super::{Checker, Section};

const ARCHS: &[&str] = &["transformer", "qwen2", "llama", "gguf"];

impl Checker {
    pub(super) fn model(&mut self, section: Section<'_>) -> Option<Model> {
        let name = section.name?.name.clone();
        let table = self.table(section.body, "model", &["arch", "value_head", "finetune"]);
        let arch = match table.get("arch") {
            Some(value) => self.arch(value),
            None => Some(Arch::default()),
        };
        let value_head = match table.get("value_head") {
            Some(value) => self.choice(
                "value_head",
                value,
                &[
                    ("none", ValueHead::None),
                    ("shared", ValueHead::Shared),
                    ("separate", ValueHead::Separate),
                ],
            ),
            None => Some(ValueHead::default()),
        };
        let finetune = match table.get("finetune") {
            Some(value) => self.finetune(value),
            None => Some(Finetune::default()),
        };
        if let (Some(Finetune::Lora(_)), Some(ValueHead::Separate)) = (&finetune, value_head) {
            let span = table
                .get("value_head")
                .map_or(section.body.span, |v| v.span);
            self.error(
                Diagnostic::new(
                    span,
                    "a separate critic cannot be trained with `finetune = lora`",
                    "a second full network",
                )
                .with_hint(
                    "LoRA keeps one frozen base; write `value_head = shared` for a value head \
                     on it",
                ),
            );
        }
        Some(Model {
            name,
            arch: arch?,
            value_head: value_head?,
            finetune: finetune?,
        })
    }

    /// `full`, `lora` or `lora { rank, alpha, dropout, targets }`.
    fn finetune(&mut self, value: &Value) -> Option<Finetune> {
        const EXPECTED: &str = "`full` or `lora { rank = ... }`";
        let (head, body) = self.constructor("finetune", value, EXPECTED)?;
        let body = body.as_ref();
        match &head.kind {
            ValueKind::Ident(n) if n == "full" && body.items.is_empty() => {
                return Some(Finetune::Full);
            }
            ValueKind::Ident(n) if n == "full" => {
                self.error(Diagnostic::new(
                    body.span,
                    "`full` takes no settings",
                    "settings of nothing",
                ));
                return None;
            }
            ValueKind::Ident(n) if n == "lora" => {}
            ValueKind::Ident(n) => {
                let hint = suggest(n, ["full", "lora"])
                    .unwrap_or_else(|| format!("`finetune` is {EXPECTED}"));
                self.error(
                    Diagnostic::new(
                        head.span,
                        format!("unknown fine-tuning `{n}`"),
                        "not `full` or `lora`",
                    )
                    .with_hint(hint),
                );
                return None;
            }
            _ => {
                self.wrong_type("finetune", head, EXPECTED);
                return None;
            }
        }
        let table = self.table(body, "lora", &["rank", "alpha", "dropout", "targets"]);
        let rank = match table.get("rank") {
            Some(v) => self.size("rank", v, 1),
            None => Some(Lora::DEFAULT_RANK),
        };
        let alpha = match table.get("alpha") {
            Some(v) => self.number_in("alpha", v, Interval::above(0.0)),
            None => Some(Lora::DEFAULT_ALPHA),
        };
        let dropout = match table.get("dropout") {
            Some(v) => self.number_in("dropout", v, Interval::new(0.0, false, 1.0, true)),
            None => Some(Lora::DEFAULT_DROPOUT),
        };
        let targets = match table.get("targets") {
            Some(v) => self.lora_targets(v),
            None => Some(LoraTarget::ALL.to_vec()),
        };
        Some(Finetune::Lora(Lora {
            rank: rank?,
            alpha: alpha?,
            dropout: dropout?,
            targets: targets?,
        }))
    }

    /// `targets = [q, v, ...]`: known layer names, at least one, none twice.
    fn lora_targets(&mut self, value: &Value) -> Option<Vec<LoraTarget>> {
        let names: Vec<&str> = LoraTarget::ALL.iter().map(|t| t.name()).collect();
        let ValueKind::List(items) = &value.kind else {
            self.wrong_type(
                "targets",
                value,
                &format!("a list of layers ({})", one_of(&names)),
            );
            return None;
        };
        if items.is_empty() {
            self.error(
                Diagnostic::new(value.span, "`targets` is empty", "no layer to adapt")
                    .with_hint(format!("list some of {}", one_of(&names))),
            );
            return None;
        }
        let choices: Vec<(&str, LoraTarget)> =
            LoraTarget::ALL.iter().map(|&t| (t.name(), t)).collect();
        let mut targets = Vec::new();
        let mut ok = true;
        for item in items {
            match self.choice("targets", item, &choices) {
                Some(t) if targets.contains(&t) => {
                    self.error(Diagnostic::new(
                        item.span,
                        format!("`{}` is listed twice", t.name()),
                        "listed again here",
                    ));
                    ok = false;
                }
                Some(t) => targets.push(t),
                None => ok = false,
            }
        }
        ok.then_some(targets)
    }

    /// `transformer`, `transformer { ... }`, `qwen2 { weights = "..." }`, `llama { ... }`,
    /// `gguf { file = "..." }`.
    fn arch(&mut self, value: &Value) -> Option<Arch> {
        let (head, body) = self.constructor(
            "arch",
            value,
            &format!("an architecture ({})", one_of(ARCHS)),
        )?;
        let body = body.as_ref();
        let ValueKind::Ident(kind) = &head.kind else {
            self.wrong_type(
                "arch",
                head,
                &format!("an architecture ({})", one_of(ARCHS)),
            );
            return None;
        };
        match kind.as_str() {
            "transformer" => self.transformer(body),
            "qwen2" | "llama" => {
                let weights = self.path_key(
                    body,
                    head,
                    kind,
                    "weights",
                    "a directory",
                    &format!(
                        "write `arch = {kind} {{ weights = \"models/...\" }}`, a directory \
                         with config.json, tokenizer.json and safetensors"
                    ),
                )?;
                Some(if kind == "qwen2" {
                    Arch::Qwen2 { weights }
                } else {
                    Arch::Llama { weights }
                })
            }
            "gguf" => {
                let file = self.path_key(
                    body,
                    head,
                    kind,
                    "file",
                    "a file",
                    "write `arch = gguf { file = \"models/NAME.gguf\" }`, a llama.cpp GGUF file \
                     of a Llama or Qwen2 model",
                )?;
                Some(Arch::Gguf { file })
            }
            other => {
                let hint = suggest(other, ARCHS.iter().copied())
                    .unwrap_or_else(|| format!("the architectures are {}", one_of(ARCHS)));
                self.error(
                    Diagnostic::new(
                        head.span,
                        format!("unknown architecture `{other}`"),
                        "unknown architecture",
                    )
                    .with_hint(hint),
                );
                None
            }
        }
    }

    /// The one string key of a pretrained model's block (`weights`, `file`): present and
    /// not empty. `what` is what it names, `hint` how to write the block.
    fn path_key(
        &mut self,
        body: &Block,
        head: &Value,
        kind: &str,
        key: &str,
        what: &str,
        hint: &str,
    ) -> Option<String> {
        let table = self.table(body, kind, &[key]);
        match table.get(key) {
            Some(v) => match &v.kind {
                ValueKind::Str(s) if !s.is_empty() => Some(s.clone()),
                ValueKind::Str(_) => {
                    self.error(Diagnostic::new(
                        v.span,
                        format!("`{key}` is empty"),
                        format!("expected {what}"),
                    ));
                    None
                }
                _ => {
                    self.wrong_type(key, v, "a string");
                    None
                }
            },
            None => {
                let missing = if key == "file" {
                    "no GGUF file"
                } else {
                    "no checkpoint directory"
                };
                self.error(
                    Diagnostic::new(head.span, format!("`{kind}` needs `{key}`"), missing)
                        .with_hint(hint.to_string()),
                );
                None
            }
        }
    }

    fn transformer(&mut self, body: &Block) -> Option<Arch> {
        let keys = [
            "layers",
            "d_model",
            "heads",
            "kv_heads",
            "ffn",
            "context",
            "tie_embeddings",
            "vocab",
        ];
        let table = self.table(body, "transformer", &keys);
        let defaults = TransformerArch::default();
        let size =
            |checker: &mut Checker, key: &str, min: usize, default: usize| match table.get(key) {
                Some(v) => checker.size(key, v, min),
                None => Some(default),
            };
        let layers = size(self, "layers", 1, defaults.layers);
        let d_model = size(self, "d_model", 8, defaults.d_model);
        let heads = size(self, "heads", 1, defaults.heads);
        let kv_heads = match table.get("kv_heads") {
            Some(v) => self.size("kv_heads", v, 1),
            None => heads,
        };
        let ffn = match table.get("ffn") {
            Some(v) => self.size("ffn", v, 1),
            None => d_model.map(TransformerArch::default_ffn),
        };
        let context = size(self, "context", 16, defaults.context);
        // The specials and the 256 bytes take 262 tokens before any word.
        let vocab = size(self, "vocab", 512, defaults.vocab);
        let tie_embeddings = match table.get("tie_embeddings") {
            Some(v) => self.boolean("tie_embeddings", v),
            None => Some(defaults.tie_embeddings),
        };
        if let (Some(d), Some(h)) = (d_model, heads)
            && d % h != 0
        {
            let span = table.get("d_model").or(table.get("heads")).map(|v| v.span);
            let nearest = (d / h).max(1) * h;
            self.error(
                Diagnostic::new(
                    span.unwrap_or(body.span),
                    format!("`d_model` ({d}) must be a multiple of `heads` ({h})"),
                    "not a multiple of `heads`",
                )
                .with_hint(format!(
                    "each head gets `d_model / heads` dimensions; try `d_model = {nearest}`"
                )),
            );
        }
        if let (Some(d), Some(h)) = (d_model, heads)
            && d % h == 0
            && (d / h) % 2 != 0
        {
            let span = table.get("d_model").or(table.get("heads")).map(|v| v.span);
            self.error(
                Diagnostic::new(
                    span.unwrap_or(body.span),
                    format!("the head width `d_model / heads` ({}) must be even", d / h),
                    "odd head width",
                )
                .with_hint("rotary position embeddings rotate pairs of dimensions"),
            );
        }
        if let (Some(h), Some(kv)) = (heads, kv_heads)
            && h % kv != 0
        {
            let span = table.get("kv_heads").or(table.get("heads")).map(|v| v.span);
            self.error(
                Diagnostic::new(
                    span.unwrap_or(body.span),
                    format!("`heads` ({h}) must be a multiple of `kv_heads` ({kv})"),
                    "does not divide `heads`",
                )
                .with_hint(
                    "grouped-query attention shares each key/value head among `heads / kv_heads` \
                     query heads",
                ),
            );
        }
        Some(Arch::Transformer(TransformerArch {
            layers: layers?,
            d_model: d_model?,
            heads: heads?,
            kv_heads: kv_heads?,
            ffn: ffn?,
            context: context?,
            tie_embeddings: tie_embeddings?,
            vocab: vocab?,
        }))
    }
}
