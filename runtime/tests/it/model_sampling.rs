//! Sampling options against references: top-k 1 is greedy, stop sequences end a generation
//! exactly where they occur, rows of different lengths share a batch, the KV cache matches
//! recomputation without it, and recorded log-probabilities match what training recomputes.

use crate::common;
use agentry_runtime::model::{
    Generation, KeptCache, Policy, PolicyConfig, Sampling, generate, generate_kept,
    generate_switching, generate_uncached,
};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

type B = Flex;

const VOCAB: usize = 64;

fn policy(kv_heads: usize, seed: u64) -> Policy<B> {
    let config = PolicyConfig {
        vocab: VOCAB,
        layers: 2,
        d_model: 32,
        heads: 4,
        kv_heads,
        ffn: 64,
        context: 96,
        tie_embeddings: kv_heads != 2,
    };
    common::seeded::<B, _>(&Default::default(), seed, |device| config.init::<B>(device))
}

/// Prompts of lengths 11, 2, 6, 1 and 30.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 7, 9, 3, 22, 4, 5, 6, 30, 31, 2],
        vec![1, 8],
        vec![1, 40, 41, 42, 43, 44],
        vec![3],
        (0..30).map(|i| 6 + (i * 7) % 50).collect(),
    ]
}

fn run(p: &Policy<B>, sampling: &Sampling, seed: u64) -> Vec<Generation> {
    generate(
        p,
        &prompts(),
        sampling,
        &mut ChaCha8Rng::seed_from_u64(seed),
    )
}

fn assert_close(a: &[f32], b: &[f32], tolerance: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tolerance, "{what}, token {k}: {x} vs {y}");
    }
}

#[test]
fn top_k_one_is_greedy() {
    let p = policy(2, 11);
    let greedy = Sampling {
        max_new_tokens: 16,
        greedy: true,
        ..Sampling::default()
    };
    let top1 = Sampling {
        top_k: Some(1),
        ..Sampling {
            greedy: false,
            ..greedy.clone()
        }
    };
    // At temperature 1 the recorded log-probabilities agree too (greedy records
    // temperature-1 values).
    assert_eq!(run(&p, &top1, 5), run(&p, &greedy, 0));
    // At any temperature the tokens agree.
    let cold = Sampling {
        temperature: 0.6,
        top_p: 0.5,
        ..top1
    };
    let tokens =
        |gens: Vec<Generation>| -> Vec<Vec<u32>> { gens.into_iter().map(|g| g.tokens).collect() };
    assert_eq!(tokens(run(&p, &cold, 9)), tokens(run(&p, &greedy, 0)));
}

/// Where a generation without stop sequences would end with them: at the first point its
/// generated tokens end with one of `stops`.
fn cut_at_first_stop(tokens: &[u32], stops: &[Vec<u32>]) -> Vec<u32> {
    let end = (1..=tokens.len())
        .find(|&e| stops.iter().any(|s| tokens[..e].ends_with(s)))
        .unwrap_or(tokens.len());
    tokens[..end].to_vec()
}

#[test]
fn stop_sequences_end_generation_exactly_at_the_sequence() {
    let p = policy(4, 12);
    let free = Sampling {
        max_new_tokens: 24,
        greedy: true,
        ..Sampling::default()
    };
    let unstopped = run(&p, &free, 0);
    // A two-token sequence from the middle of row 0's generation, a three-token one from
    // row 2's, and one spanning row 1's prompt and its first token, which must not match:
    // stop sequences are matched against generated tokens only.
    let t0 = &unstopped[0].tokens;
    let t2 = &unstopped[2].tokens;
    let spanning = vec![*prompts()[1].last().unwrap(), unstopped[1].tokens[0]];
    let stops = vec![t0[6..8].to_vec(), t2[9..12].to_vec(), spanning];
    let stopped = run(
        &p,
        &Sampling {
            stop_sequences: stops.clone(),
            ..free.clone()
        },
        0,
    );
    for (row, (before, after)) in unstopped.iter().zip(&stopped).enumerate() {
        let expected = cut_at_first_stop(&before.tokens, &stops);
        assert_eq!(after.tokens, expected, "row {row}");
        assert_close(
            &after.logprobs,
            &before.logprobs[..expected.len()],
            // Rows leave the batch at other times, so the sums run in other shapes.
            1e-5,
            "same prefix, same log-probabilities",
        );
    }
    for (row, end) in [(0, 8), (2, 12)] {
        let t = &stopped[row].tokens;
        assert!(
            t.len() <= end && stops.iter().any(|s| t.ends_with(s)),
            "{t:?}"
        );
    }
    // An empty stop sequence is ignored rather than ending every generation at once.
    let empty = run(
        &p,
        &Sampling {
            stop_sequences: vec![vec![]],
            ..free
        },
        0,
    );
    assert_eq!(empty, unstopped);
}

#[test]
fn stop_tokens_and_sequences_combine_with_sampling() {
    let p = policy(2, 13);
    let sampling = Sampling {
        temperature: 0.9,
        top_k: Some(8),
        top_p: 0.95,
        max_new_tokens: 40,
        stop: vec![5],
        stop_sequences: vec![vec![9, 10], vec![20, 21, 22]],
        greedy: false,
    };
    for seed in 0..6 {
        for g in run(&p, &sampling, seed) {
            let t = &g.tokens;
            let end_at = (1..=t.len()).find(|&e| {
                sampling.stop.contains(&t[e - 1])
                    || sampling.stop_sequences.iter().any(|s| t[..e].ends_with(s))
            });
            // Generation ends at the first stop, or runs to its budget without one.
            assert_eq!(end_at.unwrap_or(40), t.len(), "{t:?}");
        }
    }
}

/// Each row of a batch of different-length prompts generates what it generates alone.
#[test]
fn rows_of_different_lengths_share_a_batch() {
    for kv_heads in [4, 2, 1] {
        let p = policy(kv_heads, 14);
        let sampling = Sampling {
            max_new_tokens: 20,
            greedy: true,
            stop: vec![7],
            stop_sequences: vec![vec![12, 13]],
            ..Sampling::default()
        };
        let batch = run(&p, &sampling, 0);
        let lengths: Vec<usize> = batch.iter().map(|g| g.tokens.len()).collect();
        for (prompt, g) in prompts().iter().zip(&batch) {
            let alone = generate(
                &p,
                std::slice::from_ref(prompt),
                &sampling,
                &mut ChaCha8Rng::seed_from_u64(0),
            );
            assert_eq!(
                alone[0].tokens, g.tokens,
                "kv_heads {kv_heads}: {lengths:?}"
            );
            assert_close(&alone[0].logprobs, &g.logprobs, 1e-5, "alone vs batch");
        }
    }
}

/// The KV cache changes nothing but speed: greedy tokens are identical, sampled ones under the
/// same seed too, and log-probabilities agree within 1e-5.
#[test]
fn cached_generation_equals_recomputation_without_cache() {
    for kv_heads in [4, 2, 1] {
        let p = policy(kv_heads, 15);
        let greedy = Sampling {
            max_new_tokens: 30,
            greedy: true,
            stop: vec![3],
            ..Sampling::default()
        };
        let sampled = Sampling {
            temperature: 0.8,
            top_k: Some(10),
            top_p: 0.9,
            greedy: false,
            stop_sequences: vec![vec![4, 4]],
            ..greedy.clone()
        };
        for (sampling, seed) in [(&greedy, 0), (&sampled, 1), (&sampled, 2)] {
            let cached = run(&p, sampling, seed);
            let uncached = generate_uncached(
                &p,
                &prompts(),
                sampling,
                &mut ChaCha8Rng::seed_from_u64(seed),
            );
            assert!(cached.iter().map(|g| g.tokens.len()).sum::<usize>() > 30);
            for (row, (c, u)) in cached.iter().zip(&uncached).enumerate() {
                assert_eq!(c.tokens, u.tokens, "kv_heads {kv_heads}, row {row}");
                assert_close(&c.logprobs, &u.logprobs, 1e-5, "cached vs uncached");
            }
        }
    }
}

/// What training recomputes for the generated tokens ([`Policy::scored_logprobs`] at the
/// sampling temperature) is what sampling recorded, whatever top-k and top-p kept: a fresh
/// token's importance ratio is exactly 1.
/// Three turns of five conversations: each turn's prompt is the last one, its reply and a few
/// new tokens (an observation). Keeping each sequence's keys and values between turns and
/// prefilling only the new tokens gives what a whole prefill gives, for grouped-query and full
/// heads; of a kept cache that is not a prefix of its prompt (another conversation's), only
/// the tokens the two share are reused.
#[test]
fn kept_caches_continue_conversations_as_a_whole_prefill_would() {
    for kv_heads in [2, 4] {
        let p = policy(kv_heads, 17);
        let sampling = Sampling {
            greedy: true,
            max_new_tokens: 5,
            stop: vec![9],
            ..Sampling::default()
        };
        let mut prompts = prompts();
        let mut kept: Vec<Option<KeptCache<B>>> = vec![None; prompts.len()];
        for turn in 0..3 {
            if turn == 2 {
                // Conversations 0 and 1 swap caches: they share their first token only.
                kept.swap(0, 1);
            }
            let whole = generate(&p, &prompts, &sampling, &mut ChaCha8Rng::seed_from_u64(1));
            let reused = generate_kept(
                &p,
                &prompts,
                &mut kept,
                &sampling,
                &mut ChaCha8Rng::seed_from_u64(1),
            );
            for (i, (a, b)) in whole.iter().zip(&reused).enumerate() {
                let what = format!("kv_heads {kv_heads}, turn {turn}, conversation {i}");
                assert_eq!(a.tokens, b.tokens, "{what}");
                assert_close(&a.logprobs, &b.logprobs, 1e-5, &what);
                let cache = kept[i].as_ref().expect("every conversation generated");
                assert_eq!(cache.len(), prompts[i].len() + a.tokens.len() - 1, "{what}");
            }
            // The next prompt: this one, its reply, and an observation of 1 to 5 tokens.
            for (i, (prompt, reply)) in prompts.iter_mut().zip(&whole).enumerate() {
                prompt.extend_from_slice(&reply.tokens);
                prompt.extend((0..1 + (i + turn) % 5).map(|k| (11 + 3 * k + turn) as u32));
            }
        }
    }
}

/// Each generated token's log-probability under `p` at temperature 0.7, given its prompt and
/// the tokens before it.
fn scored(p: &Policy<B>, prompts: &[Vec<u32>], gens: &[Generation]) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .zip(gens)
        .map(|(prompt, g)| prompt.iter().chain(&g.tokens).copied().collect())
        .collect();
    let width = rows.iter().map(Vec::len).max().unwrap();
    let ids: Vec<i64> = rows
        .iter()
        .flat_map(|r| (0..width).map(move |j| r.get(j).map_or(0, |&t| i64::from(t))))
        .collect();
    let tokens = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids, [rows.len(), width]),
        &Default::default(),
    );
    // Position j predicts token j + 1: score exactly the generated tokens.
    let scored: Vec<bool> = prompts
        .iter()
        .zip(&rows)
        .flat_map(|(prompt, row)| (1..width).map(move |j| j >= prompt.len() && j < row.len()))
        .collect();
    let logprobs = p.scored_logprobs(tokens, &scored, 0.7);
    let logprobs: Vec<f32> = logprobs.into_data().into_vec().unwrap();
    prompts
        .iter()
        .zip(gens)
        .enumerate()
        .map(|(r, (prompt, g))| {
            let row = &logprobs[r * (width - 1)..(r + 1) * (width - 1)];
            row[prompt.len() - 1..prompt.len() - 1 + g.tokens.len()].to_vec()
        })
        .collect()
}

fn scoring_sampling() -> Sampling {
    Sampling {
        temperature: 0.7,
        top_k: Some(5),
        top_p: 0.8,
        max_new_tokens: 25,
        ..Sampling::default()
    }
}

#[test]
fn recorded_logprobs_are_what_training_scores() {
    let p = policy(2, 16);
    let prompts = prompts();
    let gens = run(&p, &scoring_sampling(), 3);
    for (g, recomputed) in gens.iter().zip(scored(&p, &prompts, &gens)) {
        assert_close(&g.logprobs, &recomputed, 1e-5, "recorded vs scored");
    }
}

/// Partial rollouts (`interrupt = token`): a generation that takes newer weights part-way
/// samples every later token from them, each token's log-probability the one of the policy
/// that sampled it; switching to the same weights changes nothing.
#[test]
fn a_generation_goes_on_with_newer_weights_from_the_next_token() {
    let (old, new) = (policy(2, 16), policy(2, 17));
    let prompts = prompts();
    let sampling = scoring_sampling();
    // After the third decode step: the prefill samples token 0, each step one more.
    let switching = |to: &Policy<B>| {
        let mut asked = 0;
        let mut newer = || {
            asked += 1;
            (asked == 3).then_some(to)
        };
        generate_switching(
            &old,
            &mut newer,
            &prompts,
            &sampling,
            &mut ChaCha8Rng::seed_from_u64(3),
        )
    };

    let same = switching(&old);
    let plain = run(&old, &sampling, 3);
    for (s, p) in same.iter().zip(&plain) {
        assert_eq!(s.tokens, p.tokens);
        assert_close(
            &s.logprobs,
            &p.logprobs,
            1e-5,
            "switching to the same weights",
        );
    }

    let gens = switching(&new);
    let (by_old, by_new) = (scored(&old, &prompts, &gens), scored(&new, &prompts, &gens));
    let mut switched = 0;
    for (r, g) in gens.iter().enumerate() {
        let at = match g.switches.as_slice() {
            [] => {
                // It ended before the switch.
                assert!(g.tokens.len() <= 3, "row {r}: {g:?}");
                g.tokens.len()
            }
            [at] => {
                switched += 1;
                *at
            }
            more => panic!("row {r} switched {} times", more.len()),
        };
        assert_eq!(at.min(3), at, "row {r}");
        assert_close(
            &g.logprobs[..at],
            &by_old[r][..at],
            1e-5,
            "before the switch",
        );
        assert_close(
            &g.logprobs[at..],
            &by_new[r][at..],
            1e-5,
            "after the switch",
        );
    }
    assert!(switched >= 3, "{switched} rows switched");
    assert_ne!(gens, plain, "the newer weights sampled other tokens");
}
