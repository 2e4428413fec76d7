//! Policy speed on the CPU (burn's flex backend with Agentry's fused kernels): training tokens
//! per second, and batched generation tokens per second with the KV cache against recomputing
//! without it, measured in one run on one model.
//!
//! ```text
//! cargo run --release --example bench_policy                 # the small model (minutes)
//! cargo run --release --example bench_policy -- --quick      # a tiny smoke run (seconds, CI)
//! cargo run --release --example bench_policy -- --torch      # also time PyTorch and
//!                                                            # transformers on the same shapes
//! cargo run --release --example bench_policy -- --model large --torch
//! cargo run --release --example bench_policy -- --model smollm2 --batch 16 --torch
//! cargo run --release --example bench_policy -- --model smollm2 --blocks q4_1 --torch
//! cargo run --release --example bench_policy -- --decomposed # burn's ops, no fused kernels
//! cargo run --release --example bench_policy -- --model smollm2 --lora 16 --batch 8 --seq 512 \
//!     --only train --torch                                  # LoRA training and its memory
//! cargo run --release --example bench_policy -- --model smollm2 --lora 16 --batch 8 --seq 512 \
//!     --only train --recompute --torch                      # ... with recomputed blocks
//! RAYON_NUM_THREADS=1 cargo run --release --example bench_policy -- --torch --only train
//! ```
//!
//! flex and the kernels run on rayon's pool (`RAYON_NUM_THREADS` sets its size; the header
//! prints it); the PyTorch twin is given the same thread count. `--only train|generate`
//! measures one half (for a profiler). Compare ratios from one run: on a shared machine
//! absolute times drift.
//!
//! Models: `small` (4 layers, d_model 128, 4 heads, vocabulary 2048, SwiGLU 512, tied; batch
//! 16 × 256), `large` (8 layers, d_model 256, 8 heads, SwiGLU 1024; batch 8 × 512) and
//! `smollm2` (SmolLM2-135M's shape with random weights: 30 layers, d_model 576, 9 heads / 3
//! key-value heads, SwiGLU 1536, vocabulary 49152, tied; generation only, 300-token prompts, 64
//! new tokens, batch 4 unless `--batch`). Training is one step of forward, backward, global
//! gradient-norm clipping and AdamW, two ways: a plain language-model loss from the full logits
//! and the trainer's own SFT loss ([`Policy::scored_logprobs`]: the fused LM head), with the
//! page faults per step. Generation samples a fixed number of new tokens per prompt with the
//! KV cache ([`generate`]) and, for the small models, again recomputing every step
//! ([`generate_uncached`]) from the same seed, so both must produce the same tokens.
//!
//! `--lora RANK` trains LoRA adapters of that rank (alpha 2 × rank, on all seven projections)
//! over the frozen model instead of every weight, on any model (SmolLM2's shape included); the
//! PyTorch twin is then transformers' Llama with PEFT's LoRA. Each side prints its peak
//! resident memory (`VmHWM`, `ru_maxrss`): run `--only train` for the training's own peak.
//! `--blocks q4_1|q8_0` generates with the policy's weights kept in ggml blocks of that format
//! (its head in Q8_0), as SmolLM2's GGUF file holds them
//! ([`Policy::with_quantized_base`]): decode steps multiply by the blocks. transformers, which
//! dequantizes a GGUF file to f32, runs f32 products on the PyTorch side.
//! `--matmul-precision medium` sets both sides' products to PyTorch's `medium`
//! ([`matmul::Precision`]): bf16 operands on CPUs with AMX tiles, f32 elsewhere.
//! `--recompute` recomputes each block's activations in the backward pass
//! (`train { recompute = true }`; transformers' gradient checkpointing on the PyTorch side).
//!
//! Targets (issue 16): training at least 1.2× PyTorch's tokens per second at 1 and 2 threads;
//! KV-cache generation at least 2× transformers' `generate`. Issue 18: LoRA rank 16 at batch 8
//! × 512 on SmolLM2 in under 4 GB.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentry::model::{Policy, PolicyConfig, Sampling, generate, generate_uncached, recompute};
use agentry::optim::{PolicyOptimizer, clip_global_norm};
use agentry::spec;
use agentry_kernels::blocks::BlockFormat;
use agentry_kernels::matmul::{self, Precision};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type B = Flex;
type AD = Autodiff<Flex>;

#[derive(Parser, Debug)]
#[command(about = "Training and generation speed of the policy transformer on the CPU.")]
struct Args {
    /// A tiny model and batch that finish in seconds (a smoke test for CI, not a measurement).
    #[arg(long)]
    quick: bool,
    /// Also run `benches/bench_policy.py` (PyTorch, same model and batch) and print the ratio.
    #[arg(long)]
    torch: bool,
    /// Timed training steps (after one untimed warm-up step).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Sequences per training batch and prompts per generation batch.
    #[arg(long)]
    batch: Option<usize>,
    /// Positions per training sequence.
    #[arg(long)]
    seq: Option<usize>,
    /// New tokens per generated sequence.
    #[arg(long)]
    new_tokens: Option<usize>,
    /// Prompt length for generation.
    #[arg(long, default_value_t = 16)]
    prompt: usize,
    /// Measure only training (`train`) or only generation (`generate`), e.g. under a profiler.
    #[arg(long, value_parser = ["all", "train", "generate"], default_value = "all")]
    only: String,
    /// The model: `small` (the default: 4 layers, d_model 128), `large` (8 layers, d_model
    /// 256, 512 positions) or `smollm2` (SmolLM2-135M's shape with random weights: 30 layers,
    /// d_model 576, 9 heads / 3 key-value heads, vocabulary 49152; prompts of 300 tokens, 64
    /// new; generation only).
    #[arg(long, value_parser = ["small", "large", "smollm2"], default_value = "small")]
    model: String,
    /// Skip the no-cache generation baseline (it grows with the square of the length).
    #[arg(long)]
    no_uncached: bool,
    /// Run burn's decomposed ops instead of the fused kernels (what the kernels replace).
    #[arg(long)]
    decomposed: bool,
    /// Leave glibc's allocator at its defaults, which return freed memory to the system (what
    /// runs did before the runtime kept it; compare page faults and speed).
    #[arg(long)]
    default_malloc: bool,
    /// Train LoRA adapters of this rank over the frozen model instead of every weight.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    lora: Option<u32>,
    /// Recompute each block's activations in the backward pass instead of keeping them.
    #[arg(long)]
    recompute: bool,
    /// Generate with the weights kept in ggml blocks of this format (the tied head in Q8_0),
    /// as a GGUF file's quantized model is: decode steps multiply by the blocks.
    #[arg(long, value_parser = ["q4_1", "q8_0"])]
    blocks: Option<String>,
    /// Products' precision, PyTorch's `torch.set_float32_matmul_precision` on both sides:
    /// `medium` rounds the large products' operands to bf16 on CPUs with AMX tiles.
    #[arg(long, value_parser = ["highest", "medium"], default_value = "highest")]
    matmul_precision: String,
}

/// The sizes of one benchmark run.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    vocab: usize,
    layers: usize,
    d_model: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    tie_embeddings: bool,
    batch: usize,
    seq: usize,
    new_tokens: usize,
    prompt: usize,
    steps: usize,
    /// A smoke run: the issue's targets do not apply.
    quick: bool,
}

impl Sizes {
    fn of(args: &Args) -> Self {
        let mut sizes = if args.quick {
            Sizes {
                vocab: 256,
                layers: 2,
                d_model: 32,
                heads: 2,
                kv_heads: 2,
                ffn: 128,
                tie_embeddings: true,
                batch: 2,
                seq: 32,
                new_tokens: 16,
                prompt: 4,
                steps: 1,
                quick: true,
            }
        } else {
            let small = Sizes {
                vocab: 2048,
                layers: 4,
                d_model: 128,
                heads: 4,
                kv_heads: 4,
                ffn: 512,
                tie_embeddings: true,
                batch: 16,
                seq: 256,
                new_tokens: 256,
                prompt: args.prompt,
                steps: args.steps,
                quick: false,
            };
            match args.model.as_str() {
                "large" => Sizes {
                    layers: 8,
                    d_model: 256,
                    heads: 8,
                    kv_heads: 8,
                    ffn: 1024,
                    batch: 8,
                    seq: 512,
                    ..small
                },
                "smollm2" => Sizes {
                    vocab: 49152,
                    layers: 30,
                    d_model: 576,
                    heads: 9,
                    kv_heads: 3,
                    ffn: 1536,
                    batch: 4,
                    seq: 300,
                    new_tokens: 64,
                    prompt: 300,
                    ..small
                },
                _ => small,
            }
        };
        sizes.batch = args.batch.unwrap_or(sizes.batch);
        sizes.seq = args.seq.unwrap_or(sizes.seq);
        sizes.new_tokens = args.new_tokens.unwrap_or(sizes.new_tokens);
        sizes.steps = sizes.steps.max(1);
        sizes
    }

    fn config(&self) -> PolicyConfig {
        PolicyConfig {
            vocab: self.vocab,
            layers: self.layers,
            d_model: self.d_model,
            heads: self.heads,
            kv_heads: self.kv_heads,
            ffn: self.ffn,
            context: (self.seq + 1).max(self.prompt + self.new_tokens),
            tie_embeddings: self.tie_embeddings,
        }
    }
}

fn main() -> agentry::Result<()> {
    let args = Args::parse();
    if args.decomposed {
        agentry::model::kernels::with_decomposed_ops(|| measure(&args))
    } else {
        measure(&args)
    }
}

fn measure(args: &Args) -> agentry::Result<()> {
    let sizes = Sizes::of(args);
    let config = sizes.config();
    // burn's flex backend and Agentry's kernels run on rayon's global pool, which honours
    // RAYON_NUM_THREADS; the PyTorch twin is given the same count.
    let threads = rayon::current_num_threads();
    let precision: Precision = args.matmul_precision.parse().map_err(anyhow::Error::msg)?;
    matmul::set_precision(precision);
    // What a run on flex does first (`device::dispatch`), unless asked to measure without it.
    let freed_memory = if args.default_malloc {
        agentry::device::FreedMemory::AllocatorDefault
    } else {
        agentry::device::keep_freed_memory()
    };
    println!(
        "bench_policy{}{}{} --model {}: {} layers, d_model {}, {} heads / {} key-value heads, \
         ffn {}, vocab {}, {} embeddings; flex backend, {threads} CPU thread{}, {}; products \
         {}; freed memory: {freed_memory}",
        if args.quick { " --quick" } else { "" },
        if args.decomposed { " --decomposed" } else { "" },
        if args.default_malloc {
            " --default-malloc"
        } else {
            ""
        },
        args.model,
        sizes.layers,
        sizes.d_model,
        sizes.heads,
        sizes.kv_heads,
        config.ffn,
        sizes.vocab,
        if sizes.tie_embeddings {
            "tied"
        } else {
            "untied"
        },
        if threads == 1 { "" } else { "s" },
        agentry_kernels::simd::Level::detected(),
        precision.describe(),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0);

    let lora = args.lora.map(|rank| spec::Lora {
        rank: rank as usize,
        alpha: 2.0 * f64::from(rank),
        dropout: 0.0,
        targets: spec::LoraTarget::ALL.to_vec(),
    });
    if args.only != "generate" && (args.model != "smollm2" || lora.is_some()) {
        let measured = bench_training(&sizes, &config, &mut rng, lora.as_ref(), args.recompute);
        if args.torch {
            torch_training(&sizes, threads, measured, lora.as_ref(), args.recompute)?;
        }
    }
    if args.only != "train" {
        let uncached = !args.no_uncached && args.model != "smollm2";
        let blocks = args.blocks.as_deref().map(|name| match name {
            "q8_0" => BlockFormat::Q8_0,
            _ => BlockFormat::Q4_1,
        });
        let tokens_per_second = bench_generation(&sizes, &config, &mut rng, uncached, blocks)?;
        if args.torch {
            torch_generation(&sizes, threads, tokens_per_second)?;
        }
    }
    Ok(())
}

/// Tokens per second of the two training losses.
#[derive(Clone, Copy, Debug)]
struct Training {
    /// The plain loss (not measured with LoRA).
    lm: Option<f64>,
    sft: f64,
}

/// (a): prints both training measurements.
fn bench_training(
    sizes: &Sizes,
    config: &PolicyConfig,
    rng: &mut ChaCha8Rng,
    lora: Option<&spec::Lora>,
    recompute: bool,
) -> Training {
    let rows: Vec<Vec<u32>> = (0..sizes.batch)
        .map(|_| random_tokens(rng, sizes.seq + 1, sizes.vocab))
        .collect();
    let tokens_per_step = (sizes.batch * sizes.seq) as f64;
    println!(
        "\n(a) training{}{}: batch {} x {} positions, forward + backward + clip + AdamW, \
         mean of {} timed step(s) after 1 untimed",
        lora.map_or(String::new(), |l| format!(
            " LoRA rank {} (base frozen)",
            l.rank
        )),
        if recompute { ", blocks recomputed" } else { "" },
        sizes.batch,
        sizes.seq,
        sizes.steps
    );
    let report = |name: &str, (time, faults): (Duration, Option<u64>)| {
        println!(
            "  {name:<32} {:>8.1} ms/step  {:>8.0} tokens/s  {}",
            time.as_secs_f64() * 1e3,
            tokens_per_step / time.as_secs_f64(),
            faults.map_or(String::new(), |f| format!("{f} page faults/step"))
        );
        tokens_per_step / time.as_secs_f64()
    };
    // The trainer's loss first, so the peak memory printed after it is the trainer's.
    let sft = report(
        "trainer's SFT loss (fused head)",
        time_training(config, &rows, sizes.steps, Loss::Sft, lora, recompute),
    );
    println!("  peak resident memory so far: {}", peak_memory());
    // The full logits of a large vocabulary are what the fused head avoids; with LoRA (the
    // large models) the comparison is the trainer's loss alone.
    let lm = lora.is_none().then(|| {
        report(
            "plain LM loss (full logits)",
            time_training(config, &rows, sizes.steps, Loss::Lm, lora, recompute),
        )
    });
    Training { lm, sft }
}

/// (b): generation with the KV cache and, when asked, without it, from the same seed; returns
/// the cached generation's new tokens per second.
fn bench_generation(
    sizes: &Sizes,
    config: &PolicyConfig,
    rng: &mut ChaCha8Rng,
    uncached: bool,
    blocks: Option<BlockFormat>,
) -> agentry::Result<f64> {
    println!(
        "\n(b) generation: {} prompts of {} tokens, {} new tokens each, temperature 1, same \
         seed{}",
        sizes.batch,
        sizes.prompt,
        sizes.new_tokens,
        blocks.map_or(String::new(), |f| format!(
            "; weights in {} blocks (head Q8_0)",
            f.name()
        ))
    );
    B::seed(&Default::default(), 0);
    let policy: Policy<B> = config.init(&Default::default());
    let policy = match blocks {
        Some(format) => policy
            .with_quantized_base(format)
            .map_err(|e| anyhow::anyhow!("cannot quantize the policy: {e}"))?,
        None => policy,
    };
    let prompts: Vec<Vec<u32>> = (0..sizes.batch)
        .map(|_| random_tokens(rng, sizes.prompt, sizes.vocab))
        .collect();
    // Every row generates exactly `new_tokens` (no stop token), as transformers' `generate`
    // with `min_new_tokens` does on the PyTorch side.
    let sampling = Sampling {
        max_new_tokens: sizes.new_tokens,
        ..Sampling::default()
    };
    // An untimed short run first, so neither side pays for first-touch allocations.
    generate(
        &policy,
        &prompts,
        &Sampling {
            max_new_tokens: 4,
            ..sampling.clone()
        },
        &mut ChaCha8Rng::seed_from_u64(1),
    );
    // The prefill (and its first token) alone; the decode steps are the rest of the run.
    let started = Instant::now();
    generate(
        &policy,
        &prompts,
        &Sampling {
            max_new_tokens: 1,
            ..sampling.clone()
        },
        &mut ChaCha8Rng::seed_from_u64(2),
    );
    let prefill = started.elapsed();
    let started = Instant::now();
    let cached = generate(
        &policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(2),
    );
    let cached_time = started.elapsed();
    let new_tokens: usize = cached.iter().map(|g| g.tokens.len()).sum();
    let rate = |time: Duration| new_tokens as f64 / time.as_secs_f64();
    println!(
        "  {:<32} {:>8.0} ms        {:>8.0} new tokens/s (prefill included)",
        "KV cache",
        cached_time.as_secs_f64() * 1e3,
        rate(cached_time)
    );
    let steps = cached.iter().map(|g| g.tokens.len()).max().unwrap_or(0);
    println!(
        "  {:<32} {:>8.0} ms, then {:.1} ms per decode step",
        "  of which prefill",
        prefill.as_secs_f64() * 1e3,
        cached_time.saturating_sub(prefill).as_secs_f64() * 1e3
            / steps.saturating_sub(1).max(1) as f64
    );
    if !uncached {
        return Ok(rate(cached_time));
    }
    let started = Instant::now();
    let uncached = generate_uncached(
        &policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(2),
    );
    let uncached_time = started.elapsed();
    let same = cached
        .iter()
        .zip(&uncached)
        .all(|(c, u)| c.tokens == u.tokens);
    println!(
        "  {:<32} {:>8.0} ms        {:>8.0} new tokens/s",
        "recompute, no cache",
        uncached_time.as_secs_f64() * 1e3,
        rate(uncached_time)
    );
    println!(
        "  cache speed-up: {:.1}x{}; same tokens both ways: {same}",
        uncached_time.as_secs_f64() / cached_time.as_secs_f64(),
        if sizes.quick { "" } else { " (target >= 10x)" }
    );
    anyhow::ensure!(same, "cached and uncached generation disagree");
    Ok(rate(cached_time))
}

fn random_tokens(rng: &mut ChaCha8Rng, len: usize, vocab: usize) -> Vec<u32> {
    // Avoid the first ids (specials in a real tokenizer); the model does not care.
    (0..len)
        .map(|_| rng.random_range(8..vocab as u32))
        .collect()
}

#[derive(Clone, Copy)]
enum Loss {
    /// Mean next-token cross-entropy over every position, from the full logits.
    Lm,
    /// The trainer's SFT loss: [`Policy::scored_logprobs`] with every position scored.
    Sft,
}

/// The mean time of `steps` training steps on `rows`, after one untimed step, and the page
/// faults per step (where the system counts them).
fn time_training(
    config: &PolicyConfig,
    rows: &[Vec<u32>],
    steps: usize,
    loss: Loss,
    lora: Option<&spec::Lora>,
    recompute: bool,
) -> (Duration, Option<u64>) {
    let device = Default::default();
    AD::seed(&device, 0);
    let mut policy: Policy<AD> = config.init(&device);
    if let Some(lora) = lora {
        policy = policy.with_lora(lora);
    }
    policy = policy.with_recompute(recompute);
    let mut optimizer = PolicyOptimizer::<Policy<AD>, AD>::new(&spec::Optimizer::AdamW {
        weight_decay: 0.01,
        beta1: 0.9,
        beta2: 0.999,
    });
    let (b, t) = (rows.len(), rows[0].len());
    let ids: Vec<i64> = rows.iter().flatten().map(|&x| i64::from(x)).collect();
    let tokens = Tensor::<AD, 2, Int>::from_data(TensorData::new(ids, [b, t]), &device);
    let scored = vec![true; b * (t - 1)];
    let mut step = |policy: Policy<AD>| -> Policy<AD> {
        let loss = match loss {
            Loss::Lm => {
                let logits = policy.forward(tokens.clone().narrow(1, 0, t - 1));
                let targets = tokens.clone().narrow(1, 1, t - 1).reshape([b, t - 1, 1]);
                log_softmax(logits, 2).gather(2, targets).mean().neg()
            }
            Loss::Sft => {
                let logprobs = policy.scored_logprobs(tokens.clone(), &scored, 1.0);
                logprobs.mean().neg()
            }
        };
        let mut grads = recompute::gradients(loss, &policy);
        clip_global_norm(&policy, &mut grads, Some(1.0));
        optimizer.step(1e-3, policy, grads)
    };
    policy = step(policy);
    let faults = page_faults();
    let started = Instant::now();
    for _ in 0..steps {
        policy = step(policy);
    }
    // Read a weight back so every queued operation has finished before the clock stops.
    let _ = policy.valid().embed.weight.val().into_data();
    let elapsed = started.elapsed() / steps as u32;
    let faults = faults
        .zip(page_faults())
        .map(|(before, after)| (after - before) / steps as u64);
    (elapsed, faults)
}

/// The process's peak resident memory (`VmHWM` of `/proc/self/status`), or why it is unknown.
fn peak_memory() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let kib: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(format!("{:.2} GiB", kib / (1024.0 * 1024.0)))
        })
        .unwrap_or_else(|| "unknown (no /proc/self/status)".to_string())
}

/// Page faults of this process so far (minor and major, from `/proc/self/stat`); `None` where
/// that file does not exist.
fn page_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesized command name: state is field 3, minflt 10, majflt 12.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let minor: u64 = fields.get(7)?.parse().ok()?;
    let major: u64 = fields.get(9)?.parse().ok()?;
    Some(minor + major)
}

/// Runs `benches/bench_policy.py` with the model's sizes and `extra` arguments; returns the
/// value of its `key=` line, or `None` when PyTorch is unavailable (it says so).
fn run_torch(
    sizes: &Sizes,
    threads: usize,
    extra: &[&str],
    key: &str,
) -> agentry::Result<Option<f64>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/bench_policy.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    println!("  ({python} {} {})", script.display(), extra.join(" "));
    let output = Command::new(&python)
        .arg(&script)
        .args(["--batch", &sizes.batch.to_string()])
        .args(["--seq", &sizes.seq.to_string()])
        .args(["--vocab", &sizes.vocab.to_string()])
        .args(["--layers", &sizes.layers.to_string()])
        .args(["--d-model", &sizes.d_model.to_string()])
        .args(["--heads", &sizes.heads.to_string()])
        .args(["--kv-heads", &sizes.kv_heads.to_string()])
        .args(["--ffn", &sizes.ffn.to_string()])
        .args(["--prompt", &sizes.prompt.to_string()])
        .args(["--new-tokens", &sizes.new_tokens.to_string()])
        .args(["--steps", &sizes.steps.to_string()])
        .args(["--threads", &threads.to_string()])
        .args(["--matmul-precision", matmul::precision().name()])
        .args(if sizes.tie_embeddings {
            &[][..]
        } else {
            &["--untied"][..]
        })
        .args(extra)
        .output();
    let output = match output {
        Ok(output) if output.status.success() => output,
        Ok(output) => anyhow::bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => {
            println!("  skipped: cannot run `{python}`: {e}");
            return Ok(None);
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!(
        "{}",
        stdout
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    Ok(stdout
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse::<f64>().ok()))
}

/// The PyTorch twin of the training measurement, and Agentry's speed relative to it.
fn torch_training(
    sizes: &Sizes,
    threads: usize,
    burn: Training,
    lora: Option<&spec::Lora>,
    recompute: bool,
) -> agentry::Result<()> {
    println!("\n(a') PyTorch, same model, batch and thread count");
    let rank = lora.map(|l| l.rank.to_string());
    let mut extra: Vec<&str> = match &rank {
        Some(rank) => vec!["--lora", rank],
        None => Vec::new(),
    };
    if recompute {
        extra.push("--recompute");
    }
    let Some(torch) = run_torch(sizes, threads, &extra, "tokens_per_second=")? else {
        return Ok(());
    };
    let target = if sizes.quick { "" } else { " (target >= 1.2x)" };
    println!(
        "  Agentry tokens/s / PyTorch tokens/s: {:.2}x with the trainer's loss{target}{}",
        burn.sft / torch,
        burn.lm.map_or(String::new(), |lm| format!(
            ", {:.2}x with the plain loss",
            lm / torch
        ))
    );
    Ok(())
}

/// transformers' `generate` on the same shapes, and Agentry's speed relative to it.
fn torch_generation(sizes: &Sizes, threads: usize, burn: f64) -> agentry::Result<()> {
    println!("\n(b') transformers `generate` (KV cache), same shapes, batch and thread count");
    let Some(torch) = run_torch(sizes, threads, &["--generate"], "new_tokens_per_second=")? else {
        return Ok(());
    };
    let target = if sizes.quick { "" } else { " (target >= 2x)" };
    println!(
        "  Agentry new tokens/s / transformers new tokens/s: {:.2}x{target}",
        burn / torch
    );
    Ok(())
}
