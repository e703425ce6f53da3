//! Helpers shared by the allocator tests: an invariant checker that compares the allocator's
//! snapshot and statistics with the test's own list of live blocks and with the simulated
//! device's books.

#![allow(dead_code)]

pub mod trace;

use frugal_cuda::allocator::{
    BlockHandle, CachingAllocator, MIN_BLOCK_SIZE, SimulatedDevice, Snapshot,
};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Checks every structural invariant of the allocator against `live`, the blocks the test
/// holds. Returns a description of the first violation.
pub fn check_invariants(
    alloc: &CachingAllocator<SimulatedDevice>,
    live: &[BlockHandle],
) -> Result<(), String> {
    let snap = alloc.snapshot();
    let st = snap.stats;
    let dev = alloc.device();

    // Segments: blocks tile [0, mapped) exactly, aligned, and no two free blocks touch
    // (coalescing is complete).
    let mut free_bytes = 0;
    let mut largest_free = 0;
    let mut allocated_in_blocks = 0;
    let mut live_blocks = 0;
    let mut mapped_total = 0;
    for seg in &snap.segments {
        if seg.mapped_size > seg.virtual_size {
            return Err(format!("segment {:?} maps more than it spans", seg.id));
        }
        if seg.expandable && !seg.mapped_size.is_multiple_of(dev_granularity(alloc)) {
            return Err(format!("segment {:?} maps a partial granule", seg.id));
        }
        mapped_total += seg.mapped_size;
        let mut expected = 0;
        let mut prev_free = false;
        let mut in_blocks = 0;
        let granule = dev_granularity(alloc);
        for b in &seg.blocks {
            if b.offset < expected {
                return Err(format!(
                    "segment {:?}: block at {} overlaps the previous, which ends at {expected}",
                    seg.id, b.offset
                ));
            }
            if b.offset > expected {
                // An unmapped gap: only in expandable segments, whole granules.
                if !seg.expandable
                    || !expected.is_multiple_of(granule)
                    || !b.offset.is_multiple_of(granule)
                {
                    return Err(format!(
                        "segment {:?}: gap [{expected}, {}) in a plain segment or not granule-aligned",
                        seg.id, b.offset
                    ));
                }
                prev_free = false;
            }
            in_blocks += b.size;
            if b.size == 0 || !b.size.is_multiple_of(MIN_BLOCK_SIZE) {
                return Err(format!("segment {:?}: block size {}", seg.id, b.size));
            }
            if b.allocated {
                if b.requested > b.size || b.requested == 0 {
                    return Err(format!(
                        "segment {:?}: live block of {} holds {}",
                        seg.id, b.size, b.requested
                    ));
                }
                allocated_in_blocks += b.requested;
                live_blocks += 1;
                prev_free = false;
            } else {
                if prev_free {
                    return Err(format!(
                        "segment {:?}: two adjacent free blocks at {}",
                        seg.id, b.offset
                    ));
                }
                free_bytes += b.size;
                largest_free = largest_free.max(b.size);
                prev_free = true;
            }
            expected = b.offset + b.size;
        }
        if in_blocks != seg.mapped_size {
            return Err(format!(
                "segment {:?}: blocks hold {in_blocks} B, mapped {}",
                seg.id, seg.mapped_size
            ));
        }
        if expected > seg.virtual_size || (!seg.expandable && expected != seg.mapped_size) {
            return Err(format!(
                "segment {:?}: blocks end at {expected}, spans {}, mapped {}",
                seg.id, seg.virtual_size, seg.mapped_size
            ));
        }
    }

    // Statistics against the snapshot, the device and the test's shadow list.
    let shadow_allocated: u64 = live.iter().map(|h| h.size()).sum();
    let checks = [
        (
            "allocated vs live list",
            st.allocated_bytes,
            shadow_allocated,
        ),
        (
            "allocated vs blocks",
            st.allocated_bytes,
            allocated_in_blocks,
        ),
        ("active blocks", st.active_blocks, live.len() as u64),
        ("live blocks in snapshot", live_blocks, live.len() as u64),
        ("reserved vs mapped", st.reserved_bytes, mapped_total),
        (
            "reserved vs device",
            st.reserved_bytes,
            dev.physical_in_use(),
        ),
        ("free bytes", st.free_bytes, free_bytes),
        ("largest free block", st.largest_free_block, largest_free),
        ("segments", st.segments, snap.segments.len() as u64),
        (
            "device objects",
            (dev.plain_allocations() + dev.reservations()) as u64,
            snap.segments.len() as u64,
        ),
        (
            "unused reserved",
            st.unused_reserved_bytes(),
            mapped_total - shadow_allocated,
        ),
    ];
    for (what, got, want) in checks {
        if got != want {
            return Err(format!("{what}: allocator says {got}, expected {want}"));
        }
    }
    if st.peak_allocated_bytes < st.allocated_bytes || st.peak_reserved_bytes < st.reserved_bytes {
        return Err(format!("peak below current: {st:?}"));
    }
    if !(0.0..=1.0).contains(&st.fragmentation()) {
        return Err(format!("fragmentation {}", st.fragmentation()));
    }

    // Live blocks: inside the mapped part of their segment, backed by device memory, and no
    // two overlap.
    let mut ranges = Vec::with_capacity(live.len());
    for h in live {
        let Some(seg) = snap.segments.iter().find(|s| s.id == h.segment()) else {
            return Err(format!("live block {h:?} in a missing segment"));
        };
        if h.address() != seg.address + h.offset() {
            return Err(format!("block {h:?}: address is not segment base + offset"));
        }
        if h.offset() + h.size() > seg.virtual_size {
            return Err(format!(
                "block {h:?} ends past the {} B its segment spans",
                seg.virtual_size
            ));
        }
        if !h.address().is_multiple_of(MIN_BLOCK_SIZE) {
            return Err(format!("block {h:?} is misaligned"));
        }
        match seg.blocks.iter().find(|b| b.offset == h.offset()) {
            Some(b) if b.allocated && b.requested == h.size() => {}
            other => return Err(format!("block {h:?}: snapshot has {other:?}")),
        }
        if !dev.is_accessible(h.address(), h.size()) {
            return Err(format!("block {h:?} is not backed by device memory"));
        }
        ranges.push((h.address(), h.address() + h.size()));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(format!("live blocks overlap: {:?} and {:?}", w[0], w[1]));
        }
    }
    Ok(())
}

/// Every segment is one free block (or, for an expandable segment, nothing mapped).
pub fn all_segments_free(snap: &Snapshot) -> Result<(), String> {
    for seg in &snap.segments {
        let whole = seg.blocks.len() == 1
            && !seg.blocks[0].allocated
            && seg.blocks[0].size == seg.mapped_size;
        // After a release, an expandable segment's free memory may lie between unmapped gaps.
        let gapped = seg.expandable && seg.blocks.iter().all(|b| !b.allocated);
        let empty = seg.blocks.is_empty() && seg.mapped_size == 0;
        if !(whole || empty || gapped) {
            return Err(format!("segment not coalesced: {seg:?}"));
        }
    }
    Ok(())
}

fn dev_granularity(alloc: &CachingAllocator<SimulatedDevice>) -> u64 {
    use frugal_cuda::allocator::DeviceMemory;
    alloc.device().granularity()
}
