//! CubeCL's memory management on top of the caching allocator.
//!
//! CubeCL 0.10 keeps its pool algorithms private, but its `MemoryManagement` is public and is the
//! only thing that can map a client's memory handle to storage. So it stays, as a handle
//! registry, and the allocation policy moves below it, into a [`ComputeStorage`]:
//!
//! - `MemoryManagement` runs in *persistent* mode with no dynamic pools: every reservation it
//!   cannot serve from a free slot of exactly the same (512-byte padded) size becomes one
//!   `ComputeStorage::alloc` of that size, so each live tensor has a storage block of its own;
//! - [`AllocatorStorage`] serves those from a [`CachingAllocator`] (best fit, splitting,
//!   coalescing, expandable segments, cap);
//! - CubeCL only notices freed slots lazily, and keeps them until an explicit cleanup. So on a
//!   miss (no cached block fits without asking the device), [`HandleRegistry::reserve`] first
//!   has CubeCL hand every free slot back (`cleanup(true)` → `dealloc` → coalesce), and only then
//!   lets the allocator grow. Memory is therefore only reserved when what is really live,
//!   packed by the allocator, does not fit.
//! - That hand-back rebuilds CubeCL's whole list of slots, so under a tight growth limit, where
//!   most large requests miss, the host can spend more time in it than the device spends on
//!   the step. So the registry times its misses over each training step, as the caller marks
//!   steps ([`HandleRegistry::mark_step`]; Frugal's budget marks the steps of its plan and says
//!   which are settled), and where, in a settled step, they took more than a share of the step
//!   ([`HandleRegistry::set_miss_time_share`], [`MISS_TIME_SHARE`] unless set), counting only
//!   misses after which the device had run out of work ([`DeviceMemory::idle`]), it raises the
//!   allocator's growth limit by an eighth: reserved memory stays near the limit where keeping
//!   to it is cheap (while the device is busy, misses hide behind its work) and gives way where
//!   the device waits for them. Only marked steps are judged: misses while a run warms up
//!   (compiling, learning its step) say nothing of the steps that follow. A raise is a trial
//!   ([`crate::miss_rule`]): where the steps after it are no faster, the limit goes back and
//!   the cached memory above it is given back.
//!
//! Everything here is generic over [`DeviceMemory`], so it runs on the
//! [`super::allocator::SimulatedDevice`] in the CPU tests exactly as on CUDA.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cubecl_common::backtrace::BackTrace;
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryBinding, ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration,
    MemoryManagement, MemoryManagementOptions, MemoryUsage,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

/// The allocator's trace, recorded through [`AllocatorStorage::record_trace`].
pub use crate::allocator::TraceEvent;
use crate::allocator::{
    ALIGNMENT, AllocError, BlockHandle, CachingAllocator, DeviceMemory, OomInfo, Stats,
};
pub use crate::miss_rule::{BASELINE_STEPS, MISS_TIME_SHARE, TRIAL_STEPS};
use crate::miss_rule::{MissRule, Verdict};

/// How many kernel-argument slots [`AllocatorStorage::get`] cycles through. A launch passes the
/// *address of* each buffer's device pointer to `cuLaunchKernel`, so those pointers must stay
/// put until the launch call returns; no launch binds more buffers than this.
pub const BINDING_SLOTS: usize = 1024;

/// A buffer as a kernel sees it: its device address, and a pointer to a copy of that address
/// that stays valid until [`BINDING_SLOTS`] more buffers have been bound (what
/// `cuLaunchKernel`'s parameter array needs).
#[derive(Debug)]
pub struct DeviceResource {
    /// Device address of the first byte.
    pub ptr: u64,
    /// Points at a `u64` holding [`Self::ptr`], for kernel parameter arrays.
    pub binding: *mut c_void,
    /// Bytes the resource covers.
    pub size: u64,
}

// SAFETY: the binding points into the storage's own slot ring, which lives as long as the
// server; the resource only travels with the server that owns that storage.
unsafe impl Send for DeviceResource {}

/// CubeCL `ComputeStorage` whose blocks come from a [`CachingAllocator`].
///
/// `alloc` only takes cached memory unless growth was allowed by [`HandleRegistry`] (after it
/// had CubeCL return its free slots); see the [module docs](self).
pub struct AllocatorStorage<D: DeviceMemory> {
    allocator: CachingAllocator<D>,
    blocks: HashMap<StorageId, BlockHandle>,
    may_grow: bool,
    /// Set when `alloc` refused for lack of a cached block (not for a real out-of-memory).
    missed: bool,
    /// The last allocation error that was not a miss, kept for the error report.
    last_error: Option<AllocError>,
    slots: Box<[u64; BINDING_SLOTS]>,
    cursor: usize,
    /// Set while [`HandleRegistry::new`] reserves its unallocated slot: `alloc` then hands out
    /// an id with no memory behind it.
    making_unallocated: bool,
    /// The id of that slot's storage.
    unallocated: Option<StorageId>,
}

impl<D: DeviceMemory> std::fmt::Debug for AllocatorStorage<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatorStorage")
            .field("blocks", &self.blocks.len())
            .field("allocator", &self.allocator)
            .finish_non_exhaustive()
    }
}

impl<D: DeviceMemory> AllocatorStorage<D> {
    /// Storage over `allocator`.
    pub fn new(allocator: CachingAllocator<D>) -> Self {
        Self {
            allocator,
            blocks: HashMap::new(),
            may_grow: false,
            missed: false,
            last_error: None,
            slots: Box::new([0; BINDING_SLOTS]),
            cursor: 0,
            making_unallocated: false,
            unallocated: None,
        }
    }

    /// The allocator.
    pub fn allocator(&self) -> &CachingAllocator<D> {
        &self.allocator
    }

    /// The allocator, mutably (cap, out-of-memory handler, releasing cached memory).
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator<D> {
        &mut self.allocator
    }

    /// Number of storage blocks CubeCL holds (live tensors plus the free slots it has not
    /// handed back yet).
    pub fn held_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Starts (clearing what was recorded) or stops recording the allocator's trace
    /// ([`CachingAllocator::record_trace`]). Its requests are what CubeCL's registry asked of
    /// the allocator: reservations served from CubeCL's own free slots never reach it, and
    /// frees arrive when CubeCL hands slots back.
    pub fn record_trace(&mut self, on: bool) {
        self.allocator.record_trace(on);
    }

    /// The events recorded since recording started, leaving the recording on and empty.
    pub fn take_trace(&mut self) -> Vec<TraceEvent> {
        self.allocator.take_trace()
    }

    /// The device address of a storage id, if it is held.
    pub fn address(&self, id: StorageId) -> Option<u64> {
        self.blocks.get(&id).map(BlockHandle::address)
    }
}

fn miss_error(size: u64) -> IoError {
    IoError::BufferTooBig {
        size,
        backtrace: BackTrace::capture(),
    }
}

impl<D: DeviceMemory + Send> ComputeStorage for AllocatorStorage<D> {
    type Resource = DeviceResource;

    fn alignment(&self) -> usize {
        ALIGNMENT as usize
    }

    fn get(&mut self, handle: &StorageHandle) -> DeviceResource {
        // CubeCL hands out storage handles only for blocks it allocated here and has not
        // deallocated, so a missing id is a bug in the registry, not bad user input.
        let base = self
            .blocks
            .get(&handle.id)
            .map(BlockHandle::address)
            .expect("frugal-cuda: a storage handle CubeCL holds has no block");
        let ptr = base + handle.offset();
        let slot = &mut self.slots[self.cursor];
        *slot = ptr;
        let binding = slot as *mut u64 as *mut c_void;
        self.cursor = (self.cursor + 1) % BINDING_SLOTS;
        DeviceResource {
            ptr,
            binding,
            size: handle.size(),
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if std::mem::take(&mut self.making_unallocated) {
            let id = StorageId::new();
            self.unallocated = Some(id);
            return Ok(StorageHandle::new(
                id,
                StorageUtilization { offset: 0, size },
            ));
        }
        let block = if self.may_grow {
            match self.allocator.alloc(size) {
                Ok(block) => block,
                Err(e) => {
                    self.last_error = Some(e);
                    return Err(miss_error(size));
                }
            }
        } else {
            match self.allocator.try_alloc_cached(size) {
                Some(block) => block,
                None => {
                    self.missed = true;
                    return Err(miss_error(size));
                }
            }
        };
        let id = StorageId::new();
        self.blocks.insert(id, block);
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        let Some(block) = self.blocks.remove(&id) else {
            return;
        };
        if let Err(e) = self.allocator.dealloc(block) {
            // Cannot happen for a block this storage handed out; record rather than panic.
            self.last_error = Some(e);
        }
    }

    fn flush(&mut self) {
        self.allocator.flush();
    }
}

/// Counts of what the registry did, beside the allocator's own [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RegistryCounters {
    /// Reservations served (by a free slot of the same size, a cached block, or growth).
    pub reservations: u64,
    /// Reservations that found no cached block and made CubeCL hand back its free slots.
    pub misses: u64,
    /// Reservations refused for lack of memory.
    pub failures: u64,
    /// The highest bytes of live tensors seen at a miss, right after CubeCL handed back its
    /// free slots: the only moments the registry knows exactly what is live (CubeCL notices
    /// frees lazily). Misses are when the device may be asked for more, so this is the live
    /// figure each growth decision was made against.
    pub peak_live_at_miss_bytes: u64,
    /// Host time spent on misses having CubeCL hand back its free slots (its registry rebuilt,
    /// each slot deallocated), in nanoseconds.
    pub miss_cleanup_nanos: u64,
    /// Host time spent on misses in the allocator after that (growth, the out-of-memory
    /// handler), in nanoseconds.
    pub miss_grow_nanos: u64,
    /// Of the misses' host time, the part of misses after which the device had run all its
    /// queued work: time the device waited for the host (the rest was hidden behind its work).
    pub miss_idle_nanos: u64,
    /// Times the growth limit was raised because misses took more than their share of a
    /// marked step (see [`MISS_TIME_SHARE`]).
    pub growth_limit_raises: u64,
    /// Times raises were taken back because the steps after them were no faster (see
    /// [`TRIAL_STEPS`]) or the caller's plan changed while they were on trial.
    pub growth_limit_reverts: u64,
    /// Cached bytes given back to the device when raises were taken back.
    pub reverted_bytes: u64,
    /// Times the growth limit went back after steps passed it for reasons later steps do not
    /// share: a settled step began after unsettled ones (compiling and autotuning kernels,
    /// learning a plan), or a settled step lifted it for the first time under its plan (a
    /// kernel compiled late); see [`crate::miss_rule`].
    pub settle_trims: u64,
    /// Cached bytes given back to the device then.
    pub settle_trimmed_bytes: u64,
    /// Settled steps marked by the caller ([`HandleRegistry::mark_step`]).
    pub marked_steps: u64,
    /// The most bytes reserved in a settled step begun with no raise on trial, since
    /// [`HandleRegistry::reset_peaks`] (0: none ended since): the steps a growth limit is
    /// meant to bound, without the warm-up before them or the trials (see
    /// [`crate::miss_rule`]).
    pub settled_peak_reserved_bytes: u64,
    /// The growth limit that step began under: what was known, before it ran, that it would
    /// reserve at most, unless reusing cached memory could not serve an allocation.
    pub settled_peak_limit_bytes: u64,
    /// Of those steps since [`HandleRegistry::reset_peaks`], how many reserved past the
    /// growth limit they began under.
    pub settled_steps_over_limit: u64,
}

/// CubeCL's `MemoryManagement` used as a handle registry over an [`AllocatorStorage`]; see the
/// [module docs](self).
///
/// A client handle whose reservation failed is never bound, and CubeCL resolves an unbound
/// handle to its first slot without checking: a kernel would then write a tensor's bytes into
/// whatever the first slot holds (the illegal address of a failed allocation). So the first slot
/// is held by the registry itself, with no memory behind it, and resolving to it is an error:
/// no kernel and no copy ever runs on a buffer that was not allocated.
pub struct HandleRegistry<D: DeviceMemory + Send> {
    memory: MemoryManagement<AllocatorStorage<D>>,
    counters: RegistryCounters,
    /// When misses raise the growth limit, and when a raise is taken back.
    miss_rule: MissRule,
    /// The growth limit the step under way began under (its last mark, or the limit set since).
    step_limit: Option<u64>,
    /// The first slot, where unbound handles resolve; held for the registry's life.
    _unallocated: ManagedMemoryHandle,
}

/// Bytes of the unallocated first slot, as CubeCL counts it.
const UNALLOCATED_SLOT: u64 = 1;

impl<D: DeviceMemory + Send> std::fmt::Debug for HandleRegistry<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleRegistry")
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl<D: DeviceMemory + Send> HandleRegistry<D> {
    /// A registry over `allocator`, logging through `logger`.
    pub fn new(allocator: CachingAllocator<D>, logger: Arc<ServerLogger>) -> Self {
        let properties = MemoryDeviceProperties {
            max_page_size: u64::MAX,
            alignment: ALIGNMENT,
        };
        let mut memory = MemoryManagement::from_configuration(
            AllocatorStorage::new(allocator),
            &properties,
            MemoryConfiguration::Custom {
                pool_options: Vec::new(),
            },
            logger,
            MemoryManagementOptions::new("frugal-cuda").mode(MemoryAllocationMode::Persistent),
        );
        memory.storage().making_unallocated = true;
        let unallocated = memory
            .reserve(UNALLOCATED_SLOT)
            .expect("an empty persistent pool makes its first slot from `alloc`");
        debug_assert!(memory.storage().unallocated.is_some());
        Self {
            memory,
            counters: RegistryCounters::default(),
            step_limit: None,
            miss_rule: MissRule::default(),
            _unallocated: unallocated,
        }
    }

    /// Reserves `size` bytes: a free slot of the same padded size, else a cached block of the
    /// allocator; on a miss, CubeCL's free slots are handed back (and merged) and the allocator
    /// may grow, up to its cap, calling its out-of-memory handler before giving up.
    pub fn reserve(&mut self, size: u64) -> Result<ManagedMemoryHandle, AllocError> {
        self.counters.reservations += 1;
        match self.memory.reserve(size) {
            Ok(handle) => return Ok(handle),
            Err(e) => {
                if !std::mem::take(&mut self.memory.storage().missed) {
                    self.counters.failures += 1;
                    return Err(self.take_error(size, e));
                }
            }
        }
        self.counters.misses += 1;
        let started = Instant::now();
        self.memory.cleanup(true);
        let live = self.memory_usage().bytes_in_use;
        self.counters.peak_live_at_miss_bytes = self.counters.peak_live_at_miss_bytes.max(live);
        let cleaned = Instant::now();
        self.counters.miss_cleanup_nanos += (cleaned - started).as_nanos() as u64;
        let handler_calls = self.stats().oom_handler_calls;
        let mut result = self.grow(size);
        // A handler that freed tensors only dropped client handles: CubeCL notices those slots
        // at its next cleanup, so hand them back and try once more.
        if result.is_err() && self.stats().oom_handler_calls > handler_calls {
            self.memory.storage().last_error = None;
            self.memory.cleanup(true);
            result = self.grow(size);
        }
        let done = Instant::now();
        self.counters.miss_grow_nanos += (done - cleaned).as_nanos() as u64;
        // A miss delays the step only if the device ran out of work meanwhile; while it still
        // has work queued the host's time is hidden behind it.
        if self.memory.storage().allocator().device().idle() {
            let nanos = (done - started).as_nanos() as u64;
            self.counters.miss_idle_nanos += nanos;
            self.miss_rule.add_wait(nanos);
        }
        result.map_err(|e| {
            self.counters.failures += 1;
            self.take_error(size, e)
        })
    }

    /// Marks the beginning of a training step (the end of the one before), `settled` if it
    /// repeats the ones that follow (Frugal's budget: a step of a settled plan). If the step
    /// that ended was settled and the misses after which the device was idle took more than
    /// their share (see [`Self::set_miss_time_share`]) of it, the growth limit is raised by an
    /// eighth, on trial: unless the settled steps after it are faster (see [`TRIAL_STEPS`]),
    /// the limit goes back, the cached memory above it is given back, and it is not raised
    /// again until set anew. A step that compiled kernels or learned its plan is not settled:
    /// it is neither judged nor timed, and it takes back raises still on trial; the first
    /// settled step after such steps sets the limit back to where it was set (with the raises
    /// that paid off) and gives the cached memory above it back, and so does the first
    /// settled step under a plan that lifted the limit by itself (a second one keeps it).
    pub fn mark_step(&mut self, settled: bool) {
        self.counters.marked_steps += u64::from(settled);
        let allocator = self.memory.storage().allocator();
        let (limit, step_peak) = (allocator.growth_limit(), allocator.step_peak_reserved());
        if self.miss_rule.step_is_settled_off_trial()
            && let Some(began_under) = self.step_limit
        {
            let counters = &mut self.counters;
            counters.settled_steps_over_limit += u64::from(step_peak > began_under);
            if step_peak >= counters.settled_peak_reserved_bytes {
                counters.settled_peak_reserved_bytes = step_peak;
                counters.settled_peak_limit_bytes = began_under;
            }
        }
        self.judge_step(settled, limit);
        let allocator = self.memory.storage().allocator_mut();
        allocator.start_step_peak();
        self.step_limit = allocator.growth_limit();
    }

    /// Applies the miss rule's verdict at a mark (see [`Self::mark_step`]).
    fn judge_step(&mut self, settled: bool, limit: Option<u64>) {
        match self.miss_rule.mark(Instant::now(), settled, limit) {
            Verdict::Keep => {}
            Verdict::Raise {
                limit,
                waited_nanos,
                step_nanos,
            } => {
                self.set_limit_keeping_the_rule(Some(limit));
                self.counters.growth_limit_raises += 1;
                log::debug!(
                    "frugal-cuda: the device waited {:.1} ms of the last step ({:.1} ms) for \
                     misses; growth limit raised to {limit} B, on trial",
                    waited_nanos as f64 / 1e6,
                    step_nanos as f64 / 1e6,
                );
            }
            Verdict::PaidOff {
                baseline_nanos,
                trial_nanos,
            } => log::debug!(
                "frugal-cuda: steps took {:.1} ms after the growth limit's raises, {:.1} ms \
                 before: the raises stay",
                trial_nanos as f64 / 1e6,
                baseline_nanos as f64 / 1e6,
            ),
            Verdict::Revert {
                limit,
                baseline_nanos,
                trial_nanos,
            } => {
                let released = self.lower_limit(limit);
                self.counters.growth_limit_reverts += 1;
                self.counters.reverted_bytes += released;
                log::debug!(
                    "frugal-cuda: steps took {:.1} ms after the growth limit's raises, {:.1} ms \
                     before: limit back to {limit} B, {released} B of cached memory given back",
                    trial_nanos as f64 / 1e6,
                    baseline_nanos as f64 / 1e6,
                );
            }
            Verdict::Abandon { limit } => {
                let released = self.lower_limit(limit);
                self.counters.growth_limit_reverts += 1;
                self.counters.reverted_bytes += released;
                log::debug!(
                    "frugal-cuda: the plan changed while the growth limit's raises were on \
                     trial: limit back to {limit} B, {released} B of cached memory given back",
                );
            }
            Verdict::Settle { limit } => {
                let released = self.lower_limit(limit);
                self.counters.settle_trims += 1;
                self.counters.settle_trimmed_bytes += released;
                log::debug!(
                    "frugal-cuda: growth limit back to {limit} B from what the step before \
                     passed, {released} B of cached memory given back",
                );
            }
        }
    }

    /// Sets the growth limit back to `limit` and gives the cached memory above it back;
    /// returns the bytes given back.
    fn lower_limit(&mut self, limit: u64) -> u64 {
        self.set_limit_keeping_the_rule(Some(limit));
        // CubeCL's free slots hold blocks until it hands them back.
        self.memory.cleanup(true);
        self.memory
            .storage()
            .allocator_mut()
            .release_above(limit)
            .unwrap_or_else(|e| {
                log::warn!("frugal-cuda: giving cached memory back failed: {e}");
                0
            })
    }

    /// Sets the share of a marked step misses may take before the growth limit is raised by
    /// an eighth ([`MISS_TIME_SHARE`] unless set); `None` keeps the limit where it is set,
    /// whatever the misses cost.
    pub fn set_miss_time_share(&mut self, share: Option<f64>) {
        self.miss_rule.set_share(share);
    }

    fn grow(&mut self, size: u64) -> Result<ManagedMemoryHandle, IoError> {
        self.memory.storage().may_grow = true;
        let result = self.memory.reserve(size);
        let storage = self.memory.storage();
        storage.may_grow = false;
        storage.missed = false;
        result
    }

    fn take_error(&mut self, size: u64, cubecl: IoError) -> AllocError {
        self.memory.storage().last_error.take().unwrap_or_else(|| {
            AllocError::Device(crate::allocator::DeviceError::Invalid(format!(
                "CubeCL refused a reservation of {size} B: {cubecl}"
            )))
        })
    }

    /// Points the client's handle `assigned` at the memory of `reserved` (CubeCL's `bind`).
    pub fn bind(
        &mut self,
        reserved: ManagedMemoryHandle,
        assigned: ManagedMemoryHandle,
        cursor: u64,
    ) -> Result<(), IoError> {
        self.memory.bind(reserved, assigned, cursor)
    }

    /// The resource behind a binding, optionally narrowed to `[start, len - end)`; an error for
    /// a handle that was never bound (its reservation failed).
    pub fn get_resource(
        &mut self,
        binding: ManagedMemoryBinding,
        offset_start: Option<u64>,
        offset_end: Option<u64>,
    ) -> Result<DeviceResource, IoError> {
        // One lookup, then CubeCL's own narrowing (as its `get_resource` does).
        let mut handle = self.memory.get_storage(binding)?;
        if Some(handle.id) == self.memory.storage().unallocated {
            return Err(IoError::NotFound {
                backtrace: BackTrace::capture(),
                reason: "a buffer whose allocation failed (out of memory) was used".into(),
            });
        }
        if let Some(offset) = offset_start {
            handle = handle.offset_start(offset);
        }
        if let Some(offset) = offset_end {
            handle = handle.offset_end(offset);
        }
        Ok(self.memory.storage().get(&handle))
    }

    /// The cursor (stream position) recorded when a binding's memory was bound.
    pub fn get_cursor(&self, binding: ManagedMemoryBinding) -> Result<u64, IoError> {
        self.memory.get_cursor(binding)
    }

    /// Hands CubeCL's free slots back to the allocator and returns unused segments to the
    /// device (CubeCL's `memory_cleanup`, PyTorch's `empty_cache`). Returns the bytes released.
    pub fn cleanup(&mut self) -> Result<u64, AllocError> {
        self.memory.cleanup(true);
        self.memory.storage().allocator_mut().release_cached()
    }

    /// CubeCL's view of usage with the allocator's reserved bytes: `bytes_in_use` and
    /// `number_allocs` are the live tensors', `bytes_reserved` is what the device gave the
    /// allocator, which is what out-of-memory is about.
    pub fn memory_usage(&mut self) -> MemoryUsage {
        let mut usage = self.memory.memory_usage();
        // The unallocated first slot is not a tensor.
        usage.bytes_in_use = usage.bytes_in_use.saturating_sub(UNALLOCATED_SLOT);
        usage.number_allocs = usage.number_allocs.saturating_sub(1);
        usage.bytes_reserved = self.memory.storage().allocator().stats().reserved_bytes;
        usage
    }

    /// The allocator's statistics.
    pub fn stats(&mut self) -> Stats {
        self.memory.storage().allocator().stats()
    }

    /// What the registry did.
    pub fn counters(&self) -> RegistryCounters {
        self.counters
    }

    /// The storage (allocator, held blocks).
    pub fn storage(&mut self) -> &mut AllocatorStorage<D> {
        self.memory.storage()
    }

    /// Resets the allocator's peaks and [`RegistryCounters::peak_live_at_miss_bytes`] to the
    /// current figures.
    pub fn reset_peaks(&mut self) {
        self.memory.storage().allocator_mut().reset_peak();
        let counters = &mut self.counters;
        counters.peak_live_at_miss_bytes = 0;
        counters.settled_peak_reserved_bytes = 0;
        counters.settled_peak_limit_bytes = 0;
        counters.settled_steps_over_limit = 0;
    }

    /// Sets the allocator's cap (bytes reserved from the device); `None` removes it.
    pub fn set_cap(&mut self, cap: Option<u64>) -> Result<(), AllocError> {
        self.memory.cleanup(true);
        self.memory.storage().allocator_mut().set_cap(cap)
    }

    /// Sets the allocator's growth limit (see [`CachingAllocator::set_growth_limit`]); misses
    /// may raise it again even where a raise of the limit before was taken back.
    pub fn set_growth_limit(&mut self, limit: Option<u64>) {
        self.miss_rule.reset(limit);
        self.set_limit_keeping_the_rule(limit);
        self.step_limit = limit;
    }

    fn set_limit_keeping_the_rule(&mut self, limit: Option<u64>) {
        self.memory
            .storage()
            .allocator_mut()
            .set_growth_limit(limit);
    }

    /// Installs the out-of-memory handler tried before a reservation fails.
    pub fn set_oom_handler(&mut self, handler: impl FnMut(&OomInfo) -> bool + Send + 'static) {
        self.memory
            .storage()
            .allocator_mut()
            .set_oom_handler(handler);
    }
}

#[cfg(test)]
mod tests {
    use cubecl_runtime::memory_management::MemoryHandle;

    use super::*;
    use crate::allocator::SimulatedDevice;

    #[test]
    fn the_registrys_trace_names_the_addresses_kernels_get() {
        let mut reg = HandleRegistry::new(
            CachingAllocator::new(SimulatedDevice::new()),
            Arc::new(ServerLogger::default()),
        );
        reg.storage().record_trace(true);
        let reserved = reg.reserve(3 << 20).unwrap();
        let handle = ManagedMemoryHandle::new();
        reg.bind(reserved, handle.clone(), 0).unwrap();
        let ptr = reg
            .get_resource(MemoryHandle::binding(handle.clone()), None, None)
            .unwrap()
            .ptr;
        drop(handle);
        let released = reg.cleanup().unwrap();
        assert_eq!(reg.stats().reserved_bytes, 0);
        let trace = reg.storage().take_trace();
        let [
            TraceEvent::SegmentMap {
                address: mapped_at,
                size: mapped,
                ..
            },
            TraceEvent::Alloc {
                address: allocated_at,
                bytes: 3145728,
                ..
            },
            TraceEvent::Free {
                address: freed_at, ..
            },
            TraceEvent::SegmentUnmap {
                address: unmapped_at,
                size: unmapped,
                ..
            },
        ] = trace[..]
        else {
            panic!("{trace:?}");
        };
        assert_eq!((allocated_at, freed_at), (ptr, ptr));
        assert_eq!((mapped_at, unmapped_at), (ptr, ptr));
        assert_eq!((mapped, unmapped), (released, released));
    }
}
