//! The public memory API, keyed by device, with names a PyTorch user would guess:
//! `live_bytes` is `torch.cuda.memory_allocated`, `peak_bytes` is `max_memory_allocated`,
//! `report` is `memory_summary`, `snapshot` is `memory._snapshot`.
//!
//! The figures count every buffer held by a tensor of `Frugal<_>` on the device, once, at its
//! logical size (elements × dtype size). Views (reshape, transpose, permute, swap_dims, slice,
//! expand, detach) share their input's record. Where this can differ from the device's own
//! count: allocator padding and reserved pages are not tensor bytes (see [`PoolUsage`]);
//! when an inner backend copies for a view op (e.g. reshaping a non-contiguous tensor) while
//! the source is still held elsewhere, the copy is not counted; and when it reuses an input
//! buffer in place, the ledger counts input and output both until the op returns.

use burn_backend::DeviceOps;

use crate::device::DeviceState;
pub use crate::engine::{EvictionMode, Policy, RematStats};
pub use crate::ledger::{Event, EventKind};
pub use crate::report::{Holder, MemoryReport, PeakHolders, Snapshot};
pub use crate::runtime::{PoolUsage, pool_usage};
pub use crate::units::{format_bytes, parse_bytes};

/// Bytes of live tensor storage on `device`.
pub fn live_bytes<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.live_bytes()
}

/// Highest [`live_bytes`] since the process started or [`reset_peak`] was last called.
pub fn peak_bytes<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.bytes().peak()
}

/// Number of live buffers on `device` (views of one buffer count once).
pub fn live_tensors<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.buffers().current()
}

/// Sets the peak to the current live bytes, to measure the peak of what follows.
pub fn reset_peak<D: DeviceOps + 'static>(device: &D) {
    DeviceState::of_device(device).ledger.reset_peak()
}

/// A summary of `device`: live and peak bytes, buffer counts, the biggest holders by op, and
/// the CubeCL pool's own figures where the device has one. Print it with `{}`.
///
/// The pool figures are read as they are: call `B::sync(device)` first for settled numbers.
pub fn report<D: DeviceOps + 'static>(device: &D) -> MemoryReport {
    MemoryReport::of(DeviceState::of_device(device), pool_usage(device))
}

/// The report plus the recorded timeline (see [`record_timeline`]), exportable as JSON.
pub fn snapshot<D: DeviceOps + 'static>(device: &D) -> Snapshot {
    let state = DeviceState::of_device(device);
    let report = MemoryReport::of(state, pool_usage(device));
    state.ledger.with_timeline(|timeline| Snapshot {
        report,
        events: timeline.events.iter().cloned().collect(),
        dropped_events: timeline.dropped,
    })
}

/// Starts recording allocation, free and mark events on `device`, keeping the last `capacity`
/// of them; `0` stops recording. Clears earlier events. Recording costs a lock and a small
/// allocation per event, so it is off until asked for.
pub fn record_timeline<D: DeviceOps + 'static>(device: &D, capacity: usize) {
    DeviceState::of_device(device).ledger.set_timeline(capacity)
}

/// Adds a labelled mark to the timeline of `device` (when recording), e.g. between the
/// forward and backward passes, so plots can show the phases.
pub fn mark<D: DeviceOps + 'static>(device: &D, label: &str) {
    DeviceState::of_device(device).ledger.mark(label)
}

/// Sets the memory budget of `device` in bytes (`None`: no budget), effective at once.
///
/// From then on every tensor Frugal creates on the device records how to recompute it, and
/// after each op Frugal evicts tensors (see [`Policy`]) until [`live_bytes`] is at most the
/// budget, restoring them when they are read. Tensors created before the first budget was set
/// are not evicted. If an op's own inputs and output do not fit, the op panics with a message
/// naming the budget, the bytes it needed and the biggest holders.
pub fn set_budget<D: DeviceOps + 'static>(device: &D, bytes: Option<u64>) {
    DeviceState::of_device(device).set_budget(bytes);
}

/// The memory budget of `device`, if one is set.
pub fn budget<D: DeviceOps + 'static>(device: &D) -> Option<u64> {
    DeviceState::of_device(device).budget.limit()
}

/// Sets how `device`'s budget chooses what to evict and how.
pub fn set_policy<D: DeviceOps + 'static>(device: &D, policy: Policy) {
    DeviceState::of_device(device).budget.set_policy(policy)
}

/// The eviction policy of `device`.
pub fn policy<D: DeviceOps + 'static>(device: &D) -> Policy {
    DeviceState::of_device(device).budget.policy()
}

/// What the budget and checkpoint scopes have evicted, recomputed, offloaded and restored on
/// `device` since the process started.
pub fn remat_stats<D: DeviceOps + 'static>(device: &D) -> RematStats {
    DeviceState::of_device(device).budget.stats()
}

/// Lets the budget keep f32 tensors on `device` compressed to `dtype` (`LowPrecision::BF16` or
/// `F16`), as a third eviction action beside recomputation and offload (see
/// [`crate::policy`]); `None` switches compression off (the default: it is lossy, a
/// compressed tensor reads back as its rounded value). Refused, naming the backend and the
/// types it accepts, when `B` cannot store that type on `device`.
pub fn set_storage_precision<B: burn_backend::Backend>(
    device: &B::Device,
    dtype: Option<crate::precision::LowPrecision>,
) -> Result<(), crate::precision::PrecisionError>
where
    B::Device: DeviceOps + 'static,
{
    if let Some(dtype) = dtype {
        crate::precision::check_supported::<B>(device, dtype.dtype())?;
    }
    DeviceState::of_device(device).budget.set_storage(dtype);
    Ok(())
}

/// The storage type of compressed tensors on `device`, or `None` when compression is off.
pub fn storage_precision<D: DeviceOps + 'static>(
    device: &D,
) -> Option<crate::precision::LowPrecision> {
    DeviceState::of_device(device).budget.storage()
}
