//! The requests' daily and weekly cycle per NodePool ([`DemandHistory`]), shared by the
//! disruption controller, which records it and keeps the capacity it expects, and the
//! provisioning controller, which buys ahead of the growth it expects.
//!
//! The history is kept in the ConfigMap [`CONFIG_MAP`] in the agent's namespace, written by
//! the leader as it records, so a restart or a new leader does not start over: without
//! it, nothing is expected for a day after every restart.

use crate::cloud::CloudProvider;
use crate::disruption::forecast::{DEFAULT_HORIZON, DemandHistory};

use super::Context;

/// The ConfigMap holding the history.
pub const CONFIG_MAP: &str = "tailor-demand-history";

/// Its key.
pub const KEY: &str = "history.json";

/// The leader writes the history at most this often (seconds): a sample is recorded every
/// five minutes, and a new leader loses at most this much of it.
pub const SAVE_EVERY: i64 = 5 * 60;

/// History kept in the ConfigMap: a week back and a horizon, as the forecast reads it.
const KEEP: i64 = 7 * 86_400 + DEFAULT_HORIZON;

/// A ConfigMap holds at most 1 MiB; past this size only the last day and a horizon are
/// kept (the week-ago cycle is lost, yesterday's is not).
const MAX_BYTES: usize = 900 * 1024;

/// Replaces the shared history with the one kept in the ConfigMap when that one is newer
/// (a restart, or leadership taken over from another replica). A missing ConfigMap leaves
/// the history as it is; an unreadable one is reported and left alone (it is overwritten
/// by the next save).
pub async fn load<C: CloudProvider>(ctx: &Context<C>) {
    let namespace = &ctx.settings.namespace;
    let json = match ctx
        .writer
        .config_map_value(namespace, CONFIG_MAP, KEY)
        .await
    {
        Ok(Some(json)) => json,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "the demand history cannot be read; it starts over");
            return;
        }
    };
    let now = ctx.clock.now().as_second();
    match DemandHistory::from_json(&json, now) {
        Ok(kept) => {
            let mut demand = ctx.demand.lock().unwrap_or_else(|e| e.into_inner());
            if kept.newest() > demand.newest() {
                tracing::info!(
                    configmap = %format!("{namespace}/{CONFIG_MAP}"),
                    newest = kept.newest().unwrap_or_default(),
                    "demand history read back"
                );
                // Holding the peak until a day is the run's setting, not the history's.
                let hold = demand.holds_peak();
                *demand = kept.with_peak_held(hold);
            }
        }
        Err(e) => tracing::warn!(
            configmap = %format!("{namespace}/{CONFIG_MAP}"),
            key = KEY,
            error = %e,
            "the kept demand history is unreadable; it starts over and is overwritten"
        ),
    }
}

/// Writes the shared history to the ConfigMap.
pub async fn save<C: CloudProvider>(ctx: &Context<C>) {
    let json = {
        let demand = ctx.demand.lock().unwrap_or_else(|e| e.into_inner());
        let json = demand.to_json(KEEP);
        if json.len() > MAX_BYTES {
            demand.to_json(86_400 + DEFAULT_HORIZON)
        } else {
            json
        }
    };
    if let Err(e) = ctx
        .writer
        .apply_config_map_value(&ctx.settings.namespace, CONFIG_MAP, KEY, &json)
        .await
    {
        tracing::warn!(error = %e, "keeping the demand history failed");
    }
}
