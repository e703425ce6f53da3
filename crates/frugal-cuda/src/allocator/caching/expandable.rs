//! Expandable segments: where a request is mapped into one (the unmapped gap that takes it
//! with the fewest granules), mapping granules and merging them with the free blocks around
//! them, and unmapping the free granules a release gives back.

use super::{
    Block, CachingAllocator, Ceiling, FreeKey, GrowError, Release, Segment, grow_error, pool_index,
};
use crate::allocator::device::DeviceMemory;
use crate::allocator::trace::TraceEvent;
use crate::allocator::{AllocError, BlockHandle, Pool, SegmentId};

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Unmaps every whole granule inside the free blocks of expandable segment `id` (only its
    /// last block with [`Release::Ends`]), keeping the parts of those blocks that share a
    /// granule with a live block, and stopping once `enough` bytes are unmapped (a block's
    /// last granules go first). Returns the bytes unmapped.
    pub(super) fn unmap_free_granules(
        &mut self,
        id: u64,
        what: Release,
        enough: u64,
        keep: Option<KeptRange>,
    ) -> Result<u64, AllocError> {
        let g = self.granularity;
        let Some(seg) = self.segments.get(&id) else {
            return Ok(0);
        };
        let (base, pool) = (seg.base, pool_index(seg.pool));
        let last = seg.blocks.last_key_value().map(|(&offset, _)| offset);
        let free_blocks: Vec<(u64, u64)> = seg
            .blocks
            .iter()
            .filter(|(offset, b)| {
                b.live.is_none()
                    && (what == Release::Holes || Some(**offset) == last)
                    && keep.is_none_or(|k| **offset + b.size <= k.start || **offset >= k.end)
            })
            .map(|(&offset, b)| (offset, b.size))
            .collect();
        let mut released = 0;
        for (offset, size) in free_blocks {
            if released >= enough {
                break;
            }
            let end = (offset + size) / g * g;
            let whole = offset.next_multiple_of(g);
            if whole >= end {
                continue;
            }
            let wanted = (enough - released)
                .checked_next_multiple_of(g)
                .unwrap_or(u64::MAX);
            let start = whole.max(end.saturating_sub(wanted));
            self.device.unmap(base, start, end - start)?;
            if let Some(trace) = &mut self.trace {
                trace.push(TraceEvent::SegmentUnmap {
                    segment: SegmentId(id),
                    address: base + start,
                    size: end - start,
                });
            }
            let Some(seg) = self.segments.get_mut(&id) else {
                break;
            };
            let free = &mut self.free[pool];
            free.remove(&(size, id, offset));
            seg.blocks.remove(&offset);
            for (part, part_size) in [(offset, start - offset), (end, offset + size - end)] {
                if part_size > 0 {
                    seg.blocks.insert(
                        part,
                        Block {
                            size: part_size,
                            live: None,
                        },
                    );
                    free.insert((part_size, id, part));
                }
            }
            let trim = end - start;
            self.st.unmapped_bytes += trim;
            seg.mapped -= trim;
            self.st.reserved_bytes -= trim;
            self.st.free_bytes -= trim;
            self.st.device_frees += 1;
            released += trim;
        }
        Ok(released)
    }

    /// Records `[at, at + size)` of segment `id`, just mapped, as a free block merged with the
    /// free blocks that touch it; returns the merged block's free-index key.
    fn insert_mapped(&mut self, id: u64, at: u64, size: u64) -> FreeKey {
        let seg = self
            .segments
            .get_mut(&id)
            .expect("growth names a live segment");
        let free = &mut self.free[pool_index(seg.pool)];
        let (mut start, mut merged) = (at, size);
        if let Some((&prev, &pb)) = seg.blocks.range(..at).next_back()
            && pb.live.is_none()
            && prev + pb.size == at
        {
            free.remove(&(pb.size, id, prev));
            start = prev;
            merged += pb.size;
        }
        if let Some(nb) = seg.blocks.get(&(at + size)).copied()
            && nb.live.is_none()
        {
            free.remove(&(nb.size, id, at + size));
            seg.blocks.remove(&(at + size));
            merged += nb.size;
        }
        seg.blocks.insert(
            start,
            Block {
                size: merged,
                live: None,
            },
        );
        seg.mapped += size;
        free.insert((merged, id, start));
        (merged, id, start)
    }

    /// Where an expandable segment of `pool` takes a request of `rounded` bytes with the
    /// fewest granules mapped: an unmapped range and the free blocks touching it.
    pub(super) fn best_gap(&self, pool: Pool, rounded: u64) -> Option<BestGap> {
        if pool == Pool::Small || !self.expandable {
            return None;
        }
        let mut best: Option<BestGap> = None;
        for (&id, seg) in &self.segments {
            let Some(virtual_size) = seg.expandable.filter(|_| seg.pool == pool) else {
                continue;
            };
            for gap in unmapped_gaps(seg, virtual_size) {
                let Some(growth) = gap.growth_for(rounded, self.granularity) else {
                    continue;
                };
                if best.is_none_or(|b| growth < b.growth) {
                    best = Some(BestGap {
                        growth,
                        at: gap.start,
                        kept: KeptRange {
                            segment: id,
                            start: gap.start - gap.free_before,
                            end: gap.end + gap.free_after,
                        },
                    });
                }
            }
        }
        best
    }

    /// Maps granules into an expandable segment of `pool` where the fewest are needed: an
    /// unmapped gap or the unmapped end of its range, counting the free blocks that touch it
    /// (with which the new memory merges). If no segment has room, makes a new one.
    pub(super) fn grow_expandable(
        &mut self,
        pool: Pool,
        rounded: u64,
        ceiling: Ceiling,
    ) -> Result<BlockHandle, GrowError> {
        let g = self.granularity;
        if let Some(BestGap {
            growth,
            kept: KeptRange { segment: id, .. },
            at,
        }) = self.best_gap(pool, rounded)
        {
            self.check_cap(growth, ceiling)?;
            let Some(seg) = self.segments.get(&id) else {
                return Err(GrowError::DeviceOom);
            };
            let base = seg.base;
            self.device.map(base, at, growth).map_err(grow_error)?;
            if let Some(trace) = &mut self.trace {
                trace.push(TraceEvent::SegmentMap {
                    segment: SegmentId(id),
                    address: base + at,
                    size: growth,
                });
            }
            let key = self.insert_mapped(id, at, growth);
            self.add_reserved(growth);
            self.st.mapped_bytes += growth;
            self.st.device_allocs += 1;
            self.st.segment_growths += 1;
            return Ok(self.take(key, rounded));
        }
        let mapped = rounded
            .checked_next_multiple_of(g)
            .ok_or(GrowError::DeviceOom)?;
        let virtual_size = self.virtual_size.max(mapped);
        self.check_cap(mapped, ceiling)?;
        let base = self.device.reserve(virtual_size).map_err(grow_error)?;
        if let Err(e) = self.device.map(base, 0, mapped) {
            // Nothing is mapped: giving the range back cannot leave memory behind, and a
            // failure to do so only leaks address space, so the map error is the one to report.
            let _ = self.device.release(base, virtual_size);
            return Err(grow_error(e));
        }
        let id = self.new_segment(pool, base, Some(virtual_size), mapped);
        self.st.mapped_bytes += mapped;
        Ok(self.take((mapped, id, 0), rounded))
    }
}

/// Free blocks of one segment that a release under the growth limit leaves mapped: those
/// around the unmapped range the request will be mapped into.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeptRange {
    pub(super) segment: u64,
    start: u64,
    end: u64,
}

/// The unmapped range of an expandable segment that takes a request with the least growth.
#[derive(Debug, Clone, Copy)]
pub(super) struct BestGap {
    /// Granule-rounded bytes to map.
    pub(super) growth: u64,
    /// Offset in the segment where they go.
    at: u64,
    /// The gap with the free blocks around it.
    pub(super) kept: KeptRange,
}

/// An unmapped range of an expandable segment: a gap between mapped blocks, or the rest of
/// its address range after the last one.
#[derive(Debug, Clone, Copy)]
struct UnmappedGap {
    start: u64,
    end: u64,
    /// Size of the free block that ends at `start`, 0 if none.
    free_before: u64,
    /// Size of the free block that starts at `end`, 0 if none.
    free_after: u64,
}

impl UnmappedGap {
    /// Granule-rounded bytes to map at `start` so that, merged with the free blocks touching
    /// it, a block of `rounded` bytes forms; `None` if the gap cannot give that much.
    fn growth_for(&self, rounded: u64, granularity: u64) -> Option<u64> {
        let need = rounded.checked_sub(self.free_before).filter(|&n| n > 0)?;
        let len = self.end - self.start;
        match need.checked_next_multiple_of(granularity) {
            Some(growth) if growth <= len => Some(growth),
            // Mapping all of it joins the free block after it.
            _ if need <= len + self.free_after => Some(len),
            _ => None,
        }
    }
}

/// The unmapped ranges of an expandable segment spanning `virtual_size` bytes, in address
/// order.
fn unmapped_gaps(seg: &Segment, virtual_size: u64) -> Vec<UnmappedGap> {
    let mut gaps = Vec::new();
    let mut cursor = 0;
    let mut free_before = 0;
    for (&offset, block) in &seg.blocks {
        if offset > cursor {
            gaps.push(UnmappedGap {
                start: cursor,
                end: offset,
                free_before,
                free_after: if block.live.is_none() { block.size } else { 0 },
            });
        }
        cursor = offset + block.size;
        free_before = if block.live.is_none() { block.size } else { 0 };
    }
    if virtual_size > cursor {
        gaps.push(UnmappedGap {
            start: cursor,
            end: virtual_size,
            free_before,
            free_after: 0,
        });
    }
    gaps
}
