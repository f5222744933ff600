//! The eviction fallback of `InPlace`, pure: which pods of a workload to evict now because
//! the node cannot resize them, and why the others wait (VPA's InPlaceOrRecreate, made
//! safer).
//!
//! A pod needs the fallback when its resize is `Infeasible` (the `PodResizePending`
//! condition the kubelet sets), `Deferred` for more than [`DEFERRED_LIMIT_SECONDS`] (at
//! once when the increase follows an OOM kill: the container is killed again at its size
//! for as long as the node has no room), or when the API server refused the resize call.
//! Such a pod is evicted (through the Eviction
//! API, so its PodDisruptionBudget is enforced by the API server) only while at least
//! `update.minReplicas` of the workload's pods stay available besides it, and only when a
//! replacement gets the recommended requests (the admission webhook is serving); otherwise
//! it waits, and the controller says why. The controller does the I/O; a `429` from the
//! Eviction API makes the pod wait for the next round, never a retry within it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// How long a resize may stay `Deferred` before the pod is evicted instead (VPA's
/// InPlaceOrRecreate uses the same 5 minutes).
pub const DEFERRED_LIMIT_SECONDS: i64 = 300;

/// The pod condition the kubelet sets while a resize cannot be made yet.
const RESIZE_PENDING: &str = "PodResizePending";

/// Why a pod cannot be resized in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stuck {
    /// The node can never hold the new resources (the kubelet's message).
    Infeasible(String),
    /// The node cannot hold them now, and has not for this many seconds.
    Deferred(i64),
    /// The API server refused the resize (its message).
    Refused(String),
}

impl Stuck {
    /// A bounded label for metrics and Event reasons.
    pub fn as_str(&self) -> &'static str {
        match self {
            Stuck::Infeasible(_) => "infeasible",
            Stuck::Deferred(_) => "deferred",
            Stuck::Refused(_) => "refused",
        }
    }
}

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stuck::Infeasible(m) => write!(f, "resize Infeasible: {m}"),
            Stuck::Deferred(s) => write!(f, "resize Deferred for {s}s"),
            Stuck::Refused(m) => write!(f, "resize refused: {m}"),
        }
    }
}

/// Why a pod that needs the fallback is not evicted now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Evicting it would leave fewer than `update.minReplicas` pods available.
    MinReplicas {
        /// Pods of the workload available now.
        available: usize,
        /// The policy's `update.minReplicas`.
        min: i32,
    },
    /// No admission webhook serves: a replacement would get the template's requests and be
    /// stuck the same way.
    NoWebhook,
}

impl Wait {
    /// A bounded label for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Wait::MinReplicas { .. } => "min_replicas",
            Wait::NoWebhook => "no_webhook",
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::MinReplicas { available, min } => write!(
                f,
                "{available} pod(s) available and update.minReplicas is {min}: evicting \
                 would leave fewer"
            ),
            Wait::NoWebhook => write!(
                f,
                "no admission webhook (--webhook-address): a replacement would get the \
                 template's requests"
            ),
        }
    }
}

/// What to do with a workload's pods that cannot be resized in place.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Pods to evict now (names), with why.
    pub evict: Vec<(String, Stuck)>,
    /// Pods that need the fallback but wait, with why they need it and why they wait.
    pub waiting: Vec<(String, Stuck, Wait)>,
}

/// Whether the pod's last resize is stuck at `now` (unix seconds): its `PodResizePending`
/// condition says `Infeasible`, or `Deferred` since more than [`DEFERRED_LIMIT_SECONDS`],
/// or `Deferred` at all when the resize is `urgent` (a memory increase an OOM kill forced:
/// waiting for room on the node only repeats the kill).
pub fn stuck(pod: &Pod, now: i64, urgent: bool) -> Option<Stuck> {
    let condition = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == RESIZE_PENDING && c.status == "True")?;
    match condition.reason.as_deref() {
        Some("Infeasible") => Some(Stuck::Infeasible(
            condition.message.clone().unwrap_or_default(),
        )),
        Some("Deferred") => {
            let since = condition
                .last_transition_time
                .as_ref()
                .map_or(now, |t| t.0.as_second());
            (urgent || now - since > DEFERRED_LIMIT_SECONDS).then_some(Stuck::Deferred(now - since))
        }
        _ => None,
    }
}

/// Whether a pod counts as available: running, ready and not terminating.
pub fn available(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Which of a workload's `pods` to evict now. `refused` holds the pods whose resize call
/// the API server refused (name: its message); `min_replicas` pods must stay available
/// besides the evicted ones; `webhook` says whether replacements get the recommendation;
/// `urgent`, whether the resizes are a memory increase an OOM kill forced ([`stuck`]).
/// Pods are taken in name order, so a round's choice is stable.
pub fn plan<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    refused: &BTreeMap<String, String>,
    min_replicas: i32,
    webhook: bool,
    urgent: bool,
    now: i64,
) -> Plan {
    let mut pods: Vec<&Pod> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let available_now = pods.iter().filter(|p| available(p)).count();
    let min = usize::try_from(min_replicas.max(0)).unwrap_or(0);
    let mut left = available_now;
    let mut out = Plan::default();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(why) =
            stuck(pod, now, urgent).or_else(|| refused.get(&name).cloned().map(Stuck::Refused))
        else {
            continue;
        };
        if !webhook {
            out.waiting.push((name, why, Wait::NoWebhook));
            continue;
        }
        let counts = available(pod);
        if counts && left <= min {
            out.waiting.push((
                name,
                why,
                Wait::MinReplicas {
                    available: available_now,
                    min: min_replicas,
                },
            ));
            continue;
        }
        if counts {
            left -= 1;
        }
        out.evict.push((name, why));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    /// A running, ready pod; `resize` is the reason of its `PodResizePending` condition,
    /// set `age` seconds before [`NOW`].
    fn pod(name: &str, resize: Option<(&str, i64)>) -> Pod {
        let mut conditions = vec![
            "{type: Ready, status: 'True'}".to_string(),
            "{type: PodScheduled, status: 'True'}".to_string(),
        ];
        if let Some((reason, age)) = resize {
            let at = jiff::Timestamp::from_second(NOW - age).expect("time");
            conditions.push(format!(
                "{{type: PodResizePending, status: 'True', reason: {reason}, message: 'Node didn''t have enough capacity: cpu', lastTransitionTime: '{at}'}}"
            ));
        }
        serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: shop}}\nspec: {{containers: [{{name: app}}]}}\nstatus: {{phase: Running, conditions: [{}]}}\n",
            conditions.join(", ")
        ))
        .expect("pod")
    }

    fn names(list: &[(String, Stuck)]) -> Vec<&str> {
        list.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn an_infeasible_resize_is_evicted_while_min_replicas_stay_available() {
        let pods = [
            pod("web-a", Some(("Infeasible", 10))),
            pod("web-b", Some(("Infeasible", 10))),
            pod("web-c", None),
        ];
        let plan = plan(&pods, &BTreeMap::new(), 1, true, false, NOW);
        // Three available, one must stay: both stuck pods go.
        assert_eq!(names(&plan.evict), ["web-a", "web-b"]);
        assert!(matches!(&plan.evict[0].1, Stuck::Infeasible(m) if m.contains("capacity")));
        assert!(plan.waiting.is_empty());
    }

    #[test]
    fn evictions_stop_where_fewer_than_min_replicas_would_stay_available() {
        let pods = [
            pod("web-a", Some(("Infeasible", 10))),
            pod("web-b", Some(("Infeasible", 10))),
        ];
        let plan = plan(&pods, &BTreeMap::new(), 1, true, false, NOW);
        assert_eq!(names(&plan.evict), ["web-a"]);
        assert_eq!(plan.waiting.len(), 1);
        assert_eq!(plan.waiting[0].0, "web-b");
        assert_eq!(
            plan.waiting[0].2,
            Wait::MinReplicas {
                available: 2,
                min: 1
            }
        );
        // The only pod of a single-replica workload waits by default; minReplicas 0 lets it go.
        let single = [pod("api-a", Some(("Infeasible", 10)))];
        assert!(
            super::plan(&single, &BTreeMap::new(), 1, true, false, NOW)
                .evict
                .is_empty()
        );
        assert_eq!(
            names(&super::plan(&single, &BTreeMap::new(), 0, true, false, NOW).evict),
            ["api-a"]
        );
    }

    #[test]
    fn a_deferred_resize_is_evicted_only_after_five_minutes() {
        let young = [pod("web-a", Some(("Deferred", 299))), pod("web-b", None)];
        assert_eq!(
            plan(&young, &BTreeMap::new(), 1, true, false, NOW),
            Plan::default()
        );
        let old = [pod("web-a", Some(("Deferred", 301))), pod("web-b", None)];
        let p = plan(&old, &BTreeMap::new(), 1, true, false, NOW);
        assert_eq!(p.evict, [("web-a".to_string(), Stuck::Deferred(301))]);
    }

    #[test]
    fn a_refused_resize_is_evicted_and_a_pod_resizing_normally_is_not() {
        let pods = [pod("web-a", None), pod("web-b", None), pod("web-c", None)];
        let refused = BTreeMap::from([("web-b".to_string(), "forbidden".to_string())]);
        let p = plan(&pods, &refused, 1, true, false, NOW);
        assert_eq!(
            p.evict,
            [("web-b".to_string(), Stuck::Refused("forbidden".to_string()))]
        );
        assert!(
            plan(&pods, &BTreeMap::new(), 1, true, false, NOW)
                .evict
                .is_empty()
        );
    }

    #[test]
    fn without_the_webhook_nothing_is_evicted_and_each_stuck_pod_says_why() {
        let pods = [
            pod("web-a", Some(("Infeasible", 10))),
            pod("web-b", None),
            pod("web-c", None),
        ];
        let p = plan(&pods, &BTreeMap::new(), 1, false, false, NOW);
        assert!(p.evict.is_empty());
        assert_eq!(p.waiting.len(), 1);
        assert_eq!(p.waiting[0].2, Wait::NoWebhook);
        assert!(p.waiting[0].2.to_string().contains("--webhook-address"));
    }

    #[test]
    fn pods_not_ready_or_terminating_do_not_count_as_available() {
        let mut not_ready = pod("web-b", None);
        if let Some(cs) = not_ready
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
        {
            cs[0].status = "False".to_string();
        }
        let mut terminating = pod("web-c", None);
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::from_second(NOW).expect("time"),
            ));
        let pods = [
            pod("web-a", Some(("Infeasible", 10))),
            not_ready,
            terminating,
        ];
        let p = plan(&pods, &BTreeMap::new(), 1, true, false, NOW);
        assert!(p.evict.is_empty(), "{p:?}");
        assert_eq!(
            p.waiting[0].2,
            Wait::MinReplicas {
                available: 1,
                min: 1
            }
        );
    }
}
