//! Events expire, as upstream's do: kube-apiserver writes every Event with an etcd lease
//! of `--event-ttl` (one hour), renewed by each write, so a busy cluster keeps an hour
//! of Events and no more. The embedded store has no leases, so this sweeper does the
//! same for both backends: every so often it deletes the Events whose last write is
//! older than the TTL. Watchers see the deletions, as they see a lease expire upstream.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::Api;
use crate::loopback::{Loopback, Resource};

/// Deletes expired Events every `ttl / 4` (at most every minute) until the process ends.
pub async fn run(api: std::sync::Arc<Api>, ttl: Duration) {
    let mut ticker = tokio::time::interval((ttl / 4).min(Duration::from_secs(60)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match sweep(&api, ttl).await {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(deleted, "expired events deleted"),
            Err(err) => tracing::warn!(%err, "deleting expired events"),
        }
    }
}

async fn sweep(api: &Api, ttl: Duration) -> Result<usize, krust_api::status::ApiError> {
    let internal = Loopback { scope: &api.scope };
    let events = internal.list(Resource::core("events", None), "").await?;
    let Some(cutoff) = SignedDuration::try_from(ttl)
        .ok()
        .and_then(|ttl| Timestamp::now().checked_sub(ttl).ok())
    else {
        return Ok(0);
    };
    let mut deleted = 0;
    for event in events
        .iter()
        .filter(|e| last_write(e).is_some_and(|t| t < cutoff))
    {
        let meta = &event["metadata"];
        let (Some(namespace), Some(name), Some(rv)) = (
            meta["namespace"].as_str(),
            meta["name"].as_str(),
            meta["resourceVersion"].as_str(),
        ) else {
            continue;
        };
        // Only the version we judged: an Event written since then lives on.
        match internal
            .delete_unchanged(Resource::core("events", Some(namespace)), name, rv)
            .await
        {
            Ok(()) => deleted += 1,
            Err(err) if matches!(err.code, 404 | 409) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(deleted)
}

/// When the Event was last written, as far as its fields tell: the latest of its
/// timestamps and of its managers' write times.
fn last_write(event: &Value) -> Option<Timestamp> {
    let meta = &event["metadata"];
    let managed = meta["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| &entry["time"]);
    [
        &meta["creationTimestamp"],
        &event["lastTimestamp"],
        &event["eventTime"],
        &event["series"]["lastObservedTime"],
    ]
    .into_iter()
    .chain(managed)
    .filter_map(|t| t.as_str())
    .filter_map(|t| t.parse::<Timestamp>().ok())
    .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_last_write_is_the_latest_timestamp_an_event_carries() {
        let event = json!({
            "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"time": "2026-01-01T00:05:00Z"}]},
            "lastTimestamp": "2026-01-01T00:03:00Z",
            "series": {"lastObservedTime": "2026-01-01T00:07:00.123456Z"},
        });
        assert_eq!(
            last_write(&event).unwrap().to_string(),
            "2026-01-01T00:07:00.123456Z"
        );
        assert_eq!(last_write(&json!({"metadata": {}})), None);
    }
}
