//! The host memory that offloads of every device in the process share.
//!
//! A budget on each of several GPUs offloads to one host: a share of the host's memory per
//! device would let two budgets hold twice what the host can give. Unless the user chose a
//! limit for a device, its offloads count against one process-wide share, set when the first
//! budget is set.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::NO_LIMIT;

/// Host bytes held by offloads and the most they may hold.
pub(crate) struct HostShare {
    held: AtomicU64,
    limit: AtomicU64,
}

/// The share of every device whose host limit the user did not choose.
pub(crate) static PROCESS_HOST_SHARE: HostShare = HostShare::new();

impl HostShare {
    pub(crate) const fn new() -> Self {
        Self {
            held: AtomicU64::new(0),
            limit: AtomicU64::new(NO_LIMIT),
        }
    }

    /// The most bytes offloads may hold, if limited.
    pub(crate) fn limit(&self) -> Option<u64> {
        let limit = self.limit.load(Relaxed);
        (limit != NO_LIMIT).then_some(limit)
    }

    /// Sets the limit unless one is set: the first budget decides, so that a later one does
    /// not count the host memory the first one's offloads already hold as unavailable.
    pub(crate) fn limit_once(&self, limit: u64) {
        let _ = self
            .limit
            .compare_exchange(NO_LIMIT, limit, Relaxed, Relaxed);
    }

    /// Bytes offloads hold now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Relaxed)
    }

    pub(crate) fn add(&self, bytes: u64) {
        self.held.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn sub(&self, bytes: u64) {
        let _ = self
            .held
            .fetch_update(Relaxed, Relaxed, |held| Some(held.saturating_sub(bytes)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_stays_and_releases_never_go_below_zero() {
        let share = HostShare::new();
        assert_eq!(share.limit(), None, "no limit until a budget sets one");
        share.limit_once(1000);
        share.limit_once(5000);
        assert_eq!(share.limit(), Some(1000));
        share.add(600);
        share.add(300);
        assert_eq!(share.held(), 900);
        share.sub(900);
        share.sub(1);
        assert_eq!(share.held(), 0);
    }
}
