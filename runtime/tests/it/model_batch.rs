//! Continuous batching against [`generate`]: sequences that join a running batch at any step,
//! longer or shorter than those already in it, with their own sampling settings and seeds,
//! generate what they generate alone; removed sequences leave the others untouched.

use crate::common;
use agentry_runtime::model::batch::{Request, Sampled};
use agentry_runtime::model::{
    ContinuousBatch, End, Generation, Policy, PolicyConfig, Sampling, generate,
};
use burn::backend::Flex;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

type B = Flex;

fn policy(kv_heads: usize) -> Policy<B> {
    let config = PolicyConfig {
        vocab: 64,
        layers: 2,
        d_model: 32,
        heads: 4,
        kv_heads,
        ffn: 64,
        context: 96,
        tie_embeddings: true,
    };
    common::seeded::<B, _>(&Default::default(), 23, |device| config.init::<B>(device))
}

/// Prompts of lengths 11, 2, 30, 6 and 1.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 7, 9, 3, 22, 4, 5, 6, 30, 31, 2],
        vec![1, 8],
        (0..30).map(|i| 6 + (i * 7) % 50).collect(),
        vec![1, 40, 41, 42, 43, 44],
        vec![3],
    ]
}

/// Per prompt, a different sampling setting: greedy, tempered, top-k, top-p, a stop token.
fn samplings() -> Vec<Sampling> {
    let base = Sampling {
        max_new_tokens: 12,
        ..Sampling::default()
    };
    vec![
        Sampling {
            greedy: true,
            ..base.clone()
        },
        Sampling {
            temperature: 0.7,
            max_new_tokens: 20,
            ..base.clone()
        },
        Sampling {
            top_k: Some(4),
            max_new_tokens: 5,
            ..base.clone()
        },
        Sampling {
            top_p: 0.8,
            ..base.clone()
        },
        Sampling {
            stop: vec![17, 40],
            max_new_tokens: 30,
            ..base
        },
    ]
}

fn request(i: usize) -> Request<usize, ChaCha8Rng> {
    Request {
        key: i,
        prompt: prompts()[i].clone(),
        sampling: samplings()[i].clone(),
        rng: ChaCha8Rng::seed_from_u64(100 + i as u64),
        top_logprobs: i % 3,
    }
}

/// What each prompt generates alone, with its own setting and seed.
fn alone(p: &Policy<B>) -> Vec<Generation> {
    (0..prompts().len())
        .map(|i| {
            let mut rng = ChaCha8Rng::seed_from_u64(100 + i as u64);
            generate(p, &prompts()[i..=i], &samplings()[i], &mut rng).remove(0)
        })
        .collect()
}

/// Collects the batch's tokens per key; checks each token's alternatives and end.
fn collect(out: &mut [Generation], ended: &mut [Option<End>], tokens: Vec<Sampled<usize>>) {
    for s in tokens {
        assert!(ended[s.key].is_none(), "sequence {} ended already", s.key);
        assert_eq!(s.top.len(), s.key % 3, "alternatives asked for");
        if let Some(&(best, logprob)) = s.top.first() {
            assert!(
                s.top.windows(2).all(|w| w[0].1 >= w[1].1),
                "most likely first"
            );
            if samplings()[s.key].greedy {
                assert_eq!(
                    (best, logprob),
                    (s.token, s.logprob),
                    "greedy takes the best"
                );
            }
        }
        out[s.key].tokens.push(s.token);
        out[s.key].logprobs.push(s.logprob);
        ended[s.key] = s.end;
    }
}

fn assert_same(batch: &[Generation], alone: &[Generation], what: &str) {
    for (i, (a, b)) in batch.iter().zip(alone).enumerate() {
        assert_eq!(a.tokens, b.tokens, "{what}: sequence {i}");
        for (k, (x, y)) in a.logprobs.iter().zip(&b.logprobs).enumerate() {
            assert!(
                (x - y).abs() < 1e-4,
                "{what}: sequence {i}, token {k}: {x} vs {y}"
            );
        }
    }
}

/// Sequences join one, two and three steps apart (the 30-token prompt joins a batch of
/// shorter ones, the 1-token prompt a batch of longer ones), each with its own setting.
#[test]
fn sequences_joining_a_running_batch_generate_what_they_generate_alone() {
    for kv_heads in [2, 4] {
        let p = policy(kv_heads);
        let reference = alone(&p);
        let n = prompts().len();
        let mut out = vec![Generation::default(); n];
        let mut ended = vec![None; n];
        let mut batch = ContinuousBatch::<B, usize, ChaCha8Rng>::new(&p);
        let joins = [(0, vec![0, 1]), (1, vec![2]), (3, vec![3, 4])];
        let mut step = 0;
        loop {
            for (at, keys) in &joins {
                if *at == step {
                    let admitted = batch.admit(keys.iter().map(|&i| request(i)).collect());
                    collect(&mut out, &mut ended, admitted);
                }
            }
            if batch.is_empty() && step > 3 {
                break;
            }
            collect(&mut out, &mut ended, batch.step());
            step += 1;
        }
        assert_same(&out, &reference, &format!("kv_heads {kv_heads}"));
        for (i, end) in ended.iter().enumerate() {
            let expected = match reference[i].tokens.last() {
                Some(t) if samplings()[i].stop.contains(t) => End::Stop,
                _ => End::Length,
            };
            assert_eq!(*end, Some(expected), "sequence {i}'s end");
        }
    }
}

/// Removing a sequence mid-way (a cancelled request) leaves the others' tokens as they were,
/// and a batch emptied by removal takes new sequences again.
#[test]
fn removed_sequences_leave_the_others_untouched() {
    let p = policy(2);
    let reference = alone(&p);
    let n = prompts().len();
    let mut out = vec![Generation::default(); n];
    let mut ended = vec![None; n];
    let mut batch = ContinuousBatch::<B, usize, ChaCha8Rng>::new(&p);
    collect(
        &mut out,
        &mut ended,
        batch.admit((0..4).map(request).collect()),
    );
    collect(&mut out, &mut ended, batch.step());
    batch.remove(&2);
    batch.remove(&99);
    while !batch.is_empty() {
        collect(&mut out, &mut ended, batch.step());
    }
    for i in [0, 1, 3] {
        assert_same(&out[i..=i], &reference[i..=i], "kept");
    }
    assert_eq!(
        out[2].tokens,
        reference[2].tokens[..2],
        "removed after two tokens"
    );
    assert_eq!(ended[2], None, "a removed sequence reports no end");

    batch.remove(&0);
    let mut again = vec![Generation::default(); n];
    let mut ended = vec![None; n];
    collect(&mut again, &mut ended, batch.admit(vec![request(4)]));
    while !batch.is_empty() {
        collect(&mut again, &mut ended, batch.step());
    }
    assert_same(&again[4..], &reference[4..], "after emptying");
}

/// Requests that can generate nothing (empty prompt, a prompt filling the context, no new
/// tokens allowed) end at once without joining; a one-token limit ends at the first token.
#[test]
fn requests_that_cannot_generate_do_not_join() {
    let p = policy(4);
    let mut batch = ContinuousBatch::<B, usize, ChaCha8Rng>::new(&p);
    let mut empty = request(0);
    empty.prompt.clear();
    let mut full = request(1);
    full.prompt = vec![5; 96];
    let mut none = request(2);
    none.sampling.max_new_tokens = 0;
    let mut one = request(3);
    one.sampling.max_new_tokens = 1;
    let out = batch.admit(vec![empty, full, none, one]);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].key, out[0].end), (3, Some(End::Length)));
    assert!(batch.is_empty());
    assert!(batch.step().is_empty());
}
