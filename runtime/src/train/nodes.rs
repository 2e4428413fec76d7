//! Data-parallel training across processes and machines (`agentry run --nodes N --node-rank R
//! --orchestrator URL`): `train.data_parallel` replicas on every node, joined by burn's
//! collective through its global orchestrator.
//!
//! Rank 0 is the leader: it runs the invocation's runs as one process would (rollouts,
//! evaluations, checkpoints, the run directory), its own replicas beside it. Every other rank
//! only trains: its replicas wait for the leader's messages, which reach them through the
//! collective itself ([`super::exchange`]), so the nodes need no second connection:
//! - `Start`: a run's replicas begin, from the leader's weights and optimizer state as they
//!   are at its first data-parallel update (after a warm-up, a resume or a shared warm-up
//!   alike), with the experiment to build the policy from (a pretrained base is loaded from
//!   the same path on every node);
//! - `Update`: every replica's share of an update ([`Work`]), then the gradient sum every
//!   replica takes part in ([`super::replicas`]);
//! - `End`: the run is over; `Quit`: the invocation is, and every rank's process exits.
//!
//! The nodes register with the orchestrator once per process, so one session spans every run of
//! the invocation (registering for each run would race: a node could register for the next run
//! before another had left the last). Peer `rank · data_parallel + i` is replica `i` of node `rank`; the leader is
//! peer 0.

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use agentry_dsl::spec::{self, Device};
use burn_collective::{CollectiveConfig, PeerId};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{optimizer_bytes, optimizer_from_bytes, recorder, weight_bytes};
use crate::device::{self, OnBackend};
use crate::error::RunError;
use crate::model::{Origin, Policy, TrainBackend};
use crate::optim::PolicyOptimizer;

use super::exchange::exchange;
use super::replicas::{Outcome, Replica, Sharing, Work, panic_message};
use super::setup::declared_policy;

/// Where this process is among a multi-node run's: what `--nodes`, `--node-rank`,
/// `--orchestrator` and `--node-address` say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// Nodes in all (at least 2).
    pub nodes: u32,
    /// This node's rank, `0..nodes`; 0 leads.
    pub rank: u32,
    /// The global orchestrator every node registers with (`agentry orchestrator`):
    /// `ws://HOST:PORT`.
    pub orchestrator: String,
    /// Where the other nodes reach this one, `ws://HOST:PORT`: it serves its tensors to them
    /// on that port.
    pub address: String,
    /// How long the leader waits for the other nodes at any one point (their registration,
    /// their part of an update's sum) before the step fails.
    pub timeout: Duration,
}

impl NodeConfig {
    /// Checks the ranks and addresses, so a mistyped command line fails before any work.
    pub fn check(&self) -> Result<(), String> {
        if self.nodes < 2 {
            return Err(format!(
                "--nodes {} needs at least 2 nodes (one node is the default)",
                self.nodes
            ));
        }
        if self.rank >= self.nodes {
            return Err(format!(
                "--node-rank {} is not below --nodes {}: ranks go from 0 to {}",
                self.rank,
                self.nodes,
                self.nodes - 1
            ));
        }
        port_of(&self.orchestrator).map_err(|e| format!("--orchestrator: {e}"))?;
        port_of(&self.address).map_err(|e| format!("--node-address: {e}"))?;
        Ok(())
    }

    /// The collective's configuration for `per_node` replicas on this node.
    fn collective(&self, per_node: usize) -> Result<CollectiveConfig, String> {
        let parse = |url: &str| url.parse().map_err(|e: String| e);
        Ok(CollectiveConfig::default()
            .with_num_devices(per_node)
            .with_num_nodes(self.nodes)
            .with_global_address(parse(&self.orchestrator)?)
            .with_node_address(parse(&self.address)?)
            .with_data_service_port(port_of(&self.address)?))
    }
}

/// The port of a `ws://HOST:PORT` address.
fn port_of(url: &str) -> Result<u16, String> {
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| format!("`{url}` is not a `ws://HOST:PORT` address"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    authority
        .rsplit_once(':')
        .and_then(|(host, port)| (!host.is_empty()).then_some(port))
        .and_then(|port| port.parse::<u16>().ok())
        .filter(|&port| port != 0)
        .ok_or_else(|| format!("`{url}` names no port: write `ws://HOST:PORT`"))
}

/// A multi-node invocation's membership, shared by all its runs ([`super::RunOptions::nodes`]):
/// rank 0 joins the collective before its first run ([`Nodes::join`]; a run's first update
/// joins if nothing did) and stays joined until this is dropped, which tells every other rank
/// to exit.
pub struct Nodes {
    config: NodeConfig,
    /// The leader's side of the session, once joined ([`Cluster`] of the run's backend).
    session: Mutex<Option<Box<dyn Session>>>,
}

impl Nodes {
    /// The membership `config` describes (checked).
    pub fn new(config: NodeConfig) -> Result<Nodes, String> {
        config.check()?;
        Ok(Nodes {
            config,
            session: Mutex::new(None),
        })
    }

    /// Where this process is.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Rank 0 joins the other nodes for the runs of `specs` (`device` overrides theirs),
    /// waiting for them up to the timeout: before any run, so that a rank that never comes is
    /// an error at once, and so that the others hear when the invocation ends even if no run
    /// reaches an update.
    pub fn join(&self, specs: &[spec::Experiment], device: Option<Device>) -> Result<(), RunError> {
        let (per_node, kind) = agreed(specs, device)?;
        device::dispatch(
            kind,
            Join {
                nodes: self,
                per_node,
            },
        )?
    }

    /// Trainer replicas in all, for `per_node` on each node.
    pub fn replicas(&self, per_node: usize) -> usize {
        per_node * self.config.nodes as usize
    }

    /// The leader's session on backend `B`, joined with `per_node` replicas on each node
    /// on `device` if it is not yet.
    pub(super) fn with_cluster<B: TrainBackend, T>(
        &self,
        per_node: usize,
        device: &B::Device,
        then: impl FnOnce(&mut Cluster<B>) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if session.is_none() {
            *session = Some(Box::new(Cluster::<B>::join(
                &self.config,
                per_node,
                device,
            )?));
        }
        let cluster = session
            .as_mut()
            .and_then(|s| s.as_any().downcast_mut::<Cluster<B>>())
            .ok_or("every run of a multi-node invocation must run on the same device kind")?;
        if cluster.per_node != per_node {
            return Err(format!(
                "every run of a multi-node invocation must have the same `train.data_parallel` \
                 (the nodes joined with {}, this run has {per_node})",
                cluster.per_node
            ));
        }
        then(cluster)
    }
}

impl fmt::Debug for Nodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nodes")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let session = self.session.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(session) = session.take() {
            session.quit();
        }
    }
}

/// A joined session, whatever its backend.
trait Session: Send {
    fn as_any(&mut self) -> &mut dyn Any;
    /// Tells every other rank to exit, and ends this process's replicas.
    fn quit(self: Box<Self>);
}

/// What the leader tells every replica.
#[derive(Serialize, Deserialize)]
pub(super) enum Message {
    /// A run's replicas begin from this state.
    Start(Box<Start>),
    /// Every replica's share of an update: replica `peer` takes `shares[peer - 1]`.
    Update(Vec<Work>),
    /// The run is over; the replicas wait for the next.
    End,
    /// The invocation is over; the replicas end.
    Quit,
}

/// A run's policy and optimizer as the leader holds them when its replicas begin.
#[derive(Serialize, Deserialize)]
pub(super) struct Start {
    spec: spec::Experiment,
    vocab: usize,
    pad: u32,
    #[serde(with = "serde_bytes")]
    weights: Vec<u8>,
    #[serde(with = "serde_bytes")]
    optimizer: Vec<u8>,
}

impl Start {
    /// The state of `policy` and `optimizer`, for a run of `spec`.
    pub fn of<B: TrainBackend>(
        spec: &spec::Experiment,
        vocab: usize,
        pad: u32,
        policy: &Policy<B>,
        optimizer: &PolicyOptimizer<Policy<B>, B>,
    ) -> Result<Start, String> {
        Ok(Start {
            spec: spec.clone(),
            vocab,
            pad,
            weights: weight_bytes(policy).map_err(|e| format!("the weights: {e}"))?,
            optimizer: optimizer_bytes(optimizer).map_err(|e| format!("the optimizer: {e}"))?,
        })
    }

    /// Replica `peer` of this state, on `device`: the policy built as the run builds it, with
    /// the leader's weights and optimizer state.
    fn replica<B: TrainBackend>(
        self,
        peer: PeerId,
        device: &B::Device,
    ) -> Result<Replica<B>, String> {
        let loaded = Origin::of(&self.spec.model.arch, device).map_err(|e| e.to_string())?;
        let policy = declared_policy(loaded, &self.spec, self.vocab, device)
            .load_trained(&recorder(), self.weights, device)
            .map_err(|e| format!("the leader's weights do not fit this node's policy: {e}"))?;
        let optimizer = optimizer_from_bytes(
            PolicyOptimizer::new(&self.spec.train.optimizer),
            self.optimizer,
            device,
        )
        .map_err(|e| format!("the leader's optimizer state: {e}"))?;
        Ok(Replica::new(
            peer,
            device.clone(),
            policy,
            optimizer,
            self.pad,
            self.spec.algorithm.grad_clip,
            Sharing::Turns,
        ))
    }
}

/// Sends `message` from the leader (peer 0) to every replica.
fn send<B: TrainBackend>(
    device: &B::Device,
    nodes: usize,
    timeout: Duration,
    message: &Message,
) -> Result<(), String> {
    let bytes = rmp_serde::to_vec(message).map_err(|e| format!("cannot encode a message: {e}"))?;
    let device = device.clone();
    within(timeout, "the other nodes", move || {
        exchange::<B::InnerBackend>(PeerId::from(0u32), &device, nodes, Some(&bytes))
            .map(drop)
            .map_err(|e| format!("sending to the other nodes failed ({e}): {STOPPED}"))
    })
}

/// What a failed all-reduce between nodes most likely means.
pub(super) const STOPPED: &str = "did a node stop? Its output says why";

/// What the leader sent, at replica `peer`.
fn receive<B: TrainBackend>(
    peer: PeerId,
    device: &B::Device,
    nodes: usize,
) -> Result<Message, String> {
    let bytes = exchange::<B::InnerBackend>(peer, device, nodes, None)
        .map_err(|e| format!("receiving from the leader failed ({e}): {STOPPED}"))?;
    rmp_serde::from_slice(&bytes).map_err(|e| format!("cannot decode the leader's message: {e}"))
}

/// `work` run on its own thread, given up after `timeout` (the thread is left waiting: a
/// collective call cannot be cancelled, and the step fails either way).
pub(super) fn within<T: Send + 'static>(
    timeout: Duration,
    whom: &str,
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (done, result) = mpsc::channel();
    std::thread::Builder::new()
        .name("agentry-collective".into())
        .spawn(move || {
            let _ = done.send(work());
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    match result.recv_timeout(timeout) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "no answer from {whom} within {} s (a node stopped, or is slower than \
             --node-timeout allows)",
            timeout.as_secs()
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err("the collective call panicked".into()),
    }
}

/// The leader's side of the session: its registration, and the other replicas of its own node
/// (threads that report each update's outcome, as a one-node run's replicas do).
pub(super) struct Cluster<B: TrainBackend> {
    device: B::Device,
    per_node: usize,
    nodes: usize,
    timeout: Duration,
    /// Each update's outcome on the other replicas of the leader's node.
    pub local: Vec<Receiver<Outcome>>,
    /// A message or a sum failed: the collective is in an unknown state, so nothing more is
    /// sent (the leader would only wait out the timeout again).
    pub broken: bool,
    threads: Vec<JoinHandle<()>>,
}

impl<B: TrainBackend> Cluster<B> {
    /// Registers the leader and its node's other replicas with the orchestrator; waits (up to
    /// the timeout) until every node has.
    fn join(config: &NodeConfig, per_node: usize, device: &B::Device) -> Result<Self, String> {
        let collective = config.collective(per_node)?;
        let mut local = Vec::new();
        let mut threads = Vec::new();
        for i in 1..per_node {
            let (report, outcomes) = mpsc::channel();
            let failed = report.clone();
            let thread = spawn_replica::<B>(
                config,
                PeerId::from(i as u32),
                device,
                &collective,
                Some(report),
                move |served| {
                    if let Err(reason) = served {
                        let _ = failed.send(Outcome::Failed(reason));
                        burn_collective::reset_collective::<B::InnerBackend>();
                    }
                },
            )?;
            local.push(outcomes);
            threads.push(thread);
        }
        let device_for_leader = device.clone();
        within(
            config.timeout,
            "the orchestrator or the other nodes",
            move || {
                burn_collective::register::<B::InnerBackend>(
                    PeerId::from(0u32),
                    device_for_leader,
                    collective,
                )
                .map_err(|e| format!("cannot join the nodes: {e:?}"))
            },
        )?;
        Ok(Cluster {
            device: device.clone(),
            per_node,
            nodes: config.nodes as usize,
            timeout: config.timeout,
            local,
            broken: false,
            threads,
        })
    }
}

impl<B: TrainBackend> Cluster<B> {
    /// Sends `message` to every other replica, unless the collective already failed; a
    /// failure now marks it failed.
    pub fn send(&mut self, message: &Message) -> Result<(), String> {
        if self.broken {
            return Err(format!("an earlier message or sum failed: {STOPPED}"));
        }
        send::<B>(&self.device, self.nodes, self.timeout, message)
            .inspect_err(|_| self.broken = true)
    }
}

impl<B: TrainBackend> Session for Cluster<B> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn quit(mut self: Box<Self>) {
        if self.broken {
            return;
        }
        if let Err(reason) = self.send(&Message::Quit) {
            eprintln!("warning: could not tell the other nodes to stop: {reason}");
            return;
        }
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// Starts replica `peer` of this node on its own thread ([`serve`]), reporting each update to
/// `report` (the leader's node); `ended` gets how its service ended.
fn spawn_replica<B: TrainBackend>(
    config: &NodeConfig,
    peer: PeerId,
    device: &B::Device,
    collective: &CollectiveConfig,
    report: Option<Sender<Outcome>>,
    ended: impl FnOnce(Result<(), String>) + Send + 'static,
) -> Result<JoinHandle<()>, String> {
    let (device, collective) = (device.clone(), collective.clone());
    let nodes = config.nodes as usize;
    std::thread::Builder::new()
        .name(format!("agentry-replica-{}", peer.0))
        .spawn(move || ended(serve::<B>(peer, &device, collective, nodes, report)))
        .map_err(|e| format!("cannot start replica {}: {e}", peer.0))
}

/// Replica `peer` of a node: takes the leader's messages until it quits. `report` (the
/// leader's own node) gets each update's outcome.
fn serve<B: TrainBackend>(
    peer: PeerId,
    device: &B::Device,
    collective: CollectiveConfig,
    nodes: usize,
    report: Option<Sender<Outcome>>,
) -> Result<(), String> {
    let served = std::panic::catch_unwind(AssertUnwindSafe(|| {
        burn_collective::register::<B::InnerBackend>(peer, device.clone(), collective)
            .map_err(|e| format!("cannot join the nodes: {e:?}"))?;
        let mut replica: Option<Replica<B>> = None;
        loop {
            match receive::<B>(peer, device, nodes)? {
                Message::Start(start) => replica = Some(start.replica(peer, device)?),
                Message::Update(shares) => {
                    let replica = replica
                        .as_mut()
                        .ok_or("an update came before its run started")?;
                    let work = shares
                        .into_iter()
                        .nth(peer.0 as usize - 1)
                        .ok_or("the update has no share for this replica")?;
                    replica.update(work).map_err(|outcome| match outcome {
                        Outcome::Failed(reason) | Outcome::Aborted(reason) => reason,
                        Outcome::Stepped => String::new(),
                    })?;
                    if let Some(report) = &report {
                        let _ = report.send(Outcome::Stepped);
                    }
                }
                Message::End => replica = None,
                Message::Quit => return Ok(()),
            }
        }
    }));
    match served {
        Ok(result) => result,
        Err(panic) => Err(format!("it panicked: {}", panic_message(&*panic))),
    }
}

/// Serves burn's global collective orchestrator on `port` (every interface) until the process
/// is stopped: every node of a multi-node run registers with it, and it tells each where the
/// others are (the tensors go between the nodes directly). `listening` is called once the port
/// is known to be free.
pub fn serve_orchestrator(port: u16, listening: impl FnOnce()) -> Result<(), String> {
    // burn's server only logs a port it cannot take; say so here instead.
    drop(
        std::net::TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| format!("cannot listen on port {port}: {e}"))?,
    );
    listening();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the orchestrator's runtime: {e}"))?;
    runtime.block_on(burn_collective::start_global_orchestrator(port));
    Ok(())
}

/// Refuses what several nodes cannot train as one process would: LoRA with dropout, whose
/// masks each node would draw from its own random stream (the checker refuses it for
/// `data_parallel > 1` on one node, for the same reason).
pub(super) fn refuse_unsupported(spec: &spec::Experiment) -> Result<(), RunError> {
    match &spec.model.finetune {
        spec::Finetune::Lora(lora) if lora.dropout > 0.0 => Err(RunError::Unsupported(format!(
            "`{}` trains LoRA with dropout ({}), which several nodes cannot repeat from the \
             seed: each would draw its masks from its own random stream; set `lora {{ dropout \
             = 0 }}` to train on several nodes",
            spec.name, lora.dropout
        ))),
        _ => Ok(()),
    }
}

/// Runs rank `config.rank` (> 0) of a multi-node invocation of `specs` (every run of it,
/// which must agree on the device and on `train.data_parallel`): its replicas take the
/// leader's updates until the leader is done. `device` overrides the files'.
pub fn follow(
    config: &NodeConfig,
    specs: &[spec::Experiment],
    device: Option<Device>,
) -> Result<(), RunError> {
    config.check().map_err(RunError::Unsupported)?;
    if config.rank == 0 {
        return Err(RunError::Unsupported(
            "rank 0 leads the run: it runs the experiments, the other ranks follow".into(),
        ));
    }
    let (per_node, kind) = agreed(specs, device)?;
    device::dispatch(
        kind,
        Follower {
            config: config.clone(),
            per_node,
        },
    )?
}

/// The replicas per node and the device every run of `specs` (on every node) must share.
fn agreed(specs: &[spec::Experiment], device: Option<Device>) -> Result<(usize, Device), RunError> {
    let first = specs
        .first()
        .ok_or_else(|| RunError::Unsupported("no experiment to run on the nodes".into()))?;
    let kind = device::resolve(device.unwrap_or(first.device));
    for spec in specs {
        refuse_unsupported(spec)?;
        if device::resolve(device.unwrap_or(spec.device)) != kind
            || spec.train.data_parallel != first.train.data_parallel
            || spec.matmul_precision != first.matmul_precision
        {
            return Err(RunError::Unsupported(format!(
                "every experiment of a multi-node invocation must run on the same device with \
                 the same `train.data_parallel` and `matmul_precision` (`{}` and `{}` differ)",
                first.name, spec.name
            )));
        }
    }
    // The followers' gradients come from the same products as the leader's.
    device::set_matmul_precision(first.matmul_precision);
    Ok((first.train.data_parallel, kind))
}

struct Join<'a> {
    nodes: &'a Nodes,
    per_node: usize,
}

impl OnBackend for Join<'_> {
    type Output = Result<(), RunError>;

    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output {
        self.nodes
            .with_cluster::<B, _>(self.per_node, &device, |_| Ok(()))
            .map_err(|reason| RunError::Unsupported(format!("cannot join the nodes: {reason}")))
    }
}

struct Follower {
    config: NodeConfig,
    per_node: usize,
}

impl OnBackend for Follower {
    type Output = Result<(), RunError>;

    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output {
        let failed =
            |reason: String| RunError::Unsupported(format!("node {}: {reason}", self.config.rank));
        let collective = self.config.collective(self.per_node).map_err(failed)?;
        let (ended, ends) = mpsc::channel();
        for i in 0..self.per_node {
            let peer = PeerId::from((self.config.rank as usize * self.per_node + i) as u32);
            let ended = ended.clone();
            spawn_replica::<B>(
                &self.config,
                peer,
                &device,
                &collective,
                None,
                move |served| {
                    let _ = ended.send((peer, served));
                },
            )
            .map_err(failed)?;
        }
        drop(ended);
        for (peer, end) in ends {
            // A replica that fails ends this node: the leader's step then fails for want of
            // its part, and the run resumes from its latest checkpoint.
            end.map_err(|reason| failed(format!("replica {} failed: {reason}", peer.0)))?;
        }
        Ok(())
    }
}
