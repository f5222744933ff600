//! A NodeClaim's life, one step per file: [`launch`] (the cloud creates the instance),
//! [`registration`] (its Node appears and is adopted), [`initialization`] (the Node is
//! ready for pods), [`liveness`] (a node that never registers is replaced) and
//! [`termination`] (behind a finalizer: drain through the Eviction API, delete the
//! instance and the Node). [`decide`] picks the step; it is pure.

pub mod initialization;
pub mod launch;
pub mod liveness;
pub mod registration;
pub mod termination;

use crate::controllers::state::InOrder;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::{Context, wait_for_change_since};
use crate::apis::nodeclaim::condition;
use crate::apis::{NodeClaim, find_condition, is_condition_true, labels};
use crate::cloud::CloudProvider;
use crate::telemetry::names::{Controller, Stage};

/// What a NodeClaim needs next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Deleted: drain and terminate.
    Terminate,
    /// Its Node is being deleted by someone else: delete the claim, so it drains properly.
    NodeDeleted,
    /// Not launched yet.
    Launch,
    /// Launched long ago and still no Node: replace it.
    Liveness,
    /// Launched; waiting for its Node.
    AwaitNode,
    /// Its Node appeared: adopt it.
    Register,
    /// Registered; the Node is ready for pods.
    Initialize,
    /// Registered; the Node is not ready yet.
    AwaitReady,
    /// Nothing to do.
    Steady,
}

/// The next step for `claim`, whose Node (matched by provider ID) is `node`.
pub fn decide(
    claim: &NodeClaim,
    node: Option<&Node>,
    now: Timestamp,
    registration_ttl: SignedDuration,
) -> Step {
    let conditions = claim.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    // 1. Deletion wins over everything.
    if claim.metadata.deletion_timestamp.is_some() {
        return Step::Terminate;
    }
    // 2. Nothing launched yet.
    let launched = claim
        .status
        .as_ref()
        .and_then(|s| s.provider_id.as_ref())
        .is_some();
    if !launched {
        return Step::Launch;
    }
    let Some(node) = node else {
        // 3. Launched, no Node yet: wait, up to the registration TTL.
        let since = find_condition(conditions, condition::LAUNCHED)
            .map(|c| c.last_transition_time.0)
            .unwrap_or(now);
        return if now.duration_since(since) >= registration_ttl
            && !is_condition_true(conditions, condition::REGISTERED)
        {
            Step::Liveness
        } else {
            Step::AwaitNode
        };
    };
    // 4. Someone deletes the Node: the claim follows, through its finalizer.
    if node.metadata.deletion_timestamp.is_some() {
        return Step::NodeDeleted;
    }
    // 5. Adopt the Node, then wait for it to be ready.
    if !is_condition_true(conditions, condition::REGISTERED) {
        return Step::Register;
    }
    if !is_condition_true(conditions, condition::INITIALIZED) {
        return if initialization::is_initialized(claim, node) {
            Step::Initialize
        } else {
            Step::AwaitReady
        };
    }
    Step::Steady
}

/// The longest a node is kept from pods while the other nodes of its launch batch appear.
pub const BATCH_HOLD: SignedDuration = SignedDuration::from_secs(10);

/// The launch batches (by [`labels::LAUNCH_BATCH_ANNOTATION`]) some live, unregistered claim
/// of which has no Node yet. `has_node` says whether a claim's Node has appeared.
pub fn incomplete_batches<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    has_node: impl Fn(&NodeClaim) -> bool,
) -> HashSet<String> {
    claims
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| !c.condition_true(condition::REGISTERED) && !has_node(c))
        .filter_map(|c| {
            c.annotations()
                .get(labels::LAUNCH_BATCH_ANNOTATION)
                .cloned()
        })
        .collect()
}

/// Whether registering `claim`'s `node` waits for the rest of its launch batch: while another
/// node of the batch has yet to appear, for at most [`BATCH_HOLD`] after this node appeared.
/// Nodes of one plan turning schedulable together let kube-scheduler honour the plan's
/// nominations; a node turning schedulable alone draws pods nominated to its siblings.
pub fn holds_for_batch(
    claim: &NodeClaim,
    node: &Node,
    incomplete: &HashSet<String>,
    now: Timestamp,
) -> bool {
    let Some(batch) = claim.annotations().get(labels::LAUNCH_BATCH_ANNOTATION) else {
        return false;
    };
    let appeared = node
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    incomplete.contains(batch) && now.duration_since(appeared) < BATCH_HOLD
}

/// A condition in the form the status carries.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        last_transition_time: Time(now),
        observed_generation: None,
    }
}

/// Work in progress that must not be started twice (a launch takes minutes).
#[derive(Default, Clone)]
pub struct InFlight(Arc<Mutex<HashSet<String>>>);

impl InFlight {
    /// Marks `name` in flight; false when it already was.
    pub fn start(&self, name: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string())
    }

    /// Marks `name` done.
    pub fn finish(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}

/// Runs the lifecycle controller until aborted: every claim is reconciled whenever the
/// stores change, and at least once a second.
/// Records how long `claim` took to reach `stage` since its condition `since` turned
/// true (or since it was created, for the launch).
fn observe_stage<C: CloudProvider>(
    ctx: &Context<C>,
    claim: &NodeClaim,
    stage: Stage,
    since: Option<&str>,
    now: Timestamp,
) {
    let from = match since {
        Some(type_) => claim
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, type_))
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0),
        None => claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
    };
    if let Some(from) = from {
        let pool = claim
            .labels()
            .get(crate::apis::labels::NODE_POOL)
            .map_or("", String::as_str);
        let seconds = now.duration_since(from).as_secs_f64().max(0.0);
        ctx.metrics.observe_nodeclaim_stage(pool, stage, seconds);
    }
}

/// While a launch or a termination is under way, the controller looks again this often
/// whatever changed: their steps retry on time (a launch that failed, a drain a budget
/// refused).
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// With nothing under way, it looks again at least this often.
const IDLE_EVERY: Duration = Duration::from_secs(30);

/// How long the controller may wait for a change in the stores before a claim's next step
/// is due on time alone: [`RETRY_EVERY`] while any claim launches or terminates; else until
/// the first launched claim would pass its registration TTL or a batch's hold ends, at
/// most [`IDLE_EVERY`]. Pure.
pub fn next_look<'a>(
    claims: impl IntoIterator<Item = (&'a NodeClaim, Option<Arc<Node>>)>,
    now: Timestamp,
    registration_ttl: SignedDuration,
) -> Duration {
    let mut due: Option<Timestamp> = None;
    let mut soon = |t: Timestamp| due = Some(due.map_or(t, |d| d.min(t)));
    for (claim, node) in claims {
        let conditions = claim.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let launched = claim
            .status
            .as_ref()
            .and_then(|s| s.provider_id.as_ref())
            .is_some();
        if claim.metadata.deletion_timestamp.is_some() || !launched {
            return RETRY_EVERY;
        }
        if is_condition_true(conditions, condition::REGISTERED) {
            continue;
        }
        match node {
            None => {
                if let Some(c) = find_condition(conditions, condition::LAUNCHED) {
                    soon(
                        c.last_transition_time
                            .0
                            .checked_add(registration_ttl)
                            .unwrap_or(now),
                    );
                }
            }
            Some(node) => {
                let appeared = node
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(now, |t| t.0);
                soon(appeared.checked_add(BATCH_HOLD).unwrap_or(now));
            }
        }
    }
    let left = due.map_or(IDLE_EVERY, |t| {
        Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
    });
    left.clamp(RETRY_EVERY, IDLE_EVERY)
}

pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    let launches = InFlight::default();
    let terminations = InFlight::default();
    let mut seen = ctx.state.generation();
    let mut wait = RETRY_EVERY;
    loop {
        wait_for_change_since(&ctx.state, seen, wait).await;
        seen = ctx.state.generation();
        if !ctx.writer.is_leader() {
            continue;
        }
        let now = ctx.clock.now();
        let nodes: HashMap<String, Arc<Node>> = ctx
            .state
            .nodes
            .state()
            .into_iter()
            .filter_map(|n| Some((n.spec.as_ref()?.provider_id.clone()?, n)))
            .collect();
        let claims = ctx.state.node_claims.in_order();
        let node_of = |c: &NodeClaim| {
            c.status
                .as_ref()
                .and_then(|s| s.provider_id.as_ref())
                .and_then(|p| nodes.get(p))
                .cloned()
        };
        let incomplete = incomplete_batches(claims.iter().map(|c| &**c), |c| node_of(c).is_some());
        wait = next_look(
            claims.iter().map(|c| (&**c, node_of(c))),
            now,
            ctx.settings.registration_ttl,
        );
        // A batch's nodes are registered together, concurrently, after the other steps.
        let mut registrations = Vec::new();
        for claim in claims {
            let node = node_of(&claim);
            let step = decide(&claim, node.as_deref(), now, ctx.settings.registration_ttl);
            let name = claim.name_any();
            let started = std::time::Instant::now();
            let result = match step {
                Step::Launch => {
                    if launches.start(&name) {
                        let (ctx, launches) = (ctx.clone(), launches.clone());
                        tokio::spawn(async move {
                            launch::launch(&ctx, &claim).await;
                            // Held in flight until the store shows what the launch recorded,
                            // so a pass reading the store in between does not launch again.
                            let name = claim.name_any();
                            for _ in 0..100 {
                                let recorded = ctx.state.node_claims.state().iter().any(|c| {
                                    c.name_any() == name
                                        && c.status
                                            .as_ref()
                                            .is_some_and(|s| s.provider_id.is_some())
                                });
                                if recorded {
                                    break;
                                }
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            launches.finish(&name);
                        });
                    }
                    Ok(())
                }
                Step::Register => {
                    if let Some(node) = node
                        && !holds_for_batch(&claim, &node, &incomplete, now)
                    {
                        registrations.push((claim.clone(), node));
                    }
                    continue;
                }
                Step::Initialize => match node {
                    Some(node) => initialization::initialize(&ctx, &claim, &node, now).await,
                    None => Ok(()),
                },
                Step::Liveness => liveness::replace(&ctx, &claim).await,
                Step::NodeDeleted => ctx.writer.delete_node_claim(&name).await,
                Step::Terminate => {
                    if terminations.start(&name) {
                        let (ctx, terminations) = (ctx.clone(), terminations.clone());
                        tokio::spawn(async move {
                            termination::terminate(&ctx, &claim, now).await;
                            terminations.finish(&claim.name_any());
                        });
                    }
                    Ok(())
                }
                Step::AwaitNode | Step::AwaitReady | Step::Steady => Ok(()),
            };
            let failed = matches!(&result, Err(e) if !matches!(e, super::writes::WriteError::Conflict { .. }));
            ctx.metrics.reconcile(
                Controller::Nodeclaim,
                started.elapsed().as_secs_f64(),
                failed,
            );
            match result {
                Ok(()) => {}
                // The store was behind the API server: the next pass reads the new version.
                Err(e @ super::writes::WriteError::Conflict { .. }) => {
                    tracing::debug!(nodeclaim = %name, step = ?step, error = %e, "retrying after a conflict");
                }
                Err(e) => {
                    tracing::warn!(nodeclaim = %name, step = ?step, error = %e, "nodeclaim reconcile failed");
                }
            }
        }
        let ctx = &ctx;
        if !registrations.is_empty() {
            let pods = ctx.state.pods.state();
            let waiting =
                registration::waiting_for(registrations.iter().map(|(c, n)| (&**c, &**n)), &pods);
            drop(pods);
            let nominations: Vec<(&str, String)> = waiting
                .iter()
                .map(|(pod, node)| (pod.as_str(), node.clone()))
                .collect();
            crate::controllers::provisioning::nominate(ctx, &nominations).await;
        }
        futures::future::join_all(registrations.into_iter().map(|(claim, node)| async move {
            let started = std::time::Instant::now();
            let result = registration::register(ctx, &claim, &node, now).await;
            let failed = matches!(&result, Err(e) if !matches!(e, super::writes::WriteError::Conflict { .. }));
            ctx.metrics
                .reconcile(Controller::Nodeclaim, started.elapsed().as_secs_f64(), failed);
            match result {
                Ok(()) => {}
                Err(e @ super::writes::WriteError::Conflict { .. }) => {
                    tracing::debug!(nodeclaim = %claim.name_any(), error = %e, "retrying registration after a conflict");
                }
                Err(e) => {
                    tracing::warn!(nodeclaim = %claim.name_any(), error = %e, "registration failed");
                }
            }
        }))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::NodeClaimStatus;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn claim(conditions: &[(&str, bool)], provider_id: Option<&str>) -> NodeClaim {
        let mut c: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: default-abcde}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("valid nodeclaim");
        c.status = Some(NodeClaimStatus {
            provider_id: provider_id.map(str::to_string),
            conditions: conditions
                .iter()
                .map(|(ty, ok)| condition(ty, *ok, "Test", "", t(0)))
                .collect(),
            ..NodeClaimStatus::default()
        });
        c
    }

    fn ready_node() -> Node {
        serde_yaml::from_str(
            "metadata: {name: default-abcde}\nspec: {providerID: 'kwok://default-abcde'}\nstatus:\n  allocatable: {cpu: '2', memory: 4Gi}\n  conditions: [{type: Ready, status: 'True'}]\n",
        )
        .expect("valid node")
    }

    const TTL: SignedDuration = SignedDuration::from_mins(15);

    fn in_batch(mut c: NodeClaim, name: &str, batch: &str) -> NodeClaim {
        c.metadata.name = Some(name.to_string());
        c.annotations_mut().insert(
            labels::LAUNCH_BATCH_ANNOTATION.to_string(),
            batch.to_string(),
        );
        c
    }

    #[test]
    fn a_batch_is_incomplete_while_an_unregistered_live_claim_has_no_node() {
        let launched = claim(&[(condition::LAUNCHED, true)], Some("kwok://x"));
        let registered = claim(
            &[(condition::LAUNCHED, true), (condition::REGISTERED, true)],
            Some("kwok://x"),
        );
        let a = in_batch(launched.clone(), "a", "p1");
        let b = in_batch(launched.clone(), "b", "p1");
        let c = in_batch(registered, "c", "p2");
        let d = in_batch(launched.clone(), "d", "p2");
        let mut gone = in_batch(launched, "e", "p3");
        gone.metadata.deletion_timestamp = Some(Time(t(0)));
        let with_node = ["a", "d"];
        let incomplete = incomplete_batches([&a, &b, &c, &d, &gone], |c| {
            with_node.contains(&c.name_any().as_str())
        });
        // p1: b has no node. p2: c is registered, d has its node. p3: its only claim is going.
        assert_eq!(incomplete, HashSet::from(["p1".to_string()]));
    }

    #[test]
    fn registration_waits_for_the_batch_at_most_the_hold() {
        let launched = claim(&[(condition::LAUNCHED, true)], Some("kwok://default-abcde"));
        let mut node = ready_node();
        node.metadata.creation_timestamp = Some(Time(t(100)));
        let incomplete = HashSet::from(["p1".to_string()]);
        let batched = in_batch(launched.clone(), "a", "p1");
        assert!(holds_for_batch(&batched, &node, &incomplete, t(101)));
        assert!(holds_for_batch(&batched, &node, &incomplete, t(109)));
        // The hold expires.
        assert!(!holds_for_batch(&batched, &node, &incomplete, t(110)));
        // A complete batch, another batch, or no batch at all: no hold.
        assert!(!holds_for_batch(&batched, &node, &HashSet::new(), t(101)));
        let other = in_batch(launched.clone(), "b", "p2");
        assert!(!holds_for_batch(&other, &node, &incomplete, t(101)));
        assert!(!holds_for_batch(&launched, &node, &incomplete, t(101)));
    }

    #[test]
    fn a_claim_walks_launch_register_initialize_in_order() {
        let node = ready_node();
        assert_eq!(decide(&claim(&[], None), None, t(0), TTL), Step::Launch);
        let launched = claim(&[(condition::LAUNCHED, true)], Some("kwok://default-abcde"));
        assert_eq!(decide(&launched, None, t(60), TTL), Step::AwaitNode);
        assert_eq!(decide(&launched, Some(&node), t(60), TTL), Step::Register);
        let registered = claim(
            &[(condition::LAUNCHED, true), (condition::REGISTERED, true)],
            Some("kwok://default-abcde"),
        );
        assert_eq!(
            decide(&registered, Some(&node), t(60), TTL),
            Step::Initialize
        );
        let mut not_ready = node.clone();
        not_ready.status.as_mut().expect("status").conditions = None;
        assert_eq!(
            decide(&registered, Some(&not_ready), t(60), TTL),
            Step::AwaitReady
        );
        let done = claim(
            &[
                (condition::LAUNCHED, true),
                (condition::REGISTERED, true),
                (condition::INITIALIZED, true),
            ],
            Some("kwok://default-abcde"),
        );
        assert_eq!(decide(&done, Some(&node), t(60), TTL), Step::Steady);
    }

    #[test]
    fn the_controller_looks_again_when_the_next_step_is_due_on_time_alone() {
        let steady = claim(
            &[
                (condition::LAUNCHED, true),
                (condition::REGISTERED, true),
                (condition::INITIALIZED, true),
            ],
            Some("kwok://default-abcde"),
        );
        // Nothing due: the idle look.
        assert_eq!(next_look([(&steady, None)], t(60), TTL), IDLE_EVERY);
        // Launching, or terminating: every second.
        let launching = claim(&[], None);
        assert_eq!(
            next_look([(&steady, None), (&launching, None)], t(60), TTL),
            RETRY_EVERY
        );
        let mut going = steady.clone();
        going.metadata.deletion_timestamp = Some(Time(t(0)));
        assert_eq!(next_look([(&going, None)], t(60), TTL), RETRY_EVERY);
        // Launched at 0 with no node: due at the TTL, 15 minutes on; looked at within the
        // idle look until then, and at once when it is due.
        let launched = claim(&[(condition::LAUNCHED, true)], Some("kwok://default-abcde"));
        assert_eq!(next_look([(&launched, None)], t(60), TTL), IDLE_EVERY);
        assert_eq!(
            next_look([(&launched, None)], t(15 * 60 - 20), TTL),
            Duration::from_secs(20)
        );
        assert_eq!(next_look([(&launched, None)], t(15 * 60), TTL), RETRY_EVERY);
        // Its node appeared at 100: the batch hold ends at 110.
        let mut node = ready_node();
        node.metadata.creation_timestamp = Some(Time(t(100)));
        let node = Some(Arc::new(node));
        assert_eq!(
            next_look([(&launched, node.clone())], t(103), TTL),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn a_node_that_never_registers_is_replaced_after_the_ttl() {
        let launched = claim(&[(condition::LAUNCHED, true)], Some("kwok://default-abcde"));
        assert_eq!(decide(&launched, None, t(14 * 60), TTL), Step::AwaitNode);
        assert_eq!(decide(&launched, None, t(15 * 60), TTL), Step::Liveness);
    }

    #[test]
    fn deletion_comes_before_every_other_step() {
        let mut c = claim(&[], None);
        c.metadata.deletion_timestamp = Some(Time(t(0)));
        assert_eq!(decide(&c, None, t(0), TTL), Step::Terminate);
        let launched = claim(
            &[(condition::LAUNCHED, true), (condition::REGISTERED, true)],
            Some("kwok://default-abcde"),
        );
        let mut node = ready_node();
        node.metadata.deletion_timestamp = Some(Time(t(0)));
        assert_eq!(decide(&launched, Some(&node), t(0), TTL), Step::NodeDeleted);
    }
}
