//! Policy speed on the CPU (burn's flex backend): training tokens per second, and batched
//! generation tokens per second with the KV cache against recomputing without it, measured in
//! one run on one model.
//!
//! ```text
//! cargo run --release --example bench_policy                 # the issue's sizes (minutes)
//! cargo run --release --example bench_policy -- --quick      # a tiny smoke run (seconds, CI)
//! cargo run --release --example bench_policy -- --torch      # also time PyTorch on the same
//!                                                            # model and batch (needs torch)
//! RAYON_NUM_THREADS=1 cargo run --release --example bench_policy -- --torch --only train
//! ```
//!
//! burn's flex backend runs on rayon's pool (`RAYON_NUM_THREADS` sets its size); the PyTorch
//! twin is given the same thread count. `--only train|generate` measures one half (for a
//! profiler). Compare ratios from one run: on a shared machine absolute times drift.
//!
//! The model is the issue's: 4 layers, d_model 128, 4 heads, vocabulary 2048, SwiGLU width
//! 512 (the language's default, 4 × d_model), tied embeddings. Training is one step of
//! forward, backward, global gradient-norm clipping and AdamW on 16 sequences of 256 positions,
//! two ways: a plain language-model loss (what `benches/bench_policy.py` times in PyTorch) and
//! the trainer's own SFT loss ([`Policy::scored_logprobs`] on the scored positions).
//! Generation samples 256 new tokens for 16 prompts of 16 tokens,
//! first with the KV cache ([`generate`]), then recomputing every step ([`generate_uncached`]),
//! from the same seed, so both must produce the same tokens.
//!
//! Targets (issue 4): generation at least 10× the no-cache baseline at 256 new tokens; training
//! within 2× of PyTorch on CPU.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentry::model::{Policy, PolicyConfig, Sampling, generate, generate_uncached};
use agentry::optim::{PolicyOptimizer, clip_global_norm};
use agentry::spec;
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
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
}

/// The sizes of one benchmark run.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    vocab: usize,
    layers: usize,
    d_model: usize,
    heads: usize,
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
                batch: 2,
                seq: 32,
                new_tokens: 16,
                prompt: 4,
                steps: 1,
                quick: true,
            }
        } else {
            Sizes {
                vocab: 2048,
                layers: 4,
                d_model: 128,
                heads: 4,
                batch: 16,
                seq: 256,
                new_tokens: 256,
                prompt: args.prompt,
                steps: args.steps,
                quick: false,
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
            kv_heads: self.heads,
            ffn: 4 * self.d_model,
            context: (self.seq + 1).max(self.prompt + self.new_tokens),
            tie_embeddings: true,
        }
    }
}

fn main() -> agentry::Result<()> {
    let args = Args::parse();
    let sizes = Sizes::of(&args);
    let config = sizes.config();
    // burn's flex backend runs on rayon's global pool, which honours RAYON_NUM_THREADS; the
    // PyTorch twin is given the same count.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    println!(
        "bench_policy{}: {} layers, d_model {}, {} heads, ffn {}, vocab {}, tied embeddings; \
         flex backend, {threads} CPU threads",
        if args.quick { " --quick" } else { "" },
        sizes.layers,
        sizes.d_model,
        sizes.heads,
        config.ffn,
        sizes.vocab,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(0);

    if args.only != "generate" {
        let lm = bench_training(&sizes, &config, &mut rng);
        if args.torch {
            torch(&sizes, threads, lm)?;
        }
    }
    if args.only != "train" {
        bench_generation(&sizes, &config, &mut rng)?;
    }
    Ok(())
}

/// (a): prints both training measurements; returns the plain LM loss's tokens per second.
fn bench_training(sizes: &Sizes, config: &PolicyConfig, rng: &mut ChaCha8Rng) -> f64 {
    let rows: Vec<Vec<u32>> = (0..sizes.batch)
        .map(|_| random_tokens(rng, sizes.seq + 1, sizes.vocab))
        .collect();
    let tokens_per_step = (sizes.batch * sizes.seq) as f64;
    println!(
        "\n(a) training: batch {} x {} positions, forward + backward + clip + AdamW, \
         mean of {} timed step(s) after 1 untimed",
        sizes.batch, sizes.seq, sizes.steps
    );
    let lm = time_training(config, &rows, sizes.steps, Loss::Lm);
    let sft = time_training(config, &rows, sizes.steps, Loss::Sft);
    for (name, time) in [
        ("plain LM loss (as in PyTorch)", lm),
        ("trainer's SFT loss", sft),
    ] {
        println!(
            "  {name:<32} {:>8.1} ms/step  {:>8.0} tokens/s",
            time.as_secs_f64() * 1e3,
            tokens_per_step / time.as_secs_f64()
        );
    }
    tokens_per_step / lm.as_secs_f64()
}

/// (b): generation with and without the KV cache, from the same seed.
fn bench_generation(
    sizes: &Sizes,
    config: &PolicyConfig,
    rng: &mut ChaCha8Rng,
) -> agentry::Result<()> {
    println!(
        "\n(b) generation: {} prompts of {} tokens, {} new tokens each, temperature 1, same seed",
        sizes.batch, sizes.prompt, sizes.new_tokens
    );
    B::seed(&Default::default(), 0);
    let policy: Policy<B> = config.init(&Default::default());
    let prompts: Vec<Vec<u32>> = (0..sizes.batch)
        .map(|_| random_tokens(rng, sizes.prompt, sizes.vocab))
        .collect();
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
    let started = Instant::now();
    let cached = generate(
        &policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(2),
    );
    let cached_time = started.elapsed();
    let started = Instant::now();
    let uncached = generate_uncached(
        &policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(2),
    );
    let uncached_time = started.elapsed();
    let new_tokens: usize = cached.iter().map(|g| g.tokens.len()).sum();
    let same = cached
        .iter()
        .zip(&uncached)
        .all(|(c, u)| c.tokens == u.tokens);
    for (name, time) in [
        ("KV cache", cached_time),
        ("recompute, no cache", uncached_time),
    ] {
        println!(
            "  {name:<32} {:>8.0} ms        {:>8.0} new tokens/s",
            time.as_secs_f64() * 1e3,
            new_tokens as f64 / time.as_secs_f64()
        );
    }
    println!(
        "  cache speed-up: {:.1}x{}; same tokens both ways: {same}",
        uncached_time.as_secs_f64() / cached_time.as_secs_f64(),
        if sizes.quick { "" } else { " (target >= 10x)" }
    );
    anyhow::ensure!(same, "cached and uncached generation disagree");
    Ok(())
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

/// The mean time of `steps` training steps on `rows`, after one untimed step.
fn time_training(config: &PolicyConfig, rows: &[Vec<u32>], steps: usize, loss: Loss) -> Duration {
    let device = Default::default();
    AD::seed(&device, 0);
    let mut policy: Policy<AD> = config.init(&device);
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
        let grads = GradientsParams::from_grads(loss.backward(), &policy);
        let mut grads = grads;
        clip_global_norm(&policy, &mut grads, Some(1.0));
        optimizer.step(1e-3, policy, grads)
    };
    policy = step(policy);
    let started = Instant::now();
    for _ in 0..steps {
        policy = step(policy);
    }
    // Read a weight back so every queued operation has finished before the clock stops.
    let _ = policy.valid().embed.weight.val().into_data();
    started.elapsed() / steps as u32
}

/// Runs the PyTorch twin of the training measurement and prints burn's speed relative to it.
fn torch(sizes: &Sizes, threads: usize, burn_tokens_per_second: f64) -> agentry::Result<()> {
    let target = if sizes.quick { "" } else { " (target <= 2x)" };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/bench_policy.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    println!(
        "\n(a') PyTorch, same model, batch and thread count ({python} {})",
        script.display()
    );
    let output = Command::new(&python)
        .arg(&script)
        .args(["--batch", &sizes.batch.to_string()])
        .args(["--seq", &sizes.seq.to_string()])
        .args(["--vocab", &sizes.vocab.to_string()])
        .args(["--layers", &sizes.layers.to_string()])
        .args(["--d-model", &sizes.d_model.to_string()])
        .args(["--heads", &sizes.heads.to_string()])
        .args(["--steps", &sizes.steps.to_string()])
        .args(["--threads", &threads.to_string()])
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
            return Ok(());
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
    let torch_tokens_per_second = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tokens_per_second="))
        .and_then(|v| v.trim().parse::<f64>().ok());
    if let Some(torch) = torch_tokens_per_second {
        println!(
            "  burn step time / PyTorch step time: {:.2}x{target}",
            torch / burn_tokens_per_second
        );
    }
    Ok(())
}
