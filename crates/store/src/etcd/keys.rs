//! The store's key prefix: where its keys live in etcd's flat keyspace, and the conversion of
//! etcd's key-values back into the store's.
//!
//! Every key is stored as `prefix + key`, so several stores (say, two clusters) can share one
//! etcd. Ranges and watches over a store prefix become etcd ranges `[start, end)` inside the
//! store's prefix, and the prefix is stripped from every key etcd returns.

use bytes::Bytes;

use crate::KeyValue;

use super::error::EtcdError;

/// Maps store keys to etcd keys and back.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// The etcd key of a store key.
    pub(crate) fn full(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(self.prefix.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// The etcd range `[start, end)` of the keys under `prefix`, or only those strictly after
    /// `start_after` when it is given (and not before the prefix, which would widen the range).
    pub(crate) fn range(&self, prefix: &str, start_after: Option<&str>) -> (Vec<u8>, Vec<u8>) {
        let full_prefix = self.full(prefix);
        let end = prefix_end(&full_prefix);
        let start = match start_after {
            Some(after) if after >= prefix => {
                // The smallest key greater than `after`.
                let mut start = self.full(after);
                start.push(0);
                start
            }
            _ => full_prefix,
        };
        (non_empty(start), end)
    }

    /// A key that stands for "somewhere in this store" in requests that only want the response
    /// header or a revision check: a count-only read of it touches no values.
    pub(crate) fn probe(&self) -> Vec<u8> {
        // etcd rejects an empty key; a NUL after the prefix is a valid, practically unused key.
        self.full("\0")
    }

    /// Converts an etcd key-value under this store's prefix into the store's.
    pub(crate) fn key_value(&self, kv: etcd_client::KeyValue) -> Result<KeyValue, EtcdError> {
        let (create_revision, mod_revision, version) =
            (kv.create_revision(), kv.mod_revision(), kv.version());
        let (key, value) = kv.into_key_value();
        Ok(KeyValue {
            key: self.strip(key)?,
            value: Bytes::from(value),
            create_revision,
            mod_revision,
            version,
        })
    }

    /// The store key of an etcd key.
    fn strip(&self, key: Vec<u8>) -> Result<String, EtcdError> {
        let key = String::from_utf8(key).map_err(|err| EtcdError::KeyNotUtf8 {
            key: String::from_utf8_lossy(err.as_bytes()).into_owned(),
        })?;
        match key.strip_prefix(&self.prefix) {
            Some(stripped) => Ok(stripped.to_owned()),
            None => Err(EtcdError::OutsidePrefix {
                key,
                prefix: self.prefix.clone(),
            }),
        }
    }
}

/// The end of the etcd range holding every key that starts with `prefix`: the prefix with its
/// last byte below 0xff incremented (etcd's `GetPrefixRangeEnd`). `[0]` means "no upper
/// bound", for the empty prefix and for prefixes of only 0xff bytes.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] += 1;
            end
        }
        None => vec![0],
    }
}

/// etcd rejects an empty key; `[0]` is the smallest key there is.
fn non_empty(key: Vec<u8>) -> Vec<u8> {
    if key.is_empty() { vec![0] } else { key }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_ff() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"/a\xff\xff"), b"/b");
        assert_eq!(prefix_end(b""), [0]);
        assert_eq!(prefix_end(b"\xff"), [0]);
    }

    #[test]
    fn ranges_stay_inside_the_store_prefix() {
        let keys = Keys::new("/t");
        assert_eq!(
            keys.range("/p/", None),
            (b"/t/p/".to_vec(), b"/t/p0".to_vec())
        );
        assert_eq!(
            keys.range("/p/", Some("/p/a")),
            (b"/t/p/a\0".to_vec(), b"/t/p0".to_vec())
        );
        // A start key before the prefix does not widen the range.
        assert_eq!(
            keys.range("/p/", Some("/a")),
            (b"/t/p/".to_vec(), b"/t/p0".to_vec())
        );
        // The whole store.
        assert_eq!(keys.range("", None), (b"/t".to_vec(), b"/u".to_vec()));
    }

    #[test]
    fn an_empty_prefix_ranges_over_everything() {
        let keys = Keys::new("");
        assert_eq!(keys.range("", None), (vec![0], vec![0]));
        assert_eq!(keys.full("/registry/a"), b"/registry/a");
    }

    #[test]
    fn keys_outside_the_prefix_are_rejected() {
        let keys = Keys::new("/t");
        assert_eq!(keys.strip(b"/t/a".to_vec()).unwrap(), "/a");
        assert!(matches!(
            keys.strip(b"/u/a".to_vec()),
            Err(EtcdError::OutsidePrefix { .. })
        ));
        assert!(matches!(
            keys.strip(vec![b'/', b't', 0xff]),
            Err(EtcdError::KeyNotUtf8 { .. })
        ));
    }
}
