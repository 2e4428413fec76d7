//! Data-parallel training (`train { data_parallel = N }`): N trainer replicas, each scoring
//! and differentiating its share of every update's batch ([`super::shares`]); their losses,
//! statistics and gradients summed by burn's collective all-reduce; the same clip and optimizer
//! step on every replica.
//!
//! The trainer's own thread is replica 0, the leader: it plays the rollouts, prepares each
//! update, cuts it into shares, keeps the checkpointed state and publishes the weights.
//! Replicas 1..N are threads holding a copy of the policy and of its optimizer's state, made
//! from the leader's when the first update starts; from then on every replica changes only by
//! the steps all take together on the same summed gradients, so they all hold the leader's
//! weights. Shares travel as plain data ([`TensorData`](burn::tensor::TensorData)).
//!
//! Every replica takes part in every sum, even with an empty share or a non-finite loss, and
//! decides from the summed numbers alone whether to step: a skipped update is skipped
//! everywhere. A replica that fails (a panic in its forward pass, a failed sum) reports why and
//! resets the collective, which ends the pending sum on every other replica with an error: the
//! step fails with the replica's reason, and the run can resume from its latest checkpoint.
//!
//! How the replicas of one process share its device is a [`Sharing`]: on a GPU they take
//! turns; on the CPU each computes at once on its own share of the threads.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use agentry_dsl::spec;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};

use crate::algo::loss::Share;
use crate::model::{Kernels, Policy, TrainBackend};
use crate::optim::{Descent, GradientSum, PolicyOptimizer, descend_summed};
use crate::text::Transcript;

use super::nodes::{Message, Nodes, STOPPED, Start, within};
use super::shares::{RlRowsData, RlSettings, rl_loss, sft_loss};

/// One replica's part of an update, as data.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) enum Work {
    /// A warm-up step: the NLL of `transcripts`, weighed by `share`.
    Sft {
        transcripts: Vec<Transcript>,
        share: f32,
        lr: f64,
    },
    /// An RL epoch on `rows`, weighed by `share`.
    Rl {
        rows: RlRowsData,
        share: Share,
        settings: RlSettings,
        lr: f64,
    },
}

/// The replicas beside the leader, and the leader's place in the collective.
pub(super) struct Replicas<B: TrainBackend> {
    link: Link,
    /// Where the leader computes.
    sharing: Sharing,
    device: B::Device,
    grad_clip: Option<f64>,
    /// Held while the replicas live: one data-parallel run per process at a time, since
    /// burn's local collective is one per backend type.
    _lease: Lease,
}

/// How the leader reaches the other replicas.
enum Link {
    /// Threads of this process, each with its own channel.
    Threads(Vec<Peer>),
    /// Replicas on several nodes ([`super::nodes`]), `per_node` on each.
    Nodes { nodes: Arc<Nodes>, per_node: usize },
}

struct Peer {
    work: Option<Sender<Work>>,
    outcomes: Receiver<Outcome>,
    thread: Option<JoinHandle<()>>,
}

/// How a replica's update ended.
pub(super) enum Outcome {
    /// Its step is taken.
    Stepped,
    /// It failed on its own: the step's cause.
    Failed(String),
    /// Its sum failed because another replica failed.
    Aborted(String),
}

/// What the replicas start from: the leader's run as it is at its first data-parallel update.
pub(super) struct LeaderState<'a, B: TrainBackend> {
    pub spec: &'a spec::Experiment,
    pub policy: &'a Policy<B>,
    pub optimizer: &'a PolicyOptimizer<Policy<B>, B>,
    pub vocab: usize,
    pub pad: u32,
}

impl<B: TrainBackend> Replicas<B> {
    /// Starts the other replicas from `leader`, on `device` (the leader's) or on other
    /// `nodes` (`train.data_parallel` on each), and registers the leader as replica 0; waits
    /// for any other data-parallel run of this process to end first.
    pub fn start(
        leader: LeaderState<'_, B>,
        device: &B::Device,
        nodes: Option<&Arc<Nodes>>,
    ) -> Result<Replicas<B>, String> {
        let lease = Lease::take();
        let per_node = leader.spec.train.data_parallel;
        let grad_clip = leader.spec.algorithm.grad_clip;
        if let Some(nodes) = nodes {
            let start = Start::of(
                leader.spec,
                leader.vocab,
                leader.pad,
                leader.policy,
                leader.optimizer,
            )?;
            nodes.with_cluster::<B, _>(per_node, device, |cluster| {
                cluster.send(&Message::Start(Box::new(start)))
            })?;
            return Ok(Replicas {
                link: Link::Nodes {
                    nodes: nodes.clone(),
                    per_node,
                },
                sharing: Sharing::Turns,
                device: device.clone(),
                grad_clip,
                _lease: lease,
            });
        }
        burn_collective::reset_collective::<B::InnerBackend>();
        let config = CollectiveConfig::default().with_num_devices(per_node);
        let mut sharing = Sharing::of_device::<B>(per_node)?.into_iter();
        let leader_sharing = sharing.next().unwrap_or(Sharing::Turns);
        let peers = (1..per_node)
            .zip(sharing)
            .map(|(r, sharing)| {
                let (work, jobs) = mpsc::channel();
                let (report, outcomes) = mpsc::channel();
                // Fresh autodiff leaves: a replica's graph must not share nodes with the
                // leader's, or burn-autodiff merges the two graphs under one lock.
                let replica = Replica::new(
                    PeerId::from(r as u32),
                    device.clone(),
                    Policy::from_inner(leader.policy.valid()),
                    leader.optimizer.clone(),
                    leader.pad,
                    grad_clip,
                    sharing,
                );
                let config = config.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("agentry-replica-{r}"))
                    .spawn(move || replica.serve(config, jobs, report))
                    .map_err(|e| format!("cannot start replica {r}: {e}"))?;
                Ok(Peer {
                    work: Some(work),
                    outcomes,
                    thread: Some(thread),
                })
            })
            .collect::<Result<Vec<Peer>, String>>()?;
        let mut replicas = Replicas {
            link: Link::Threads(peers),
            sharing: leader_sharing,
            device: device.clone(),
            grad_clip,
            _lease: lease,
        };
        burn_collective::register::<B::InnerBackend>(PeerId::from(0u32), device.clone(), config)
            .map_err(|e| replicas.failure(format!("{e:?}")))?;
        Ok(replicas)
    }

    /// The number of replicas, the leader included.
    pub fn count(&self) -> usize {
        match &self.link {
            Link::Threads(peers) => peers.len() + 1,
            Link::Nodes {
                nodes, per_node, ..
            } => nodes.replicas(*per_node),
        }
    }

    /// Hands `shares[r - 1]` to replica `r` (1..count).
    pub fn dispatch(&mut self, shares: Vec<Work>) -> Result<(), String> {
        match &mut self.link {
            Link::Threads(peers) => {
                let ended = shares
                    .into_iter()
                    .zip(peers.iter())
                    .position(|(work, peer)| {
                        peer.work
                            .as_ref()
                            .is_none_or(|channel| channel.send(work).is_err())
                    });
                match ended {
                    Some(i) => Err(self.failure(format!("replica {}'s thread has ended", i + 1))),
                    None => Ok(()),
                }
            }
            Link::Nodes { nodes, per_node } => {
                let message = Message::Update(shares);
                nodes
                    .with_cluster::<B, _>(*per_node, &self.device, |cluster| cluster.send(&message))
            }
        }
    }

    /// The leader's step: its share's loss and `scalars` to sum, as `loss` computes them from
    /// `policy` where the leader computes ([`Sharing::run`]); the summed loss decides, the
    /// summed gradients step. Returns the stepped policy and the summed scalars.
    pub fn descend<F>(
        &mut self,
        policy: Policy<B>,
        optimizer: &mut PolicyOptimizer<Policy<B>, B>,
        lr: f64,
        loss: F,
    ) -> Result<(Policy<B>, Descent, Vec<f32>), String>
    where
        F: FnOnce(&Policy<B>) -> (Option<Tensor<B, 1>>, Vec<f32>) + Send,
    {
        self.sharing.clone().run(|turn| {
            let (loss, scalars) = loss(&policy);
            let timeout = match &self.link {
                Link::Threads(_) => None,
                Link::Nodes { nodes, .. } => Some(nodes.config().timeout),
            };
            let peer = PeerId::from(0u32);
            let mut sum = Collective::<B>::new(peer, &self.device, &scalars, turn);
            sum.timeout = timeout;
            let stepped = descend_summed(policy, optimizer, loss, lr, self.grad_clip, &mut sum);
            let scalars = std::mem::take(&mut sum.scalars);
            drop(sum);
            let (policy, descent) = stepped.map_err(|e| self.failure(e))?;
            self.stepped()?;
            Ok((policy, descent, scalars))
        })
    }

    /// Waits until every replica of this node has taken its step: nothing the leader computes
    /// next (the next rollouts) runs beside a replica's step, so a run does the same arithmetic
    /// in the same order each time. (Other nodes' replicas have summed their gradients; their
    /// steps run beside the leader's next rollouts, on their own devices.)
    fn stepped(&mut self) -> Result<(), String> {
        let outcomes = match &self.link {
            Link::Threads(peers) => {
                let outcomes = peers.iter().map(|peer| peer.outcomes.recv().ok());
                outcomes.collect::<Vec<_>>()
            }
            Link::Nodes {
                nodes, per_node, ..
            } => nodes.with_cluster::<B, _>(*per_node, &self.device, |cluster| {
                Ok(cluster
                    .local
                    .iter()
                    .map(|local| local.recv().ok())
                    .collect())
            })?,
        };
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Some(Outcome::Stepped) => {}
                Some(Outcome::Failed(reason)) => {
                    return Err(format!("replica {} failed: {reason}", i + 1));
                }
                Some(Outcome::Aborted(reason)) => return Err(self.failure(reason)),
                None => return Err(format!("replica {}'s thread has ended", i + 1)),
            }
        }
        Ok(())
    }

    /// Why the data-parallel step failed: a replica of this node that failed on its own
    /// (waiting a moment for its report), else the leader's own `error`.
    fn failure(&mut self, error: String) -> String {
        let own = |outcomes: &[&Receiver<Outcome>]| {
            for (i, outcomes) in outcomes.iter().enumerate() {
                loop {
                    match outcomes.recv_timeout(Duration::from_secs(2)) {
                        Ok(Outcome::Failed(reason)) => {
                            return Some(format!("replica {} failed: {reason}", i + 1));
                        }
                        Ok(Outcome::Stepped | Outcome::Aborted(_)) => continue,
                        Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                    }
                }
            }
            None
        };
        let found = match &self.link {
            Link::Threads(peers) => own(&peers.iter().map(|p| &p.outcomes).collect::<Vec<_>>()),
            Link::Nodes {
                nodes, per_node, ..
            } => nodes
                .with_cluster::<B, _>(*per_node, &self.device, |cluster| {
                    cluster.broken = true;
                    Ok(own(&cluster.local.iter().collect::<Vec<_>>()))
                })
                .ok()
                .flatten(),
        };
        found.unwrap_or_else(|| match self.link {
            Link::Threads(_) => format!("the gradient all-reduce failed: {error}"),
            Link::Nodes { .. } => format!("the gradient all-reduce failed ({error}): {STOPPED}"),
        })
    }
}

impl<B: TrainBackend> Drop for Replicas<B> {
    fn drop(&mut self) {
        let peers = match &mut self.link {
            Link::Threads(peers) => peers,
            Link::Nodes {
                nodes, per_node, ..
            } => {
                // The run is over; the replicas wait for the next one (unless the collective
                // failed, which ends the invocation).
                let ended = nodes.with_cluster::<B, _>(*per_node, &self.device, |cluster| {
                    if cluster.broken {
                        return Ok(());
                    }
                    cluster.send(&Message::End)
                });
                if let Err(reason) = ended {
                    eprintln!("warning: could not tell the other nodes the run ended: {reason}");
                }
                return;
            }
        };
        for peer in peers.iter_mut() {
            peer.work = None;
        }
        // Ends any sum a replica still waits in.
        burn_collective::reset_collective::<B::InnerBackend>();
        for peer in peers.iter_mut() {
            if let Some(thread) = peer.thread.take() {
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while !thread.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if thread.is_finished() {
                    let _ = thread.join();
                }
            }
        }
        burn_collective::reset_collective::<B::InnerBackend>();
    }
}

/// A replica's thread state: its copy of the policy and of the optimizer.
pub(super) struct Replica<B: TrainBackend> {
    peer: PeerId,
    device: B::Device,
    policy: Policy<B>,
    optimizer: PolicyOptimizer<Policy<B>, B>,
    pad: u32,
    grad_clip: Option<f64>,
    /// Where it computes.
    sharing: Sharing,
    /// Updates taken, for [`fail_replica_at`].
    updates: u64,
}

impl<B: TrainBackend> Replica<B> {
    /// Replica `peer`, training `policy` with `optimizer` on `device`, computing as
    /// `sharing` says.
    pub fn new(
        peer: PeerId,
        device: B::Device,
        policy: Policy<B>,
        optimizer: PolicyOptimizer<Policy<B>, B>,
        pad: u32,
        grad_clip: Option<f64>,
        sharing: Sharing,
    ) -> Self {
        Replica {
            peer,
            device,
            policy,
            optimizer,
            pad,
            grad_clip,
            sharing,
            updates: 0,
        }
    }

    /// Registers, then takes each update sent until the leader hangs up, reporting each
    /// outcome; on a failure resets the collective so no other replica waits for this one.
    fn serve(mut self, config: CollectiveConfig, jobs: Receiver<Work>, report: Sender<Outcome>) {
        let peer = self.peer;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            burn_collective::register::<B::InnerBackend>(peer, self.device.clone(), config)
                .map_err(|e| Outcome::Failed(format!("cannot join the collective: {e:?}")))?;
            while let Ok(work) = jobs.recv() {
                self.update(work)?;
                if report.send(Outcome::Stepped).is_err() {
                    break;
                }
            }
            Ok::<(), Outcome>(())
        }));
        let failure = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(failure)) => failure,
            Err(panic) => Outcome::Failed(format!("it panicked: {}", panic_message(&*panic))),
        };
        let _ = report.send(failure);
        burn_collective::reset_collective::<B::InnerBackend>();
    }

    /// Takes its share of an update: its loss and gradients, their sum with every other
    /// replica's, the step; where it computes ([`Sharing::run`]).
    pub fn update(&mut self, work: Work) -> Result<(), Outcome> {
        self.sharing.clone().run(|turn| self.compute(work, turn))
    }

    fn compute(&mut self, work: Work, turn: Turn) -> Result<(), Outcome> {
        self.updates += 1;
        if injected_fault(self.peer, self.updates) {
            panic!("a fault injected at its update {}", self.updates);
        }
        let (loss, mut scalars, lr) = match work {
            Work::Sft {
                transcripts,
                share,
                lr,
            } => (
                sft_loss(&self.policy, &transcripts, self.pad, share),
                Vec::new(),
                lr,
            ),
            Work::Rl {
                rows,
                share,
                settings,
                lr,
            } => {
                let rows = rows.on::<B>(&self.device);
                let value = settings.value.is_some() && rows.value_targets.is_some();
                match rl_loss(&self.policy, &rows, share, &[], 0.0, &settings) {
                    Some((loss, terms)) => (Some(loss), terms.to_vec(), lr),
                    None => (
                        None,
                        super::shares::RlTerms::from_slice(&[], value).to_vec(),
                        lr,
                    ),
                }
            }
        };
        let mut sum = Collective::<B>::new(self.peer, &self.device, &scalars, turn);
        let policy = self.policy.clone();
        let (policy, _) = descend_summed(
            policy,
            &mut self.optimizer,
            loss,
            lr,
            self.grad_clip,
            &mut sum,
        )
        .map_err(Outcome::Aborted)?;
        scalars.clear();
        self.policy = policy;
        Ok(())
    }
}

pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// One replica's sum: its loss, statistics and gradients, flattened into one vector
/// (`[loss, scalars.., one presence flag per trainable parameter, every gradient]`) and summed
/// across replicas in a single all-reduce.
struct Collective<B: AutodiffBackend> {
    peer: PeerId,
    device: B::Device,
    scalars: Vec<f32>,
    /// This replica's turn to compute, given back while it waits for the sum.
    turn: Turn,
    /// How long to wait for the sum (the leader of a multi-node run); `None`: as long as it
    /// takes.
    timeout: Option<Duration>,
}

impl<B: AutodiffBackend> Collective<B> {
    fn new(peer: PeerId, device: &B::Device, scalars: &[f32], turn: Turn) -> Self {
        Collective {
            peer,
            device: device.clone(),
            scalars: scalars.to_vec(),
            turn,
            timeout: None,
        }
    }
}

impl<B: AutodiffBackend> GradientSum<B> for Collective<B> {
    type Error = String;

    fn sum<M: AutodiffModule<B>>(
        &mut self,
        module: &M,
        loss: f32,
        grads: Option<GradientsParams>,
    ) -> Result<(f32, Option<GradientsParams>), String> {
        let mut flatten = Flatten::<B> {
            grads: grads.as_ref(),
            device: self.device.clone(),
            present: Vec::new(),
            parts: Vec::new(),
        };
        module.visit(&mut flatten);
        let mut head = Vec::with_capacity(1 + self.scalars.len() + flatten.present.len());
        head.push(loss);
        head.extend(&self.scalars);
        head.extend(flatten.present.iter().map(|&p| f32::from(u8::from(p))));
        let head_len = head.len();
        let device = flatten.device.clone();
        let mut parts = vec![Tensor::<B::InnerBackend, 1>::from_data(
            TensorData::new(head, [head_len]),
            &device,
        )];
        parts.append(&mut flatten.parts);
        let flat = Tensor::cat(parts, 0);
        let peer = self.peer;
        let reduce = move || {
            burn_collective::all_reduce::<B::InnerBackend>(
                peer,
                flat.into_primitive().tensor(),
                ReduceOperation::Sum,
            )
            .map_err(|e| format!("{e:?}"))
        };
        let timeout = self.timeout;
        let summed = self.turn.given_back(|| match timeout {
            None => reduce(),
            Some(timeout) => within(timeout, "the other replicas", reduce),
        })?;
        let summed = Tensor::<B::InnerBackend, 1>::from_primitive(TensorPrimitive::Float(summed));
        let head: Vec<f32> = summed
            .clone()
            .slice(0..head_len)
            .into_data()
            .into_vec()
            .map_err(|e| format!("{e:?}"))?;
        let loss = head[0];
        let k = self.scalars.len();
        self.scalars = head[1..1 + k].to_vec();
        let present: Vec<bool> = head[1 + k..].iter().map(|&p| p > 0.0).collect();
        if !present.iter().any(|&p| p) {
            return Ok((loss, None));
        }
        let mut unflatten = Unflatten::<B> {
            summed,
            offset: head_len,
            present: present.into_iter(),
            grads: GradientsParams::new(),
        };
        module.visit(&mut unflatten);
        Ok((loss, Some(unflatten.grads)))
    }
}

/// Each trainable parameter's gradient flattened (zeros where this replica has none) and
/// whether it had one, in the module's visiting order, the same on every replica.
struct Flatten<'a, B: AutodiffBackend> {
    grads: Option<&'a GradientsParams>,
    device: B::Device,
    present: Vec<bool>,
    parts: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        let size = value.shape().num_elements();
        let grad = self
            .grads
            .and_then(|g| g.get::<B::InnerBackend, D>(param.id));
        self.present.push(grad.is_some());
        self.parts.push(match grad {
            Some(grad) => grad.reshape([size]),
            None => Tensor::zeros([size], &self.device),
        });
    }
}

/// The summed gradients back in their parameters' shapes, for the parameters some replica
/// had a gradient for (a parameter no share reached stays without one, as for one trainer).
struct Unflatten<B: AutodiffBackend> {
    summed: Tensor<B::InnerBackend, 1>,
    offset: usize,
    present: std::vec::IntoIter<bool>,
    grads: GradientsParams,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        let dims = value.shape().dims::<D>();
        let size = value.shape().num_elements();
        let range = self.offset..self.offset + size;
        self.offset += size;
        if self.present.next() == Some(true) {
            let grad = self.summed.clone().slice(range).reshape(dims);
            self.grads.register::<B::InnerBackend, D>(param.id, grad);
        }
    }
}

/// How the replicas of one process share its device.
///
/// A GPU computes one replica's kernels at a time anyway, so its replicas take turns. On the
/// CPU a replica's step is partly serial (burn's graph, its element-wise ops, allocations),
/// which leaves cores idle while one replica runs on all of them: there each replica runs at
/// once on a pool of its own threads, the global pool's count split among them. Each
/// replica's work stays inside its own pool, so rayon never runs one replica's work on
/// another's stack (with one shared pool, a thread holding one replica's burn-autodiff graph
/// lock could take up another replica's work that waits for that lock). Results are the same
/// either way: every kernel is bit-identical for any thread count, and the sums are taken
/// in the collective's order.
#[derive(Clone)]
pub(super) enum Sharing {
    /// One replica at a time, on all of the device.
    Turns,
    /// At once, on this replica's own threads.
    Cores(Arc<rayon::ThreadPool>),
}

impl Sharing {
    /// How each of `replicas` (the leader first) computes on `B`'s device: on the CPU with
    /// at least as many threads as replicas, pools of the threads split as evenly as they go;
    /// otherwise turns.
    pub(super) fn of_device<B: TrainBackend>(replicas: usize) -> Result<Vec<Sharing>, String> {
        let threads = rayon::current_num_threads();
        if !<B as Kernels>::on_cpu_threads() || threads < replicas {
            return Ok(vec![Sharing::Turns; replicas]);
        }
        (0..replicas)
            .map(|r| {
                let count = threads / replicas + usize::from(r < threads % replicas);
                rayon::ThreadPoolBuilder::new()
                    .num_threads(count)
                    .thread_name(move |i| format!("agentry-replica-{r}-cpu-{i}"))
                    .build()
                    .map(|pool| Sharing::Cores(Arc::new(pool)))
                    .map_err(|e| format!("cannot start replica {r}'s {count} CPU threads: {e}"))
            })
            .collect()
    }

    /// The threads a replica computes on (`None`: the global pool's, in turns).
    #[cfg(test)]
    fn threads(&self) -> Option<usize> {
        match self {
            Sharing::Turns => None,
            Sharing::Cores(pool) => Some(pool.current_num_threads()),
        }
    }

    /// Runs `work` where this replica computes, in its turn: on the calling thread (its
    /// kernels on the global pool), or inside its own pool.
    fn run<R: Send>(self, work: impl FnOnce(Turn) -> R + Send) -> R {
        match &self {
            Sharing::Turns => work(Turn::take(self)),
            Sharing::Cores(pool) => pool.clone().install(|| work(Turn::take(self))),
        }
    }
}

/// A replica's turn to compute (its forward and backward passes, its optimizer step): waited
/// for when replicas take turns ([`Sharing::Turns`]), nothing to wait for on cores.
pub(super) struct Turn {
    sharing: Sharing,
    held: Option<MutexGuard<'static, ()>>,
}

impl Turn {
    fn take(sharing: Sharing) -> Turn {
        let held = match sharing {
            Sharing::Turns => Some(COMPUTE.lock().unwrap_or_else(|e| e.into_inner())),
            Sharing::Cores(_) => None,
        };
        Turn { sharing, held }
    }

    /// Runs `wait` (a sum) with the turn given back, then takes it again.
    fn given_back<R>(&mut self, wait: impl FnOnce() -> R) -> R {
        self.held = None;
        let done = wait();
        *self = Turn::take(self.sharing.clone());
        done
    }
}

static COMPUTE: Mutex<()> = Mutex::new(());

/// Held by a data-parallel run's replicas; the next one waits until it is dropped.
struct Lease;

static BUSY: Mutex<bool> = Mutex::new(false);
static FREED: Condvar = Condvar::new();

impl Lease {
    fn take() -> Lease {
        let mut busy = BUSY.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = FREED.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        Lease
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *BUSY.lock().unwrap_or_else(|e| e.into_inner()) = false;
        FREED.notify_one();
    }
}

/// `replica << 32 | update` of the one fault to inject, 0 for none.
static FAULT: AtomicU64 = AtomicU64::new(0);

/// Makes replica `replica` (1..) of this process's next data-parallel run panic at its update
/// `update` (1-based; warm-up steps and RL epochs count alike), once: how the tests show what
/// a failing replica does to a run.
#[doc(hidden)]
pub fn fail_replica_at(replica: u32, update: u32) {
    FAULT.store(
        u64::from(replica) << 32 | u64::from(update),
        Ordering::SeqCst,
    );
}

fn injected_fault(peer: PeerId, update: u64) -> bool {
    let planned = FAULT.load(Ordering::SeqCst);
    planned != 0
        && planned == u64::from(peer.0) << 32 | update
        && FAULT
            .compare_exchange(planned, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};

    use super::Sharing;

    fn threads_of(global: usize, replicas: usize) -> Vec<Option<usize>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(global)
            .build()
            .unwrap();
        pool.install(|| {
            let sharing = Sharing::of_device::<Autodiff<Flex>>(replicas).unwrap();
            sharing.iter().map(Sharing::threads).collect()
        })
    }

    #[test]
    fn on_the_cpu_replicas_split_the_threads_and_take_turns_when_there_are_too_few() {
        assert_eq!(threads_of(2, 2), [Some(1), Some(1)]);
        assert_eq!(threads_of(5, 2), [Some(3), Some(2)]);
        assert_eq!(threads_of(4, 3), [Some(2), Some(1), Some(1)]);
        assert_eq!(threads_of(1, 2), [None, None]);
        assert_eq!(threads_of(2, 3), [None, None, None]);
    }

    #[test]
    fn work_runs_on_its_replicas_own_threads() {
        let sharing = Sharing::of_device::<Autodiff<Flex>>(1).unwrap();
        let inside = sharing[0].clone().run(|_| rayon::current_num_threads());
        assert_eq!(Some(inside), sharing[0].threads());
        assert!(
            Sharing::Turns
                .run(|_| rayon::current_thread_index())
                .is_none()
        );
    }
}
