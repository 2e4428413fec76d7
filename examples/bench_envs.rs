//! Environment speed: steps per second of each built-in task on one core, driven by its oracle
//! and by a seeded random agent, and the cost of generating an instance.
//!
//! ```text
//! cargo run --release --example bench_envs [-- --episodes 2000]
//! ```
//!
//! Target (issue 3): at least 50k steps/s per core for the simulated tasks and 5k for DB, so
//! environments never bound training. Everything runs on the calling thread.

use std::time::{Duration, Instant};

use agentry::env::{Environment, RandomAgent, Split};
use agentry::spec::BuiltinEnv;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn main() -> agentry::Result<()> {
    let mut episodes = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--episodes" => {
                episodes = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| anyhow::anyhow!("--episodes needs a positive integer"))?;
            }
            other => anyhow::bail!("unknown argument `{other}`; usage: bench_envs [--episodes N]"),
        }
    }

    println!(
        "{episodes} episodes per task (difficulties 1-3, train split), one thread\n\
         | task | instance (µs) | oracle steps/s | oracle solved | random steps/s | random solved |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for env in BuiltinEnv::ALL {
        let generator = agentry::tasks::builtin(env);
        let instances = |seed: u64| -> (Vec<Box<dyn Environment>>, Duration) {
            let started = Instant::now();
            let envs = (0..episodes as u64)
                .map(|i| generator.instance(Split::Train, 1 + (i % 3) as u8, seed + i))
                .collect();
            (envs, started.elapsed())
        };

        let (mut envs, generation) = instances(0);
        let oracle = drive(&mut envs, env.default_max_turns(), |env, _| env.oracle());

        let (mut envs, _) = instances(1_000_000);
        let agent = RandomAgent::new(generator.vocabulary());
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let random = drive(&mut envs, env.default_max_turns(), |_, reset| {
            agent.call(reset, &mut rng)
        });

        println!(
            "| {} | {:.1} | {:.0} | {:.3} | {:.0} | {:.3} |",
            env.name(),
            generation.as_secs_f64() * 1e6 / episodes as f64,
            oracle.steps_per_second(),
            oracle.solved as f64 / episodes as f64,
            random.steps_per_second(),
            random.solved as f64 / episodes as f64,
        );
    }
    Ok(())
}

/// What one pass over a set of episodes measured: steps taken (resets included in the time),
/// wall time, and episodes solved.
struct Pass {
    steps: u64,
    elapsed: Duration,
    solved: usize,
}

impl Pass {
    fn steps_per_second(&self) -> f64 {
        self.steps as f64 / self.elapsed.as_secs_f64()
    }
}

/// Plays every episode to its end or `max_turns`, asking `next` for each call.
fn drive(
    envs: &mut [Box<dyn Environment>],
    max_turns: u32,
    mut next: impl FnMut(&dyn Environment, &agentry::env::Reset) -> Option<agentry::env::ToolCall>,
) -> Pass {
    let started = Instant::now();
    let mut steps = 0;
    let mut solved = 0;
    for env in envs.iter_mut() {
        let reset = env.reset();
        for _ in 0..max_turns {
            let Some(call) = next(env.as_ref(), &reset) else {
                break;
            };
            steps += 1;
            if env.step(&call).done() {
                break;
            }
        }
        solved += usize::from(env.success());
    }
    Pass {
        steps,
        elapsed: started.elapsed(),
        solved,
    }
}
