//! A consistent copy of the store's file while it serves: every table read in one redb
//! read transaction (so the copy is one committed state, however the committer writes
//! meanwhile) and written to a new file with a durable commit.

use std::path::Path;

use redb::{
    Database, Key, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, Value,
    WriteTransaction,
};

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
    copy_table(&read, &write, HISTORY, "history")?;
    copy_table(&read, &write, META, "meta")?;
    // redb's default durability: the commit returns once the file is synced.
    write.commit().map_err(|source| BackendError::Commit {
        action: "the copy",
        source,
    })
}

/// Every row of `table` as `read` sees it, into the same table of `write`.
fn copy_table<K: Key + 'static, V: Value + 'static>(
    read: &ReadTransaction,
    write: &WriteTransaction,
    table: TableDefinition<K, V>,
    name: &'static str,
) -> Result<(), BackendError> {
    let from = read.open_table(table).map_err(BackendError::table(name))?;
    let mut to = write.open_table(table).map_err(BackendError::table(name))?;
    for item in from
        .iter()
        .map_err(BackendError::storage("scanning a table"))?
    {
        let (key, value) = item.map_err(BackendError::storage("scanning a table"))?;
        to.insert(key.value(), value.value())
            .map_err(BackendError::storage("copying a row"))?;
    }
    Ok(())
}
