//! One counted quantity: its current value, its peak and its running total.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A quantity followed with relaxed atomics: current value, highest value since the last
/// reset, and the total ever added.
#[derive(Default)]
pub(crate) struct Stat {
    current: AtomicU64,
    peak: AtomicU64,
    total: AtomicU64,
}

impl Stat {
    /// Adds `n`; returns the total before it (a sequence number when `n` is 1) and the new
    /// current value.
    #[inline]
    pub(crate) fn add(&self, n: u64) -> (u64, u64) {
        let before = self.total.fetch_add(n, Relaxed);
        let current = self.current.fetch_add(n, Relaxed) + n;
        // A plain load first: the read-modify-write is only needed at a new high.
        if current > self.peak.load(Relaxed) {
            self.peak.fetch_max(current, Relaxed);
        }
        (before, current)
    }

    /// Removes `n`; returns the new current value.
    #[inline]
    pub(crate) fn sub(&self, n: u64) -> u64 {
        self.current.fetch_sub(n, Relaxed) - n
    }

    /// The current value.
    #[inline]
    pub(crate) fn current(&self) -> u64 {
        self.current.load(Relaxed)
    }

    /// The highest value since the start or the last [`Self::reset_peak`].
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    /// Everything ever added.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// Sets the peak to the current value.
    pub(crate) fn reset_peak(&self) {
        self.peak.store(self.current(), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Stat;

    #[test]
    fn the_peak_follows_the_highest_current_value_until_reset() {
        let stat = Stat::default();
        assert_eq!(stat.add(5), (0, 5));
        assert_eq!(stat.add(3), (5, 8));
        assert_eq!(stat.sub(6), 2);
        assert_eq!((stat.current(), stat.peak(), stat.total()), (2, 8, 8));
        stat.reset_peak();
        assert_eq!(stat.peak(), 2);
        stat.add(1);
        assert_eq!((stat.current(), stat.peak(), stat.total()), (3, 3, 9));
    }
}
