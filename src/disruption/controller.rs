//! Carrying out disruption decisions, safely: each decision waits out a validation delay
//! and is checked again against the cluster as it is then; replacements are launched
//! through the [`CloudProvider`] and must be running and registered before the old nodes
//! are tainted (when they are not within the replacement TTL, the command is undone and
//! they are deleted: [`progress`], the same rule the agent's controller applies to its
//! NodeClaims); pods are evicted through the [`Actuator`] (which respects
//! PodDisruptionBudgets), DaemonSet pods last; then the VMs and Node objects are deleted.
//! In recommend-only mode decisions are recorded with their savings and nothing is done.
//!
//! The controller is driven by [`Disrupter::tick`] with the current time and cluster, so
//! the same code runs on a real clock in a cluster and on a virtual one in the simulator.

use std::future::Future;

use jiff::{SignedDuration, Timestamp};

use super::{Cluster, Decision, Settings, is_daemon, revalidate};
use crate::cloud::{CloudProvider, Instance, InstanceState};
use crate::provisioning::{Mode, launch_request};
use crate::telemetry::Metrics;

/// Karpenter waits this long before acting on a consolidation decision and re-checks it.
pub const DEFAULT_VALIDATION_DELAY: SignedDuration = SignedDuration::from_secs(15);

/// The taint put on nodes being disrupted, so nothing new lands on them.
pub const DISRUPTED_TAINT: &str = crate::apis::labels::DISRUPTED_TAINT_KEY;

/// A command that made no replacement after this long is abandoned (its creator crashed
/// between marking the old nodes and creating replacements).
pub const ORPHANED_COMMAND: SignedDuration = SignedDuration::from_secs(60);

/// A replacement that is not running and registered this long after its launch is given
/// up on, and its command undone: the registration TTL of a NodeClaim.
pub const DEFAULT_REPLACEMENT_TTL: SignedDuration = SignedDuration::from_mins(15);

/// A decision waiting out the validation delay. It is carried out only if, once the delay
/// has passed, deciding again on the cluster as it is then gives the same decision (the
/// same method over the same nodes); a different decision starts its own delay, and no
/// decision drops it. The agent's controller and the simulator both validate this way.
/// Pure: the caller decides and passes the time.
#[derive(Debug, Clone)]
pub struct Validation {
    delay: SignedDuration,
    pending: Option<(Timestamp, Decision)>,
}

impl Validation {
    /// Nothing waiting; decisions wait `delay`.
    pub fn new(delay: SignedDuration) -> Self {
        Validation {
            delay,
            pending: None,
        }
    }

    /// Whether a decision is waiting.
    pub fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Forgets the waiting decision (the cluster is in no state to decide over).
    pub fn clear(&mut self) {
        self.pending = None;
    }

    /// Takes this pass's first decision at `now`: returns it when the same decision has
    /// been offered since at least the delay ago, to be carried out now.
    pub fn offer(&mut self, now: Timestamp, decision: Option<Decision>) -> Option<Decision> {
        let Some(decision) = decision else {
            self.pending = None;
            return None;
        };
        match &self.pending {
            Some((since, waiting))
                if waiting.nodes == decision.nodes && waiting.method == decision.method =>
            {
                if now.duration_since(*since) < self.delay {
                    return None;
                }
                self.pending = None;
                Some(decision)
            }
            _ => {
                self.pending = Some((now, decision));
                None
            }
        }
    }
}

/// A command in flight: the nodes it disrupts and its replacements, as the agent reads
/// them back from the NodeClaims' annotations and the [`Disrupter`] holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// Command id.
    pub id: String,
    /// Old NodeClaims (nodes, in the simulator).
    pub old: Vec<String>,
    /// Replacements needed.
    pub needed: usize,
    /// Replacements (claim names) and whether each is initialized: running and registered.
    pub replacements: Vec<(String, bool)>,
    /// When the command began (oldest marking).
    pub started: Option<Timestamp>,
}

/// What to do with a command in flight.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Replacements ready (or none needed): delete the old claims.
    Finish,
    /// Keep waiting.
    Wait,
    /// Give up and restore the old nodes.
    Undo(String),
}

/// Decides the next step of a command in flight, for the agent's controller and the
/// [`Disrupter`] alike: finish once every replacement is ready, undo when replacements are
/// missing after [`ORPHANED_COMMAND`] or not ready within `ttl`. Pure.
pub fn progress(cmd: &InFlight, now: Timestamp, ttl: SignedDuration) -> Progress {
    let age = cmd
        .started
        .map_or(SignedDuration::ZERO, |s| now.duration_since(s));
    if cmd.replacements.len() < cmd.needed {
        return if age >= ORPHANED_COMMAND {
            Progress::Undo(format!(
                "{} of {} replacement(s) exist after {age:#}",
                cmd.replacements.len(),
                cmd.needed
            ))
        } else {
            Progress::Wait
        };
    }
    if cmd.replacements.iter().all(|(_, ready)| *ready) {
        return Progress::Finish;
    }
    if age >= ttl {
        return Progress::Undo(format!("replacements not initialized after {age:#}"));
    }
    Progress::Wait
}

/// Why an action on the cluster did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActError {
    /// A PodDisruptionBudget refuses the eviction now; try again later.
    #[error("eviction of {pod} refused: {reason}")]
    Refused {
        /// `namespace/name`.
        pod: String,
        /// The API server's reason.
        reason: String,
    },
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

/// The cluster side of disruption: the Kubernetes API in a cluster, the in-memory cluster
/// in the simulator.
pub trait Actuator: Send {
    /// Taints a node `tailor.sh/disrupted:NoSchedule`.
    fn taint(&mut self, node: &str) -> impl Future<Output = Result<(), ActError>> + Send;
    /// Evicts a pod (the eviction API: PodDisruptionBudgets are honoured).
    fn evict(&mut self, pod: &str) -> impl Future<Output = Result<(), ActError>> + Send;
    /// Deletes the Node object.
    fn delete_node(&mut self, node: &str) -> impl Future<Output = Result<(), ActError>> + Send;
}

/// Where a command is.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Waiting out the validation delay.
    Validating {
        /// When to check again.
        until: Timestamp,
    },
    /// Replacements launched, waiting for them to run and register.
    Launching,
    /// Old nodes tainted, pods being evicted.
    Draining,
    /// Finished: old nodes gone.
    Done,
    /// Dropped, with the reason; nothing was disrupted.
    Aborted(String),
}

/// One decision being carried out.
#[derive(Debug, Clone)]
pub struct Command {
    /// The decision as taken.
    pub decision: Decision,
    /// Where it is.
    pub phase: Phase,
    /// Replacements launched for it.
    pub launched: Vec<Instance>,
    /// When its replacements were launched: the replacement TTL runs from here.
    pub launched_at: Option<Timestamp>,
    /// Pods evicted so far.
    pub evicted: Vec<String>,
    /// What happened, with times.
    pub log: Vec<(Timestamp, String)>,
}

impl Command {
    fn note(&mut self, now: Timestamp, what: String) {
        tracing::info!(nodes = ?self.decision.nodes, "{what}");
        self.log.push((now, what));
    }
}

/// Carries out disruption decisions over a cloud.
pub struct Disrupter<C> {
    cloud: C,
    mode: Mode,
    settings: Settings,
    validation_delay: SignedDuration,
    replacement_ttl: SignedDuration,
    commands: Vec<Command>,
    /// Decisions recorded in recommend-only mode.
    recommended: Vec<(Timestamp, Decision)>,
    /// Where replacement launches are counted, beside the provisioner's.
    metrics: Option<Metrics>,
}

impl<C: CloudProvider> Disrupter<C> {
    /// A disrupter acting (or, in recommend-only mode, reporting) over `cloud`.
    pub fn new(cloud: C, mode: Mode, settings: Settings, validation_delay: SignedDuration) -> Self {
        Disrupter {
            cloud,
            mode,
            settings,
            validation_delay,
            replacement_ttl: DEFAULT_REPLACEMENT_TTL,
            commands: Vec::new(),
            recommended: Vec::new(),
            metrics: None,
        }
    }

    /// Counts replacement launches in `metrics`' launch counter.
    pub fn with_metrics(mut self, metrics: Option<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Gives replacements `ttl` to run and register before their command is undone
    /// (default [`DEFAULT_REPLACEMENT_TTL`]).
    pub fn with_replacement_ttl(mut self, ttl: SignedDuration) -> Self {
        self.replacement_ttl = ttl;
        self
    }

    /// Commands, finished ones included.
    pub fn commands(&self) -> &[Command] {
        &self.commands
    }

    /// Decisions recorded in recommend-only mode.
    pub fn recommended(&self) -> &[(Timestamp, Decision)] {
        &self.recommended
    }

    /// Whether a command is still in flight (a new evaluation waits for it).
    pub fn busy(&self) -> bool {
        self.commands
            .iter()
            .any(|c| !matches!(c.phase, Phase::Done | Phase::Aborted(_)))
    }

    /// Nodes in flight: not to be counted on by new decisions.
    pub fn nodes_in_flight(&self) -> Vec<String> {
        self.commands
            .iter()
            .filter(|c| !matches!(c.phase, Phase::Done | Phase::Aborted(_)))
            .flat_map(|c| c.decision.nodes.iter().cloned())
            .collect()
    }

    /// Takes decisions: in autonomous mode they start their validation delay; in
    /// recommend-only mode they are recorded and nothing else happens.
    pub fn submit(&mut self, now: Timestamp, decisions: Vec<Decision>) {
        for decision in decisions {
            if self.mode == Mode::RecommendOnly {
                tracing::info!(
                    method = ?decision.method,
                    nodes = ?decision.nodes,
                    savings_per_hour = decision.savings_per_hour,
                    pods = decision.pods_moved.len(),
                    "recommend-only: disruption not carried out"
                );
                self.recommended.push((now, decision));
                continue;
            }
            let until = now
                .checked_add(self.validation_delay)
                .unwrap_or(Timestamp::MAX);
            let mut c = Command {
                decision,
                phase: Phase::Validating { until },
                launched: Vec::new(),
                launched_at: None,
                evicted: Vec::new(),
                log: Vec::new(),
            };
            c.note(now, format!("decided; re-validating at {until}"));
            self.commands.push(c);
        }
    }

    /// Moves every command in flight as far as it can go at `now`.
    pub async fn tick<A: Actuator>(&mut self, now: Timestamp, cluster: &Cluster, actuator: &mut A) {
        for i in 0..self.commands.len() {
            let mut c = self.commands[i].clone();
            self.step(&mut c, now, cluster, actuator).await;
            self.commands[i] = c;
        }
    }

    async fn step<A: Actuator>(
        &self,
        c: &mut Command,
        now: Timestamp,
        cluster: &Cluster,
        actuator: &mut A,
    ) {
        if let Phase::Validating { until } = c.phase {
            if now < until {
                return;
            }
            let plan = match revalidate(cluster, &self.settings, &c.decision) {
                Ok(plan) => plan,
                Err(why) => {
                    c.note(now, format!("re-validation failed: {why}"));
                    c.phase = Phase::Aborted(why);
                    return;
                }
            };
            for claim in &plan.node_claims {
                match self
                    .cloud
                    .create(&launch_request(&cluster.input, claim))
                    .await
                {
                    Ok(instance) => {
                        c.note(
                            now,
                            format!(
                                "launched replacement {} ({} {})",
                                instance.claim, instance.instance_type, instance.zone
                            ),
                        );
                        if let Some(m) = &self.metrics {
                            m.nodeclaim_launched(
                                &claim.node_pool,
                                &instance.instance_type,
                                instance.capacity_type.as_str(),
                                &instance.zone,
                            );
                        }
                        c.launched.push(instance);
                    }
                    Err(e) => {
                        // Nothing was disrupted yet: take back what was launched.
                        for l in &c.launched {
                            if let Err(e) = self.cloud.delete(&l.provider_id).await {
                                tracing::warn!(error = %e, "deleting an unneeded replacement failed");
                            }
                        }
                        let why = format!("launching a replacement failed: {e}");
                        c.note(now, why.clone());
                        c.phase = Phase::Aborted(why);
                        return;
                    }
                }
            }
            c.launched_at = Some(now);
            c.phase = Phase::Launching;
        }
        if c.phase == Phase::Launching {
            let mut replacements = Vec::new();
            for l in &c.launched {
                let running = matches!(
                    self.cloud.get(&l.provider_id).await,
                    Ok(i) if i.state == InstanceState::Running
                );
                let registered = cluster.input.nodes.iter().any(|n| n.name == l.claim);
                replacements.push((l.claim.clone(), running && registered));
            }
            let in_flight = InFlight {
                id: c.decision.nodes.join(","),
                old: c.decision.nodes.clone(),
                needed: c.launched.len(),
                replacements,
                started: c.launched_at,
            };
            match progress(&in_flight, now, self.replacement_ttl) {
                Progress::Wait => return,
                Progress::Undo(why) => {
                    // Nothing was tainted yet: the replacements that never came up go, the
                    // ready ones stay as ordinary nodes (as the agent's controller does).
                    for (l, (_, ready)) in c.launched.iter().zip(&in_flight.replacements) {
                        if !ready && let Err(e) = self.cloud.delete(&l.provider_id).await {
                            tracing::warn!(error = %e, "deleting a replacement that never came up failed");
                        }
                    }
                    c.note(now, format!("undone: {why}"));
                    c.phase = Phase::Aborted(why);
                    return;
                }
                Progress::Finish => {}
            }
            for node in &c.decision.nodes {
                if let Err(e) = actuator.taint(node).await {
                    c.note(now, format!("tainting {node} failed: {e}; retrying"));
                    return;
                }
            }
            c.note(now, "replacements ready; old nodes tainted".to_string());
            c.phase = Phase::Draining;
        }
        if c.phase == Phase::Draining {
            let mut remaining = 0;
            for node in c.decision.nodes.clone() {
                let Some(n) = cluster.input.nodes.iter().find(|n| n.name == node) else {
                    continue;
                };
                let workload: Vec<&str> = n
                    .pods
                    .iter()
                    .filter(|p| !is_daemon(p))
                    .map(|p| p.key.as_str())
                    .collect();
                // DaemonSet pods go last, once the node's workload pods are gone.
                let batch: Vec<&str> = if workload.is_empty() {
                    n.pods.iter().map(|p| p.key.as_str()).collect()
                } else {
                    workload
                };
                for pod in batch {
                    remaining += 1;
                    match actuator.evict(pod).await {
                        Ok(()) => {
                            c.evicted.push(pod.to_string());
                        }
                        Err(e) => c.note(now, format!("{e}; retrying")),
                    }
                }
            }
            if remaining > 0 {
                return;
            }
            for node in &c.decision.nodes {
                let provider_id = cluster
                    .input
                    .nodes
                    .iter()
                    .position(|n| &n.name == node)
                    .and_then(|i| cluster.nodes.get(i))
                    .and_then(|m| m.provider_id.clone());
                if let Some(id) = provider_id
                    && let Err(e) = self.cloud.delete(&id).await
                {
                    c.note(
                        now,
                        format!("deleting the VM of {node} failed: {e}; retrying"),
                    );
                    return;
                }
                if let Err(e) = actuator.delete_node(node).await {
                    c.note(now, format!("deleting node {node} failed: {e}; retrying"));
                    return;
                }
            }
            c.note(
                now,
                format!(
                    "done: {} pod(s) evicted, saving ${:.4}/hour",
                    c.evicted.len(),
                    c.decision.savings_per_hour
                ),
            );
            c.phase = Phase::Done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn cmd(needed: usize, replacements: &[bool]) -> InFlight {
        InFlight {
            id: "single-1".to_string(),
            old: vec!["old".to_string()],
            needed,
            replacements: replacements
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("r{i}"), *r))
                .collect(),
            started: Some(t(0)),
        }
    }

    const TTL: SignedDuration = SignedDuration::from_mins(15);

    fn decision(method: super::super::Method, nodes: &[&str]) -> Decision {
        Decision {
            method,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            replacements: Vec::new(),
            savings_per_hour: 0.1,
            pods_moved: Vec::new(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_decision_is_carried_out_once_it_has_been_decided_again_after_the_delay() {
        use super::super::Method::{Empty, Single};
        let delay = DEFAULT_VALIDATION_DELAY;
        let mut v = Validation::new(delay);
        let a = || Some(decision(Empty, &["a"]));
        assert_eq!(v.offer(t(0), a()), None, "first seen: it waits");
        assert!(v.pending());
        assert_eq!(v.offer(t(10), a()), None, "within the delay");
        assert_eq!(v.offer(t(15), a()), a(), "the same after the delay");
        assert!(!v.pending());

        // Another decision starts its own delay; so does the same nodes by another method.
        assert_eq!(v.offer(t(20), a()), None);
        assert_eq!(v.offer(t(40), Some(decision(Empty, &["b"]))), None);
        assert_eq!(v.offer(t(50), Some(decision(Single, &["b"]))), None);
        assert_eq!(v.offer(t(60), Some(decision(Single, &["b"]))), None);
        assert_eq!(
            v.offer(t(65), Some(decision(Single, &["b"]))),
            Some(decision(Single, &["b"]))
        );

        // A pass that finds nothing, or a clear, drops what was waiting.
        assert_eq!(v.offer(t(100), a()), None);
        assert_eq!(v.offer(t(105), None), None);
        assert!(!v.pending());
        assert_eq!(v.offer(t(130), a()), None, "the delay runs again");
        v.clear();
        assert_eq!(v.offer(t(200), a()), None);
    }

    #[test]
    fn old_nodes_go_only_once_every_replacement_is_initialized() {
        assert_eq!(
            progress(&cmd(0, &[]), t(1), TTL),
            Progress::Finish,
            "a deletion needs none"
        );
        assert_eq!(progress(&cmd(1, &[false]), t(30), TTL), Progress::Wait);
        assert_eq!(
            progress(&cmd(2, &[true, false]), t(30), TTL),
            Progress::Wait
        );
        assert_eq!(
            progress(&cmd(2, &[true, true]), t(30), TTL),
            Progress::Finish
        );
    }

    #[test]
    fn a_command_left_half_made_by_a_crash_is_undone() {
        // Marked, but the replacement was never created: undone after a minute.
        assert_eq!(progress(&cmd(1, &[]), t(30), TTL), Progress::Wait);
        assert!(matches!(
            progress(&cmd(1, &[]), t(61), TTL),
            Progress::Undo(_)
        ));
        // Replacement never became ready: undone after the registration TTL.
        assert!(matches!(
            progress(&cmd(1, &[false]), t(15 * 60), TTL),
            Progress::Undo(_)
        ));
    }
}
