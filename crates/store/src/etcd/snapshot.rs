//! etcd's own snapshot (the Maintenance API's stream, the bytes `etcdctl snapshot save`
//! writes), streamed to a file that appears once complete and durable.

use std::path::Path;

use etcd_client::MaintenanceClient;
use tokio::io::AsyncWriteExt;

use super::error::EtcdError;
use crate::snapshot_file;

/// Streams the snapshot of the member `maintenance` talks to into `dest`.
pub(crate) async fn save(
    maintenance: &mut MaintenanceClient,
    dest: &Path,
) -> Result<u64, EtcdError> {
    let partial = snapshot_file::partial(dest);
    let result = stream_to(maintenance, &partial).await.and_then(|()| {
        snapshot_file::commit(&partial, dest).map_err(|source| EtcdError::SnapshotFile {
            path: dest.to_owned(),
            source,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

async fn stream_to(maintenance: &mut MaintenanceClient, partial: &Path) -> Result<(), EtcdError> {
    let file_error = |source| EtcdError::SnapshotFile {
        path: partial.to_owned(),
        source,
    };
    let rpc_error = |source| EtcdError::Rpc {
        action: "snapshot".into(),
        source,
    };
    let mut file = tokio::fs::File::create(partial).await.map_err(file_error)?;
    let mut stream = maintenance.snapshot().await.map_err(rpc_error)?;
    while let Some(chunk) = stream.message().await.map_err(rpc_error)? {
        file.write_all(chunk.blob()).await.map_err(file_error)?;
    }
    file.sync_all().await.map_err(file_error)
}
