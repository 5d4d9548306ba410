//! Backups of the store, as k3s's `etcd-snapshot` keeps them: files in one directory
//! named `<name>-<node>-<unix seconds>` (`etcd-snapshot` for the scheduled ones,
//! `on-demand` by default for the others), taken while serving ([`Store::snapshot`]:
//! a redb copy of the embedded store, etcd's own snapshot of etcd), on a cron schedule
//! with a retention, and listed for API clients in the ConfigMap
//! `kube-system/krust-etcd-snapshots` (one entry per snapshot, as k3s's
//! `k3s-etcd-snapshots`).
//!
//! `krust etcd-snapshot` drives them through `/db/snapshots` on the apiserver's port (the
//! store's file is the server's alone), which only `system:masters` may use:
//! `GET` lists, `POST {"name"}` saves, `DELETE /db/snapshots/NAME` deletes, and
//! `POST /db/snapshots/prune {"name", "retention"}` keeps the newest of a name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{Method, StatusCode};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use krust_api::cron::Schedule;
use krust_api::status::{ApiError, Target};
use krust_generic_apiserver::response::{self, Response};
use krust_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::loopback::{Loopback, Resource};

/// The name of scheduled snapshots (k3s's).
pub const SCHEDULED_NAME: &str = "etcd-snapshot";
/// The name of snapshots saved on request when none is given (k3s's).
pub const ON_DEMAND_NAME: &str = "on-demand";
/// Where snapshots are listed for API clients.
pub const CONFIGMAP: &str = "krust-etcd-snapshots";
const CONFIGMAPS: Resource<'static> = Resource::core("configmaps", Some("kube-system"));

/// Where snapshots go and when they are taken.
#[derive(Debug, Clone)]
pub struct Config {
    /// The snapshot directory (k3s: `<data-dir>/server/db/snapshots`).
    pub dir: PathBuf,
    /// This server's node name, part of every snapshot's name.
    pub node: String,
    /// When scheduled snapshots are taken; `None` takes none.
    pub schedule: Option<Schedule>,
    /// How many scheduled snapshots are kept.
    pub retention: usize,
}

/// One snapshot file, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub name: String,
    /// `file://` URL of the snapshot.
    pub location: String,
    pub node_name: String,
    /// RFC 3339.
    pub created_at: String,
    pub size: u64,
}

#[derive(Deserialize)]
struct SaveRequest {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct PruneRequest {
    #[serde(default)]
    name: Option<String>,
    retention: usize,
}

/// The server's snapshots.
pub struct Snapshots {
    config: Config,
    store: Arc<dyn Store>,
    /// One operation at a time: a prune must not race a save of the same name.
    busy: tokio::sync::Mutex<()>,
}

fn target(name: &str) -> Target<'_> {
    Target {
        group: "",
        resource: "snapshots",
        name,
    }
}

/// A snapshot name is a file name of its own: lowercase letters, digits, `-` and `.`,
/// not starting with `.`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl Snapshots {
    pub fn new(config: Config, store: Arc<dyn Store>) -> Arc<Snapshots> {
        Arc::new(Snapshots {
            config,
            store,
            busy: tokio::sync::Mutex::new(()),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.config.dir.join(name)
    }

    /// The prefix of every snapshot of `name` taken on this node.
    fn prefix(&self, name: &str) -> String {
        format!("{name}-{}-", self.config.node)
    }

    /// Takes a snapshot named `<name>-<node>-<now>`.
    pub async fn save(&self, name: &str) -> Result<Record, ApiError> {
        if !valid_name(name) {
            return Err(ApiError::bad_request(format!(
                "invalid snapshot name {name:?}: lowercase letters, digits, '-' and '.' only"
            )));
        }
        let _busy = self.busy.lock().await;
        std::fs::create_dir_all(&self.config.dir).map_err(|e| {
            ApiError::internal(format!("creating {}: {e}", self.config.dir.display()))
        })?;
        let file = format!("{}{}", self.prefix(name), Timestamp::now().as_second());
        let path = self.path(&file);
        if path.exists() {
            return Err(ApiError::already_exists(target(&file)));
        }
        let started = std::time::Instant::now();
        self.store
            .snapshot(&path)
            .await
            .map_err(|e| ApiError::internal(format!("taking snapshot {file}: {e}")))?;
        tracing::info!(
            snapshot = %path.display(),
            ms = started.elapsed().as_millis() as u64,
            "snapshot saved"
        );
        self.record(&file)
    }

    /// Every snapshot in the directory, oldest first.
    pub fn list(&self) -> Result<Vec<Record>, ApiError> {
        let entries = match std::fs::read_dir(&self.config.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(ApiError::internal(format!(
                    "reading {}: {e}",
                    self.config.dir.display()
                )));
            }
        };
        let mut records: Vec<Record> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| valid_name(name) && !name.ends_with(".partial"))
            .filter_map(|name| self.record(&name).ok())
            .collect();
        records.sort_by(|a, b| (&a.created_at, &a.name).cmp(&(&b.created_at, &b.name)));
        Ok(records)
    }

    fn record(&self, name: &str) -> Result<Record, ApiError> {
        let path = self.path(name);
        let meta = std::fs::metadata(&path).map_err(|_| ApiError::not_found(target(name)))?;
        let created = meta
            .modified()
            .ok()
            .and_then(|t| Timestamp::try_from(t).ok())
            .unwrap_or(Timestamp::UNIX_EPOCH);
        Ok(Record {
            name: name.to_owned(),
            location: format!("file://{}", absolute(&path).display()),
            node_name: self.config.node.clone(),
            created_at: created.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            size: meta.len(),
        })
    }

    /// Deletes one snapshot.
    pub async fn delete(&self, name: &str) -> Result<Record, ApiError> {
        if !valid_name(name) {
            return Err(ApiError::not_found(target(name)));
        }
        let _busy = self.busy.lock().await;
        let record = self.record(name)?;
        std::fs::remove_file(self.path(name))
            .map_err(|e| ApiError::internal(format!("deleting snapshot {name}: {e}")))?;
        tracing::info!(snapshot = name, "snapshot deleted");
        Ok(record)
    }

    /// Deletes this node's snapshots of `name` but the newest `retention`; returns what
    /// it deleted.
    pub async fn prune(&self, name: &str, retention: usize) -> Result<Vec<String>, ApiError> {
        let _busy = self.busy.lock().await;
        let prefix = self.prefix(name);
        // Only names this node wrote for `name`: the rest is a number.
        let mut ours: Vec<(i64, String)> = self
            .list()?
            .into_iter()
            .filter_map(|r| {
                let seconds = r.name.strip_prefix(&prefix)?.parse().ok()?;
                Some((seconds, r.name))
            })
            .collect();
        ours.sort();
        let excess = ours.len().saturating_sub(retention);
        let mut deleted = Vec::new();
        for (_, name) in ours.into_iter().take(excess) {
            std::fs::remove_file(self.path(&name))
                .map_err(|e| ApiError::internal(format!("deleting snapshot {name}: {e}")))?;
            deleted.push(name);
        }
        if !deleted.is_empty() {
            tracing::info!(?deleted, retention, "snapshots pruned");
        }
        Ok(deleted)
    }

    /// Makes the ConfigMap list this node's snapshots as they are now, keeping other
    /// nodes' entries.
    pub async fn publish(&self, api: &crate::Api) -> Result<(), ApiError> {
        let records = self.list()?;
        let internal = Loopback { scope: &api.scope };
        let current = match internal.get(CONFIGMAPS, CONFIGMAP).await {
            Ok(current) => Some(current),
            Err(e) if e.code == 404 => None,
            Err(e) => return Err(e),
        };
        let mut data = serde_json::Map::new();
        if let Some(Value::Object(entries)) = current.as_ref().map(|c| c["data"].clone()) {
            for (key, value) in entries {
                let node = value
                    .as_str()
                    .and_then(|v| serde_json::from_str::<Record>(v).ok())
                    .map(|r| r.node_name);
                if node.as_deref() != Some(&self.config.node) {
                    data.insert(key, value);
                }
            }
        }
        for record in records {
            let text = serde_json::to_string(&record).unwrap_or_default();
            data.insert(record.name, Value::String(text));
        }
        match current {
            Some(mut current) => {
                if current["data"] == Value::Object(data.clone()) {
                    return Ok(());
                }
                current["data"] = Value::Object(data);
                internal.update(CONFIGMAPS, &current).await.map(|_| ())
            }
            None => {
                let body = json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": CONFIGMAP, "namespace": "kube-system"},
                    "data": data,
                });
                internal.create(CONFIGMAPS, &body).await.map(|_| ())
            }
        }
    }

    /// Takes the scheduled snapshots until the process ends: each one pruned to the
    /// retention and published.
    pub async fn run_schedule(self: Arc<Self>, api: Arc<crate::Api>) {
        let Some(schedule) = self.config.schedule.clone() else {
            return;
        };
        if let Err(e) = self.publish(&api).await {
            tracing::warn!(error = %e.message, "listing snapshots in the ConfigMap");
        }
        let tz = TimeZone::system();
        while let Some(next) = schedule.next_after(Timestamp::now(), &tz) {
            let wait = next.duration_since(Timestamp::now());
            tokio::time::sleep(wait.try_into().unwrap_or_default()).await;
            let taken = self.save(SCHEDULED_NAME).await;
            let pruned = self.prune(SCHEDULED_NAME, self.config.retention).await;
            for error in [taken.err(), pruned.err()].into_iter().flatten() {
                tracing::error!(error = %error.message, "scheduled snapshot");
            }
            if let Err(e) = self.publish(&api).await {
                tracing::warn!(error = %e.message, "listing snapshots in the ConfigMap");
            }
        }
    }

    /// Serves `/db/snapshots[/NAME]`; `rest` is what follows `/db/snapshots`.
    pub async fn serve(
        &self,
        api: &crate::Api,
        method: &Method,
        rest: &[&str],
        body: &[u8],
    ) -> Result<Response, ApiError> {
        let answer = match (method, rest) {
            (&Method::GET, []) => json!({"items": self.list()?}),
            (&Method::POST, []) => {
                let request: SaveRequest = parse(body)?;
                let name = request.name.as_deref().unwrap_or(ON_DEMAND_NAME);
                json!(self.save(name).await?)
            }
            (&Method::POST, ["prune"]) => {
                let request: PruneRequest = parse(body)?;
                let name = request.name.as_deref().unwrap_or(ON_DEMAND_NAME);
                json!({"deleted": self.prune(name, request.retention).await?})
            }
            (&Method::GET, [name]) => json!(self.record(name)?),
            (&Method::DELETE, [name]) => json!(self.delete(name).await?),
            (method, _) => {
                return Err(ApiError::method_not_allowed(
                    method.as_str(),
                    "/db/snapshots",
                ));
            }
        };
        if method != Method::GET
            && let Err(e) = self.publish(api).await
        {
            tracing::warn!(error = %e.message, "listing snapshots in the ConfigMap");
        }
        let code = if method == Method::POST && rest.is_empty() {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(response::json(code, &answer))
    }
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let body = if body.is_empty() {
        b"{}" as &[u8]
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("decoding the request body: {e}")))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::valid_name;

    #[test]
    fn snapshot_names_are_plain_file_names() {
        assert!(valid_name("on-demand-node1-1700000000"));
        assert!(valid_name("before.upgrade"));
        for bad in ["", ".hidden", "a/b", "../x", "Upper", "a b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
