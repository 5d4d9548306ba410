//! Per-cycle scratch space shared between a plugin's extension points.
//!
//! A plugin computes something about the incoming pod once (in PreFilter or
//! PreScore) and reads it back for every node (in Filter or Score). Entries are
//! keyed by their Rust type, so each plugin owns a private state type and cannot
//! collide with another. The whole state is cloneable because preemption
//! evaluates "what if these pods were gone" on a copy.

use std::any::{Any, TypeId};
use std::collections::{BTreeSet, HashMap};

/// A value that can live in a [`CycleState`].
pub trait StateData: Any + Send + Sync {
    fn clone_data(&self) -> Box<dyn StateData>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Clone + Send + Sync> StateData for T {
    fn clone_data(&self) -> Box<dyn StateData> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Typed per-cycle data plus the plugins that asked to be skipped this cycle.
#[derive(Default)]
pub struct CycleState {
    data: HashMap<TypeId, Box<dyn StateData>>,
    skip_filter: BTreeSet<&'static str>,
    skip_score: BTreeSet<&'static str>,
}

impl Clone for CycleState {
    fn clone(&self) -> Self {
        CycleState {
            data: self
                .data
                .iter()
                .map(|(k, v)| (*k, (**v).clone_data()))
                .collect(),
            skip_filter: self.skip_filter.clone(),
            skip_score: self.skip_score.clone(),
        }
    }
}

impl std::fmt::Debug for CycleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CycleState")
            .field("entries", &self.data.len())
            .field("skip_filter", &self.skip_filter)
            .field("skip_score", &self.skip_score)
            .finish()
    }
}

impl CycleState {
    pub fn write<T: Any + Clone + Send + Sync>(&mut self, value: T) {
        self.data.insert(TypeId::of::<T>(), Box::new(value));
    }

    pub fn read<T: Any>(&self) -> Option<&T> {
        self.data
            .get(&TypeId::of::<T>())
            .and_then(|v| (**v).as_any().downcast_ref())
    }

    pub fn read_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.data
            .get_mut(&TypeId::of::<T>())
            .and_then(|v| (**v).as_any_mut().downcast_mut())
    }

    pub(crate) fn skip_filter(&mut self, plugin: &'static str) {
        self.skip_filter.insert(plugin);
    }

    pub(crate) fn skip_score(&mut self, plugin: &'static str) {
        self.skip_score.insert(plugin);
    }

    pub fn is_filter_skipped(&self, plugin: &str) -> bool {
        self.skip_filter.contains(plugin)
    }

    pub fn is_score_skipped(&self, plugin: &str) -> bool {
        self.skip_score.contains(plugin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Counter(u32);

    #[test]
    fn typed_entries_and_independent_clones() {
        let mut state = CycleState::default();
        assert!(state.read::<Counter>().is_none());
        state.write(Counter(1));
        let copy = state.clone();
        state.read_mut::<Counter>().unwrap().0 = 5;
        assert_eq!(state.read::<Counter>(), Some(&Counter(5)));
        assert_eq!(copy.read::<Counter>(), Some(&Counter(1)));
    }
}
