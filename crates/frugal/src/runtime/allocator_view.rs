//! What frugal-cuda's caching allocator holds (segments and blocks at their device addresses)
//! and the trace that led there, in types of this crate, so that a snapshot carries them in
//! every build and the memory_viz writer is tested without a GPU. Read when a snapshot is
//! taken, never per op: it is a round trip to the device server.

use serde::Serialize;

/// A caching allocator's memory at one moment, and, when it was recording, how it got there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocatorView {
    /// The segments, in the allocator's order.
    pub segments: Vec<AllocatorSegment>,
    /// Bytes the device has given the allocator: the segments' mapped bytes.
    pub reserved_bytes: u64,
    /// Bytes of live blocks, each at its rounded request.
    pub allocated_bytes: u64,
    /// The allocator's trace up to the same moment, oldest first; `None` unless it was
    /// recording (`frugal_cuda::record_allocation_trace`).
    pub trace: Option<Vec<AllocatorEvent>>,
}

/// A segment: memory the allocator got from the device in one piece (a plain segment) or one
/// virtual range it maps memory into (an expandable segment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocatorSegment {
    /// Device address of its first byte.
    pub address: u64,
    /// Its pool: `"small"`, `"large"` or `"huge"`.
    pub pool: &'static str,
    /// Whether it is an expandable segment, whose blocks may have unmapped gaps between them.
    pub expandable: bool,
    /// Its blocks in address order; they tile its mapped memory.
    pub blocks: Vec<AllocatorBlock>,
}

/// A block of a segment, live or cached free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AllocatorBlock {
    /// Device address of its first byte.
    pub address: u64,
    /// Its size.
    pub size: u64,
    /// The rounded request of a live block; 0 for a free one.
    pub requested: u64,
    /// Whether it is live.
    pub allocated: bool,
}

/// One event of the allocator's trace (sizes of blocks are rounded requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum AllocatorEvent {
    /// A block was allocated.
    Alloc {
        /// Its device address.
        address: u64,
        /// Its rounded request.
        size: u64,
    },
    /// A block was freed.
    Free {
        /// Its device address.
        address: u64,
        /// Its rounded request.
        size: u64,
    },
    /// A plain segment was allocated from the device.
    SegmentAlloc {
        /// Its device address.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// A plain segment went back to the device.
    SegmentFree {
        /// Its device address.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// Memory was mapped into an expandable segment.
    SegmentMap {
        /// Device address of the first byte mapped.
        address: u64,
        /// Bytes mapped.
        size: u64,
    },
    /// Memory of an expandable segment went back to the device.
    SegmentUnmap {
        /// Device address of the first byte unmapped.
        address: u64,
        /// Bytes unmapped.
        size: u64,
    },
    /// An allocation found no memory.
    Oom {
        /// Bytes requested.
        bytes: u64,
        /// Bytes the allocator could still have reserved (the room under its cap when the cap
        /// refused, 0 when the device did).
        free: u64,
    },
}

/// The allocator's segments, blocks and trace behind `device`, if it is a frugal-cuda device;
/// `None` for every other device.
pub fn allocator_view<D: 'static>(device: &D) -> Option<AllocatorView> {
    #[allow(unused_variables)]
    let any = device as &dyn std::any::Any;
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) = any.downcast_ref::<frugal_cuda::FrugalCudaDevice>() {
        return Some(from_history(frugal_cuda::allocator_history(device)));
    }
    None
}

#[cfg(feature = "frugal-cuda")]
fn from_history(history: frugal_cuda::allocator::History) -> AllocatorView {
    use frugal_cuda::allocator::{Pool, TraceEvent};
    let snapshot = history.snapshot;
    let segments = snapshot
        .segments
        .into_iter()
        .map(|seg| AllocatorSegment {
            address: seg.address,
            pool: match seg.pool {
                Pool::Small => "small",
                Pool::Large => "large",
                Pool::Huge => "huge",
            },
            expandable: seg.expandable,
            blocks: seg
                .blocks
                .iter()
                .map(|b| AllocatorBlock {
                    address: seg.address + b.offset,
                    size: b.size,
                    requested: b.requested,
                    allocated: b.allocated,
                })
                .collect(),
        })
        .collect();
    let trace = history.trace.map(|events| {
        events
            .into_iter()
            .map(|event| match event {
                TraceEvent::Alloc { address, size, .. } => AllocatorEvent::Alloc { address, size },
                TraceEvent::Free { address, size, .. } => AllocatorEvent::Free { address, size },
                TraceEvent::SegmentAlloc { address, size, .. } => {
                    AllocatorEvent::SegmentAlloc { address, size }
                }
                TraceEvent::SegmentFree { address, size, .. } => {
                    AllocatorEvent::SegmentFree { address, size }
                }
                TraceEvent::SegmentMap { address, size, .. } => {
                    AllocatorEvent::SegmentMap { address, size }
                }
                TraceEvent::SegmentUnmap { address, size, .. } => {
                    AllocatorEvent::SegmentUnmap { address, size }
                }
                TraceEvent::Oom { bytes, free } => AllocatorEvent::Oom { bytes, free },
            })
            .collect()
    });
    AllocatorView {
        segments,
        reserved_bytes: snapshot.stats.reserved_bytes,
        allocated_bytes: snapshot.stats.allocated_bytes,
        trace,
    }
}
