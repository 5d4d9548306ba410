//! A consistent copy of the store's file while it serves: every table read in one redb
//! read transaction (so the copy is one committed state, however the committer writes
//! meanwhile) and written to a new file with a durable commit.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable};

use super::error::BackendError;
use super::history::{HISTORY, META};
use crate::snapshot_file;

/// Copies `db` to `dest` and returns the copy's size in bytes.
pub(crate) fn copy(db: &Database, dest: &Path) -> Result<u64, BackendError> {
    let partial = snapshot_file::partial(dest);
    // What an earlier attempt left is worthless.
    let _ = std::fs::remove_file(&partial);
    let result = write_copy(db, &partial).and_then(|()| {
        snapshot_file::commit(&partial, dest).map_err(BackendError::io("putting the copy in place"))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn write_copy(db: &Database, partial: &Path) -> Result<(), BackendError> {
    let read = db.begin_read().map_err(BackendError::BeginRead)?;
    let copy = Database::create(partial).map_err(|source| BackendError::Open {
        path: partial.to_owned(),
        source,
    })?;
    let write = copy.begin_write().map_err(BackendError::BeginWrite)?;
    {
        let from = read
            .open_table(HISTORY)
            .map_err(BackendError::table("history"))?;
        let mut to = write
            .open_table(HISTORY)
            .map_err(BackendError::table("history"))?;
        for item in from
            .iter()
            .map_err(BackendError::storage("scanning history"))?
        {
            let (key, value) = item.map_err(BackendError::storage("scanning history"))?;
            to.insert(key.value(), value.value())
                .map_err(BackendError::storage("copying history"))?;
        }
        let from = read.open_table(META).map_err(BackendError::table("meta"))?;
        let mut to = write
            .open_table(META)
            .map_err(BackendError::table("meta"))?;
        for item in from
            .iter()
            .map_err(BackendError::storage("scanning meta"))?
        {
            let (key, value) = item.map_err(BackendError::storage("scanning meta"))?;
            to.insert(key.value(), value.value())
                .map_err(BackendError::storage("copying meta"))?;
        }
    }
    // redb's default durability: the commit returns once the file is synced.
    write.commit().map_err(|source| BackendError::Commit {
        action: "the copy",
        source,
    })
}
