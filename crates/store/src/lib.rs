//! MVCC key-value storage with etcd v3 semantics.
//!
//! Everything krust persists goes through the [`Store`] trait. Its shape follows etcd v3 so
//! that the etcd backend maps onto it one to one:
//!
//! - one store-wide [`Revision`] that every successful write bumps by exactly one;
//! - per key a create revision, a mod revision and a version (writes since creation);
//! - [`Store::range`] over a prefix at a fixed read revision, paged by `limit` and a start key,
//!   so a paged list sees one consistent snapshot;
//! - [`Store::txn`]: one compare on a key's mod revision followed by a put or delete, which is
//!   all optimistic concurrency needs;
//! - [`Store::watch`] from a revision: the history since then, then live events, or
//!   [`StoreError::Compacted`] when that history is gone;
//! - [`Store::compact`] to drop history older than a revision.
//!
//! The embedded backend ([`embedded::EmbeddedStore`]) keeps everything in one redb file and
//! commits concurrent writers in groups so that they share one fsync. The etcd backend
//! ([`etcd::EtcdStore`]) keeps everything in an etcd cluster, so that several apiservers can
//! share it.

pub mod embedded;
pub mod encrypted;
mod error_chain;
pub mod etcd;
mod snapshot_file;
mod types;

pub use types::*;
