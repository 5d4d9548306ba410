//! Store backups with k3s's names: the server flags of scheduled snapshots, `krust
//! etcd-snapshot save|ls|delete|prune` (through the server's `/db/snapshots`, since the
//! store's file is the running server's alone), and the restore `krust server
//! --cluster-reset --cluster-reset-restore-path FILE` does before it serves.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use krust_api::cron::Schedule;
use krust_apiserver::snapshots::{self, Record};
use krust_store::embedded::EmbeddedStore;
use serde_json::{Value, json};

use crate::cli::Kubeconfig;

/// The server's snapshot flags (k3s's).
#[derive(Args, Clone, Debug)]
pub struct SnapshotArgs {
    /// Take no scheduled snapshots.
    #[arg(long)]
    pub etcd_disable_snapshots: bool,
    /// When scheduled snapshots are taken (cron, in this machine's time zone).
    #[arg(long, default_value = "0 */12 * * *", value_parser = Schedule::parse)]
    pub etcd_snapshot_schedule_cron: Schedule,
    /// How many scheduled snapshots are kept.
    #[arg(long, default_value_t = 5)]
    pub etcd_snapshot_retention: usize,
    /// Where snapshots are written (default: `<data-dir>/server/db/snapshots`).
    #[arg(long)]
    pub etcd_snapshot_dir: Option<PathBuf>,
}

impl SnapshotArgs {
    pub fn config(&self, data_dir: &Path, node: &str) -> snapshots::Config {
        snapshots::Config {
            dir: self
                .etcd_snapshot_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("server").join("db").join("snapshots")),
            node: node.to_owned(),
            schedule: (!self.etcd_disable_snapshots)
                .then(|| self.etcd_snapshot_schedule_cron.clone()),
            retention: self.etcd_snapshot_retention,
        }
    }
}

/// `krust server`'s restore flags (k3s's).
#[derive(Args, Clone, Debug)]
pub struct ResetArgs {
    /// Reset the store, then exit: with `--cluster-reset-restore-path`, restore it from
    /// that snapshot (the old data is kept beside it); without, make the managed etcd
    /// member forget its peers. The next start serves the result.
    #[arg(long)]
    pub cluster_reset: bool,
    /// The snapshot `--cluster-reset` restores.
    #[arg(long, requires = "cluster_reset")]
    pub cluster_reset_restore_path: Option<PathBuf>,
}

/// Restores the embedded store in `data_dir` from `snapshot`: the snapshot is checked by
/// opening it as a store, the current file is renamed `state.redb.old-<unix seconds>`,
/// and the snapshot's copy takes its place.
pub fn restore_embedded(data_dir: &Path, snapshot: &Path) -> Result<PathBuf> {
    let db_dir = data_dir.join("server").join("db");
    std::fs::create_dir_all(&db_dir).with_context(|| format!("creating {}", db_dir.display()))?;
    let target = db_dir.join("state.redb");
    let copy = db_dir.join("state.redb.restoring");
    std::fs::copy(snapshot, &copy)
        .with_context(|| format!("copying {} to {}", snapshot.display(), copy.display()))?;
    let checked = EmbeddedStore::open(&copy)
        .with_context(|| format!("{} is not a krust store snapshot", snapshot.display()));
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&copy);
        return Err(e);
    }
    drop(checked);
    let old = db_dir.join(format!(
        "state.redb.old-{}",
        jiff::Timestamp::now().as_second()
    ));
    if target.exists() {
        std::fs::rename(&target, &old)
            .with_context(|| format!("moving the current store to {}", old.display()))?;
    }
    std::fs::rename(&copy, &target).with_context(|| format!("writing {}", target.display()))?;
    std::fs::File::open(&db_dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", db_dir.display()))?;
    Ok(old)
}

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot now (named `<name>-<node>-<unix seconds>`).
    Save {
        /// The snapshot's name.
        #[arg(long, default_value = snapshots::ON_DEMAND_NAME)]
        name: String,
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
    /// List the snapshots.
    #[command(alias = "list")]
    Ls {
        /// `json` for the records as JSON.
        #[arg(short, long)]
        output: Option<String>,
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
    /// Delete snapshots by name.
    Delete {
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
    /// Delete the oldest snapshots of a name, keeping the newest.
    Prune {
        /// The name whose snapshots are pruned.
        #[arg(long, default_value = snapshots::ON_DEMAND_NAME)]
        name: String,
        /// How many to keep.
        #[arg(long, default_value_t = 5)]
        snapshot_retention: usize,
        #[command(flatten)]
        kubeconfig: Kubeconfig,
    },
}

pub async fn run(command: SnapshotCommand) -> Result<()> {
    match command {
        SnapshotCommand::Save { name, kubeconfig } => {
            let answer = call(&kubeconfig, http::Method::POST, "", json!({"name": name})).await?;
            let record: Record = serde_json::from_value(answer)?;
            println!("Snapshot {} saved.", record.name);
        }
        SnapshotCommand::Ls { output, kubeconfig } => {
            let answer = call(&kubeconfig, http::Method::GET, "", Value::Null).await?;
            let records: Vec<Record> = serde_json::from_value(answer["items"].clone())?;
            match output.as_deref() {
                Some("json") => println!("{}", serde_json::to_string_pretty(&records)?),
                Some(other) => bail!("unknown output format {other:?} (json)"),
                None => print!("{}", table(&records)),
            }
        }
        SnapshotCommand::Delete { names, kubeconfig } => {
            for name in names {
                call(&kubeconfig, http::Method::DELETE, &name, Value::Null).await?;
                println!("Snapshot {name} deleted.");
            }
        }
        SnapshotCommand::Prune {
            name,
            snapshot_retention,
            kubeconfig,
        } => {
            let body = json!({"name": name, "retention": snapshot_retention});
            let answer = call(&kubeconfig, http::Method::POST, "prune", body).await?;
            for deleted in answer["deleted"].as_array().into_iter().flatten() {
                println!("Snapshot {} deleted.", deleted.as_str().unwrap_or_default());
            }
        }
    }
    Ok(())
}

/// k3s's listing: name, location, size, creation time.
fn table(records: &[Record]) -> String {
    let rows: Vec<[String; 4]> = std::iter::once(["Name", "Location", "Size", "Created"])
        .map(|r| r.map(str::to_owned))
        .chain(records.iter().map(|r| {
            [
                r.name.clone(),
                r.location.clone(),
                r.size.to_string(),
                r.created_at.clone(),
            ]
        }))
        .collect();
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = (0..4)
                .map(|i| format!("{:w$}", row[i], w = widths[i]))
                .collect();
            format!("{}\n", cells.join(" ").trim_end())
        })
        .collect()
}

/// One request to `/db/snapshots[/path]`, answered with JSON.
async fn call(
    kubeconfig: &Kubeconfig,
    method: http::Method,
    path: &str,
    body: Value,
) -> Result<Value> {
    let (client, _) = krust_client::connect::from_kubeconfig(&kubeconfig.read()?).await?;
    let uri = match path {
        "" => "/db/snapshots".to_owned(),
        path => format!("/db/snapshots/{path}"),
    };
    let body = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(&body)?
    };
    let request = http::Request::builder()
        .method(method)
        .uri(&uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)?;
    let text = client
        .request_text(request)
        .await
        .with_context(|| format!("asking the server ({uri})"))?;
    serde_json::from_str(&text).with_context(|| format!("the server's answer to {uri}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_is_aligned_as_k3s_prints_it() {
        let record = Record {
            name: "on-demand-n1-1700000000".into(),
            location: "file:///var/lib/krust/server/db/snapshots/on-demand-n1-1700000000".into(),
            node_name: "n1".into(),
            created_at: "2023-11-14T22:13:20Z".into(),
            size: 4096,
        };
        let text = table(&[record]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("Name "));
        assert_eq!(lines[0].find("Location"), lines[1].find("file://"));
        assert!(lines[1].ends_with("4096 2023-11-14T22:13:20Z"));
    }
}
