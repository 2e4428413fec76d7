//! Tests of the environment controller: KG sessions through the batch API match sequential runs,
//! timeouts, panics, cancellation, forks, real concurrency and shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use agentry_env::controller::{Controller, ControllerConfig, ControllerError, SessionId};
use agentry_env::kg::Kg;
use agentry_env::{Environment, Reset, Split, Status, Step, TaskGenerator, ToolCall};
use serde_json::json;

fn controller(workers: usize, timeout: Duration) -> Controller {
    Controller::new(ControllerConfig { workers, timeout }).unwrap()
}

fn go() -> ToolCall {
    ToolCall::new("go", [])
}

/// A toy environment: finishes after `finish_after` steps, and can sleep or panic on demand.
#[derive(Clone)]
struct Toy {
    label: usize,
    reset_sleep: Duration,
    step_sleep: Duration,
    panic_in_reset: bool,
    panic_at_step: Option<u32>,
    panic_in_oracle: bool,
    /// Set when a step begins.
    entered: Arc<AtomicBool>,
    steps: u32,
    finish_after: u32,
}

impl Toy {
    fn new(label: usize) -> Toy {
        Toy {
            label,
            reset_sleep: Duration::ZERO,
            step_sleep: Duration::ZERO,
            panic_in_reset: false,
            panic_at_step: None,
            panic_in_oracle: false,
            entered: Arc::new(AtomicBool::new(false)),
            steps: 0,
            finish_after: 3,
        }
    }

    fn step_sleep(mut self, d: Duration) -> Toy {
        self.step_sleep = d;
        self
    }

    fn boxed(self) -> Box<dyn Environment> {
        Box::new(self)
    }
}

impl Environment for Toy {
    fn reset(&mut self) -> Reset {
        thread::sleep(self.reset_sleep);
        if self.panic_in_reset {
            panic!("reset exploded");
        }
        Reset {
            instruction: format!("toy {}", self.label),
            tools: Vec::new(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        self.entered.store(true, Ordering::SeqCst);
        self.steps += 1;
        if self.panic_at_step == Some(self.steps) {
            panic!("toy {} fails at step {}", self.label, self.steps);
        }
        thread::sleep(self.step_sleep);
        let done = self.steps >= self.finish_after;
        Step {
            observation: format!("toy {} step {} {}", self.label, self.steps, call.name),
            reward: if done { 1.0 } else { 0.0 },
            status: if done {
                Status::Completed
            } else {
                Status::Running
            },
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        assert!(!self.panic_in_oracle, "no oracle today");
        (self.steps < self.finish_after).then(go)
    }

    fn success(&self) -> bool {
        self.steps >= self.finish_after
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

/// Waits until a toy's step has begun.
fn wait_for(entered: &AtomicBool) {
    let t = Instant::now();
    while !entered.load(Ordering::SeqCst) {
        assert!(t.elapsed() < Duration::from_secs(5), "the step never began");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Starts sessions that must reset fine; returns their ids.
fn start_all(c: &Controller, envs: Vec<Box<dyn Environment>>) -> Vec<SessionId> {
    c.start_many(envs)
        .into_iter()
        .map(|s| {
            let s = s.unwrap();
            s.reset.unwrap();
            s.id
        })
        .collect()
}

fn batch(ids: &[SessionId]) -> Vec<(SessionId, ToolCall)> {
    ids.iter().map(|&id| (id, go())).collect()
}

fn assert_task_error(step: &Step, needle: &str) {
    assert_eq!(step.status, Status::TaskError, "{}", step.observation);
    assert_eq!(step.reward, 0.0);
    assert!(
        step.observation.contains(needle),
        "`{}` does not mention `{needle}`",
        step.observation
    );
}

type Transcript = (Reset, Vec<(ToolCall, Step)>);

fn kg_instance(kg: &Kg, i: u64) -> Box<dyn Environment> {
    let split = if i % 4 == 3 {
        Split::Test
    } else {
        Split::Train
    };
    kg.instance(split, (i % 3) as u8 + 1, i)
}

#[test]
fn kg_sessions_through_the_batch_api_match_sequential_runs() {
    const N: u64 = 256;
    let kg = Kg::default();
    let sequential: Vec<Transcript> = (0..N)
        .map(|i| {
            let mut env = kg_instance(&kg, i);
            let reset = env.reset();
            let mut trace = Vec::new();
            while let Some(call) = env.oracle() {
                let step = env.step(&call);
                trace.push((call, step));
            }
            assert!(env.success());
            (reset, trace)
        })
        .collect();

    let c = controller(8, Duration::from_secs(30));
    let started = c.start_many((0..N).map(|i| kg_instance(&kg, i)).collect());
    let mut ids = Vec::new();
    let mut transcripts: Vec<Transcript> = Vec::new();
    for s in started {
        let s = s.unwrap();
        ids.push(s.id);
        transcripts.push((s.reset.unwrap(), Vec::new()));
    }
    assert_eq!(c.stats().live_sessions, N as usize);
    let mut live: Vec<usize> = (0..N as usize).collect();
    let mut turns = 0;
    while !live.is_empty() {
        let live_ids: Vec<SessionId> = live.iter().map(|&k| ids[k]).collect();
        let calls: Vec<(SessionId, ToolCall)> = live_ids
            .iter()
            .zip(c.oracle_many(&live_ids))
            .map(|(&id, call)| {
                (
                    id,
                    call.unwrap().expect("a live session has an oracle call"),
                )
            })
            .collect();
        let steps = c.step_many(&calls);
        assert_eq!(steps.len(), calls.len());
        let mut still = Vec::new();
        for ((&k, (_, call)), step) in live.iter().zip(calls).zip(steps) {
            let step = step.unwrap();
            let done = step.done();
            transcripts[k].1.push((call, step));
            if !done {
                still.push(k);
            }
        }
        live = still;
        turns += 1;
        assert!(turns <= 10, "the oracles do not end");
    }
    assert_eq!(transcripts, sequential);
    for &id in &ids {
        assert_eq!(c.success(id), Ok(true));
        assert_eq!(c.oracle(id), Err(ControllerError::Finished(id)));
        assert_eq!(c.step(id, &go()), Err(ControllerError::Finished(id)));
    }
    let stats = c.stats();
    let total: usize = sequential.iter().map(|t| t.1.len()).sum();
    assert_eq!(stats.live_sessions, 0);
    assert_eq!(stats.started, N);
    assert_eq!(stats.finished, N);
    assert_eq!(stats.steps, total as u64);
    assert_eq!((stats.timeouts, stats.panics, stats.cancelled), (0, 0, 0));
    assert_eq!(stats.workers, 8);
}

#[test]
fn concurrency_is_real_and_answers_keep_input_order() {
    const N: usize = 8;
    let c = controller(N, Duration::from_secs(5));
    // The later a session is in the batch, the sooner it finishes: 200 ms down to 95 ms, 1.18 s
    // if run one after another.
    let ids = start_all(
        &c,
        (0..N)
            .map(|i| {
                Toy::new(i)
                    .step_sleep(Duration::from_millis(200 - 15 * i as u64))
                    .boxed()
            })
            .collect(),
    );
    for round in 1..=2 {
        let t = Instant::now();
        let steps = c.step_many(&batch(&ids));
        let elapsed = t.elapsed();
        assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
        for (i, step) in steps.into_iter().enumerate() {
            let step = step.unwrap();
            assert_eq!(step.observation, format!("toy {i} step {round} go"));
            assert_eq!(step.status, Status::Running);
        }
    }
    // Input order holds whatever the ids' order.
    let reversed: Vec<SessionId> = ids.iter().rev().copied().collect();
    let steps = c.step_many(&batch(&reversed));
    for (j, step) in steps.into_iter().enumerate() {
        let step = step.unwrap();
        assert_eq!(step.observation, format!("toy {} step 3 go", N - 1 - j));
        assert_eq!(step.status, Status::Completed);
    }
    assert_eq!(c.stats().live_sessions, 0);
}

#[test]
fn a_call_past_the_timeout_ends_only_its_session_and_the_pool_keeps_its_capacity() {
    const WORKERS: usize = 8;
    let timeout = Duration::from_millis(300);
    let c = controller(WORKERS, timeout);
    let stuck = Duration::from_secs(5);
    let bound = Duration::from_millis(1500);

    // One stuck session among quick ones.
    let mut envs = vec![Toy::new(0).step_sleep(stuck).boxed()];
    envs.extend((1..WORKERS).map(|i| Toy::new(i).boxed()));
    let ids = start_all(&c, envs);
    let t = Instant::now();
    let steps = c.step_many(&batch(&ids));
    assert!(t.elapsed() < bound, "{:?}", t.elapsed());
    assert_task_error(steps[0].as_ref().unwrap(), "timed out");
    for (i, step) in steps.iter().enumerate().skip(1) {
        assert_eq!(
            step.as_ref().unwrap().observation,
            format!("toy {i} step 1 go")
        );
    }
    assert_eq!(
        c.step(ids[0], &go()),
        Err(ControllerError::Finished(ids[0]))
    );
    assert_eq!(c.success(ids[0]), Ok(false));
    let stats = c.stats();
    assert_eq!((stats.timeouts, stats.stuck_threads), (1, 1));
    assert_eq!(stats.workers, WORKERS);

    // A whole batch of stuck sessions: as many as there are workers.
    let sleepers = start_all(
        &c,
        (0..WORKERS)
            .map(|i| Toy::new(100 + i).step_sleep(stuck).boxed())
            .collect(),
    );
    let t = Instant::now();
    for step in c.step_many(&batch(&sleepers)) {
        assert_task_error(&step.unwrap(), "timed out");
    }
    assert!(t.elapsed() < bound, "{:?}", t.elapsed());
    let stats = c.stats();
    assert_eq!((stats.timeouts, stats.stuck_threads), (9, 9));
    assert_eq!(stats.workers, WORKERS);

    // Still full capacity: 8 sessions sleeping 150 ms (1.2 s one after another) run at once.
    let busy = start_all(
        &c,
        (0..WORKERS)
            .map(|i| {
                Toy::new(200 + i)
                    .step_sleep(Duration::from_millis(150))
                    .boxed()
            })
            .collect(),
    );
    for _ in 0..2 {
        let t = Instant::now();
        for step in c.step_many(&batch(&busy)) {
            assert_eq!(step.unwrap().status, Status::Running);
        }
        assert!(
            t.elapsed() < Duration::from_millis(800),
            "{:?}",
            t.elapsed()
        );
    }
    // The quick sessions of the first batch went on untouched.
    for (i, step) in c.step_many(&batch(&ids[1..])).into_iter().enumerate() {
        assert_eq!(
            step.unwrap().observation,
            format!("toy {} step 2 go", i + 1)
        );
    }

    // Dropping the controller does not wait for the stuck threads.
    let t = Instant::now();
    drop(c);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn a_reset_past_the_timeout_fails_its_start_only() {
    let c = controller(2, Duration::from_millis(200));
    let mut slow = Toy::new(0);
    slow.reset_sleep = Duration::from_secs(3);
    let t = Instant::now();
    let started = c.start_many(vec![slow.boxed(), Toy::new(1).boxed()]);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let first = started[0].as_ref().unwrap();
    assert_task_error(first.reset.as_ref().unwrap_err(), "timed out");
    assert_eq!(
        c.step(first.id, &go()),
        Err(ControllerError::Finished(first.id))
    );
    let second = started[1].as_ref().unwrap();
    assert_eq!(second.reset.as_ref().unwrap().instruction, "toy 1");
    assert_eq!(c.step(second.id, &go()).unwrap().status, Status::Running);
    assert_eq!(c.stats().timeouts, 1);
}

#[test]
fn the_late_result_of_a_timed_out_call_is_discarded() {
    let c = controller(2, Duration::from_millis(100));
    let id = start_all(
        &c,
        vec![Toy::new(0).step_sleep(Duration::from_millis(400)).boxed()],
    )[0];
    assert_task_error(&c.step(id, &go()).unwrap(), "timed out");
    assert_eq!(c.stats().stuck_threads, 1);
    // The call returns 300 ms later; its thread leaves instead of rejoining the pool.
    thread::sleep(Duration::from_millis(700));
    let stats = c.stats();
    assert_eq!((stats.stuck_threads, stats.workers), (0, 2));
    assert_eq!((stats.live_sessions, stats.finished), (0, 1));
    assert_eq!(c.step(id, &go()), Err(ControllerError::Finished(id)));
    assert_eq!(c.success(id), Ok(false));
    // And the pool still serves.
    let ids = start_all(&c, vec![Toy::new(1).boxed(), Toy::new(2).boxed()]);
    for _ in 0..3 {
        for step in c.step_many(&batch(&ids)) {
            step.unwrap();
        }
    }
    assert_eq!(c.success(ids[0]), Ok(true));
    assert_eq!(c.stats().workers, 2);
}

#[test]
fn a_panicking_environment_ends_only_its_session() {
    let c = controller(4, Duration::from_secs(5));
    let mut in_step = Toy::new(0);
    in_step.panic_at_step = Some(2);
    let mut in_reset = Toy::new(1);
    in_reset.panic_in_reset = true;
    let mut in_oracle = Toy::new(2);
    in_oracle.panic_in_oracle = true;
    let started = c.start_many(vec![
        in_step.boxed(),
        in_reset.boxed(),
        in_oracle.boxed(),
        Toy::new(3).boxed(),
        Toy::new(4).boxed(),
    ]);
    let started: Vec<_> = started.into_iter().map(Result::unwrap).collect();
    assert_task_error(started[1].reset.as_ref().unwrap_err(), "reset exploded");
    assert_eq!(
        c.step(started[1].id, &go()),
        Err(ControllerError::Finished(started[1].id))
    );
    let ids: Vec<SessionId> = [0, 2, 3, 4].iter().map(|&k| started[k].id).collect();

    for step in c.step_many(&batch(&ids)) {
        assert_eq!(step.unwrap().status, Status::Running);
    }
    let steps = c.step_many(&batch(&ids));
    assert_task_error(steps[0].as_ref().unwrap(), "toy 0 fails at step 2");
    assert!(steps[0].as_ref().unwrap().observation.contains("panicked"));
    for step in &steps[1..] {
        assert_eq!(step.as_ref().unwrap().status, Status::Running);
    }
    assert_eq!(
        c.step(ids[0], &go()),
        Err(ControllerError::Finished(ids[0]))
    );

    // A panic outside reset and step is an error naming it, and ends the session too.
    match c.oracle(ids[1]) {
        Err(ControllerError::Failed { id, message }) => {
            assert_eq!(id, ids[1]);
            assert!(message.contains("no oracle today"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.step(ids[1], &go()),
        Err(ControllerError::Finished(ids[1]))
    );

    // The others go on and finish, and the pool is whole.
    for step in c.step_many(&batch(&ids[2..])) {
        assert_eq!(step.unwrap().status, Status::Completed);
    }
    assert_eq!(c.success(ids[2]), Ok(true));
    let more = start_all(&c, (10..18).map(|i| Toy::new(i).boxed()).collect());
    for _ in 0..3 {
        for step in c.step_many(&batch(&more)) {
            step.unwrap();
        }
    }
    let stats = c.stats();
    assert_eq!((stats.panics, stats.timeouts), (3, 0));
    assert_eq!((stats.workers, stats.live_sessions), (4, 0));
    assert_eq!(stats.finished, 3 + 2 + 8);
}

#[test]
fn cancel_unknown_finished_and_busy_sessions() {
    let c = controller(2, Duration::from_secs(5));
    let ids = start_all(&c, (0..3).map(|i| Toy::new(i).boxed()).collect());
    let (a, b, d) = (ids[0], ids[1], ids[2]);

    // Cancel, then every call on it is a clear error.
    c.step(a, &go()).unwrap();
    assert_eq!(c.cancel(a), Ok(()));
    assert_eq!(c.step(a, &go()), Err(ControllerError::Cancelled(a)));
    assert_eq!(c.cancel(a), Err(ControllerError::Cancelled(a)));
    assert_eq!(c.oracle(a), Err(ControllerError::Cancelled(a)));
    assert_eq!(c.success(a), Err(ControllerError::Cancelled(a)));
    assert_eq!(c.fork(a), Err(ControllerError::Cancelled(a)));

    // Unknown ids.
    let unknown = SessionId(1_000_000);
    assert_eq!(
        c.step(unknown, &go()),
        Err(ControllerError::UnknownSession(unknown))
    );
    assert_eq!(
        c.cancel(unknown),
        Err(ControllerError::UnknownSession(unknown))
    );
    assert_eq!(
        c.oracle(unknown),
        Err(ControllerError::UnknownSession(unknown))
    );
    assert_eq!(
        c.success(unknown),
        Err(ControllerError::UnknownSession(unknown))
    );
    assert_eq!(
        c.fork(unknown),
        Err(ControllerError::UnknownSession(unknown))
    );

    // A finished session.
    for _ in 0..2 {
        assert_eq!(c.step(b, &go()).unwrap().status, Status::Running);
    }
    assert_eq!(c.step(b, &go()).unwrap().status, Status::Completed);
    assert_eq!(c.step(b, &go()), Err(ControllerError::Finished(b)));
    assert_eq!(c.cancel(b), Err(ControllerError::Finished(b)));
    assert_eq!(c.success(b), Ok(true));

    // The same session twice in a batch: the second entry is refused, the first runs.
    let steps = c.step_many(&[(d, go()), (unknown, go()), (d, go())]);
    assert_eq!(steps[0].as_ref().unwrap().observation, "toy 2 step 1 go");
    assert_eq!(steps[1], Err(ControllerError::UnknownSession(unknown)));
    assert_eq!(steps[2], Err(ControllerError::Busy(d)));
    assert_eq!(c.sessions(), vec![d]);
    let stats = c.stats();
    assert_eq!((stats.cancelled, stats.finished, stats.steps), (1, 1, 5));

    // Cancelling a session while a call on it runs: the call answers "cancelled".
    let toy = Toy::new(9).step_sleep(Duration::from_secs(1));
    let entered = toy.entered.clone();
    let slow = start_all(&c, vec![toy.boxed()])[0];
    thread::scope(|s| {
        let running = s.spawn(|| c.step(slow, &go()));
        wait_for(&entered);
        assert_eq!(c.step(slow, &go()), Err(ControllerError::Busy(slow)));
        assert_eq!(c.oracle(slow), Err(ControllerError::Busy(slow)));
        assert_eq!(c.cancel(slow), Ok(()));
        assert_eq!(
            running.join().unwrap(),
            Err(ControllerError::Cancelled(slow))
        );
    });
    assert_eq!(c.step(slow, &go()), Err(ControllerError::Cancelled(slow)));
    assert_eq!(c.sessions(), vec![d]);
    assert_eq!(c.stats().cancelled, 2);
}

fn call(name: &str, args: &[(&str, serde_json::Value)]) -> ToolCall {
    ToolCall::new(name, args.iter().map(|(k, v)| (*k, v.clone())))
}

#[test]
fn fork_gives_an_independent_copy() {
    let kg = Kg::default();
    let c = controller(2, Duration::from_secs(5));
    let original = start_all(&c, vec![kg.instance(Split::Train, 2, 4)])[0];
    let first = c.oracle(original).unwrap().unwrap();
    assert_eq!(c.step(original, &first).unwrap().status, Status::Running);

    let copy = c.fork(original).unwrap();
    assert_ne!(copy, original);
    assert_eq!(c.oracle(copy), c.oracle(original));
    // The copy answers the intermediate variable: wrong, and over.
    let bad = c
        .step(copy, &call("final_answer", &[("variable", json!("#0"))]))
        .unwrap();
    assert_eq!((bad.status, bad.reward), (Status::Completed, 0.0));
    assert_eq!(c.success(copy), Ok(false));
    // The original is untouched and finishes correctly.
    let mut last = None;
    while let Ok(Some(next)) = c.oracle(original) {
        last = Some(c.step(original, &next).unwrap());
    }
    assert_eq!(last.unwrap().reward, 1.0);
    assert_eq!(c.success(original), Ok(true));

    // Forks of a toy count their own steps.
    let toy = start_all(&c, vec![Toy::new(7).boxed()])[0];
    c.step(toy, &go()).unwrap();
    let twin = c.fork(toy).unwrap();
    assert_eq!(c.step(twin, &go()).unwrap().observation, "toy 7 step 2 go");
    assert_eq!(c.step(twin, &go()).unwrap().status, Status::Completed);
    assert_eq!(c.step(toy, &go()).unwrap().observation, "toy 7 step 2 go");
    let stats = c.stats();
    assert_eq!(
        (stats.started, stats.forked, stats.live_sessions),
        (2, 2, 1)
    );
}

#[test]
fn shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Controller>();

    let kg = Arc::new(Kg::default());
    let c = Arc::new(controller(4, Duration::from_secs(30)));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let (kg, c) = (kg.clone(), c.clone());
            thread::spawn(move || {
                for i in 0..16 {
                    let env = kg.instance(Split::Test, 3, t * 16 + i);
                    let id = c.start(env).unwrap().id;
                    // The terminal step ends the session, so stop there.
                    while let Some(next) = c.oracle(id).unwrap() {
                        if c.step(id, &next).unwrap().done() {
                            break;
                        }
                    }
                    assert_eq!(c.success(id), Ok(true));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let stats = c.stats();
    assert_eq!(
        (stats.started, stats.finished, stats.live_sessions),
        (64, 64, 0)
    );
}

#[test]
fn shutdown_ends_everything_and_later_calls_are_refused() {
    // Zero workers means one.
    let c = controller(0, Duration::from_secs(5));
    assert_eq!(c.stats().workers, 1);
    let ids = start_all(&c, (0..3).map(|i| Toy::new(i).boxed()).collect());
    c.step(ids[0], &go()).unwrap();
    c.shutdown();
    assert_eq!(c.step(ids[0], &go()), Err(ControllerError::ShutDown));
    assert_eq!(c.cancel(ids[1]), Err(ControllerError::ShutDown));
    assert_eq!(c.oracle(ids[2]), Err(ControllerError::ShutDown));
    assert_eq!(c.success(ids[2]), Err(ControllerError::ShutDown));
    assert_eq!(c.fork(ids[2]), Err(ControllerError::ShutDown));
    assert_eq!(c.start(Toy::new(9).boxed()), Err(ControllerError::ShutDown));
    let stats = c.stats();
    assert_eq!((stats.workers, stats.live_sessions), (0, 0));
    c.shutdown();

    // Shutting down while a batch runs: the running call and the one queued behind it (one
    // worker) both answer "shut down", and shutdown waits only for the running call.
    let c = controller(1, Duration::from_secs(5));
    let toy = Toy::new(0).step_sleep(Duration::from_millis(300));
    let entered = toy.entered.clone();
    let ids = start_all(&c, vec![toy.boxed(), Toy::new(1).boxed()]);
    thread::scope(|s| {
        let running = s.spawn(|| c.step_many(&batch(&ids)));
        wait_for(&entered);
        let t = Instant::now();
        c.shutdown();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(
            running.join().unwrap(),
            vec![
                Err(ControllerError::ShutDown),
                Err(ControllerError::ShutDown)
            ]
        );
    });
}
