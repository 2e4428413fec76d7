//! Code generation: a checked [`Experiment`] to the Rust items the `experiment!` macro emits.
//!
//! The output spells out the whole resolved spec as a struct literal, so a reader of
//! `agentry expand` or of a snapshot sees every default the checker filled in, and it names
//! every item by an absolute path (`::agentry::...`, `::std::...`) so that it compiles in any
//! module. A task whose environment is a user's type gets a `match` arm that constructs that
//! type through its path, written verbatim, so rustc checks the path and the trait bounds and
//! reports them at the user's own type.
//!
//! The literal is wrapped in [`Checked::from_generated_code`](crate::Checked::from_generated_code):
//! it is the checker's output written out at compile time, so the runtime gets it as checked
//! without checking again (`tests/snapshots.rs` proves the two equal for every recipe).

use std::str::FromStr;

use proc_macro2::{Ident, Literal, Span, TokenStream};
use quote::quote;

use crate::spec::{
    AdvantageNorm, Aggregation, Algorithm, AlgorithmKind, Arch, BuiltinEnv, Clip, Credit, Device,
    Difficulty, EnvRef, Eval, EvalDecoding, Experiment, Filter, Finetune, Interrupt, Kl,
    KlEstimator, KlPlacement, MatmulPrecision, Model, Optimizer, Placement, Pool, PoolMode,
    Schedule, SftSource, Split, Stage, Sweep, Task, Train, ValueHead, Warmup,
};

/// The items for one experiment: a unit struct named after it and its `::agentry::Experiment`
/// implementation.
pub fn expand(spec: &Experiment) -> TokenStream {
    expand_with_origin(spec, None)
}

/// Like [`expand`], naming the source file in the struct's documentation.
pub fn expand_with_origin(spec: &Experiment, path: Option<&str>) -> TokenStream {
    let ty = Ident::new(&type_name(&spec.name), Span::call_site());
    let doc = match path {
        Some(path) => format!(" The `{}` experiment, compiled from `{path}`.", spec.name),
        None => format!(
            " The `{}` experiment, compiled from its `.arl` file.",
            spec.name
        ),
    };
    let literal = experiment(spec);
    let arms: Vec<TokenStream> = spec
        .tasks
        .iter()
        .filter_map(|task| match &task.env {
            EnvRef::Path(path) => Some((task.name.as_str(), path.as_str())),
            EnvRef::Builtin(_) | EnvRef::Remote { .. } => None,
        })
        .map(|(name, path)| {
            let path = user_path(path);
            quote! {
                #name => ::core::option::Option::Some(::std::boxed::Box::new(
                    <#path as ::core::default::Default>::default(),
                )),
            }
        })
        .collect();
    let body = if arms.is_empty() {
        quote! {
            let _ = name;
            ::core::option::Option::None
        }
    } else {
        quote! {
            match name {
                #(#arms)*
                _ => ::core::option::Option::None,
            }
        }
    };
    quote! {
        #[doc = #doc]
        pub struct #ty;

        impl ::agentry::Experiment for #ty {
            fn spec(&self) -> ::agentry::dsl::Checked<::agentry::spec::Experiment> {
                let spec = #literal;
                ::agentry::dsl::Checked::from_generated_code(spec)
            }

            fn user_task(
                &self,
                name: &str,
            ) -> ::core::option::Option<::std::boxed::Box<dyn ::agentry::env::TaskGenerator>> {
                #body
            }
        }
    }
}

/// The Rust type name of an experiment: `multi_task` becomes `MultiTask`.
///
/// Digits stay as they are; a name with no letters becomes `Experiment`, and `self` becomes
/// `SelfExperiment` (since `Self` is reserved).
pub fn type_name(name: &str) -> String {
    let mut out = String::new();
    for part in name.split('_').filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    match out.as_str() {
        "" => "Experiment".to_string(),
        "Self" => "SelfExperiment".to_string(),
        _ if out.starts_with(|c: char| c.is_ascii_digit()) => format!("Experiment{out}"),
        _ => out,
    }
}

/// A user's path as tokens. The grammar only admits `::`-separated identifiers, so this
/// cannot fail on a checked spec; a path that does not tokenize becomes a `compile_error!`.
fn user_path(path: &str) -> TokenStream {
    TokenStream::from_str(path).unwrap_or_else(|_| {
        let message = format!("invalid Rust path `{path}`");
        quote!(::core::compile_error!(#message))
    })
}

/// An `f64` literal that parses back to exactly the same value (`0.2_f64`, `1e-5_f64`).
pub fn float(value: f64) -> TokenStream {
    let literal = if value.is_finite() {
        Literal::from_str(&format!("{:?}_f64", value.abs()))
            .unwrap_or_else(|_| Literal::f64_suffixed(value.abs()))
    } else {
        Literal::f64_suffixed(0.0)
    };
    if value.is_sign_negative() {
        quote!(-#literal)
    } else {
        quote!(#literal)
    }
}

/// A `Vec` literal as a function call rather than `vec![]`, so that pretty-printers format its
/// elements (they leave macro bodies as raw tokens).
fn vec(items: impl Iterator<Item = TokenStream>) -> TokenStream {
    let items: Vec<TokenStream> = items.collect();
    if items.is_empty() {
        quote!(::std::vec::Vec::new())
    } else {
        quote!(::std::vec::Vec::from([#(#items),*]))
    }
}

fn string(value: &str) -> TokenStream {
    quote!(::std::string::String::from(#value))
}

fn uint(value: u64) -> TokenStream {
    let literal = Literal::u64_unsuffixed(value);
    quote!(#literal)
}

fn size(value: usize) -> TokenStream {
    let literal = Literal::usize_unsuffixed(value);
    quote!(#literal)
}

fn option<T>(value: &Option<T>, some: impl Fn(&T) -> TokenStream) -> TokenStream {
    match value {
        Some(v) => {
            let v = some(v);
            quote!(::core::option::Option::Some(#v))
        }
        None => quote!(::core::option::Option::None),
    }
}

fn variant(ty: &str, name: &str) -> TokenStream {
    let ty = Ident::new(ty, Span::call_site());
    let name = Ident::new(name, Span::call_site());
    quote!(::agentry::spec::#ty::#name)
}

fn experiment(spec: &Experiment) -> TokenStream {
    let name = string(&spec.name);
    let seed = uint(spec.seed);
    let device = variant(
        "Device",
        match spec.device {
            Device::Auto => "Auto",
            Device::Flex => "Flex",
            Device::Wgpu => "Wgpu",
            Device::Vulkan => "Vulkan",
            Device::Cuda => "Cuda",
        },
    );
    let matmul_precision = variant(
        "MatmulPrecision",
        match spec.matmul_precision {
            MatmulPrecision::Highest => "Highest",
            MatmulPrecision::Medium => "Medium",
        },
    );
    let model = model(&spec.model);
    let tasks = vec(spec.tasks.iter().map(task));
    let stages = vec(spec.curriculum.iter().map(stage));
    let algorithm = algorithm(&spec.algorithm);
    let pool = pool(&spec.pool);
    let train = train(&spec.train);
    let eval = eval(&spec.eval);
    let sweep = option(&spec.sweep, sweep);
    quote! {
        ::agentry::spec::Experiment {
            name: #name,
            seed: #seed,
            device: #device,
            matmul_precision: #matmul_precision,
            model: #model,
            tasks: #tasks,
            curriculum: #stages,
            algorithm: #algorithm,
            pool: #pool,
            train: #train,
            eval: #eval,
            sweep: #sweep,
        }
    }
}

fn model(model: &Model) -> TokenStream {
    let name = string(&model.name);
    let arch = match &model.arch {
        Arch::Transformer(t) => {
            let (layers, d_model, heads) = (size(t.layers), size(t.d_model), size(t.heads));
            let (kv_heads, ffn, context) = (size(t.kv_heads), size(t.ffn), size(t.context));
            let (tie_embeddings, vocab) = (t.tie_embeddings, size(t.vocab));
            quote! {
                ::agentry::spec::Arch::Transformer(::agentry::spec::TransformerArch {
                    layers: #layers,
                    d_model: #d_model,
                    heads: #heads,
                    kv_heads: #kv_heads,
                    ffn: #ffn,
                    context: #context,
                    tie_embeddings: #tie_embeddings,
                    vocab: #vocab,
                })
            }
        }
        Arch::Qwen2 { weights } => {
            let weights = string(weights);
            quote!(::agentry::spec::Arch::Qwen2 { weights: #weights })
        }
        Arch::Llama { weights } => {
            let weights = string(weights);
            quote!(::agentry::spec::Arch::Llama { weights: #weights })
        }
        Arch::Gguf { file } => {
            let file = string(file);
            quote!(::agentry::spec::Arch::Gguf { file: #file })
        }
    };
    let value_head = variant(
        "ValueHead",
        match model.value_head {
            ValueHead::None => "None",
            ValueHead::Shared => "Shared",
            ValueHead::Separate => "Separate",
        },
    );
    let finetune = match &model.finetune {
        Finetune::Full => variant("Finetune", "Full"),
        Finetune::Lora(lora) => {
            let (rank, alpha, dropout) = (size(lora.rank), float(lora.alpha), float(lora.dropout));
            let targets = vec(lora
                .targets
                .iter()
                .map(|t| variant("LoraTarget", &format!("{t:?}"))));
            quote! {
                ::agentry::spec::Finetune::Lora(::agentry::spec::Lora {
                    rank: #rank,
                    alpha: #alpha,
                    dropout: #dropout,
                    targets: #targets,
                })
            }
        }
    };
    quote! {
        ::agentry::spec::Model {
            name: #name,
            arch: #arch,
            value_head: #value_head,
            finetune: #finetune,
        }
    }
}

fn difficulty(d: &Difficulty) -> TokenStream {
    let (min, max) = (Literal::u8_unsuffixed(d.min), Literal::u8_unsuffixed(d.max));
    quote!(::agentry::spec::Difficulty { min: #min, max: #max })
}

fn task(task: &Task) -> TokenStream {
    let name = string(&task.name);
    let env = match &task.env {
        EnvRef::Builtin(b) => {
            let b = variant(
                "BuiltinEnv",
                match b {
                    BuiltinEnv::Alfworld => "Alfworld",
                    BuiltinEnv::Db => "Db",
                    BuiltinEnv::Kg => "Kg",
                    BuiltinEnv::Os => "Os",
                    BuiltinEnv::Webshop => "Webshop",
                },
            );
            quote!(::agentry::spec::EnvRef::Builtin(#b))
        }
        EnvRef::Path(path) => {
            let path = string(path);
            quote!(::agentry::spec::EnvRef::Path(#path))
        }
        EnvRef::Remote { url, name } => {
            let (url, name) = (string(url), string(name));
            quote!(::agentry::spec::EnvRef::Remote { url: #url, name: #name })
        }
    };
    let weight = float(task.weight);
    let max_turns = Literal::u32_unsuffixed(task.max_turns);
    let difficulty = difficulty(&task.difficulty);
    let split = split(task.split);
    quote! {
        ::agentry::spec::Task {
            name: #name,
            env: #env,
            weight: #weight,
            max_turns: #max_turns,
            difficulty: #difficulty,
            split: #split,
        }
    }
}

fn stage(stage: &Stage) -> TokenStream {
    let name = string(&stage.name);
    let until = option(&stage.until, |u| uint(*u));
    let max_turns = option(&stage.max_turns, |m| {
        let m = Literal::u32_unsuffixed(*m);
        quote!(#m)
    });
    let tasks = vec(stage.tasks.iter().map(|t| string(t)));
    let difficulty = option(&stage.difficulty, difficulty);
    quote! {
        ::agentry::spec::Stage {
            name: #name,
            until: #until,
            max_turns: #max_turns,
            tasks: #tasks,
            difficulty: #difficulty,
        }
    }
}

fn algorithm(a: &Algorithm) -> TokenStream {
    let kind = variant(
        "AlgorithmKind",
        match a.kind {
            AlgorithmKind::Grpo => "Grpo",
            AlgorithmKind::DrGrpo => "DrGrpo",
            AlgorithmKind::Rloo => "Rloo",
            AlgorithmKind::ReinforcePp => "ReinforcePp",
            AlgorithmKind::ReinforcePpBaseline => "ReinforcePpBaseline",
            AlgorithmKind::Ppo => "Ppo",
        },
    );
    let group_size = size(a.group_size);
    let Clip { low, high } = a.clip;
    let (low, high) = (float(low), float(high));
    let dual_clip = option(&a.dual_clip, |c| float(*c));
    let kl = kl(&a.kl);
    let entropy = float(a.entropy);
    let advantage_norm = variant(
        "AdvantageNorm",
        match a.advantage_norm {
            AdvantageNorm::None => "None",
            AdvantageNorm::Group => "Group",
            AdvantageNorm::Batch => "Batch",
            AdvantageNorm::PerTask => "PerTask",
        },
    );
    let aggregation = variant(
        "Aggregation",
        match a.aggregation {
            Aggregation::TokenMean => "TokenMean",
            Aggregation::SeqMeanTokenSum => "SeqMeanTokenSum",
            Aggregation::SeqMeanTokenMean => "SeqMeanTokenMean",
        },
    );
    let sft = schedule(&a.sft);
    let filter = match a.filter {
        Filter::None => quote!(::agentry::spec::Filter::None),
        Filter::RewardStd { keep } => {
            let keep = float(keep);
            quote!(::agentry::spec::Filter::RewardStd { keep: #keep })
        }
    };
    let sft_from = match a.sft_from {
        SftSource::Oracle => quote!(::agentry::spec::SftSource::Oracle),
        SftSource::Successes { keep } => {
            let keep = size(keep);
            quote!(::agentry::spec::SftSource::Successes { keep: #keep })
        }
    };
    let is_cap = option(&a.is_cap, |c| float(*c));
    let negative_weight = float(a.negative_weight);
    let credit = match a.credit {
        Credit::Outcome => quote!(::agentry::spec::Credit::Outcome),
        Credit::Turn => quote!(::agentry::spec::Credit::Turn),
        Credit::MonteCarlo { k, first, last } => {
            let k = size(k);
            let last = option(&last, |l| quote!(#l));
            quote!(::agentry::spec::Credit::MonteCarlo { k: #k, first: #first, last: #last })
        }
    };
    let (gamma, lambda) = (float(a.gamma), float(a.lambda));
    let epochs = size(a.epochs);
    let grad_clip = option(&a.grad_clip, |c| float(*c));
    let (value_clip, value_coef) = (float(a.value_clip), float(a.value_coef));
    quote! {
        ::agentry::spec::Algorithm {
            kind: #kind,
            group_size: #group_size,
            clip: ::agentry::spec::Clip { low: #low, high: #high },
            dual_clip: #dual_clip,
            kl: #kl,
            entropy: #entropy,
            advantage_norm: #advantage_norm,
            aggregation: #aggregation,
            sft: #sft,
            sft_from: #sft_from,
            is_cap: #is_cap,
            filter: #filter,
            negative_weight: #negative_weight,
            credit: #credit,
            gamma: #gamma,
            lambda: #lambda,
            epochs: #epochs,
            grad_clip: #grad_clip,
            value_clip: #value_clip,
            value_coef: #value_coef,
        }
    }
}

fn kl(kl: &Kl) -> TokenStream {
    let estimator = option(&kl.estimator, |e| {
        variant(
            "KlEstimator",
            match e {
                KlEstimator::K1 => "K1",
                KlEstimator::K2 => "K2",
                KlEstimator::K3 => "K3",
                KlEstimator::Abs => "Abs",
            },
        )
    });
    let coef = float(kl.coef);
    let placement = variant(
        "KlPlacement",
        match kl.placement {
            KlPlacement::Loss => "Loss",
            KlPlacement::Reward => "Reward",
        },
    );
    quote! {
        ::agentry::spec::Kl {
            estimator: #estimator,
            coef: #coef,
            placement: #placement,
        }
    }
}

fn schedule(s: &Schedule) -> TokenStream {
    match *s {
        Schedule::Constant(v) => {
            let v = float(v);
            quote!(::agentry::spec::Schedule::Constant(#v))
        }
        Schedule::Linear { from, to, over } | Schedule::Cosine { from, to, over } => {
            let shape = Ident::new(
                if matches!(s, Schedule::Linear { .. }) {
                    "Linear"
                } else {
                    "Cosine"
                },
                Span::call_site(),
            );
            let (from, to, over) = (float(from), float(to), uint(over));
            quote!(::agentry::spec::Schedule::#shape { from: #from, to: #to, over: #over })
        }
        Schedule::Step { from, to, at } => {
            let (from, to, at) = (float(from), float(to), uint(at));
            quote!(::agentry::spec::Schedule::Step { from: #from, to: #to, at: #at })
        }
    }
}

fn pool(p: &Pool) -> TokenStream {
    let (engines, stale) = (size(p.engines), size(p.stale));
    let refresh_every = uint(p.refresh_every);
    let cross_policy = float(p.cross_policy);
    let max_staleness = uint(p.max_staleness);
    let mode = variant(
        "PoolMode",
        match p.mode {
            PoolMode::Sync => "Sync",
            PoolMode::Async => "Async",
        },
    );
    let placement = match &p.placement {
        Placement::Colocated => variant("Placement", "Colocated"),
        Placement::Disaggregated { devices } => {
            let devices = vec(devices.iter().map(|d| {
                let literal = Literal::u16_unsuffixed(*d);
                quote!(#literal)
            }));
            quote!(::agentry::spec::Placement::Disaggregated { devices: #devices })
        }
    };
    let interrupt = variant(
        "Interrupt",
        match p.interrupt {
            Interrupt::Never => "Never",
            Interrupt::Turn => "Turn",
            Interrupt::Token => "Token",
        },
    );
    let env_workers = option(&p.env_workers, |&n| size(n));
    quote! {
        ::agentry::spec::Pool {
            engines: #engines,
            stale: #stale,
            refresh_every: #refresh_every,
            cross_policy: #cross_policy,
            max_staleness: #max_staleness,
            mode: #mode,
            placement: #placement,
            interrupt: #interrupt,
            env_workers: #env_workers,
        }
    }
}

fn train(t: &Train) -> TokenStream {
    let steps = uint(t.steps);
    let batch = size(t.batch);
    let lr = float(t.lr);
    let optimizer = match t.optimizer {
        Optimizer::AdamW {
            weight_decay,
            beta1,
            beta2,
        } => {
            let (wd, b1, b2) = (float(weight_decay), float(beta1), float(beta2));
            quote!(::agentry::spec::Optimizer::AdamW { weight_decay: #wd, beta1: #b1, beta2: #b2 })
        }
        Optimizer::Adam { beta1, beta2 } => {
            let (b1, b2) = (float(beta1), float(beta2));
            quote!(::agentry::spec::Optimizer::Adam { beta1: #b1, beta2: #b2 })
        }
        Optimizer::Sgd { momentum } => {
            let m = float(momentum);
            quote!(::agentry::spec::Optimizer::Sgd { momentum: #m })
        }
    };
    let temperature = float(t.temperature);
    let top_p = float(t.top_p);
    let top_k = option(&t.top_k, |k| size(*k));
    let stop = vec(t.stop.iter().map(|s| string(s)));
    let max_new_tokens = size(t.max_new_tokens);
    let warmup = option(&t.warmup, |w: &Warmup| {
        let (steps, lr) = (uint(w.steps), schedule(&w.lr));
        let (demonstrations, batch) = (size(w.demonstrations), size(w.batch));
        let instances = option(&w.instances, |n| uint(*n));
        quote! {
            ::agentry::spec::Warmup {
                steps: #steps,
                lr: #lr,
                demonstrations: #demonstrations,
                batch: #batch,
                instances: #instances,
            }
        }
    });
    let checkpoint_every = option(&t.checkpoint_every, |c| uint(*c));
    let max_nonfinite_skips = Literal::u32_unsuffixed(t.max_nonfinite_skips);
    let recompute = t.recompute;
    let data_parallel = size(t.data_parallel);
    quote! {
        ::agentry::spec::Train {
            steps: #steps,
            batch: #batch,
            lr: #lr,
            optimizer: #optimizer,
            temperature: #temperature,
            top_p: #top_p,
            top_k: #top_k,
            stop: #stop,
            max_new_tokens: #max_new_tokens,
            warmup: #warmup,
            checkpoint_every: #checkpoint_every,
            max_nonfinite_skips: #max_nonfinite_skips,
            recompute: #recompute,
            data_parallel: #data_parallel,
        }
    }
}

fn split(split: Split) -> TokenStream {
    variant(
        "Split",
        match split {
            Split::Train => "Train",
            Split::Test => "Test",
        },
    )
}

fn eval(e: &Eval) -> TokenStream {
    let every = option(&e.every, |v| uint(*v));
    let split = split(e.split);
    let episodes = size(e.episodes);
    let decoding = variant(
        "EvalDecoding",
        match e.decoding {
            EvalDecoding::Greedy => "Greedy",
            EvalDecoding::Sampled => "Sampled",
            EvalDecoding::Both => "Both",
        },
    );
    quote! {
        ::agentry::spec::Eval {
            every: #every,
            split: #split,
            episodes: #episodes,
            decoding: #decoding,
        }
    }
}

fn sweep(s: &Sweep) -> TokenStream {
    let seeds = vec(s.seeds.iter().map(|v| uint(*v)));
    let ablations = vec(s.ablations.iter().map(|a| {
        let (path, value) = (string(&a.path), string(&a.value));
        let experiment = experiment(&a.experiment);
        quote! {
            ::agentry::spec::Ablation {
                path: #path,
                value: #value,
                experiment: ::std::boxed::Box::new(#experiment),
            }
        }
    }));
    let specialists = vec(s.specialists.iter().map(|sp| {
        let task = string(&sp.task);
        let experiment = experiment(&sp.experiment);
        quote! {
            ::agentry::spec::Specialist {
                task: #task,
                experiment: ::std::boxed::Box::new(#experiment),
            }
        }
    }));
    let base = s.base;
    quote! {
        ::agentry::spec::Sweep {
            seeds: #seeds,
            ablations: #ablations,
            specialists: #specialists,
            base: #base,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "experiment multi_task {
    model policy { arch = transformer }
    task kg { env = kg }
    task mine { env = crate::envs::Maze }
    algorithm grpo { group_size = 4, clip = 0.2 .. 0.28, kl = k3(1e-4) }
    train { steps = 100, batch = 16, lr = 3e-4 }
}
";

    #[test]
    fn user_paths_become_match_arms() {
        let spec = crate::check(SOURCE).unwrap();
        let code = expand(&spec).to_string();
        assert!(code.contains("pub struct MultiTask"), "{code}");
        assert!(
            code.contains("impl :: agentry :: Experiment for MultiTask"),
            "{code}"
        );
        assert!(code.contains("\"mine\" =>"), "{code}");
        assert!(
            code.contains(
                "< crate :: envs :: Maze as :: core :: default :: Default > :: default ()"
            )
        );
        assert!(!code.contains("include_bytes"));
    }

    #[test]
    fn no_user_paths_means_no_match() {
        let spec = crate::check(&SOURCE.replace("crate::envs::Maze", "db")).unwrap();
        let code = expand(&spec).to_string();
        assert!(
            code.contains("let _ = name ; :: core :: option :: Option :: None"),
            "{code}"
        );
    }

    #[test]
    fn floats_round_trip() {
        for value in [
            0.2,
            0.28,
            1e-4,
            3e-4,
            1.0,
            0.0,
            -2.5,
            1e300,
            5e-324,
            0.1 + 0.2,
            -0.0,
        ] {
            let text = float(value).to_string().replace(' ', "");
            let parsed: f64 = text.trim_end_matches("_f64").parse().unwrap();
            assert_eq!(parsed.to_bits(), value.to_bits(), "{value} became {text}");
        }
        let code = expand(&crate::check(SOURCE).unwrap()).to_string();
        assert!(code.contains("low : 0.2_f64 , high : 0.28_f64"), "{code}");
        assert!(code.contains("coef : 0.0001_f64"), "{code}");
    }

    #[test]
    fn sampling_keys_are_spelled_out() {
        let source = SOURCE.replace(
            "lr = 3e-4 }",
            r#"lr = 3e-4, top_k = 40, stop = [")", "\n"] }"#,
        );
        let code = expand(&crate::check(&source).unwrap())
            .to_string()
            .replace(' ', "");
        assert!(
            code.contains("top_k:::core::option::Option::Some(40)"),
            "{code}"
        );
        assert!(
            code.contains(
                r#"stop:::std::vec::Vec::from([::std::string::String::from(")"),::std::string::String::from("\n")])"#
            ),
            "{code}"
        );
    }

    #[test]
    fn type_names_are_upper_camel_case() {
        assert_eq!(type_name("quickstart"), "Quickstart");
        assert_eq!(type_name("multi_task_v2"), "MultiTaskV2");
        assert_eq!(type_name("_"), "Experiment");
        assert_eq!(type_name("self"), "SelfExperiment");
        assert_eq!(type_name("a__b_"), "AB");
    }
}
