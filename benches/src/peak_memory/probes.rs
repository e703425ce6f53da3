//! Probes of frugal-cuda's driver, kernels and allocator: what a step asked of them. Each
//! one answers `None` (or does nothing) on other runtimes and in builds without the
//! `frugal-cuda` feature, so the bench reads them on every device alike.

use serde::Serialize;

/// Kernels frugal-cuda made ready during one step.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct KernelsInStep {
    /// Kernels compiled with NVRTC.
    pub compiled: u64,
    /// Kernels loaded from NVRTC's disk cache.
    pub from_disk: u64,
    /// Time spent generating code and running NVRTC, summed over the compile threads.
    pub compile_ms: f64,
    /// Time spent loading kernels into the context.
    pub load_ms: f64,
    /// The part of `compile_ms` spent in NVRTC.
    pub nvrtc_ms: f64,
    /// Time the device's work waited for kernels to compile (the part of `compile_ms` that
    /// nothing else ran beside).
    pub wait_ms: f64,
}

impl KernelsInStep {
    /// What happened between `before` and `self` (two readings of one process's counts).
    pub fn since(&self, before: &Self) -> Self {
        Self {
            compiled: self.compiled - before.compiled,
            from_disk: self.from_disk - before.from_disk,
            compile_ms: self.compile_ms - before.compile_ms,
            load_ms: self.load_ms - before.load_ms,
            nvrtc_ms: self.nvrtc_ms - before.nvrtc_ms,
            wait_ms: self.wait_ms - before.wait_ms,
        }
    }
}

/// frugal-cuda's kernels made ready so far in this process (`None` on other runtimes).
pub fn kernel_loads(frugal_cuda: bool) -> Option<KernelsInStep> {
    #[cfg(feature = "frugal-cuda")]
    if frugal_cuda {
        let loads = frugal_cuda::kernel_loads();
        return Some(KernelsInStep {
            compiled: loads.compiled,
            from_disk: loads.from_disk,
            compile_ms: loads.compile_nanos as f64 / 1e6,
            load_ms: loads.load_nanos as f64 / 1e6,
            nvrtc_ms: loads.nvrtc_nanos as f64 / 1e6,
            wait_ms: loads.wait_nanos as f64 / 1e6,
        });
    }
    let _ = frugal_cuda;
    None
}

/// Waits for compiling kernels under one cause, on frugal-cuda (see `frugal_cuda::compile_waits`).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct CompileWaitsFor {
    /// What made the server wait (`frugal_cuda::CompileWaitCause::name`).
    pub cause: &'static str,
    /// How many times it waited.
    pub waits: u64,
    /// How long, in milliseconds.
    pub ms: f64,
}

/// frugal-cuda's waits for compiling kernels so far in this process, one entry per cause
/// (`None` on other runtimes).
pub fn compile_waits(frugal_cuda: bool) -> Option<Vec<CompileWaitsFor>> {
    #[cfg(feature = "frugal-cuda")]
    if frugal_cuda {
        return Some(
            frugal_cuda::compile_waits()
                .iter()
                .map(|w| CompileWaitsFor {
                    cause: w.cause.name(),
                    waits: w.waits,
                    ms: w.nanos as f64 / 1e6,
                })
                .collect(),
        );
    }
    let _ = frugal_cuda;
    None
}

/// The waits between two readings of [`compile_waits`], causes that did not wait left out,
/// longest first.
pub fn compile_waits_since(
    now: &[CompileWaitsFor],
    before: &[CompileWaitsFor],
) -> Vec<CompileWaitsFor> {
    let mut grown: Vec<CompileWaitsFor> = now
        .iter()
        .map(|w| {
            let earlier = before.iter().find(|b| b.cause == w.cause);
            CompileWaitsFor {
                cause: w.cause,
                waits: w.waits - earlier.map_or(0, |b| b.waits),
                ms: w.ms - earlier.map_or(0.0, |b| b.ms),
            }
        })
        .filter(|w| w.waits > 0)
        .collect();
    grown.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    grown
}

/// What frugal-cuda's allocator did during one step: a step that maps or waits more than the
/// others spends its extra time in the driver, not in kernels.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub struct DriverInStep {
    /// Reservations that found no cached block (CubeCL's free slots handed back first).
    pub misses: u64,
    /// Mappings of physical memory into expandable segments, and the time in them.
    pub maps: u64,
    pub maps_ms: f64,
    /// Unmappings of retired granules, and the time in them.
    pub unmaps: u64,
    pub unmaps_ms: f64,
    /// Waits for the device before giving memory back, and the time in them.
    pub waits: u64,
    pub waits_ms: f64,
    /// Bytes mapped into and unmapped from expandable segments (memory moved between
    /// addresses to keep reserved bytes within the growth limit).
    pub mapped_bytes: u64,
    pub unmapped_bytes: u64,
    /// Host time the misses took: CubeCL handing back its free slots, then the allocator.
    pub miss_cleanup_ms: f64,
    pub miss_grow_ms: f64,
    /// Of that, misses after which the device had run out of work (it waited for them).
    pub miss_idle_ms: f64,
}

impl DriverInStep {
    /// The calls made between `before` and `self` (two readings of one allocator).
    pub fn since(&self, before: &Self) -> Self {
        Self {
            misses: self.misses - before.misses,
            maps: self.maps - before.maps,
            maps_ms: self.maps_ms - before.maps_ms,
            unmaps: self.unmaps - before.unmaps,
            unmaps_ms: self.unmaps_ms - before.unmaps_ms,
            waits: self.waits - before.waits,
            waits_ms: self.waits_ms - before.waits_ms,
            mapped_bytes: self.mapped_bytes - before.mapped_bytes,
            unmapped_bytes: self.unmapped_bytes - before.unmapped_bytes,
            miss_cleanup_ms: self.miss_cleanup_ms - before.miss_cleanup_ms,
            miss_grow_ms: self.miss_grow_ms - before.miss_grow_ms,
            miss_idle_ms: self.miss_idle_ms - before.miss_idle_ms,
        }
    }
}

/// frugal-cuda's allocator calls so far on `device` (`None` on other runtimes).
#[allow(unused_variables)]
pub fn driver_calls<D: 'static>(device: &D) -> Option<DriverInStep> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let report = frugal_cuda::memory_report(device);
        let times = report.stats.device_times;
        let ms = |nanos: u64| nanos as f64 / 1e6;
        return Some(DriverInStep {
            misses: report.registry.misses,
            maps: times.maps.count,
            maps_ms: ms(times.maps.nanos),
            unmaps: times.unmaps.count,
            unmaps_ms: ms(times.unmaps.nanos),
            waits: times.waits.count,
            waits_ms: ms(times.waits.nanos),
            mapped_bytes: report.stats.mapped_bytes,
            unmapped_bytes: report.stats.unmapped_bytes,
            miss_cleanup_ms: ms(report.registry.miss_cleanup_nanos),
            miss_grow_ms: ms(report.registry.miss_grow_nanos),
            miss_idle_ms: ms(report.registry.miss_idle_nanos),
        });
    }
    None
}

/// frugal-cuda's allocator figures for a run.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct AllocatorFigures {
    /// The highest bytes reserved from the device since the peaks were reset.
    pub peak_reserved_bytes: u64,
    /// The highest bytes handed out in blocks since the peaks were reset.
    pub peak_allocated_bytes: u64,
    /// The bytes reserved from the device at the end.
    pub reserved_bytes: u64,
    /// Segments the allocator holds at the end.
    pub segments: u64,
    /// Allocations asked of the driver.
    pub device_allocs: u64,
    /// Reservations asked of the allocator.
    pub reservations: u64,
    /// Reservations that found no cached block.
    pub misses: u64,
    /// The highest live bytes when a reservation found no cached block.
    pub peak_live_at_miss_bytes: u64,
    /// The growth limit at the end (`None`: none).
    pub growth_limit: Option<u64>,
    /// Times it was raised because misses took too much of a marked step, and the steps
    /// marked (Frugal's budget marks the steps of a settled plan).
    pub growth_limit_raises: u64,
    pub marked_steps: u64,
    /// Times raises were taken back because the steps after them were no faster, and the
    /// cached bytes given back then.
    pub growth_limit_reverts: u64,
    pub reverted_bytes: u64,
    /// Times the first settled step took the growth limit back from what the steps before
    /// passed, and the cached bytes given back then.
    pub settle_trims: u64,
    pub settle_trimmed_bytes: u64,
    /// The most reserved in a settled step begun with no raise on trial (since the peaks were
    /// reset), the growth limit that step began under, and the steps that passed theirs.
    pub settled_peak_reserved_bytes: u64,
    pub settled_peak_limit_bytes: u64,
    pub settled_steps_over_limit: u64,
}

/// frugal-cuda's report for `device`, if it is a frugal-cuda device.
#[allow(unused_variables)]
pub fn allocator_figures<D: 'static>(device: &D) -> Option<AllocatorFigures> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let report = frugal_cuda::memory_report(device);
        return Some(AllocatorFigures {
            peak_reserved_bytes: report.stats.peak_reserved_bytes,
            peak_allocated_bytes: report.stats.peak_allocated_bytes,
            reserved_bytes: report.stats.reserved_bytes,
            segments: report.stats.segments,
            device_allocs: report.stats.device_allocs,
            reservations: report.registry.reservations,
            misses: report.registry.misses,
            peak_live_at_miss_bytes: report.registry.peak_live_at_miss_bytes,
            growth_limit: report.stats.growth_limit,
            growth_limit_raises: report.registry.growth_limit_raises,
            marked_steps: report.registry.marked_steps,
            growth_limit_reverts: report.registry.growth_limit_reverts,
            reverted_bytes: report.registry.reverted_bytes,
            settle_trims: report.registry.settle_trims,
            settle_trimmed_bytes: report.registry.settle_trimmed_bytes,
            settled_peak_reserved_bytes: report.registry.settled_peak_reserved_bytes,
            settled_peak_limit_bytes: report.registry.settled_peak_limit_bytes,
            settled_steps_over_limit: report.registry.settled_steps_over_limit,
        });
    }
    None
}

/// Starts recording frugal-cuda's allocator input (`start`) or writes it to `path`, if `device`
/// is a frugal-cuda device.
#[allow(unused_variables)]
pub fn allocator_trace<D: 'static>(device: &D, path: &std::path::Path, start: bool) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        if start {
            frugal_cuda::record_allocation_trace(device, true);
        } else {
            let events = frugal_cuda::write_allocation_trace(device, path)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            eprintln!("wrote {events} allocator events to {}", path.display());
        }
    }
}

/// Starts or stops recording frugal-cuda's allocator trace, if `device` is a frugal-cuda
/// device, so that the memory_viz file has the allocator's own events with its segments.
#[allow(unused_variables)]
pub fn record_allocator_history<D: 'static>(device: &D, on: bool) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::record_allocation_trace(device, on);
    }
}

/// Resets frugal-cuda's peaks, if `device` is a frugal-cuda device.
#[allow(unused_variables)]
pub fn reset_allocator_peaks<D: 'static>(device: &D) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::reset_peak_memory(device);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_s_driver_calls_are_the_difference_of_two_readings() {
        let before = DriverInStep {
            misses: 1,
            maps: 2,
            maps_ms: 0.5,
            unmaps: 3,
            unmaps_ms: 1.0,
            waits: 4,
            waits_ms: 2.0,
            mapped_bytes: 1 << 20,
            unmapped_bytes: 0,
            miss_cleanup_ms: 0.25,
            miss_grow_ms: 0.5,
            miss_idle_ms: 0.125,
        };
        let after = DriverInStep {
            misses: 11,
            maps: 5,
            maps_ms: 2.0,
            unmaps: 3,
            unmaps_ms: 1.5,
            waits: 7,
            waits_ms: 2.25,
            mapped_bytes: 5 << 20,
            unmapped_bytes: 1 << 20,
            miss_cleanup_ms: 1.0,
            miss_grow_ms: 0.75,
            miss_idle_ms: 0.5,
        };
        let step = after.since(&before);
        assert_eq!(
            (step.misses, step.maps, step.unmaps, step.waits),
            (10, 3, 0, 3)
        );
        assert_eq!(
            (step.maps_ms, step.unmaps_ms, step.waits_ms),
            (1.5, 0.5, 0.25)
        );
        assert_eq!(
            (step.miss_cleanup_ms, step.miss_grow_ms, step.miss_idle_ms),
            (0.75, 0.25, 0.375)
        );
        assert_eq!((step.mapped_bytes, step.unmapped_bytes), (4 << 20, 1 << 20));
    }

    #[test]
    fn waits_since_keep_the_causes_that_waited_longest_first() {
        let at = |sync: (u64, f64), read: (u64, f64), product: (u64, f64)| {
            [("sync", sync), ("read", read), ("product", product)]
                .map(|(cause, (waits, ms))| CompileWaitsFor { cause, waits, ms })
                .to_vec()
        };
        let before = at((2, 10.0), (1, 5.0), (0, 0.0));
        let now = at((2, 10.0), (4, 20.0), (3, 40.0));
        let since = compile_waits_since(&now, &before);
        let named: Vec<_> = since.iter().map(|w| (w.cause, w.waits)).collect();
        assert_eq!(named, [("product", 3), ("read", 3)]);
        assert_eq!(since[1].ms, 15.0);
    }

    #[test]
    fn the_probes_answer_nothing_off_frugal_cuda() {
        assert!(kernel_loads(false).is_none());
        assert!(compile_waits(false).is_none());
        assert!(driver_calls(&()).is_none());
        assert!(allocator_figures(&()).is_none());
    }
}
