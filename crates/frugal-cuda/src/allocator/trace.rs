//! The allocator's trace: what it was asked and what it did with the device, in order, with
//! device addresses.
//!
//! Two readers need it. Replaying the requests ([`TraceEvent::is_request`]) through a
//! [`super::CachingAllocator`] reproduces the device's layout, which is what allocator
//! policies are compared on without a GPU. And every event carries the addresses and sizes
//! that [`super::Snapshot`] shows, so a PyTorch memory_viz file can be built from a snapshot
//! and the trace that led to it ([`History`]): the viewer replays the trace backwards from the
//! snapshot's segments, which only works if the two agree byte for byte.
//!
//! Recording is off unless asked for ([`super::CachingAllocator::record_trace`]): then every
//! event is one push onto a vector; when off, one branch per allocation and free.

use std::fmt;

use serde::Serialize;

use super::{SegmentId, Snapshot};

/// One event of an allocator's trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TraceEvent {
    /// Block `id` was allocated for a request of `bytes`.
    Alloc {
        /// The allocator's block id.
        id: u64,
        /// Bytes requested, before rounding (what a replay asks for).
        bytes: u64,
        /// Device address of the block.
        address: u64,
        /// The rounded request: the block's [`super::BlockSnapshot::requested`].
        size: u64,
    },
    /// Block `id` was freed.
    Free {
        /// The allocator's block id.
        id: u64,
        /// Device address of the block.
        address: u64,
        /// The rounded request it was allocated for.
        size: u64,
    },
    /// A plain segment was allocated from the device (`cuMemAlloc`).
    SegmentAlloc {
        /// The new segment.
        segment: SegmentId,
        /// Its device address.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// A plain segment was returned to the device.
    SegmentFree {
        /// The segment.
        segment: SegmentId,
        /// Its device address.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// Memory was mapped into an expandable segment: its first granules when it is made, or
    /// growth later. Reserving the address range itself costs no memory and is not an event.
    SegmentMap {
        /// The segment.
        segment: SegmentId,
        /// Device address of the first byte mapped.
        address: u64,
        /// Bytes mapped.
        size: u64,
    },
    /// Memory of an expandable segment was unmapped (given back to the device).
    SegmentUnmap {
        /// The segment.
        segment: SegmentId,
        /// Device address of the first byte unmapped.
        address: u64,
        /// Bytes unmapped.
        size: u64,
    },
    /// An allocation failed for lack of memory ([`super::AllocError::OutOfMemory`]).
    Oom {
        /// Bytes requested.
        bytes: u64,
        /// Bytes the allocator could still have reserved: the room left under the cap when the
        /// cap refused, 0 when the device did (the driver's free memory is not read there).
        free: u64,
    },
}

impl TraceEvent {
    /// Whether this is a request made of the allocator (an allocation or a free), as opposed
    /// to what it did with the device: the events a replay feeds back in.
    pub fn is_request(&self) -> bool {
        matches!(self, TraceEvent::Alloc { .. } | TraceEvent::Free { .. })
    }
}

impl fmt::Display for TraceEvent {
    /// Requests in the text form of this crate's replay traces, `a <id> <bytes>` and
    /// `f <id>`; device events as `<name> <segment> <address> <size>` (`oom <bytes> <free>`),
    /// which replay readers do not accept: write only [`TraceEvent::is_request`] events for
    /// them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceEvent::Alloc { id, bytes, .. } => write!(f, "a {id} {bytes}"),
            TraceEvent::Free { id, .. } => write!(f, "f {id}"),
            TraceEvent::SegmentAlloc {
                segment,
                address,
                size,
            } => write!(f, "segment_alloc {} {address:#x} {size}", segment.0),
            TraceEvent::SegmentFree {
                segment,
                address,
                size,
            } => write!(f, "segment_free {} {address:#x} {size}", segment.0),
            TraceEvent::SegmentMap {
                segment,
                address,
                size,
            } => write!(f, "segment_map {} {address:#x} {size}", segment.0),
            TraceEvent::SegmentUnmap {
                segment,
                address,
                size,
            } => write!(f, "segment_unmap {} {address:#x} {size}", segment.0),
            TraceEvent::Oom { bytes, free } => write!(f, "oom {bytes} {free}"),
        }
    }
}

/// An allocator's segments and blocks at one moment, and the trace recorded up to that same
/// moment: what a memory_viz file is built from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct History {
    /// The segments and blocks.
    pub snapshot: Snapshot,
    /// The events since recording started, oldest first; `None` when not recording.
    pub trace: Option<Vec<TraceEvent>>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::allocator::{
        AllocError, AllocatorConfig, BlockHandle, CachingAllocator, DeviceMemory, SimulatedDevice,
        round_size,
    };

    const MIB: u64 = 1 << 20;

    /// Checks that the blocks of every segment tile its mapped ranges (contiguous from offset
    /// 0 in a plain segment; granule-aligned gaps only in an expandable one), that the
    /// segments' mapped bytes add up to the reserved bytes and their live blocks to the
    /// allocated bytes.
    fn assert_tiles(snapshot: &Snapshot, granule: u64) {
        let mut mapped = 0;
        let mut allocated = 0;
        for seg in &snapshot.segments {
            let mut end = 0;
            let mut in_blocks = 0;
            for b in &seg.blocks {
                assert!(b.offset >= end, "segment {:?}: blocks overlap", seg.id);
                if b.offset > end {
                    assert!(seg.expandable, "a gap in plain segment {:?}", seg.id);
                    assert!(end.is_multiple_of(granule) && b.offset.is_multiple_of(granule));
                }
                end = b.offset + b.size;
                in_blocks += b.size;
                if b.allocated {
                    allocated += b.requested;
                }
            }
            assert_eq!(in_blocks, seg.mapped_size, "segment {:?}", seg.id);
            assert!(end <= seg.virtual_size);
            mapped += seg.mapped_size;
        }
        assert_eq!(mapped, snapshot.stats.reserved_bytes);
        assert_eq!(allocated, snapshot.stats.allocated_bytes);
    }

    /// Bytes of `[address, end)` inside the ranges of `mapped` (start -> length).
    fn covered(mapped: &BTreeMap<u64, u64>, address: u64, end: u64) -> u64 {
        mapped
            .range(..end)
            .map(|(&s, &l)| (s + l).min(end).saturating_sub(s.max(address)))
            .sum()
    }

    /// Replays `trace` from an empty allocator, checking each event against what came
    /// before: the live blocks (address -> size) and the mapped ranges, merged.
    fn replay(trace: &[TraceEvent]) -> (BTreeMap<u64, u64>, Vec<(u64, u64)>) {
        let mut live = BTreeMap::new();
        let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
        for event in trace {
            match *event {
                TraceEvent::Alloc { address, size, .. } => {
                    assert!(live.insert(address, size).is_none(), "{event}: twice");
                    assert_eq!(
                        covered(&mapped, address, address + size),
                        size,
                        "{event}: not in memory the trace mapped before it"
                    );
                }
                TraceEvent::Free { address, size, .. } => {
                    assert_eq!(live.remove(&address), Some(size), "{event}");
                }
                TraceEvent::SegmentAlloc { address, size, .. }
                | TraceEvent::SegmentMap { address, size, .. } => {
                    assert!(mapped.insert(address, size).is_none(), "{event}");
                }
                TraceEvent::SegmentFree { address, size, .. }
                | TraceEvent::SegmentUnmap { address, size, .. } => {
                    // An unmap may take any part of what was mapped in pieces: cut every
                    // mapped range it overlaps.
                    let end = address + size;
                    let overlapping: Vec<(u64, u64)> = mapped
                        .range(..end)
                        .map(|(&s, &l)| (s, l))
                        .filter(|&(s, l)| s + l > address)
                        .collect();
                    assert_eq!(
                        covered(&mapped, address, end),
                        size,
                        "{event}: releases unmapped memory"
                    );
                    for (s, l) in overlapping {
                        mapped.remove(&s);
                        if s < address {
                            mapped.insert(s, address - s);
                        }
                        if s + l > end {
                            mapped.insert(end, s + l - end);
                        }
                    }
                    assert!(
                        !live.range(..end).any(|(&a, &s)| a + s > address),
                        "{event}: a live block is released"
                    );
                }
                TraceEvent::Oom { .. } => {}
            }
        }
        (live, merge(mapped.into_iter()))
    }

    fn merge(ranges: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (start, len) in ranges {
            match out.last_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => out.push((start, len)),
            }
        }
        out
    }

    /// The snapshot's live blocks and mapped ranges, in the same form as [`replay`]'s.
    fn layout(snapshot: &Snapshot) -> (BTreeMap<u64, u64>, Vec<(u64, u64)>) {
        let mut live = BTreeMap::new();
        let mut ranges = Vec::new();
        for seg in &snapshot.segments {
            for b in &seg.blocks {
                if b.allocated {
                    live.insert(seg.address + b.offset, b.requested);
                }
                ranges.push((seg.address + b.offset, b.size));
            }
        }
        ranges.sort_unstable();
        (live, merge(ranges.into_iter()))
    }

    /// A workload touching every event: small and large blocks, growth of an expandable
    /// segment, frees, cached memory given back (ends and holes), an out-of-memory.
    /// Returns the live blocks and the room that was left under the cap at the failure.
    fn workload(alloc: &mut CachingAllocator<SimulatedDevice>) -> (Vec<BlockHandle>, u64) {
        let mut live = Vec::new();
        let mut freed = Vec::new();
        for (i, bytes) in [1000, 3 * MIB, 700_000, 5 * MIB, 100, 13 * MIB, 2 * MIB]
            .into_iter()
            .enumerate()
        {
            let h = alloc.alloc(bytes).unwrap();
            // With plain segments, the 13 MiB block gets one of its own, which goes back whole.
            if [1, 4, 5].contains(&i) {
                freed.push(h);
            } else {
                live.push(h);
            }
        }
        for h in freed {
            alloc.dealloc(h).unwrap();
        }
        alloc.release_cached().unwrap();
        live.push(
            alloc
                .try_alloc_cached(300)
                .expect("the small segment has room"),
        );
        live.push(alloc.alloc(4 * MIB).unwrap());
        let reserved = alloc.stats().reserved_bytes;
        alloc.set_cap(Some(reserved + 2 * MIB)).unwrap();
        let Err(AllocError::OutOfMemory { cap, reserved, .. }) = alloc.alloc(64 * MIB) else {
            panic!("64 MiB cannot fit under the cap");
        };
        (live, cap.unwrap() - reserved)
    }

    fn traced_run(config: AllocatorConfig) {
        let mut alloc = CachingAllocator::with_config(SimulatedDevice::new(), config);
        let granule = alloc.device().granularity();
        alloc.record_trace(true);
        let (live, room) = workload(&mut alloc);
        let history = alloc.history();
        let trace = history.trace.clone().expect("recording is on");
        assert_tiles(&history.snapshot, granule);

        let (blocks, mapped) = replay(&trace);
        let (snapshot_blocks, snapshot_mapped) = layout(&history.snapshot);
        assert_eq!(blocks, snapshot_blocks, "the trace's live blocks");
        assert_eq!(mapped, snapshot_mapped, "the trace's mapped memory");
        assert_eq!(
            mapped.iter().map(|&(_, len)| len).sum::<u64>(),
            history.snapshot.stats.reserved_bytes
        );
        for h in &live {
            assert_eq!(blocks.get(&h.address()), Some(&h.size()));
        }

        let allocs = trace
            .iter()
            .filter(|e| matches!(e, TraceEvent::Alloc { .. }))
            .count() as u64;
        let frees = trace
            .iter()
            .filter(|e| matches!(e, TraceEvent::Free { .. }))
            .count() as u64;
        let stats = history.snapshot.stats;
        assert_eq!((allocs, frees), (stats.alloc_count, stats.free_count));
        assert!(
            trace.iter().any(|e| matches!(
                e,
                TraceEvent::SegmentFree { .. } | TraceEvent::SegmentUnmap { .. }
            )),
            "release_cached gave memory back"
        );
        let Some(&TraceEvent::Oom { bytes, free }) = trace.last() else {
            panic!("the failed allocation ends the trace: {:?}", trace.last());
        };
        assert_eq!(bytes, 64 * MIB);
        assert_eq!(free, room, "the room left under the cap");
        // The requests alone are the replay trace: allocations by the size asked.
        assert!(trace.iter().any(|e| matches!(
            e,
            TraceEvent::Alloc { bytes: 1000, size, .. } if *size == round_size(1000).unwrap()
        )));

        assert_eq!(
            alloc.take_trace(),
            trace,
            "taking returns what was recorded"
        );
        assert_eq!(
            alloc.history().trace,
            Some(Vec::new()),
            "and leaves it on, empty"
        );
        alloc.record_trace(false);
        alloc.alloc(1).unwrap();
        assert_eq!(alloc.history().trace, None);
        assert!(alloc.take_trace().is_empty());
    }

    #[test]
    fn the_trace_replays_to_the_snapshot_with_expandable_segments() {
        traced_run(AllocatorConfig::default());
    }

    #[test]
    fn the_trace_replays_to_the_snapshot_with_plain_segments() {
        traced_run(AllocatorConfig {
            expandable_segments: false,
            ..AllocatorConfig::default()
        });
    }
}
