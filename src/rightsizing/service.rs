//! The right-sizing use case: a snapshot, a usage source, the policies and `now` in;
//! a recommendation per workload container out. `tailor recommend`, the agent's
//! right-sizing controller and the demo (over its simulated usage, `sim::usage`) all call
//! [`recommend_workloads`], so what the CLI reports is what the cluster gets.
//!
//! Which policy governs a workload follows the `RightsizingPolicy` rules: a policy of the
//! workload's own namespace that selects it (by label selector or by name; a policy with
//! neither covers its whole namespace), else the cluster default (the policy named
//! `default` in the agent's namespace), else the built-in defaults in the global mode. A
//! workload whose policy cannot be used is held: no recommendation is made under it.
//!
//! When several policies of the namespace select a workload, the most specific wins: one
//! naming it in `targetRefs`, then one whose label selector matches it, then one with
//! neither; among equals the first by name. The others are told on their status
//! ([`Policies::overlapping`], the `Overlapping` condition).
//!
//! Usage is read incrementally: a workload with a checkpoint reads only what came after it,
//! one without reads its policy's whole history window.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{ContainerRecommendation, Context, Policy, Prices, Requests, recommend};
use crate::apis::rightsizingpolicy::DEFAULT_POLICY_NAME;
use crate::apis::{HpaPolicy, Mode, RightsizingPolicy};
use crate::model::quantity;
use crate::scheduling::pod::{Selector, selector};
use crate::state::Snapshot;
use crate::usage::pool::{CHECKPOINT_VERSION, Checkpoint, HourUsage, Pool};
use crate::usage::workloads::{Workload, Workloads};
use crate::usage::{ContainerKey, ObservedOom, ReadStats, UsageError, UsageQuery, UsageSource};

/// CPU sample spacing of a read unless told otherwise (the CLI's `--step` default): a
/// minute, so the short minutes a request leaves are seen as minutes. Read at a 5-minute
/// step, each sample is a 5-minute mean that hides the minutes above it: in the backtest
/// through Prometheus, requests sized from 5-minute rates left 7.4% of the minutes short
/// where the same policy on minute rates left 3.4%.
pub const DEFAULT_STEP_SECONDS: i64 = 60;

/// A RightsizingPolicy by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Which policy governs a workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Governance {
    /// A usable policy (`None`: the built-in defaults in the global mode).
    Governed {
        /// The policy object, when one selects the workload.
        source: Option<PolicyRef>,
        /// Its parameters.
        policy: Box<Policy>,
    },
    /// The policy that would govern the workload cannot be used: nothing is recommended or
    /// applied under it.
    Held {
        /// The policy.
        source: PolicyRef,
        /// Why, naming the field and value.
        error: String,
    },
}

#[derive(Debug, Clone)]
struct Candidate {
    reference: PolicyRef,
    /// The parsed selector (`None`: the policy has no selector), or why it cannot parse.
    selector: Result<Option<Selector>, String>,
    targets: Vec<(String, String)>,
    policy: Result<Policy, String>,
}

impl Candidate {
    fn of(p: &RightsizingPolicy) -> Candidate {
        let reference = PolicyRef {
            namespace: p
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            name: p.metadata.name.clone().unwrap_or_default(),
        };
        let sel = match &p.spec.selector {
            None => Ok(None),
            Some(s) => selector(Some(s))
                .map(Some)
                .map_err(|e| format!("spec.selector: {e}")),
        };
        Candidate {
            reference,
            selector: sel,
            targets: p
                .spec
                .target_refs
                .iter()
                .map(|t| (t.kind.clone(), t.name.clone()))
                .collect(),
            policy: Policy::from_spec(&p.spec).map_err(|e| e.to_string()),
        }
    }

    /// Whether the policy is usable; the reason if not.
    fn error(&self) -> Option<String> {
        match (&self.selector, &self.policy) {
            (Err(e), _) | (_, Err(e)) => Some(e.clone()),
            _ => None,
        }
    }

    fn selects(&self, w: &Workload, labels: &BTreeMap<String, String>) -> bool {
        let named = self
            .targets
            .iter()
            .any(|(k, n)| *k == w.kind && *n == w.name);
        match &self.selector {
            Ok(Some(s)) => named || s.matches(labels),
            Ok(None) => named || self.targets.is_empty(),
            // A selector that cannot parse may have been meant for any workload of its
            // namespace: they are held rather than handed to another policy.
            Err(_) => true,
        }
    }

    fn governance(&self) -> Governance {
        match (&self.selector, &self.policy) {
            (Ok(_), Ok(policy)) => Governance::Governed {
                source: Some(self.reference.clone()),
                policy: Box::new(policy.clone()),
            },
            (Err(e), _) | (_, Err(e)) => Governance::Held {
                source: self.reference.clone(),
                error: e.clone(),
            },
        }
    }
}

/// The cluster's RightsizingPolicies, ready to say which governs each workload.
#[derive(Debug, Clone)]
pub struct Policies {
    namespaced: BTreeMap<String, Vec<Candidate>>,
    default: Option<Candidate>,
    fallback: Policy,
}

impl Policies {
    /// The policies of a snapshot. The cluster default is the policy named `default` in
    /// `agent_namespace` (in any namespace when that is `None`, as for `tailor recommend`
    /// run from outside the cluster). Workloads no policy selects get the built-in
    /// defaults in `global_mode`.
    pub fn new(
        policies: &[RightsizingPolicy],
        agent_namespace: Option<&str>,
        global_mode: Mode,
    ) -> Policies {
        let mut namespaced: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
        let mut default = None;
        for p in policies {
            let c = Candidate::of(p);
            let is_default = c.reference.name == DEFAULT_POLICY_NAME
                && agent_namespace.is_none_or(|ns| ns == c.reference.namespace);
            if is_default && default.is_none() {
                default = Some(c.clone());
            }
            namespaced
                .entry(c.reference.namespace.clone())
                .or_default()
                .push(c);
        }
        for list in namespaced.values_mut() {
            list.sort_by(|a, b| a.reference.cmp(&b.reference));
        }
        Policies {
            namespaced,
            default,
            fallback: Policy {
                mode: global_mode,
                ..Policy::default()
            },
        }
    }

    /// Every workload under `policy`, as no policy object selects any (the simulator's
    /// one policy for its whole cluster).
    pub fn only(policy: Policy) -> Policies {
        Policies {
            namespaced: BTreeMap::new(),
            default: None,
            fallback: policy,
        }
    }

    /// The policy that governs `w`, whose labels are `labels`.
    pub fn govern(&self, w: &Workload, labels: &BTreeMap<String, String>) -> Governance {
        // Policies whose selector parses decide first, the most specific one winning; one
        // whose selector cannot parse then holds whatever of its namespace they leave.
        if let Some(list) = self.namespaced.get(&w.namespace) {
            if let Some(c) = self.ranked(list, w, labels).into_iter().next() {
                return c.governance();
            }
            if let Some(c) = list
                .iter()
                .find(|c| c.selector.is_err() && c.selects(w, labels))
            {
                return c.governance();
            }
        }
        match &self.default {
            Some(c) if c.selector.as_ref().is_ok_and(Option::is_none) && c.targets.is_empty() => {
                c.governance()
            }
            Some(c) if c.selects(w, labels) && c.selector.is_ok() => c.governance(),
            Some(c) if c.selector.is_err() => c.governance(),
            _ => Governance::Governed {
                source: None,
                policy: Box::new(self.fallback.clone()),
            },
        }
    }

    /// The policies of `w`'s namespace whose selector parses and that select `w`, the
    /// winner first: a policy naming `w` in `targetRefs`, then one whose label selector
    /// matches it, then one with neither (its whole namespace); equals by name.
    fn ranked<'a>(
        &self,
        list: &'a [Candidate],
        w: &Workload,
        labels: &BTreeMap<String, String>,
    ) -> Vec<&'a Candidate> {
        let mut selecting: Vec<(u8, &Candidate)> = list
            .iter()
            .filter(|c| c.selector.is_ok() && c.selects(w, labels))
            .map(|c| {
                let named = c.targets.iter().any(|(k, n)| *k == w.kind && *n == w.name);
                let rank = match (named, &c.selector) {
                    (true, _) => 0,
                    (false, Ok(Some(_))) => 1,
                    _ => 2,
                };
                (rank, c)
            })
            .collect();
        // `list` is in name order and the sort is stable.
        selecting.sort_by_key(|(rank, _)| *rank);
        selecting.into_iter().map(|(_, c)| c).collect()
    }

    /// Policies that select a workload another policy wins: per losing policy, the
    /// workloads with the policy that governs each. Pure; `workloads` with their labels.
    pub fn overlapping<'a>(
        &self,
        workloads: impl IntoIterator<Item = (&'a Workload, &'a BTreeMap<String, String>)>,
    ) -> BTreeMap<PolicyRef, Vec<(Workload, PolicyRef)>> {
        let mut out: BTreeMap<PolicyRef, Vec<(Workload, PolicyRef)>> = BTreeMap::new();
        for (w, labels) in workloads {
            let Some(list) = self.namespaced.get(&w.namespace) else {
                continue;
            };
            let ranked = self.ranked(list, w, labels);
            let Some((winner, losers)) = ranked.split_first() else {
                continue;
            };
            for loser in losers {
                out.entry(loser.reference.clone())
                    .or_default()
                    .push((w.clone(), winner.reference.clone()));
            }
        }
        for list in out.values_mut() {
            list.sort();
        }
        out
    }

    /// Every policy with what is wrong with it (`None`: usable), for status conditions.
    pub fn problems(&self) -> Vec<(PolicyRef, Option<String>)> {
        self.namespaced
            .values()
            .flatten()
            .map(|c| (c.reference.clone(), c.error()))
            .collect()
    }
}

/// How a read resumes from earlier reads.
#[derive(Debug, Clone, Default)]
pub enum Resume {
    /// Read every workload's whole history window.
    #[default]
    Nothing,
    /// One checkpoint for every workload (`tailor recommend --state`): workloads it does
    /// not hold start afresh at its end.
    All(Checkpoint),
    /// A checkpoint per workload (the agent's, kept in the API server); a workload without
    /// one reads its whole window.
    PerWorkload(BTreeMap<Workload, Checkpoint>),
}

/// What to compute.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The cluster.
    pub snapshot: &'a Snapshot,
    /// Its workloads.
    pub workloads: &'a Workloads,
    /// Its policies.
    pub policies: &'a Policies,
    /// Only workloads of these namespaces; empty: every namespace.
    pub namespaces: &'a [String],
    /// How far back to read (seconds) instead of each policy's `historyWindow`.
    pub history: Option<i64>,
    /// CPU sample spacing, seconds.
    pub step: i64,
    /// Evaluation time, unix seconds.
    pub now: i64,
    /// The largest allocatable CPU (millicores) and memory (bytes) a node offers.
    pub largest_node: Option<(i64, i64)>,
    /// What requested capacity costs.
    pub prices: Prices,
    /// Earlier reads to continue from.
    pub resume: Resume,
    /// Keep hourly usage per container (for charts).
    pub keep_hours: bool,
    /// OOM kills seen on the pods, besides those the source reads: a kill the usage
    /// history does not hold yet still bumps its container's memory now.
    pub ooms: &'a [ObservedOom],
}

/// How far before an OOM kill seen on a pod its container's memory peaks are looked for:
/// the memory interval the usage is read at.
const OBSERVED_OOM_LOOKBACK: i64 = 3_600;

/// One workload container's recommendation.
#[derive(Debug, Clone)]
pub struct ContainerOutcome {
    /// The workload.
    pub workload: Workload,
    /// The container's name.
    pub container: String,
    /// The policy it was computed under (`None`: the built-in defaults).
    pub policy: Option<PolicyRef>,
    /// The mode that applies to it.
    pub mode: Mode,
    /// How applied requests reach its pods.
    pub update: crate::apis::UpdateMode,
    /// Smallest relative change worth applying.
    pub min_change: f64,
    /// Largest relative change one actuation round makes (0: no limit).
    pub max_step: f64,
    /// Pods of the workload that stay available when one is evicted (`update.minReplicas`).
    pub min_replicas: i32,
    /// The recommendation.
    pub recommendation: ContainerRecommendation,
    /// Hourly usage read this time (when asked for).
    pub hours: Vec<HourUsage>,
    /// Unix second of the newest usage sample behind it.
    pub last_sample: Option<i64>,
}

/// Everything a computation found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Per workload container with usage, by workload and container.
    pub containers: Vec<ContainerOutcome>,
    /// Workload containers in scope with no usage in the history.
    pub without_usage: Vec<(Workload, String)>,
    /// Workloads held by a policy that cannot be used, with the policy and why.
    pub held: Vec<(Workload, PolicyRef, String)>,
    /// Containers in the history that matched no workload container of the snapshot.
    pub unmatched: usize,
    /// What the reads cost.
    pub stats: ReadStats,
    /// The earliest time read from, unix seconds.
    pub read_from: i64,
    /// Whether any workload continued from a checkpoint.
    pub resumed: bool,
    /// Checkpoints that could not be continued from, and why.
    pub not_resumed: Vec<(Workload, String)>,
    /// Per workload in scope (held ones excepted): its state up to `now`, to resume from.
    pub checkpoints: BTreeMap<Workload, Checkpoint>,
}

impl Outcome {
    /// All checkpoints as one (for a state file).
    pub fn merged_checkpoint(&self, until: i64) -> Checkpoint {
        let mut merged = Checkpoint {
            version: CHECKPOINT_VERSION,
            half_life: self
                .checkpoints
                .values()
                .next()
                .map_or(Policy::default().half_life, |c| c.half_life),
            until,
            containers: Vec::new(),
        };
        for c in self.checkpoints.values() {
            merged.containers.extend(c.containers.iter().cloned());
        }
        merged
    }
}

/// The labels of each workload object, for policy selectors.
pub fn workload_labels(snapshot: &Snapshot) -> BTreeMap<Workload, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut add = |kind: &str, m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        out.insert(
            Workload {
                namespace: m.namespace.clone().unwrap_or_else(|| "default".to_string()),
                kind: kind.to_string(),
                name: m.name.clone().unwrap_or_default(),
            },
            m.labels.clone().unwrap_or_default(),
        );
    };
    snapshot
        .deployments
        .iter()
        .for_each(|o| add("Deployment", &o.metadata));
    snapshot
        .stateful_sets
        .iter()
        .for_each(|o| add("StatefulSet", &o.metadata));
    snapshot
        .daemon_sets
        .iter()
        .for_each(|o| add("DaemonSet", &o.metadata));
    snapshot
        .replica_sets
        .iter()
        .for_each(|o| add("ReplicaSet", &o.metadata));
    snapshot.jobs.iter().for_each(|o| add("Job", &o.metadata));
    out
}

fn parse_quantity(v: Option<&Quantity>, cpu: bool) -> Option<i64> {
    v.and_then(|q| {
        if cpu {
            quantity::parse_milli(&q.0).ok()
        } else {
            quantity::parse_value(&q.0).ok()
        }
    })
}

/// A container's requests and limits as the recommender reads them.
pub fn current_requests(c: &Container) -> Requests {
    let res = c.resources.as_ref();
    let requests = res.and_then(|r| r.requests.as_ref());
    let limits = res.and_then(|r| r.limits.as_ref());
    Requests {
        cpu: parse_quantity(requests.and_then(|m| m.get("cpu")), true),
        memory: parse_quantity(requests.and_then(|m| m.get("memory")), false),
        cpu_limit: parse_quantity(limits.and_then(|m| m.get("cpu")), true),
        memory_limit: parse_quantity(limits.and_then(|m| m.get("memory")), false),
    }
}

/// Which resources an HPA targeting the workload scales on: (cpu, memory).
pub fn hpa_resources(snapshot: &Snapshot, w: &Workload) -> (bool, bool) {
    let mut cpu = false;
    let mut memory = false;
    for hpa in &snapshot.horizontal_pod_autoscalers {
        let ns = hpa.metadata.namespace.as_deref().unwrap_or("default");
        let Some(spec) = &hpa.spec else { continue };
        if ns != w.namespace
            || spec.scale_target_ref.kind != w.kind
            || spec.scale_target_ref.name != w.name
        {
            continue;
        }
        for m in spec.metrics.iter().flatten() {
            let name = m
                .resource
                .as_ref()
                .map(|r| r.name.as_str())
                .or_else(|| m.container_resource.as_ref().map(|r| r.name.as_str()));
            match name {
                Some("cpu") => cpu = true,
                Some("memory") => memory = true,
                _ => {}
            }
        }
        // An HPA without metrics scales on CPU (the API default).
        if spec.metrics.as_ref().is_none_or(|m| m.is_empty()) {
            cpu = true;
        }
    }
    (cpu, memory)
}

/// The workloads one read covers: the same policy and the same starting point.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey {
    policy: Option<PolicyRef>,
    /// Where the read continues from; `None`: the whole window.
    until: Option<i64>,
}

/// The OOM kills the pods show: each container whose last termination (or current state)
/// is `OOMKilled`, when it finished, with its memory limit (what it was killed at) and
/// request then. Pure.
pub fn oom_kills(pods: &[std::sync::Arc<Pod>]) -> Vec<ObservedOom> {
    let mut out = Vec::new();
    for pod in pods {
        let (Some(spec), Some(status)) = (pod.spec.as_ref(), pod.status.as_ref()) else {
            continue;
        };
        for cs in status.container_statuses.iter().flatten() {
            let killed_at = [cs.last_state.as_ref(), cs.state.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|s| s.terminated.as_ref())
                .filter(|t| t.reason.as_deref() == Some("OOMKilled"))
                .filter_map(|t| t.finished_at.as_ref())
                .map(|t| t.0.as_second())
                .max();
            let Some(at) = killed_at else { continue };
            let resources = spec
                .containers
                .iter()
                .find(|c| c.name == cs.name)
                .map(current_requests)
                .unwrap_or_default();
            out.push(ObservedOom {
                key: ContainerKey {
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    container: cs.name.clone(),
                },
                at,
                memory: resources.memory_limit.map(|v| v as f64),
                request: resources.memory.map(|v| v as f64),
            });
        }
    }
    out
}

/// Reads usage and computes a recommendation for every workload container in scope. On a
/// failed read nothing is returned: no recommendation rests on part of the data.
pub async fn recommend_workloads<S: UsageSource>(
    source: &S,
    request: Request<'_>,
) -> Result<Outcome, UsageError> {
    let Request {
        snapshot,
        workloads,
        policies,
        namespaces,
        history,
        step,
        now,
        largest_node,
        prices,
        resume,
        keep_hours,
        ooms,
    } = request;
    let in_scope = |w: &Workload| namespaces.is_empty() || namespaces.contains(&w.namespace);
    let labels = workload_labels(snapshot);
    let no_labels = BTreeMap::new();
    let mut outcome = Outcome {
        read_from: now,
        ..Outcome::default()
    };
    // Who governs each workload, and where its read starts.
    let mut groups: BTreeMap<GroupKey, (Policy, Vec<Workload>)> = BTreeMap::new();
    let mut per_workload = match &resume {
        Resume::PerWorkload(map) => map.clone(),
        _ => BTreeMap::new(),
    };
    for w in workloads.templates.keys().filter(|w| in_scope(w)) {
        let policy = match policies.govern(w, labels.get(w).unwrap_or(&no_labels)) {
            Governance::Governed { source, policy } => (source, *policy),
            Governance::Held { source, error } => {
                outcome.held.push((w.clone(), source, error));
                continue;
            }
        };
        let window = history.unwrap_or(policy.1.history_window);
        let until = match &resume {
            Resume::Nothing => None,
            Resume::All(c) => match c.usable(&policy.1, now - window, now) {
                Ok(()) => Some(c.until),
                Err(why) => {
                    outcome.not_resumed.push((w.clone(), why));
                    None
                }
            },
            Resume::PerWorkload(_) => match per_workload.get(w) {
                None => None,
                Some(c) => match c.usable(&policy.1, now - window, now) {
                    Ok(()) => Some(c.until),
                    Err(why) => {
                        outcome.not_resumed.push((w.clone(), why));
                        per_workload.remove(w);
                        None
                    }
                },
            },
        };
        groups
            .entry(GroupKey {
                policy: policy.0.clone(),
                until,
            })
            .or_insert_with(|| (policy.1.clone(), Vec::new()))
            .1
            .push(w.clone());
    }

    let mut unmatched: BTreeSet<ContainerKey> = BTreeSet::new();
    let mut extra_unmatched = 0;
    for (key, (policy, members)) in &groups {
        let window_start = now - history.unwrap_or(policy.history_window);
        let member_set: BTreeSet<&Workload> = members.iter().collect();
        let mut pool = match key.until {
            None => Pool::new(workloads, policy, window_start),
            Some(until) => {
                outcome.resumed = true;
                let containers = match &resume {
                    Resume::All(c) => c.containers.clone(),
                    _ => members
                        .iter()
                        .filter_map(|w| per_workload.get(w))
                        .flat_map(|c| c.containers.iter().cloned())
                        .collect(),
                };
                Pool::resume(
                    workloads,
                    policy,
                    Checkpoint {
                        version: CHECKPOINT_VERSION,
                        half_life: policy.half_life,
                        until,
                        containers,
                    },
                )
            }
        }
        .keep_hours(keep_hours);
        let start = key.until.unwrap_or(window_start);
        outcome.read_from = outcome.read_from.min(start);
        // A checkpoint taken at `now` leaves nothing new to read.
        if start < now {
            let mut group_namespaces: Vec<String> = if namespaces.is_empty() {
                members.iter().map(|w| w.namespace.clone()).collect()
            } else {
                namespaces.to_vec()
            };
            group_namespaces.sort();
            group_namespaces.dedup();
            let stats = source
                .read(
                    &UsageQuery {
                        namespaces: group_namespaces,
                        start,
                        end: now,
                        step,
                    },
                    &mut pool,
                )
                .await?;
            outcome.stats.queries += stats.queries;
            outcome.stats.series += stats.series;
            outcome.stats.samples += stats.samples;
            outcome.stats.rejected_samples += stats.rejected_samples;
        }
        for oom in ooms.iter().filter(|o| {
            o.at > window_start
                && o.at <= now
                && workloads
                    .of_pod(&o.key.namespace, &o.key.pod)
                    .is_some_and(|w| member_set.contains(&w))
        }) {
            pool.observed_oom(oom, OBSERVED_OOM_LOOKBACK);
        }
        unmatched.extend(pool.unmatched().iter().cloned());
        let pooled = pool.finish();
        let mut checkpoints: BTreeMap<Workload, Checkpoint> = members
            .iter()
            .map(|w| {
                (
                    w.clone(),
                    Checkpoint {
                        version: CHECKPOINT_VERSION,
                        half_life: policy.half_life,
                        until: now,
                        containers: Vec::new(),
                    },
                )
            })
            .collect();
        // The containers this policy sizes are sized together: one starvation price for
        // all, so the budget's starved samples go where they spare the most cores.
        // Containers whose CPU an HPA scales on keep their request and are left out.
        let cpu_starvation_price = super::cpu_starvation_price(
            pooled
                .iter()
                .filter(|((w, container), _)| {
                    member_set.contains(w)
                        && workloads.container(w, container).is_some()
                        && !(policy.hpa == HpaPolicy::Skip && hpa_resources(snapshot, w).0)
                })
                .map(|(_, p)| &p.history),
            policy,
        );
        for ((w, container), pooled) in &pooled {
            // Usage of a workload another read covers is that read's.
            if !member_set.contains(w) {
                continue;
            }
            let Some(c) = workloads.container(w, container) else {
                extra_unmatched += 1;
                continue;
            };
            let (hpa_on_cpu, hpa_on_memory) = hpa_resources(snapshot, w);
            let context = Context {
                hpa_on_cpu,
                hpa_on_memory,
                largest_node,
                prices,
                cpu_starvation_price,
            };
            let recommendation =
                recommend(&pooled.history, current_requests(c), policy, &context, now);
            if let Some(cp) = checkpoints.get_mut(w) {
                let mut history = pooled.history.clone();
                if let Some(cores) = recommendation.cpu_target_cores {
                    history.note_cpu_target(now, cores, policy.min_change);
                }
                cp.containers.push(crate::usage::pool::CheckpointEntry {
                    namespace: w.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    container: container.clone(),
                    history,
                });
            }
            outcome.containers.push(ContainerOutcome {
                workload: w.clone(),
                container: container.clone(),
                policy: key.policy.clone(),
                mode: policy.mode,
                update: policy.update,
                min_change: policy.min_change,
                max_step: policy.max_step,
                min_replicas: policy.min_replicas,
                recommendation,
                hours: pooled.hours.clone(),
                last_sample: pooled.history.last_sample(),
            });
        }
        outcome.checkpoints.extend(checkpoints);
    }
    outcome
        .containers
        .sort_by(|a, b| (&a.workload, &a.container).cmp(&(&b.workload, &b.container)));
    let with_usage: BTreeSet<(&Workload, &str)> = outcome
        .containers
        .iter()
        .map(|c| (&c.workload, c.container.as_str()))
        .collect();
    let held: BTreeSet<&Workload> = outcome.held.iter().map(|h| &h.0).collect();
    let mut without_usage = Vec::new();
    for (w, spec) in &workloads.templates {
        if !in_scope(w) || held.contains(w) {
            continue;
        }
        for c in &spec.containers {
            if !with_usage.contains(&(w, c.name.as_str())) {
                without_usage.push((w.clone(), c.name.clone()));
            }
        }
    }
    outcome.without_usage = without_usage;
    outcome.unmatched = unmatched.len() + extra_unmatched;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(yaml: &str, global: Mode) -> Policies {
        let list: Vec<RightsizingPolicy> = serde_yaml::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).expect("policy"))
            .collect();
        Policies::new(&list, Some("tailor"), global)
    }

    fn workload(ns: &str, name: &str) -> Workload {
        Workload {
            namespace: ns.to_string(),
            kind: "Deployment".to_string(),
            name: name.to_string(),
        }
    }

    fn labels(app: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("app".to_string(), app.to_string())])
    }

    const POLICIES: &str = "
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: default, namespace: tailor}
spec: {mode: Recommend}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: web, namespace: shop}
spec: {selector: {matchLabels: {app: web}}, mode: Auto}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: tight, namespace: shop}
spec:
  targetRefs: [{kind: Deployment, name: cart}]
  memory: {min: 2Gi, max: 1Gi}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: broken, namespace: batch}
spec:
  selector: {matchExpressions: [{key: app, operator: Sometimes, values: [x]}]}
";

    fn source(g: &Governance) -> String {
        match g {
            Governance::Governed { source, policy } => format!(
                "{}:{:?}",
                source
                    .as_ref()
                    .map_or("built-in".to_string(), |s| s.to_string()),
                policy.mode
            ),
            Governance::Held { source, error } => format!("held by {source}: {error}"),
        }
    }

    #[test]
    fn oom_kills_are_the_containers_whose_last_or_current_termination_says_oomkilled() {
        let pod = |name: &str, resources: &str, statuses: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\n\
                 spec:\n  containers:\n  - {{name: app, image: x, resources: {resources}}}\n  \
                 - {{name: side, image: y}}\nstatus:\n  phase: Running\n  containerStatuses:\n{statuses}"
            )
        };
        let status = |name: &str, last: &str, state: &str| {
            format!(
                "  - {{name: {name}, image: x, imageID: '', ready: true, restartCount: 1, \
                 lastState: {last}, state: {state}}}\n"
            )
        };
        let oom = |at: &str| {
            format!("{{terminated: {{exitCode: 137, reason: OOMKilled, finishedAt: '{at}'}}}}")
        };
        let running = "{running: {startedAt: '2026-12-01T10:00:00Z'}}";
        let yaml = [
            // Killed at its limit, restarted: counted with its limit and request.
            pod(
                "web-1",
                "{requests: {memory: 320Mi}, limits: {memory: 400Mi}}",
                &(status("app", &oom("2026-12-01T10:00:00Z"), running)
                    + &status("side", "{}", running)),
            ),
            // Terminated by OOM now, no limit: counted, the memory it died at unknown.
            pod(
                "web-2",
                "{requests: {memory: 256Mi}}",
                &status("app", "{}", &oom("2026-12-01T11:00:00Z")),
            ),
            // Ended otherwise: not counted.
            pod(
                "web-3",
                "{requests: {memory: 256Mi}}",
                &status(
                    "app",
                    "{terminated: {exitCode: 1, reason: Error, finishedAt: '2026-12-01T10:00:00Z'}}",
                    running,
                ),
            ),
        ]
        .join("---\n");
        let snapshot = Snapshot::from_yaml("pods", &yaml).expect("snapshot");
        let kills = oom_kills(&snapshot.pods);
        let seconds = |t: &str| t.parse::<jiff::Timestamp>().expect("time").as_second();
        assert_eq!(
            kills,
            vec![
                ObservedOom {
                    key: ContainerKey {
                        namespace: "shop".into(),
                        pod: "web-1".into(),
                        container: "app".into(),
                    },
                    at: seconds("2026-12-01T10:00:00Z"),
                    memory: Some(400.0 * 1048576.0),
                    request: Some(320.0 * 1048576.0),
                },
                ObservedOom {
                    key: ContainerKey {
                        namespace: "shop".into(),
                        pod: "web-2".into(),
                        container: "app".into(),
                    },
                    at: seconds("2026-12-01T11:00:00Z"),
                    memory: None,
                    request: Some(256.0 * 1048576.0),
                },
            ]
        );
    }

    #[test]
    fn a_policy_of_the_namespace_that_selects_the_workload_wins_over_the_cluster_default() {
        let p = policies(POLICIES, Mode::Auto);
        assert_eq!(
            source(&p.govern(&workload("shop", "web"), &labels("web"))),
            "shop/web:Auto"
        );
        // Selected by nothing of its namespace: the cluster default, whose mode wins over
        // the global one.
        assert_eq!(
            source(&p.govern(&workload("shop", "search"), &labels("search"))),
            "tailor/default:Recommend"
        );
        // No policy at all: the built-in defaults in the global mode.
        let none = Policies::new(&[], Some("tailor"), Mode::Auto);
        assert_eq!(
            source(&none.govern(&workload("shop", "web"), &labels("web"))),
            "built-in:Auto"
        );
    }

    #[test]
    fn a_policy_with_min_above_max_or_a_selector_that_cannot_parse_holds_its_workloads() {
        let p = policies(POLICIES, Mode::Auto);
        let cart = source(&p.govern(&workload("shop", "cart"), &labels("cart")));
        assert!(
            cart.starts_with("held by shop/tight: ") && cart.contains("spec.memory.min"),
            "{cart}"
        );
        let job = source(&p.govern(&workload("batch", "job"), &labels("job")));
        assert!(
            job.starts_with("held by batch/broken: spec.selector") && job.contains("Sometimes"),
            "{job}"
        );
        let problems: BTreeMap<String, Option<String>> = p
            .problems()
            .into_iter()
            .map(|(r, e)| (r.to_string(), e))
            .collect();
        assert!(problems["shop/web"].is_none());
        assert!(problems["shop/tight"].is_some());
        assert!(problems["batch/broken"].is_some());
    }

    const OVERLAPPING: &str = "
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: a-everything, namespace: shop}
spec: {mode: Recommend}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: z-web, namespace: shop}
spec: {selector: {matchLabels: {app: web}}, mode: Auto}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: y-web-too, namespace: shop}
spec: {selector: {matchLabels: {app: web}}, mode: Recommend}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: x-checkout, namespace: shop}
spec: {targetRefs: [{kind: Deployment, name: checkout}], mode: Auto}
";

    #[test]
    fn the_most_specific_policy_wins_a_workload_then_the_first_by_name_and_the_others_overlap() {
        let p = policies(OVERLAPPING, Mode::Recommend);
        // Named beats selected beats the whole namespace, whatever the names.
        assert_eq!(
            source(&p.govern(&workload("shop", "checkout"), &labels("web"))),
            "shop/x-checkout:Auto"
        );
        // Two selectors match: the first by name.
        assert_eq!(
            source(&p.govern(&workload("shop", "web"), &labels("web"))),
            "shop/y-web-too:Recommend"
        );
        // Only the namespace-wide policy selects it.
        assert_eq!(
            source(&p.govern(&workload("shop", "search"), &labels("search"))),
            "shop/a-everything:Recommend"
        );
        let (web, checkout, search) = (
            workload("shop", "web"),
            workload("shop", "checkout"),
            workload("shop", "search"),
        );
        let (web_labels, search_labels) = (labels("web"), labels("search"));
        let overlaps = p.overlapping([
            (&web, &web_labels),
            (&checkout, &web_labels),
            (&search, &search_labels),
        ]);
        let text: BTreeMap<String, Vec<String>> = overlaps
            .iter()
            .map(|(loser, list)| {
                (
                    loser.to_string(),
                    list.iter()
                        .map(|(w, winner)| format!("{} to {winner}", w.name))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            text,
            BTreeMap::from([
                (
                    "shop/a-everything".to_string(),
                    vec![
                        "checkout to shop/x-checkout".to_string(),
                        "web to shop/y-web-too".to_string()
                    ]
                ),
                (
                    "shop/y-web-too".to_string(),
                    vec!["checkout to shop/x-checkout".to_string()]
                ),
                (
                    "shop/z-web".to_string(),
                    vec![
                        "checkout to shop/x-checkout".to_string(),
                        "web to shop/y-web-too".to_string()
                    ]
                ),
            ])
        );
        // A lone policy overlaps nothing.
        let alone = policies(POLICIES, Mode::Auto);
        assert!(alone.overlapping([(&web, &web_labels)]).is_empty());
    }
}
