//! Locks that a panic does not break. krust recovers from panics where they happen (a
//! request answers 500, a work-queue pass is retried, a worker restarts), so a lock
//! held by a panicking thread must not fail every later user with `PoisonError`: these
//! accessors take the lock whether or not it is poisoned. Code inside a critical section
//! therefore keeps the data consistent wherever it could panic (docs/architecture.md,
//! "Locks and panics").

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `lock`, `read` and `write` that ignore poisoning.
pub trait Unpoisoned {
    type Target: ?Sized;
    fn locked(&self) -> MutexGuard<'_, Self::Target>;
}

impl<T: ?Sized> Unpoisoned for Mutex<T> {
    type Target = T;
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads and writes of an `RwLock` that ignore poisoning.
pub trait UnpoisonedRw {
    type Target: ?Sized;
    fn read_locked(&self) -> RwLockReadGuard<'_, Self::Target>;
    fn write_locked(&self) -> RwLockWriteGuard<'_, Self::Target>;
}

impl<T: ?Sized> UnpoisonedRw for RwLock<T> {
    type Target = T;
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_serves() {
        let m = Mutex::new(1);
        let rw = RwLock::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _g = m.lock().unwrap();
            let _w = rw.write().unwrap();
            panic!("poison both");
        });
        assert!(m.is_poisoned() && rw.is_poisoned());
        *m.locked() += 1;
        *rw.write_locked() += 1;
        assert_eq!((*m.locked(), *rw.read_locked()), (2, 2));
    }
}
