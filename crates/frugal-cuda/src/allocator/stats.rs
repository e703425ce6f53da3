//! Statistics and snapshots of a [`super::CachingAllocator`].
//!
//! The two numbers that matter to a user are **allocated** bytes (what live tensors use, the
//! analogue of PyTorch's `memory_allocated`) and **reserved** bytes (what the device has given
//! the allocator, `memory_reserved`): out-of-memory happens on reserved bytes, so the gap
//! between them is the allocator's cost, and the fragmentation figures explain it.

use serde::Serialize;

use super::{DeviceTimes, Pool, SegmentId};

/// Counters and gauges of an allocator, as returned by
/// [`super::CachingAllocator::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Bytes in live blocks, each counted at its rounded request size.
    pub allocated_bytes: u64,
    /// Highest [`Self::allocated_bytes`] since creation or the last
    /// [`super::CachingAllocator::reset_peak`].
    pub peak_allocated_bytes: u64,
    /// Bytes backed by device memory: plain segments plus the mapped part of expandable ones.
    pub reserved_bytes: u64,
    /// Highest [`Self::reserved_bytes`] since creation or the last reset.
    pub peak_reserved_bytes: u64,
    /// Number of live blocks.
    pub active_blocks: u64,
    /// Number of segments (plain and expandable).
    pub segments: u64,
    /// Of which expandable.
    pub expandable_segments: u64,
    /// Bytes in cached free blocks (both pools).
    pub free_bytes: u64,
    /// The largest cached free block (both pools).
    pub largest_free_block: u64,
    /// Successful allocations.
    pub alloc_count: u64,
    /// Successful frees.
    pub free_count: u64,
    /// Allocations served from a cached free block, without calling the device.
    pub cache_hits: u64,
    /// Allocations that had to get memory from the device (a new segment or a segment growth).
    pub device_allocs: u64,
    /// Times a plain segment was freed or granules were unmapped.
    pub device_frees: u64,
    /// Times an expandable segment was grown.
    pub segment_growths: u64,
    /// Allocations that failed for lack of memory.
    pub oom_count: u64,
    /// Allocations served, as a last resort before out-of-memory, from a free block of
    /// another pool.
    pub cross_pool_allocs: u64,
    /// Calls of the out-of-memory handler.
    pub oom_handler_calls: u64,
    /// Queued frees (see [`super::FreeQueue`]) that were refused (unknown or already free).
    pub rejected_queued_frees: u64,
    /// The cap at the time, if any.
    pub cap: Option<u64>,
    /// The growth limit at the time, if any (see
    /// [`super::CachingAllocator::set_growth_limit`]).
    pub growth_limit: Option<u64>,
    /// Allocations that reserved memory beyond the growth limit after reusing cached memory
    /// could not serve them.
    pub growth_limit_passes: u64,
    /// Bytes mapped into expandable segments, over the allocator's life (growths and new
    /// segments): with [`Self::unmapped_bytes`], the memory moved between addresses to keep
    /// reserved bytes within a cap or growth limit.
    pub mapped_bytes: u64,
    /// Bytes unmapped from expandable segments, over the allocator's life.
    pub unmapped_bytes: u64,
    /// Time the device memory spent in the driver: waits for the device before giving memory
    /// back, mappings and unmappings (see [`super::DeviceMemory::times`]).
    pub device_times: DeviceTimes,
}

impl Stats {
    /// Reserved bytes not in live blocks' requested sizes: cached free blocks plus the unsplit
    /// tails of live blocks. The allocator's whole overhead.
    pub fn unused_reserved_bytes(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }

    /// External fragmentation of the cache: `1 - largest free block / free bytes`, 0 when
    /// nothing is free or all free bytes are in one block, close to 1 when they are scattered in
    /// many small blocks that a large request cannot use.
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }

    /// Peak reserved over peak allocated (1.0 when nothing was ever allocated): how much
    /// more the device had to reserve than tensors ever held at once. The project's target is
    /// ≤ 1.1 on the reference GPT step.
    pub fn peak_ratio(&self) -> f64 {
        if self.peak_allocated_bytes == 0 {
            1.0
        } else {
            self.peak_reserved_bytes as f64 / self.peak_allocated_bytes as f64
        }
    }
}

/// A block in a [`SegmentSnapshot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// Offset in the segment.
    pub offset: u64,
    /// Size of the block (at least the requested size when live).
    pub size: u64,
    /// Whether it is live.
    pub allocated: bool,
    /// The rounded request size of a live block; 0 for a free one.
    pub requested: u64,
}

/// A segment in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    /// Its id.
    pub id: SegmentId,
    /// Its pool.
    pub pool: Pool,
    /// Whether it is an expandable (virtual-memory) segment.
    pub expandable: bool,
    /// Device address of its first byte.
    pub address: u64,
    /// Address range it spans: its size for a plain segment, the reservation for an expandable
    /// one.
    pub virtual_size: u64,
    /// Bytes backed by memory (its size for a plain segment), the sum of its blocks' sizes.
    pub mapped_size: u64,
    /// Its blocks in address order; they tile its mapped ranges. A plain segment is one range
    /// from offset 0; in an expandable one, granule-aligned unmapped gaps may lie between
    /// blocks.
    pub blocks: Vec<BlockSnapshot>,
}

/// Every segment and block of an allocator, with its statistics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Segments in id order.
    pub segments: Vec<SegmentSnapshot>,
    /// Statistics at the same time.
    pub stats: Stats,
}

/// Formats a byte count for messages: `1.50 GiB`, `20.00 MiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        _ => humansize::format_size(bytes, humansize::BINARY.decimal_places(2).decimal_zeroes(2)),
    }
}
