//! Leader election through a `coordination.k8s.io/v1` Lease, as client-go's leaderelection
//! package does it: the leader renews the Lease every retry period and steps down when it
//! has not renewed within the renew deadline; a follower takes the Lease once its holder has
//! not renewed it for the Lease's duration (timed by the follower's own clock from when it
//! last saw the record change, so clocks need not agree), or at once when it is released or
//! missing. A missing Lease (deleted by a namespace clean-up or `kubectl delete lease`) is
//! created again. The leader releases the Lease when it stops, and followers read it every
//! second at most, so a hand-over takes about a second rather than a Lease duration. Every
//! write is a merge patch conditional on the resourceVersion read (the chart grants `get`,
//! `create` and `patch` on the one Lease): of two replicas taking a free Lease, one wins.
//!
//! Liveness follows the election: when no Lease request has succeeded for a renew deadline
//! and a Lease duration, `/healthz` fails with the reason, so the pod is restarted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::server::Liveness;

/// The Lease and the timers of one election.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder's last renewal keeps others away (client-go: 15 s).
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal (client-go: 10 s).
    pub renew_deadline: Duration,
    /// How often the Lease is renewed, or tried for (client-go: 2 s).
    pub retry_period: Duration,
}

impl Settings {
    /// client-go's timers (15 s, 10 s, 2 s) multiplied by `scale` (tests shrink them),
    /// never below 4 s, 2 s and 0.5 s, and each shorter than the one before.
    pub fn scaled(namespace: &str, name: &str, identity: &str, scale: f64) -> Settings {
        let lease_duration = Duration::from_secs_f64((15.0 * scale).max(4.0));
        let renew_deadline = Duration::from_secs_f64((10.0 * scale).max(2.0));
        let retry_period = Duration::from_secs_f64((2.0 * scale).max(0.5));
        Settings {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration,
            renew_deadline: renew_deadline.min(lease_duration.mul_f64(0.75)),
            retry_period: retry_period.min(renew_deadline.mul_f64(0.5)),
        }
    }
}

/// A running election: whether this replica leads, and how to stop campaigning.
pub struct Election {
    leader: watch::Receiver<bool>,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Election {
    /// Whether this replica leads now, and every change.
    pub fn leader(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Stops campaigning: a leader stops leading and releases the Lease (within `timeout`),
    /// so a follower takes it at once instead of after the Lease's duration.
    pub async fn stop(self, timeout: Duration) {
        self.stop.notify_one();
        let _ = tokio::time::timeout(timeout, self.task).await;
    }
}

/// Starts campaigning for the Lease of `settings` on `client`; `on_change` is told each
/// change of leadership, and `liveness` fails while the election cannot reach the Lease.
pub fn start(
    client: kube::Client,
    settings: Settings,
    liveness: Liveness,
    on_change: impl Fn(bool) + Send + Sync + 'static,
) -> Election {
    let (sender, leader) = watch::channel(false);
    let stop = Arc::new(Notify::new());
    let task = tokio::spawn(campaign(
        Api::namespaced(client, &settings.namespace),
        settings,
        sender,
        stop.clone(),
        liveness,
        on_change,
    ));
    Election { leader, stop, task }
}

/// Why a round of the election failed, for logs and `/healthz`.
#[derive(Debug)]
struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure(crate::state::cluster::unreachable_cause(&e))
    }
}

/// What a follower last saw of the Lease, and when (by its own clock).
struct Observed {
    holder: String,
    renewed: Option<MicroTime>,
    at: Instant,
}

async fn campaign(
    api: Api<Lease>,
    settings: Settings,
    sender: watch::Sender<bool>,
    stop: Arc<Notify>,
    liveness: Liveness,
    on_change: impl Fn(bool),
) {
    let mut observed: Option<Observed> = None;
    let mut last_renewed: Option<Instant> = None;
    let mut last_success = Instant::now();
    let set = |leads: bool| {
        if *sender.borrow() != leads {
            sender.send_replace(leads);
            on_change(leads);
        }
    };
    loop {
        // A request that hangs must not keep a leader leading: it counts as failed after
        // the renew deadline.
        let round = tokio::time::timeout(
            settings.renew_deadline,
            try_acquire_or_renew(&api, &settings, &mut observed),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Failure(format!(
                "no answer within {:.1} s",
                settings.renew_deadline.as_secs_f64()
            )))
        });
        match round {
            Ok(leads) => {
                last_success = Instant::now();
                liveness.recover("leader election");
                if leads {
                    last_renewed = Some(Instant::now());
                }
                set(leads);
            }
            Err(e) => {
                tracing::warn!(lease = %settings.name, namespace = %settings.namespace, error = %e, "leader election: the Lease could not be read or written");
                // A leader that cannot renew within the deadline stops acting: another
                // replica may take the Lease once it expires.
                if *sender.borrow()
                    && last_renewed.is_none_or(|t| t.elapsed() >= settings.renew_deadline)
                {
                    tracing::warn!(
                        "leader election: not renewed within the renew deadline; no longer leading"
                    );
                    set(false);
                }
                if last_success.elapsed() >= settings.renew_deadline + settings.lease_duration {
                    liveness.fail(
                        "leader election",
                        format!(
                            "no request for Lease {}/{} has succeeded for {:.0} s: {e}",
                            settings.namespace,
                            settings.name,
                            last_success.elapsed().as_secs_f64()
                        ),
                    );
                }
            }
        }
        // A leader renews every retry period; a follower reads the Lease at least every
        // second, so a released Lease is taken within about a second.
        let wait = if *sender.borrow() {
            settings.retry_period
        } else {
            settings.retry_period.min(FOLLOWER_PERIOD)
        };
        tokio::select! {
            () = stop.notified() => {
                if *sender.borrow() {
                    set(false);
                    match release(&api, &settings).await {
                        Ok(()) => tracing::info!(lease = %settings.name, "leader election: Lease released"),
                        Err(e) => tracing::warn!(error = %e, "leader election: releasing the Lease failed; it expires instead"),
                    }
                }
                return;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// How often a follower reads the Lease at most.
const FOLLOWER_PERIOD: Duration = Duration::from_secs(1);

/// One round of client-go's `tryAcquireOrRenew`: creates the Lease when it is missing,
/// renews it when held, takes it when free or expired; `Ok(true)` when this replica holds
/// it afterwards.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    settings: &Settings,
    observed: &mut Option<Observed>,
) -> Result<bool, Failure> {
    let now = MicroTime(jiff::Timestamp::now());
    let seconds = settings.lease_duration.as_secs().max(1) as i32;
    let Some(lease) = api.get_opt(&settings.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.name.clone()),
                namespace: Some(settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => {
                tracing::info!(lease = %settings.name, "leader election: the Lease was missing; created it holding it");
                Ok(true)
            }
            // Another replica created it first.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let changed = observed
        .as_ref()
        .is_none_or(|o| o.holder != holder || o.renewed != spec.renew_time);
    if changed {
        *observed = Some(Observed {
            holder: holder.clone(),
            renewed: spec.renew_time.clone(),
            at: Instant::now(),
        });
    }
    let held_for =
        Duration::from_secs(spec.lease_duration_seconds.unwrap_or(seconds).max(1) as u64);
    let expired = observed.as_ref().is_none_or(|o| o.at.elapsed() >= held_for);
    if !holder.is_empty() && holder != settings.identity && !expired {
        return Ok(false);
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    let ours = holder == settings.identity;
    let acquire_time = if ours {
        spec.acquire_time.clone()
    } else {
        Some(now.clone())
    };
    let patch = json!({
        // The resourceVersion read above makes the patch conditional: of two replicas
        // taking an expired Lease, one wins and the other gets a conflict.
        "metadata": {"resourceVersion": lease.metadata.resource_version},
        "spec": {
            "holderIdentity": settings.identity,
            "leaseDurationSeconds": seconds,
            "acquireTime": acquire_time,
            "renewTime": now,
            "leaseTransitions": if ours { transitions } else { transitions + 1 },
        }
    });
    match api
        .patch(
            &settings.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            if !ours {
                tracing::info!(lease = %settings.name, previous = %holder, "leader election: took the Lease");
            }
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Gives the Lease up as client-go does when it stops: no holder, a duration of one second.
async fn release(api: &Api<Lease>, settings: &Settings) -> Result<(), kube::Error> {
    let Some(lease) = api.get_opt(&settings.name).await? else {
        return Ok(());
    };
    let spec = lease.spec.unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return Ok(());
    }
    let now = MicroTime(jiff::Timestamp::now());
    let patch = json!({
        "metadata": {"resourceVersion": lease.metadata.resource_version},
        "spec": {
            "holderIdentity": null,
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
    });
    api.patch(
        &settings.name,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_scale_shrinks_client_gos_timers_but_keeps_them_ordered() {
        let s = Settings::scaled("ns", "lease", "me", 1.0);
        assert_eq!(
            (s.lease_duration, s.renew_deadline, s.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            ),
            "client-go's defaults"
        );
        for scale in [0.5, 0.2, 0.01] {
            let s = Settings::scaled("ns", "lease", "me", scale);
            assert!(s.lease_duration >= Duration::from_secs(4), "{s:?}");
            assert!(s.retry_period >= Duration::from_millis(500), "{s:?}");
            assert!(
                s.retry_period < s.renew_deadline && s.renew_deadline < s.lease_duration,
                "a renewal has time to spare: {s:?}"
            );
        }
    }
}
