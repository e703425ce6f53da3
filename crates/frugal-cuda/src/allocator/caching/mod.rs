//! The caching allocator: segments from the device, carved into blocks, cached when freed.
//!
//! Data structures, chosen so every operation is logarithmic in the number of blocks:
//!
//! - each segment keeps its blocks in a `BTreeMap` by offset; the blocks tile the memory mapped
//!   in the segment, so a block's neighbours are the previous and next entries when they touch
//!   it, which is what coalescing needs. A plain segment is mapped whole; an expandable one may
//!   have unmapped gaps (granules given back by [`CachingAllocator::release_cached`]), which
//!   hold no block and are mapped again when a request needs them;
//! - each pool keeps its free blocks in a `BTreeSet` ordered by `(size, segment, offset)`, so
//!   the first entry at or above the requested size is the best fit (the smallest block that
//!   fits; ties go to the oldest segment and the lowest offset, which packs memory towards old
//!   segments and leaves new ones free to be released).
//!
//! This file holds the allocator's state, its construction and settings, frees, releases,
//! statistics and snapshots, and the bookkeeping of blocks and segments. Two subjects have files
//! of their own: `ladder.rs`, the allocation ladder ([`CachingAllocator::alloc`] and the
//! [`Rung`]s it climbs), and `expandable.rs`, where the granules of expandable segments are
//! mapped and unmapped.

mod expandable;
mod ladder;

pub use ladder::Rung;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::device::{DeviceError, DeviceMemory};
use super::stats::{BlockSnapshot, SegmentSnapshot, Snapshot, Stats};
use super::trace::{History, TraceEvent};
use super::{
    ALIGNMENT, AllocError, AllocatorConfig, BlockHandle, FreeQueue, MIN_BLOCK_SIZE, OomHandler,
    OomInfo, Pool, SMALL_SIZE, SegmentId, round_size,
};
use expandable::KeptRange;

/// Free-block key: `(size, segment id, offset)`. Ordered by size first for best fit.
type FreeKey = (u64, u64, u64);

/// Gives each allocator a distinct id, so a handle from another allocator is recognised.
static NEXT_ALLOCATOR: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Copy)]
struct Live {
    id: u64,
    /// Rounded request size, which is what [`Stats::allocated_bytes`] counts.
    requested: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    live: Option<Live>,
}

#[derive(Debug)]
struct Segment {
    pool: Pool,
    base: u64,
    /// `Some(virtual size)` for an expandable segment.
    expandable: Option<u64>,
    /// Bytes backed by memory: the whole size of a plain segment, the mapped granules of an
    /// expandable one. Blocks tile exactly the mapped ranges, so this is the sum of their sizes.
    mapped: u64,
    blocks: BTreeMap<u64, Block>,
    /// Number of live blocks, so "is this segment unused" is O(1).
    live: usize,
}

/// What [`CachingAllocator::release`] gives back of expandable segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Release {
    /// Only memory after the last live block: cached memory no request could miss soon.
    Ends,
    /// Also the whole granules of holes between live blocks.
    Holes,
}

/// Why growing failed.
enum GrowError {
    Cap,
    DeviceOom,
    Device(DeviceError),
}

/// The limit a growth of reserved memory is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ceiling {
    /// The hard cap only.
    Cap,
    /// The growth limit as well (the lower of the two).
    GrowthLimit,
}

fn grow_error(e: DeviceError) -> GrowError {
    match e {
        DeviceError::OutOfMemory { .. } => GrowError::DeviceOom,
        other => GrowError::Device(other),
    }
}

fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
        Pool::Huge => 2,
    }
}

/// Whether to split a free block of which `remainder` bytes are left over. PyTorch's rule:
/// in the small pool any remainder of at least one block is worth keeping. In a plain large
/// segment, a remainder of 1 MiB or less could only serve a large request after merging with a
/// neighbour, so PyTorch leaves it inside the allocated block rather than create slivers that
/// fragment the index. In an expandable segment, a remainder at the end merges with the next
/// growth, and slivers elsewhere merge back on free, so splitting always pays (PyTorch also
/// splits at 512 B there).
fn should_split(pool: Pool, expandable: bool, remainder: u64) -> bool {
    match pool {
        Pool::Small => remainder >= MIN_BLOCK_SIZE,
        Pool::Large | Pool::Huge if expandable => remainder >= MIN_BLOCK_SIZE,
        Pool::Large | Pool::Huge => remainder > SMALL_SIZE,
    }
}

/// A caching allocator over a [`DeviceMemory`]. See the [module docs](super) for the layout.
///
/// Single-threaded by design (`&mut self` everywhere): the CUDA runtime will own one per device
/// and stream. Frees from elsewhere go through its [`FreeQueue`].
pub struct CachingAllocator<D: DeviceMemory> {
    device: D,
    config: AllocatorConfig,
    /// Distinct per allocator, written into every handle.
    instance: u64,
    /// Whether large segments are expandable (asked for and supported by the device).
    expandable: bool,
    /// The device's granule size (only meaningful when `expandable`).
    granularity: u64,
    /// Virtual size of a new expandable segment.
    virtual_size: u64,
    segments: BTreeMap<u64, Segment>,
    /// Free blocks per pool (index by [`pool_index`]).
    free: [BTreeSet<FreeKey>; 3],
    next_segment: u64,
    next_block: u64,
    cap: Option<u64>,
    /// Reserved bytes beyond which cached memory is reused first (see
    /// [`Self::set_growth_limit`]); raised to what had to be reserved when that was not enough.
    growth_limit: Option<u64>,
    handler: Option<OomHandler>,
    queue: FreeQueue,
    /// Counters and gauges kept up to date incrementally; the fields computed on demand
    /// (segment counts, largest free block, cap) are filled in by [`Self::stats`].
    st: Stats,
    /// The highest reserved bytes since [`Self::start_step_peak`] (a step's mark).
    step_peak_reserved: u64,
    /// When recording ([`Self::record_trace`]): every event since, in order.
    trace: Option<Vec<TraceEvent>>,
    /// The rung that served the last successful allocation (see [`Self::last_rung`]).
    last_rung: Option<Rung>,
}

impl<D: DeviceMemory> fmt::Debug for CachingAllocator<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("config", &self.config)
            .field("expandable", &self.expandable)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// An allocator with the default configuration (expandable segments where supported, no
    /// cap).
    pub fn new(device: D) -> Self {
        Self::with_config(device, AllocatorConfig::default())
    }

    /// An allocator with `config`.
    pub fn with_config(device: D, config: AllocatorConfig) -> Self {
        let granularity = device.granularity();
        // A granule that is not a non-zero multiple of the block size cannot hold whole blocks
        // at aligned offsets: fall back to plain segments rather than misbehave.
        let expandable = config.expandable_segments
            && device.supports_vmm()
            && granularity > 0
            && granularity.is_multiple_of(MIN_BLOCK_SIZE);
        let virtual_size = if expandable {
            config
                .expandable_virtual_size
                .unwrap_or_else(|| device.total_memory())
                .checked_next_multiple_of(granularity)
                .unwrap_or(u64::MAX / granularity * granularity)
                .max(granularity)
        } else {
            0
        };
        Self {
            device,
            instance: NEXT_ALLOCATOR.fetch_add(1, Ordering::Relaxed),
            expandable,
            granularity,
            virtual_size,
            segments: BTreeMap::new(),
            free: [BTreeSet::new(), BTreeSet::new(), BTreeSet::new()],
            next_segment: 0,
            next_block: 0,
            cap: config.cap,
            growth_limit: None,
            handler: None,
            queue: FreeQueue::default(),
            st: Stats::default(),
            step_peak_reserved: 0,
            trace: None,
            last_rung: None,
            config,
        }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, mutably: for changing its settings (a simulated capacity, say). Allocating
    /// or freeing memory the allocator owns behind its back breaks it.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The configuration it was made with (the cap may have changed since, see [`Self::cap`]).
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Whether large segments are expandable: asked for, and the device supports it.
    pub fn expandable_segments(&self) -> bool {
        self.expandable
    }

    /// Alignment of every block's address and size (for CubeCL's `ComputeStorage::alignment`).
    pub fn alignment(&self) -> u64 {
        ALIGNMENT
    }

    /// The current cap on reserved bytes.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// Changes the cap on reserved bytes. Lowering it below what is reserved releases cached
    /// segments to get under it as far as live blocks allow; memory in live blocks is never
    /// taken away, but no allocation grows reserved memory beyond the cap afterwards.
    pub fn set_cap(&mut self, cap: Option<u64>) -> Result<(), AllocError> {
        self.cap = cap;
        if let Some(cap) = cap
            && self.st.reserved_bytes > cap
        {
            self.release_cached()?;
        }
        Ok(())
    }

    /// The current growth limit (see [`Self::set_growth_limit`]).
    pub fn growth_limit(&self) -> Option<u64> {
        self.growth_limit
    }

    /// Sets a soft limit on reserved bytes (`None`: none). An allocation that would take
    /// reserved memory beyond it first climbs the growth rungs of the ladder (see
    /// [`Self::alloc`]) with the limit as if it were the cap: [`Rung::Growth`] within it, then
    /// [`Rung::AnyPool`], then [`Rung::AfterReleasingEnds`] and [`Rung::AfterReleasingHoles`]
    /// giving back only the granules the request lacks (from free segment ends, then from the
    /// holes between live blocks) to map them again where it fits. Only then does it climb
    /// them again under the cap, growing past the limit, never failing for it. After such a
    /// growth the limit rises to the bytes reserved, so that the same shortfall does not make
    /// every later allocation give memory back and map it again. Unlike the cap, it never
    /// makes an allocation fail and never calls the out-of-memory handler.
    pub fn set_growth_limit(&mut self, limit: Option<u64>) {
        self.growth_limit = limit;
    }

    /// Installs the out-of-memory handler (see [`OomHandler`]), replacing any previous one.
    pub fn set_oom_handler(&mut self, handler: impl FnMut(&OomInfo) -> bool + Send + 'static) {
        self.handler = Some(Box::new(handler));
    }

    /// Removes the out-of-memory handler.
    pub fn clear_oom_handler(&mut self) {
        self.handler = None;
    }

    /// A handle on this allocator's queue of deferred frees.
    pub fn free_queue(&self) -> FreeQueue {
        self.queue.clone()
    }

    /// Allocates `size` bytes only if a cached free block fits, never calling the device:
    /// `None` on a miss (or a size that overflows). This is the "no-grow" mode of the CubeCL
    /// glue, which on a miss first hands back the slots CubeCL holds and then calls
    /// [`Self::alloc`]. It is [`Rung::CachedBlock`] alone, and a hit is recorded as such in
    /// [`Self::last_rung`].
    pub fn try_alloc_cached(&mut self, size: u64) -> Option<BlockHandle> {
        self.flush();
        let rounded = round_size(size)?;
        let handle = self.alloc_from_cache(self.pool_for(rounded), rounded)?;
        self.last_rung = Some(Rung::CachedBlock);
        if let Some(trace) = &mut self.trace {
            trace.push(alloc_event(&handle, size));
        }
        Some(handle)
    }

    /// Frees a live block: it merges with its free neighbours and stays cached in its segment.
    /// A handle that is not live (freed already) or not from this allocator is refused with an
    /// error, and nothing changes.
    pub fn dealloc(&mut self, handle: BlockHandle) -> Result<(), AllocError> {
        if handle.allocator != self.instance {
            return Err(AllocError::UnknownBlock { handle });
        }
        let seg_id = handle.segment.0;
        let Some(seg) = self.segments.get_mut(&seg_id) else {
            return Err(AllocError::DoubleFree { handle });
        };
        let block = match seg.blocks.get(&handle.offset) {
            Some(b) if b.live.is_some_and(|l| l.id == handle.id) => *b,
            _ => return Err(AllocError::DoubleFree { handle }),
        };
        let requested = block.live.map_or(0, |l| l.requested);
        let free = &mut self.free[pool_index(seg.pool)];
        let mut start = handle.offset;
        let mut size = block.size;
        if let Some((&prev, &pb)) = seg.blocks.range(..handle.offset).next_back()
            && pb.live.is_none()
            && prev + pb.size == handle.offset
        {
            free.remove(&(pb.size, seg_id, prev));
            seg.blocks.remove(&handle.offset);
            start = prev;
            size += pb.size;
        }
        if let Some((&next, &nb)) = seg.blocks.range(handle.offset + 1..).next()
            && nb.live.is_none()
            && handle.offset + block.size == next
        {
            free.remove(&(nb.size, seg_id, next));
            seg.blocks.remove(&next);
            size += nb.size;
        }
        seg.blocks.insert(start, Block { size, live: None });
        free.insert((size, seg_id, start));
        seg.live -= 1;
        self.st.allocated_bytes -= requested;
        self.st.free_bytes += block.size;
        self.st.active_blocks -= 1;
        self.st.free_count += 1;
        if let Some(trace) = &mut self.trace {
            trace.push(TraceEvent::Free {
                id: handle.id,
                address: handle.address,
                size: requested,
            });
        }
        Ok(())
    }

    /// Applies the frees queued on the [`FreeQueue`]; returns how many were applied. Refused
    /// ones (not live) are counted in [`Stats::rejected_queued_frees`].
    pub fn flush(&mut self) -> usize {
        let mut applied = 0;
        for handle in self.queue.take() {
            match self.dealloc(handle) {
                Ok(()) => applied += 1,
                Err(_) => self.st.rejected_queued_frees += 1,
            }
        }
        applied
    }

    /// Returns unused memory to the device: every plain segment without a live block, and every
    /// whole granule inside a free block of an expandable segment (an expandable segment left
    /// with nothing mapped gives its address range back too). Free bytes of a granule shared
    /// with a live block stay cached. Returns the bytes released. PyTorch's `empty_cache` does
    /// the same; unmapping the holes between live blocks is what lets a request larger than
    /// any hole be mapped from their memory.
    pub fn release_cached(&mut self) -> Result<u64, AllocError> {
        self.release(Release::Holes, u64::MAX, None)
    }

    /// Gives cached memory back until at most `limit` bytes are reserved, as far as live blocks
    /// allow: free segment ends first, then the holes between live blocks. Returns the bytes
    /// released.
    pub fn release_above(&mut self, limit: u64) -> Result<u64, AllocError> {
        let excess = self.st.reserved_bytes.saturating_sub(limit);
        if excess == 0 {
            return Ok(0);
        }
        let ends = self.release(Release::Ends, excess, None)?;
        if ends >= excess {
            return Ok(ends);
        }
        Ok(ends + self.release(Release::Holes, excess - ends, None)?)
    }

    /// [`Self::release_cached`], unmapping only free ends of expandable segments with
    /// [`Release::Ends`].
    /// It stops once `enough` bytes are given back, and gives back nothing of the free blocks
    /// `keep` names.
    fn release(
        &mut self,
        what: Release,
        enough: u64,
        keep: Option<KeptRange>,
    ) -> Result<u64, AllocError> {
        // Expandable segments first: a granule given back costs the device no wait, while
        // freeing a plain segment waits for all queued work (`cuMemFree` synchronises).
        let mut ids: Vec<u64> = self.segments.keys().copied().collect();
        ids.sort_by_key(|id| self.segments[id].expandable.is_none());
        let mut released = 0;
        for id in ids {
            if released >= enough {
                break;
            }
            let Some(seg) = self.segments.get(&id) else {
                continue;
            };
            match seg.expandable {
                None => {
                    if seg.live != 0 {
                        continue;
                    }
                    self.device.free(seg.base, seg.mapped)?;
                    let size = seg.mapped;
                    let pool = pool_index(seg.pool);
                    if let Some(trace) = &mut self.trace {
                        trace.push(TraceEvent::SegmentFree {
                            segment: SegmentId(id),
                            address: seg.base,
                            size,
                        });
                    }
                    self.segments.remove(&id);
                    self.free[pool].remove(&(size, id, 0));
                    self.st.reserved_bytes -= size;
                    self.st.free_bytes -= size;
                    self.st.device_frees += 1;
                    released += size;
                }
                Some(virtual_size) => {
                    let keep = keep.filter(|k| k.segment == id);
                    released += self.unmap_free_granules(id, what, enough - released, keep)?;
                    if let Some(seg) = self.segments.get(&id)
                        && seg.mapped == 0
                    {
                        self.device.release(seg.base, virtual_size)?;
                        self.segments.remove(&id);
                    }
                }
            }
        }
        if released > 0 {
            log::debug!(
                "frugal-cuda: gave {} of cached memory back to the device ({what:?}), {} reserved",
                super::stats::format_bytes(released),
                super::stats::format_bytes(self.st.reserved_bytes)
            );
        }
        Ok(released)
    }

    /// Same as [`Self::release_cached`], under PyTorch's name.
    pub fn empty_cache(&mut self) -> Result<u64, AllocError> {
        self.release_cached()
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let mut st = self.st;
        st.segments = self.segments.len() as u64;
        st.expandable_segments = self
            .segments
            .values()
            .filter(|s| s.expandable.is_some())
            .count() as u64;
        st.largest_free_block = self
            .largest_free(Pool::Small)
            .max(self.largest_free(Pool::Large))
            .max(self.largest_free(Pool::Huge));
        st.cap = self.cap;
        st.growth_limit = self.growth_limit;
        st.device_times = self.device.times();
        st
    }

    /// Starts (clearing what was recorded) or stops recording the trace: every allocation,
    /// free, segment change and out-of-memory, in order, with device addresses (see
    /// [`TraceEvent`]). Off by default; when off, the only cost is a branch per event.
    pub fn record_trace(&mut self, on: bool) {
        self.trace = on.then(Vec::new);
    }

    /// The events recorded since recording started or the last call, leaving the recording
    /// on and empty (empty when not recording).
    pub fn take_trace(&mut self) -> Vec<TraceEvent> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// [`Self::snapshot`] and a copy of the trace recorded up to now (the recording goes on).
    pub fn history(&self) -> History {
        History {
            snapshot: self.snapshot(),
            trace: self.trace.clone(),
        }
    }

    /// The highest reserved bytes since [`Self::start_step_peak`] was last called.
    pub fn step_peak_reserved(&self) -> u64 {
        self.step_peak_reserved.max(self.st.reserved_bytes)
    }

    /// Starts measuring a step's peak reserved bytes ([`Self::step_peak_reserved`]) from the
    /// bytes reserved now; the peaks of [`Self::reset_peak`] are left as they are.
    pub fn start_step_peak(&mut self) {
        self.step_peak_reserved = self.st.reserved_bytes;
    }

    /// Sets the peaks to the current values, to measure the peak of a phase.
    pub fn reset_peak(&mut self) {
        self.st.peak_allocated_bytes = self.st.allocated_bytes;
        self.st.peak_reserved_bytes = self.st.reserved_bytes;
    }

    /// Every segment and block, and the statistics.
    pub fn snapshot(&self) -> Snapshot {
        let segments = self
            .segments
            .iter()
            .map(|(&id, seg)| SegmentSnapshot {
                id: SegmentId(id),
                pool: seg.pool,
                expandable: seg.expandable.is_some(),
                address: seg.base,
                virtual_size: seg.expandable.unwrap_or(seg.mapped),
                mapped_size: seg.mapped,
                blocks: seg
                    .blocks
                    .iter()
                    .map(|(&offset, b)| BlockSnapshot {
                        offset,
                        size: b.size,
                        allocated: b.live.is_some(),
                        requested: b.live.map_or(0, |l| l.requested),
                    })
                    .collect(),
            })
            .collect();
        Snapshot {
            segments,
            stats: self.stats(),
        }
    }

    /// The pool a request of `rounded` bytes goes to: [`Pool::for_size`], or [`Pool::Huge`]
    /// at or above the configured threshold when segments are expandable.
    fn pool_for(&self, rounded: u64) -> Pool {
        match self.config.huge_threshold {
            Some(threshold) if self.expandable && rounded >= threshold => Pool::Huge,
            _ => Pool::for_size(rounded),
        }
    }

    fn largest_free(&self, pool: Pool) -> u64 {
        self.free[pool_index(pool)]
            .last()
            .map_or(0, |&(size, _, _)| size)
    }

    fn add_reserved(&mut self, bytes: u64) {
        log::debug!(
            "frugal-cuda: reserved {} more from the device, {} in all",
            super::stats::format_bytes(bytes),
            super::stats::format_bytes(self.st.reserved_bytes + bytes)
        );
        self.st.reserved_bytes += bytes;
        self.st.peak_reserved_bytes = self.st.peak_reserved_bytes.max(self.st.reserved_bytes);
        self.step_peak_reserved = self.step_peak_reserved.max(self.st.reserved_bytes);
        self.st.free_bytes += bytes;
    }

    /// Fails with [`GrowError::Cap`] if reserving `extra` more bytes would exceed `ceiling`.
    fn check_cap(&self, extra: u64, ceiling: Ceiling) -> Result<(), GrowError> {
        let limit = match ceiling {
            Ceiling::Cap => self.cap,
            Ceiling::GrowthLimit => match (self.cap, self.growth_limit) {
                (Some(cap), Some(limit)) => Some(cap.min(limit)),
                (cap, limit) => cap.or(limit),
            },
        };
        match limit {
            Some(cap)
                if self
                    .st
                    .reserved_bytes
                    .checked_add(extra)
                    .is_none_or(|r| r > cap) =>
            {
                Err(GrowError::Cap)
            }
            _ => Ok(()),
        }
    }

    /// [`Rung::AnyPool`]: best fit over every pool's cached free blocks. The block stays in
    /// its segment's pool (it merges back there when freed).
    fn alloc_from_any_pool(&mut self, rounded: u64) -> Option<BlockHandle> {
        let key = self
            .free
            .iter()
            .filter_map(|free| free.range((rounded, 0, 0)..).next().copied())
            .min()?;
        let handle = self.take(key, rounded);
        self.st.cache_hits += 1;
        self.st.cross_pool_allocs += 1;
        Some(handle)
    }

    /// [`Rung::CachedBlock`]: best fit from the pool's cached free blocks.
    fn alloc_from_cache(&mut self, pool: Pool, rounded: u64) -> Option<BlockHandle> {
        let key = *self.free[pool_index(pool)]
            .range((rounded, 0, 0)..)
            .next()?;
        let handle = self.take(key, rounded);
        self.st.cache_hits += 1;
        Some(handle)
    }

    /// Hands out the free block `key` for a request of `rounded` bytes, splitting off the rest
    /// when it is worth keeping.
    fn take(&mut self, key: FreeKey, rounded: u64) -> BlockHandle {
        let (size, seg_id, offset) = key;
        let seg = self
            .segments
            .get_mut(&seg_id)
            .expect("free index names a live segment");
        let free = &mut self.free[pool_index(seg.pool)];
        free.remove(&key);
        let remainder = size - rounded;
        let block_size = if should_split(seg.pool, seg.expandable.is_some(), remainder) {
            seg.blocks.insert(
                offset + rounded,
                Block {
                    size: remainder,
                    live: None,
                },
            );
            free.insert((remainder, seg_id, offset + rounded));
            rounded
        } else {
            size
        };
        let id = self.next_block;
        self.next_block += 1;
        seg.blocks.insert(
            offset,
            Block {
                size: block_size,
                live: Some(Live {
                    id,
                    requested: rounded,
                }),
            },
        );
        seg.live += 1;
        let address = seg.base + offset;
        self.st.free_bytes -= block_size;
        self.st.allocated_bytes += rounded;
        self.st.peak_allocated_bytes = self.st.peak_allocated_bytes.max(self.st.allocated_bytes);
        self.st.active_blocks += 1;
        self.st.alloc_count += 1;
        BlockHandle {
            allocator: self.instance,
            id,
            segment: SegmentId(seg_id),
            offset,
            size: rounded,
            address,
        }
    }

    /// Adds a segment whose `[0, mapped)` is one free block.
    fn new_segment(&mut self, pool: Pool, base: u64, expandable: Option<u64>, mapped: u64) -> u64 {
        let id = self.next_segment;
        self.next_segment += 1;
        let mut blocks = BTreeMap::new();
        blocks.insert(
            0,
            Block {
                size: mapped,
                live: None,
            },
        );
        self.segments.insert(
            id,
            Segment {
                pool,
                base,
                expandable,
                mapped,
                blocks,
                live: 0,
            },
        );
        self.free[pool_index(pool)].insert((mapped, id, 0));
        self.add_reserved(mapped);
        self.st.device_allocs += 1;
        if let Some(trace) = &mut self.trace {
            let (segment, address, size) = (SegmentId(id), base, mapped);
            trace.push(match expandable {
                Some(_) => TraceEvent::SegmentMap {
                    segment,
                    address,
                    size,
                },
                None => TraceEvent::SegmentAlloc {
                    segment,
                    address,
                    size,
                },
            });
        }
        id
    }
}

/// The trace event of `handle`, allocated for a request of `bytes`.
fn alloc_event(handle: &BlockHandle, bytes: u64) -> TraceEvent {
    TraceEvent::Alloc {
        id: handle.id,
        bytes,
        address: handle.address,
        size: handle.size,
    }
}
