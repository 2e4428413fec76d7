//! The serving engine: replies equal what [`generate`] gives the rendered conversation, alone
//! or among concurrent jobs; seeded replies repeat; stop texts cut replies; a reply sent back
//! renders as the tokens generated; bad conversations are refused with the reason.

use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use crate::common;
use agentry_env::{Reset, ToolCall};
use agentry_runtime::model::{Policy, PolicyConfig, Sampling, generate};
use agentry_runtime::serving::{
    ChatEvent, ChatJob, ChatMessage, Engine, EngineOptions, Finish, Refused,
};
use agentry_runtime::text::{ChatFormat, Tokenizer};
use burn::backend::Flex;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

type B = Flex;

fn reset() -> Reset {
    Reset {
        instruction: "How many neighbors does #0 have?".to_string(),
        tools: common::kg_tools(),
    }
}

fn chat() -> ChatFormat {
    let call = ToolCall::new("count", [("variable", json!("#0"))]);
    let texts = ChatFormat::corpus_text(&reset(), &[(call, "#1, 3 entities".to_string())]);
    ChatFormat::new(Tokenizer::train(texts.iter().map(String::as_str), 400))
}

fn policy(vocab: usize) -> Policy<B> {
    let config = PolicyConfig {
        vocab,
        layers: 2,
        d_model: 32,
        heads: 4,
        kv_heads: 2,
        ffn: 64,
        context: 128,
        tie_embeddings: true,
    };
    common::seeded::<B, _>(&Default::default(), 31, |device| config.init::<B>(device))
}

fn engine(options: EngineOptions) -> (Engine, ChatFormat, Policy<B>) {
    let chat = chat();
    let policy = policy(chat.tokenizer().vocab_size());
    (
        Engine::start(policy.clone(), chat.clone(), options),
        chat,
        policy,
    )
}

fn job(question: &str) -> ChatJob {
    ChatJob {
        messages: vec![ChatMessage::User(question.to_string())],
        tools: Vec::new(),
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: Some(12),
        stop: Vec::new(),
        seed: None,
        n: 1,
        top_logprobs: None,
        forced_call: None,
    }
}

/// A submitted job's events.
fn submit(engine: &Engine, job: ChatJob) -> Receiver<ChatEvent> {
    let (tx, rx) = channel();
    engine
        .submit(job, Box::new(move |event| tx.send(event).is_ok()))
        .expect("accepted");
    rx
}

/// A job's replies (text, finish) and its token counts, from its events.
struct Answer {
    replies: Vec<(String, Finish, usize)>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

fn answer(events: Receiver<ChatEvent>, n: usize) -> Answer {
    let mut replies = vec![(String::new(), None, 0); n];
    loop {
        match events
            .recv_timeout(Duration::from_secs(30))
            .expect("an event")
        {
            ChatEvent::Delta {
                index,
                text,
                tokens,
            } => {
                assert!(replies[index].1.is_none(), "text after the end");
                replies[index].0.push_str(&text);
                replies[index].2 += tokens.len();
            }
            ChatEvent::Done { index, finish, .. } => replies[index].1 = Some(finish),
            ChatEvent::Finished {
                prompt_tokens,
                completion_tokens,
            } => {
                return Answer {
                    replies: replies
                        .into_iter()
                        .map(|(t, f, k)| (t, f.expect("every reply ended"), k))
                        .collect(),
                    prompt_tokens,
                    completion_tokens,
                };
            }
        }
    }
}

/// What the policy generates greedily for the rendered conversation, as text.
fn reference(chat: &ChatFormat, policy: &Policy<B>, question: &str, max: usize) -> String {
    let reset = Reset {
        instruction: question.to_string(),
        tools: Vec::new(),
    };
    let prompt = chat.begin(&reset).tokens;
    let sampling = Sampling {
        greedy: true,
        max_new_tokens: max,
        stop: vec![chat.end_token()],
        ..Sampling::default()
    };
    let g = generate(
        policy,
        &[prompt],
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    chat.agent_text(&g[0].tokens)
}

fn questions() -> Vec<String> {
    (0..8)
        .map(|i| format!("How many neighbors does #{i} have? {}", "count ".repeat(i)))
        .collect()
}

/// Eight sampled conversations at once, in a batch of at most 3, answer as each does alone
/// (each with its seed); greedy replies are what [`generate`] gives the rendered conversation.
#[test]
fn concurrent_jobs_answer_as_alone_and_as_generate() {
    let (engine, chat, policy) = engine(EngineOptions {
        max_batch: 3,
        ..EngineOptions::default()
    });
    let seeded = |i: usize, q: &str| ChatJob {
        temperature: 1.0,
        seed: Some(i as u64),
        max_tokens: Some(5 + 3 * i),
        ..job(q)
    };
    let alone: Vec<Answer> = questions()
        .iter()
        .enumerate()
        .map(|(i, q)| answer(submit(&engine, seeded(i, q)), 1))
        .collect();
    let pending: Vec<_> = questions()
        .iter()
        .enumerate()
        .map(|(i, q)| submit(&engine, seeded(i, q)))
        .collect();
    let together: Vec<Answer> = pending.into_iter().map(|rx| answer(rx, 1)).collect();
    let distinct: std::collections::HashSet<&String> =
        alone.iter().map(|a| &a.replies[0].0).collect();
    assert!(distinct.len() > 4, "sampled replies differ: {distinct:?}");
    for (i, q) in questions().iter().enumerate() {
        assert_eq!(together[i].replies, alone[i].replies, "question {i}");
        let prompt = engine.render(&job(q)).unwrap();
        assert_eq!(alone[i].prompt_tokens, prompt.len());
        assert_eq!(together[i].completion_tokens, alone[i].completion_tokens);
        assert!(alone[i].completion_tokens <= 5 + 3 * i);
    }
    let greedy: Vec<_> = questions()
        .iter()
        .map(|q| submit(&engine, job(q)))
        .collect();
    for (q, rx) in questions().iter().zip(greedy) {
        assert_eq!(answer(rx, 1).replies[0].0, reference(&chat, &policy, q, 12));
    }
}

/// Sampled replies with a seed repeat exactly, under any load; `n` replies differ.
#[test]
fn seeded_replies_repeat_and_choices_differ() {
    let (engine, _, _) = engine(EngineOptions::default());
    let sampled = |seed| ChatJob {
        temperature: 1.0,
        seed: Some(seed),
        n: 3,
        max_tokens: Some(20),
        top_logprobs: Some(2),
        ..job("How many neighbors does #0 have?")
    };
    let first = answer(submit(&engine, sampled(7)), 3);
    let noise: Vec<_> = (0..4).map(|i| submit(&engine, sampled(100 + i))).collect();
    let again = answer(submit(&engine, sampled(7)), 3);
    noise.into_iter().for_each(|rx| drop(answer(rx, 3)));
    assert_eq!(first.replies, again.replies);
    assert!(
        first.replies[0].0 != first.replies[1].0 || first.replies[1].0 != first.replies[2].0,
        "three sampled replies of 20 tokens are not all equal"
    );
    for (text, _, tokens) in &first.replies {
        assert!(*tokens >= 1, "log-probabilities reported: {text}");
    }
    assert_eq!(
        first.completion_tokens,
        first.replies.iter().map(|r| r.2).sum::<usize>()
    );
}

/// A stop text ends the reply before it; without it the reply goes on.
#[test]
fn stop_texts_cut_replies() {
    let (engine, _, _) = engine(EngineOptions::default());
    let q = "How many neighbors does #3 have?";
    let sampled = ChatJob {
        temperature: 1.0,
        seed: Some(3),
        max_tokens: Some(30),
        ..job(q)
    };
    let full = answer(submit(&engine, sampled.clone()), 1);
    let text = &full.replies[0].0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() >= 12, "a long enough reply: {text:?}");
    // Three characters from the middle of the reply.
    let (from, to) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
    let stop = text[from..to].to_string();
    let at = text.find(&stop).unwrap();
    let cut = answer(
        submit(
            &engine,
            ChatJob {
                stop: vec![stop.clone(), "never appears".into()],
                ..sampled
            },
        ),
        1,
    );
    assert_eq!(cut.replies[0].0, text[..at], "cut before {stop:?}");
    assert_eq!(cut.replies[0].1, Finish::Stop);
}

/// A reply sent back as the assistant's message renders as the tokens generated; a call the
/// engine did not generate renders in the policy's call form.
#[test]
fn replies_sent_back_render_as_generated() {
    let (engine, chat, _) = engine(EngineOptions::default());
    let q = "How many neighbors does #5 have?";
    let first = job(q);
    let reply = answer(submit(&engine, first.clone()), 1).replies[0]
        .0
        .clone();
    let prompt = engine.render(&first).unwrap();
    let mut next = first.clone();
    next.messages.push(ChatMessage::Assistant {
        content: reply.clone(),
        calls: Vec::new(),
    });
    next.messages.push(ChatMessage::User("go on".into()));
    let rendered = engine.render(&next).unwrap();
    assert_eq!(rendered[..prompt.len()], prompt[..]);
    // The reply's generated tokens, the end token, then the observation.
    let reference = reference(&chat, &engine_policy(&chat), q, 12);
    assert_eq!(reference, reply);
    let mut transcript = chat.begin(&Reset {
        instruction: q.into(),
        tools: Vec::new(),
    });
    let reset_len = transcript.tokens.len();
    let generated = &rendered[reset_len..];
    let end = generated
        .iter()
        .position(|&t| t == chat.end_token())
        .expect("the reply's end token");
    chat.push_agent(&mut transcript, &generated[..=end]);
    chat.push_observation(&mut transcript, "go on");
    assert_eq!(rendered, transcript.tokens);

    let call = ToolCall::new("count", [("variable", json!("#0"))]);
    let mut with_call = first;
    with_call.messages.push(ChatMessage::Assistant {
        content: String::new(),
        calls: vec![("call_x".into(), call.clone())],
    });
    with_call.messages.push(ChatMessage::Tool {
        call_id: "call_x".into(),
        content: "3".into(),
    });
    let mut expected = chat.begin(&Reset {
        instruction: q.into(),
        tools: Vec::new(),
    });
    chat.push_agent(&mut expected, &chat.demo_turn(&call));
    chat.push_observation(&mut expected, "3");
    assert_eq!(engine.render(&with_call).unwrap(), expected.tokens);
}

fn engine_policy(chat: &ChatFormat) -> Policy<B> {
    policy(chat.tokenizer().vocab_size())
}

/// Conversations that cannot be answered are refused with the reason.
#[test]
fn bad_conversations_are_refused() {
    let (engine, _, _) = engine(EngineOptions::default());
    let refused = |messages: Vec<ChatMessage>| match engine.submit(
        ChatJob {
            messages,
            ..job("x")
        },
        Box::new(|_| true),
    ) {
        Err(Refused::Invalid { message, code, .. }) => (message, code),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let user = |s: &str| ChatMessage::User(s.into());
    let assistant = |s: &str| ChatMessage::Assistant {
        content: s.into(),
        calls: Vec::new(),
    };
    let (message, _) = refused(vec![assistant("hi")]);
    assert!(message.contains("start with a user message"), "{message}");
    let (message, _) = refused(vec![user("q"), assistant("a")]);
    assert!(
        message.contains("ends with an assistant message"),
        "{message}"
    );
    let (message, _) = refused(vec![user("q"), assistant("a"), assistant("b")]);
    assert!(message.contains("both the assistant's"), "{message}");
    let (message, _) = refused(vec![user("q"), ChatMessage::System("s".into())]);
    assert!(message.contains("only come first"), "{message}");
    let long = "count ".repeat(200);
    let (message, code) = refused(vec![user(&long)]);
    assert_eq!(code, Some("context_length_exceeded"), "{message}");
}

/// A job nobody listens to any more is dropped; the engine goes on serving.
#[test]
fn abandoned_jobs_are_dropped() {
    let (engine, _, _) = engine(EngineOptions::default());
    let (tx, rx) = channel();
    engine
        .submit(
            ChatJob {
                max_tokens: Some(100),
                ..job("How many neighbors does #1 have?")
            },
            Box::new(move |event| {
                let _ = tx.send(event);
                false
            }),
        )
        .unwrap();
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok(ChatEvent::Delta { .. } | ChatEvent::Done { .. })
    ));
    let after = answer(submit(&engine, job("How many neighbors does #2 have?")), 1);
    assert_eq!(after.replies.len(), 1);
    // The abandoned job sent nothing after its sink said no one listens.
    assert!(rx.try_iter().count() <= 1);
}

/// Jobs wait in a bounded queue while the batch is full (the engine takes none it has no room
/// for); one more is refused as busy, and the waiting ones are answered once there is room.
#[test]
fn a_full_queue_refuses_jobs() {
    let (engine, _, _) = engine(EngineOptions {
        max_batch: 1,
        queue: 1,
        ..EngineOptions::default()
    });
    // The first job holds the engine thread in its sink at its first two events, until
    // released each time.
    let (at, reached) = channel::<usize>();
    let (release, held) = channel::<()>();
    let mut calls = 0;
    engine
        .submit(
            ChatJob {
                max_tokens: Some(20),
                ..job("How many neighbors does #1 have?")
            },
            Box::new(move |_| {
                calls += 1;
                if calls <= 2 {
                    let _ = at.send(calls);
                    let _ = held.recv();
                }
                true
            }),
        )
        .unwrap();
    let wait = |k: usize| assert_eq!(reached.recv_timeout(Duration::from_secs(30)), Ok(k));
    wait(1);
    let queued = submit(&engine, job("How many neighbors does #2 have?"));
    release.send(()).unwrap();
    // A later step of the first job: the engine has been round its loop with the second job
    // queued and no room for it.
    wait(2);
    let refused = engine.submit(job("How many neighbors does #3 have?"), Box::new(|_| true));
    assert_eq!(refused, Err(Refused::Busy));
    release.send(()).unwrap();
    assert_eq!(answer(queued, 1).replies.len(), 1);
    let again = submit(&engine, job("How many neighbors does #3 have?"));
    assert_eq!(answer(again, 1).replies.len(), 1, "room again");
}

/// A forced call: every reply starts with the call's beginning in the policy's call form, so
/// it reads as a call of that tool whenever the arguments the policy writes parse; a tool that
/// is not declared cannot be forced.
#[test]
fn a_forced_call_starts_every_reply() {
    let (engine, chat, _) = engine(EngineOptions::default());
    let forced = ChatJob {
        tools: common::kg_tools(),
        forced_call: Some("count".to_string()),
        temperature: 1.0,
        seed: Some(1),
        n: 4,
        max_tokens: Some(8),
        ..job("How many neighbors does #0 have?")
    };
    let prompt = engine.render(&forced).unwrap();
    let unforced = engine
        .render(&ChatJob {
            forced_call: None,
            ..forced.clone()
        })
        .unwrap();
    assert_eq!(prompt[..unforced.len()], unforced[..]);
    assert_eq!(
        chat.tokenizer().decode(&prompt[unforced.len()..]),
        "count(",
        "the prompt ends with the call's beginning"
    );
    let (tx, rx) = channel();
    engine
        .submit(forced.clone(), Box::new(move |e| tx.send(e).is_ok()))
        .unwrap();
    let mut texts = vec![String::new(); 4];
    let mut calls = vec![Vec::new(); 4];
    loop {
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            ChatEvent::Delta { index, text, .. } => texts[index].push_str(&text),
            ChatEvent::Done {
                index, calls: c, ..
            } => calls[index] = c,
            ChatEvent::Finished { .. } => break,
        }
    }
    for (text, calls) in texts.iter().zip(&calls) {
        match calls.first() {
            Some((_, call)) => assert_eq!(call.name, "count"),
            None => assert!(text.starts_with("count("), "{text:?}"),
        }
    }
    let refused = engine.submit(
        ChatJob {
            forced_call: Some("delete_everything".to_string()),
            ..forced
        },
        Box::new(|_| true),
    );
    assert!(
        matches!(
            refused,
            Err(Refused::Invalid {
                param: Some("tool_choice"),
                ..
            })
        ),
        "{refused:?}"
    );
}
