//! The time a server waited for kernels to compile, by what made it wait.
//!
//! Kernels compile on [`super::compile_pool`]'s threads while their launches wait in order
//! (`server/deferred.rs`); the server waits only when something needs the stream to be
//! up to date (a read, a sync, a product, ...). Which of these waits, and for how long, is
//! what decides how much of a first step the compile threads save, so each wait is counted
//! under its cause.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What made a server wait for kernels still compiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompileWaitCause {
    /// A kernel compiled on the server's thread at its launch (one compile thread).
    Launch,
    /// The queue of waiting launches was full.
    QueueFull,
    /// A launch whose cube count is read from the device.
    DynamicCount,
    /// A read of device memory.
    Read,
    /// A write to device memory.
    Write,
    /// A sync.
    Sync,
    /// The start or end of a timed run: CubeCL's autotune trials, or a profile.
    Profile,
    /// A flush (CubeCL's autotune flushes before its trials).
    Flush,
    /// A matrix product on cuBLASLt.
    Product,
    /// A collective on NCCL.
    Collective,
    /// A buffer's address handed out.
    Resource,
    /// Memory cleanup, or an allocation that failed while launches held memory.
    Memory,
}

impl CompileWaitCause {
    /// Every cause, in the order [`compile_waits`] reports them.
    pub const ALL: [CompileWaitCause; 12] = [
        CompileWaitCause::Launch,
        CompileWaitCause::QueueFull,
        CompileWaitCause::DynamicCount,
        CompileWaitCause::Read,
        CompileWaitCause::Write,
        CompileWaitCause::Sync,
        CompileWaitCause::Profile,
        CompileWaitCause::Flush,
        CompileWaitCause::Product,
        CompileWaitCause::Collective,
        CompileWaitCause::Resource,
        CompileWaitCause::Memory,
    ];

    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            CompileWaitCause::Launch => "launch",
            CompileWaitCause::QueueFull => "queue-full",
            CompileWaitCause::DynamicCount => "dynamic-count",
            CompileWaitCause::Read => "read",
            CompileWaitCause::Write => "write",
            CompileWaitCause::Sync => "sync",
            CompileWaitCause::Profile => "profile",
            CompileWaitCause::Flush => "flush",
            CompileWaitCause::Product => "product",
            CompileWaitCause::Collective => "collective",
            CompileWaitCause::Resource => "resource",
            CompileWaitCause::Memory => "memory",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Waits, and nanoseconds waited, per cause, on every device of the process.
static WAITS: [AtomicU64; CompileWaitCause::ALL.len()] =
    [const { AtomicU64::new(0) }; CompileWaitCause::ALL.len()];
static WAIT_NANOS: [AtomicU64; CompileWaitCause::ALL.len()] =
    [const { AtomicU64::new(0) }; CompileWaitCause::ALL.len()];

/// Counts one wait of `waited` for kernels compiling, caused by `cause`.
pub(crate) fn count_compile_wait(cause: CompileWaitCause, waited: Duration) {
    WAITS[cause.index()].fetch_add(1, Relaxed);
    WAIT_NANOS[cause.index()].fetch_add(waited.as_nanos() as u64, Relaxed);
}

/// Waits for compiling kernels under one cause, so far in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileWaits {
    /// What made the servers wait.
    pub cause: CompileWaitCause,
    /// How many times a server waited for a kernel under this cause.
    pub waits: u64,
    /// How long, in nanoseconds.
    pub nanos: u64,
}

/// The waits for compiling kernels so far in this process, one entry per cause (in
/// [`CompileWaitCause::ALL`]'s order, causes that never waited included).
pub fn compile_waits() -> [CompileWaits; CompileWaitCause::ALL.len()] {
    CompileWaitCause::ALL.map(|cause| CompileWaits {
        cause,
        waits: WAITS[cause.index()].load(Relaxed),
        nanos: WAIT_NANOS[cause.index()].load(Relaxed),
    })
}

/// The nanoseconds waited under every cause together.
pub(crate) fn total_wait_nanos() -> u64 {
    WAIT_NANOS.iter().map(|nanos| nanos.load(Relaxed)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_slot_in_order() {
        for (position, cause) in CompileWaitCause::ALL.iter().enumerate() {
            assert_eq!(cause.index(), position, "{cause:?}");
        }
        let names: std::collections::HashSet<_> =
            CompileWaitCause::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), CompileWaitCause::ALL.len());
    }

    #[test]
    fn a_wait_is_counted_under_its_cause() {
        // The counters are process-wide and other tests may wait: compare one cause's growth.
        let before = compile_waits();
        let total_before = total_wait_nanos();
        count_compile_wait(CompileWaitCause::Collective, Duration::from_nanos(1_500));
        let after = compile_waits();
        let i = CompileWaitCause::Collective.index();
        assert!(after[i].waits > before[i].waits);
        assert!(after[i].nanos >= before[i].nanos + 1_500);
        assert!(total_wait_nanos() >= total_before + 1_500);
    }
}
