//! `Interner`: one shared copy of each distinct value (API versions, kinds and
//! namespaces in the garbage collector's graph; label maps of cached pods), so that
//! tens of thousands of objects holding the same few values hold pointers instead.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// Values nobody else holds any more are dropped whenever the table has doubled since
/// the last sweep, so it stays within twice what is in use.
pub struct Interner<T: ?Sized> {
    values: HashSet<Arc<T>>,
    after_sweep: usize,
}

/// Below this many values the table is never swept.
const SWEEP_FLOOR: usize = 64;

impl<T: ?Sized + Hash + Eq> Interner<T> {
    pub fn new() -> Self {
        Interner {
            values: HashSet::new(),
            after_sweep: 0,
        }
    }

    /// The shared copy of `value`.
    pub fn intern<V: Borrow<T> + Into<Arc<T>>>(&mut self, value: V) -> Arc<T> {
        if let Some(known) = self.values.get(value.borrow()) {
            return known.clone();
        }
        if self.values.len() >= 2 * self.after_sweep.max(SWEEP_FLOOR) {
            self.values.retain(|v| Arc::strong_count(v) > 1);
            self.after_sweep = self.values.len();
        }
        let shared: Arc<T> = value.into();
        self.values.insert(shared.clone());
        shared
    }
}

impl<T: ?Sized + Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: ?Sized> std::fmt::Debug for Interner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interner")
            .field("values", &self.values.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_unused_ones_are_swept() {
        let mut i: Interner<str> = Interner::new();
        let a = i.intern("default");
        let b = i.intern(String::from("default").as_str());
        assert!(Arc::ptr_eq(&a, &b));
        // Fill to twice the floor with values nobody keeps: the next new one sweeps them.
        for n in 1..2 * SWEEP_FLOOR {
            i.intern(n.to_string().as_str());
        }
        assert_eq!(i.values.len(), 2 * SWEEP_FLOOR);
        let new = i.intern("new");
        assert_eq!(
            i.values.len(),
            2,
            "only the held value and the new one remain"
        );
        assert!(Arc::ptr_eq(&a, &i.intern("default")));
        assert!(Arc::ptr_eq(&new, &i.intern("new")));
    }
}
