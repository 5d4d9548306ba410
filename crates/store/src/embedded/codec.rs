//! On-disk encoding of history records: what one revision wrote.
//!
//! The history table is keyed by revision, so each record carries its key. It also carries
//! everything needed to rebuild the key's MVCC state and to replay it as a watch event
//! without scanning older history: the create revision and version of the value written,
//! and the revision of the live value it replaced, so `prev` is one point read away.
//!
//! Layout, integers little-endian:
//!
//! ```text
//! tag              u8     1 = put, 2 = tombstone
//! prev_revision    u64    mod revision of the live value replaced, 0 if there was none
//! create_revision  u64    (put only)
//! version          u64    (put only)
//! key_len          u32
//! key              key_len bytes of UTF-8
//! value            the rest of the record (put only)
//! ```

use bytes::Bytes;

use crate::{KeyValue, Revision};

const TAG_PUT: u8 = 1;
const TAG_TOMBSTONE: u8 = 2;

/// What a revision did to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKind<'a> {
    Put {
        value: &'a [u8],
        create_revision: Revision,
        version: i64,
    },
    Tombstone,
}

/// A history record borrowed from its encoded bytes (or from the data about to be encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub key: &'a str,
    /// Mod revision of the live value this write replaced; 0 when the key did not exist.
    pub prev_revision: Revision,
    pub kind: RecordKind<'a>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("record ends after {len} bytes, {needed} needed")]
    Truncated { needed: usize, len: usize },
    #[error("unknown record tag {0}")]
    UnknownTag(u8),
    #[error("key is not valid UTF-8")]
    KeyNotUtf8,
    #[error("tombstone has {0} trailing bytes")]
    TrailingBytes(usize),
}

impl<'a> Record<'a> {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let value_len = match self.kind {
            RecordKind::Put { value, .. } => 16 + value.len(),
            RecordKind::Tombstone => 0,
        };
        let mut out = Vec::with_capacity(1 + 8 + 4 + self.key.len() + value_len);
        match self.kind {
            RecordKind::Put {
                create_revision,
                version,
                ..
            } => {
                out.push(TAG_PUT);
                out.extend_from_slice(&self.prev_revision.to_le_bytes());
                out.extend_from_slice(&create_revision.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
            }
            RecordKind::Tombstone => {
                out.push(TAG_TOMBSTONE);
                out.extend_from_slice(&self.prev_revision.to_le_bytes());
            }
        }
        // Keys longer than 4 GiB are far beyond anything redb can store as a value anyway.
        out.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        out.extend_from_slice(self.key.as_bytes());
        if let RecordKind::Put { value, .. } = self.kind {
            out.extend_from_slice(value);
        }
        out
    }

    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        let mut reader = Reader { bytes, pos: 0 };
        let tag = reader.take(1)?[0];
        let prev_revision = reader.i64()?;
        let header = match tag {
            TAG_PUT => Some((reader.i64()?, reader.i64()?)),
            TAG_TOMBSTONE => None,
            other => return Err(CodecError::UnknownTag(other)),
        };
        let key_len = u32::from_le_bytes(reader.array()?) as usize;
        let key = std::str::from_utf8(reader.take(key_len)?).map_err(|_| CodecError::KeyNotUtf8)?;
        let rest = reader.rest();
        let kind = match header {
            Some((create_revision, version)) => RecordKind::Put {
                value: rest,
                create_revision,
                version,
            },
            None if rest.is_empty() => RecordKind::Tombstone,
            None => return Err(CodecError::TrailingBytes(rest.len())),
        };
        Ok(Record {
            key,
            prev_revision,
            kind,
        })
    }

    /// The key-value this record wrote at `mod_revision`, or `None` for a tombstone.
    pub(crate) fn key_value(&self, mod_revision: Revision) -> Option<KeyValue> {
        match self.kind {
            RecordKind::Put {
                value,
                create_revision,
                version,
            } => Some(KeyValue {
                key: self.key.to_owned(),
                value: Bytes::copy_from_slice(value),
                create_revision,
                mod_revision,
                version,
            }),
            RecordKind::Tombstone => None,
        }
    }

    pub(crate) fn is_tombstone(&self) -> bool {
        matches!(self.kind, RecordKind::Tombstone)
    }
}

/// A bounds-checked cursor over a record's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(CodecError::Truncated {
            needed: self.pos.saturating_add(n),
            len: self.bytes.len(),
        })?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn rest(self) -> &'a [u8] {
        &self.bytes[self.pos..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_round_trips() {
        let record = Record {
            key: "/registry/pods/default/web",
            prev_revision: 41,
            kind: RecordKind::Put {
                value: b"{\"spec\":{}}",
                create_revision: 7,
                version: 3,
            },
        };
        let bytes = record.encode();
        assert_eq!(Record::decode(&bytes).unwrap(), record);
        let kv = record.key_value(42).unwrap();
        assert_eq!(kv.mod_revision, 42);
        assert_eq!(kv.create_revision, 7);
        assert_eq!(kv.version, 3);
        assert_eq!(&kv.value[..], b"{\"spec\":{}}");
    }

    #[test]
    fn tombstone_and_empty_value_round_trip() {
        let tombstone = Record {
            key: "k",
            prev_revision: 9,
            kind: RecordKind::Tombstone,
        };
        assert_eq!(Record::decode(&tombstone.encode()).unwrap(), tombstone);
        assert!(tombstone.key_value(10).is_none());

        let empty = Record {
            key: "",
            prev_revision: 0,
            kind: RecordKind::Put {
                value: b"",
                create_revision: 1,
                version: 1,
            },
        };
        assert_eq!(Record::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn corrupt_records_are_rejected() {
        let bytes = Record {
            key: "key",
            prev_revision: 1,
            kind: RecordKind::Put {
                value: b"v",
                create_revision: 1,
                version: 2,
            },
        }
        .encode();
        // Every prefix that cuts into the tag, the three integers, the key length or the key.
        let header_and_key = 1 + 3 * 8 + 4 + "key".len();
        for len in 0..header_and_key {
            assert!(
                Record::decode(&bytes[..len]).is_err(),
                "prefix of {len} bytes"
            );
        }
        let mut bad_tag = bytes.clone();
        bad_tag[0] = 0;
        assert!(matches!(
            Record::decode(&bad_tag),
            Err(CodecError::UnknownTag(0))
        ));
        let mut tombstone = Record {
            key: "k",
            prev_revision: 1,
            kind: RecordKind::Tombstone,
        }
        .encode();
        tombstone.push(0);
        assert!(matches!(
            Record::decode(&tombstone),
            Err(CodecError::TrailingBytes(1))
        ));
    }
}
