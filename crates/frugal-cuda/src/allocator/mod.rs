//! A caching device-memory allocator, modelled on PyTorch's `CUDACachingAllocator`.
//!
//! Asking the CUDA driver for memory (`cuMemAlloc`, or mapping physical memory) is slow and
//! synchronises the device, so the allocator asks for big **segments** and carves them into
//! **blocks**. A freed block goes back to a per-pool cache of free blocks (merged with its free
//! neighbours) and is handed out again by best fit; segments return to the driver only when
//! [`CachingAllocator::release_cached`] is called, when the cap is lowered, or when an
//! allocation would otherwise fail.
//!
//! Layout (the same numbers as PyTorch, so the two can be compared):
//!
//! - every request is rounded up to [`MIN_BLOCK_SIZE`] (512 B); a zero-byte request gets a
//!   512-byte block, so every live block has a distinct address;
//! - requests of at most [`SMALL_SIZE`] (1 MiB) come from the **small pool**, whose segments are
//!   [`SMALL_SEGMENT`] (2 MiB): small tensors then never split the big segments that large
//!   tensors need;
//! - bigger requests come from the **large pool**. With expandable segments (the default where
//!   the device supports virtual memory management), a large segment reserves one big virtual
//!   address range and maps physical granules at its end as it grows, so a growing sequence of
//!   large requests lives in one segment and free space at its end is merged with new growth.
//!   Without them, a large segment is [`LARGE_SEGMENT`] (20 MiB) for requests below
//!   [`MIN_LARGE_ALLOC`] (10 MiB), and the request rounded up to [`ROUND_LARGE`] (2 MiB)
//!   otherwise.
//!
//! Submodules: [`caching`] (the allocator, with its allocation ladder and the mapping of
//! expandable segments in files of their own), [`device`] (the driver operations it calls, and a
//! simulated device), [`stats`] (statistics and snapshots), [`trace`] (the recorded trace of
//! allocations, frees and segment changes, with device addresses).

pub mod caching;
pub mod device;
pub mod stats;
pub mod trace;

use std::fmt;
use std::sync::{Arc, Mutex};

use serde::Serialize;

pub use caching::{CachingAllocator, Rung};
pub use device::{
    CallTime, DeviceError, DeviceMemory, DeviceTimes, SimulatedDevice, SimulatedDeviceCounters,
};
pub use stats::{BlockSnapshot, SegmentSnapshot, Snapshot, Stats, format_bytes};
pub use trace::{History, TraceEvent};

/// Every block size is a multiple of this, and every block's offset too: the smallest block.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The alignment of every block's address: segments are at least this aligned by the driver
/// (CUDA aligns allocations to 256 B or more, granules to 2 MiB), and offsets are multiples.
pub const ALIGNMENT: u64 = MIN_BLOCK_SIZE;
/// Largest request served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Size of a small-pool segment.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Size of a plain large-pool segment made for a request below [`MIN_LARGE_ALLOC`].
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Requests at least this big get a plain large segment of their own size (rounded).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of plain large segments made for requests of at least [`MIN_LARGE_ALLOC`].
pub const ROUND_LARGE: u64 = 2 << 20;

/// Which pool a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Pool {
    /// Requests of at most [`SMALL_SIZE`], from [`SMALL_SEGMENT`] segments.
    Small,
    /// Bigger requests.
    Large,
    /// Requests of at least [`AllocatorConfig::huge_threshold`], in expandable segments of
    /// their own (only when that is set and expandable segments are in use), so that the
    /// holes big transient tensors leave are not split by smaller long-lived ones.
    Huge,
}

impl Pool {
    /// The pool a request of `rounded` bytes (already rounded by [`round_size`]) goes to.
    pub fn for_size(rounded: u64) -> Pool {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pool::Small => "small",
            Pool::Large => "large",
            Pool::Huge => "huge",
        })
    }
}

/// Rounds a request up to a multiple of [`MIN_BLOCK_SIZE`]; zero becomes [`MIN_BLOCK_SIZE`].
/// `None` when the rounded size does not fit in a `u64`.
pub fn round_size(size: u64) -> Option<u64> {
    if size == 0 {
        return Some(MIN_BLOCK_SIZE);
    }
    size.checked_next_multiple_of(MIN_BLOCK_SIZE)
}

/// Size of the plain (non-expandable) segment made for a request of `rounded` bytes.
/// `None` on overflow.
pub fn plain_segment_size(rounded: u64) -> Option<u64> {
    if rounded <= SMALL_SIZE {
        Some(SMALL_SEGMENT)
    } else if rounded < MIN_LARGE_ALLOC {
        Some(LARGE_SEGMENT)
    } else {
        rounded.checked_next_multiple_of(ROUND_LARGE)
    }
}

/// Identifies a segment for the lifetime of its allocator (ids are never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SegmentId(pub u64);

/// A live allocation: what [`CachingAllocator::alloc`] returns and
/// [`CachingAllocator::dealloc`] takes back.
///
/// It carries everything a CubeCL `ComputeStorage` needs to hand out a storage handle (the
/// segment, the offset in it, the size and the device address), plus a unique id, so a stale
/// copy of a freed handle is recognised even after its bytes have been handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHandle {
    /// Which allocator made it (distinct per allocator in a process).
    pub(crate) allocator: u64,
    pub(crate) id: u64,
    pub(crate) segment: SegmentId,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) address: u64,
}

impl BlockHandle {
    /// Unique id of this allocation (never reused by the allocator that made it).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The segment holding the block.
    pub fn segment(&self) -> SegmentId {
        self.segment
    }
    /// Byte offset of the block in its segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Usable size: the request rounded by [`round_size`]. The block behind it may be a little
    /// bigger when splitting off the rest was not worth it (see [`CachingAllocator`]).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Device address of the first byte (segment base + offset).
    pub fn address(&self) -> u64 {
        self.address
    }
}

/// Why an allocation found no memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum OomReason {
    /// Growing would have taken reserved bytes above the cap.
    Cap,
    /// The device itself refused (driver out-of-memory).
    Device,
}

/// What the out-of-memory handler is told before an allocation fails.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomInfo {
    /// Bytes asked for.
    pub requested: u64,
    /// The request after rounding.
    pub rounded: u64,
    /// The pool the request goes to.
    pub pool: Pool,
    /// What refused the last attempt.
    pub reason: OomReason,
    /// Statistics at the time of the failure (cached segments already released).
    pub stats: Stats,
}

/// The out-of-memory handler: called once per failing allocation, with what was asked and
/// why it failed, after the allocator has released its own cached segments and looked in
/// every pool. Return `true` if the handler freed device memory (for example by dropping
/// tensors its owner can recompute, with their blocks pushed onto the [`FreeQueue`]): the
/// allocator then applies the queued frees and tries once more ([`Rung::AfterOomHandler`]). `false` makes the allocation
/// fail with [`AllocError::OutOfMemory`]. Nothing in Frugal installs one yet.
pub type OomHandler = Box<dyn FnMut(&OomInfo) -> bool + Send>;

/// Errors of the allocator. Nothing it is given makes it panic; bad input ends here.
#[derive(Debug, Clone, PartialEq)]
pub enum AllocError {
    /// No memory for the request, after releasing cached segments and asking the handler.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// The request after rounding.
        rounded: u64,
        /// The pool the request went to.
        pool: Pool,
        /// What refused the last attempt.
        reason: OomReason,
        /// The cap at the time, if any.
        cap: Option<u64>,
        /// Bytes reserved from the device.
        reserved: u64,
        /// Bytes in live blocks (rounded request sizes).
        allocated: u64,
        /// The largest cached free block of the request's pool.
        largest_free_block: u64,
    },
    /// The request cannot be rounded or laid out without overflowing a `u64`.
    SizeOverflow {
        /// Bytes asked for.
        requested: u64,
    },
    /// The handle names no block of this allocator (its segment or offset is unknown: a handle
    /// from another allocator, or from a segment that has since been released).
    UnknownBlock {
        /// The handle given.
        handle: BlockHandle,
    },
    /// The handle's block is not live: it was already freed (and may have been reused since).
    DoubleFree {
        /// The handle given.
        handle: BlockHandle,
    },
    /// The device failed in a way other than running out of memory.
    Device(DeviceError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory {
                requested,
                rounded,
                pool,
                reason,
                cap,
                reserved,
                allocated,
                largest_free_block,
            } => {
                write!(
                    f,
                    "out of device memory: cannot allocate {} ({requested} B, {rounded} B rounded, \
                     {pool} pool): ",
                    format_bytes(*requested)
                )?;
                match reason {
                    OomReason::Cap => match cap {
                        Some(cap) => write!(
                            f,
                            "the cap of {} ({cap} B) would be exceeded",
                            format_bytes(*cap)
                        )?,
                        None => f.write_str("the cap would be exceeded")?,
                    },
                    OomReason::Device => {
                        f.write_str("the device has no memory left")?;
                        if let Some(cap) = cap {
                            write!(f, " (cap {})", format_bytes(*cap))?;
                        }
                    }
                }
                write!(
                    f,
                    "; reserved {}, allocated {}, largest free block {}",
                    format_bytes(*reserved),
                    format_bytes(*allocated),
                    format_bytes(*largest_free_block)
                )
            }
            AllocError::SizeOverflow { requested } => {
                write!(f, "allocation of {requested} B overflows the address space")
            }
            AllocError::UnknownBlock { handle } => write!(
                f,
                "free of an unknown block (segment {}, offset {}, size {}): not from this \
                 allocator, or its segment was released",
                handle.segment.0, handle.offset, handle.size
            ),
            AllocError::DoubleFree { handle } => write!(
                f,
                "double free of block {} (segment {}, offset {}, size {}): it is not live",
                handle.id, handle.segment.0, handle.offset, handle.size
            ),
            AllocError::Device(e) => write!(f, "device error: {e}"),
        }
    }
}

impl std::error::Error for AllocError {}

impl From<DeviceError> for AllocError {
    fn from(e: DeviceError) -> Self {
        AllocError::Device(e)
    }
}

/// Options of a [`CachingAllocator`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// Use expandable segments for the large pool where the device supports virtual memory
    /// management (on by default; ignored where it does not).
    pub expandable_segments: bool,
    /// Virtual address range each expandable segment reserves. `None`: the device's total
    /// memory, so one segment can grow to hold everything (as PyTorch does). Virtual address
    /// space costs no memory.
    pub expandable_virtual_size: Option<u64>,
    /// Hard limit on reserved bytes; `None` for no limit.
    pub cap: Option<u64>,
    /// Requests of at least this many bytes go to the [`Pool::Huge`] pool (with expandable
    /// segments only); `None` keeps them in the large pool.
    pub huge_threshold: Option<u64>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            expandable_segments: true,
            expandable_virtual_size: None,
            cap: None,
            huge_threshold: None,
        }
    }
}

/// A queue of frees that can be filled from anywhere (another thread, or the out-of-memory
/// handler while the allocator is busy) and is applied by the allocator at its next
/// [`CachingAllocator::alloc`] or [`CachingAllocator::flush`], and before retrying after the
/// handler. This is how an eviction done inside the handler reaches the allocator, which is
/// mutably borrowed at that moment.
#[derive(Debug, Clone, Default)]
pub struct FreeQueue {
    inner: Arc<Mutex<Vec<BlockHandle>>>,
}

impl FreeQueue {
    /// Queues `handle` to be freed.
    pub fn push(&self, handle: BlockHandle) {
        // A poisoned lock only means another thread panicked while pushing: the vector is
        // still valid, so keep going rather than propagate the panic.
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
    }

    /// Number of queued frees.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn take(&self) -> Vec<BlockHandle> {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
