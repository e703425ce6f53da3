//! The allocation ladder: [`CachingAllocator::alloc`] and the [`Rung`]s it climbs until one
//! gives a block. The ladder is described once, on `alloc`; everything else names its rungs.

use serde::Serialize;

use super::{CachingAllocator, Ceiling, GrowError, Release, alloc_event, grow_error};
use crate::allocator::device::DeviceMemory;
use crate::allocator::stats::format_bytes;
use crate::allocator::trace::TraceEvent;
use crate::allocator::{
    AllocError, BlockHandle, OomInfo, OomReason, Pool, plain_segment_size, round_size,
};

/// A rung of the allocation ladder of [`CachingAllocator::alloc`]: what served an allocation
/// (see [`CachingAllocator::last_rung`]). The variants are declared in the order the ladder
/// climbs them without a growth limit; `alloc` says how a growth limit changes that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Rung {
    /// A cached free block of the request's pool, by best fit (the smallest that fits). No
    /// device call.
    CachedBlock,
    /// Memory from the device within the ceiling. With expandable segments (the large and huge
    /// pools), granules mapped into one of the pool's segments where the fewest are needed (an
    /// unmapped gap or the end of its range, merged with the free blocks touching it), or else
    /// a new expandable segment; otherwise a new plain segment.
    Growth,
    /// [`Rung::Growth`] once more, after giving back the cached memory no live block lies
    /// beyond: the unused plain segments of every pool and the free ends of expandable
    /// segments. Climbed only if something was given back.
    AfterReleasingEnds,
    /// A cached free block of any pool, by best fit: a hole in a huge segment for a large
    /// request, a large block for a small one. The block stays in its segment's pool; counted
    /// in [`Stats::cross_pool_allocs`](crate::allocator::Stats::cross_pool_allocs).
    AnyPool,
    /// [`Rung::Growth`] once more, after also unmapping the whole free granules between the
    /// live blocks of expandable segments, so that a request larger than every hole is mapped
    /// from their memory. Climbed only if something was given back.
    AfterReleasingHoles,
    /// The out-of-memory handler said it freed memory: the queued frees applied, then
    /// [`Rung::CachedBlock`], then everything cached given back
    /// ([`CachingAllocator::release_cached`]) and [`Rung::AnyPool`], then [`Rung::Growth`]
    /// under the cap.
    AfterOomHandler,
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// Allocates `size` bytes (rounded by [`round_size`]), climbing one ladder until a rung
    /// gives a block, as `malloc` in PyTorch's caching allocator does. This is the one
    /// description of the ladder; its rungs are the variants of [`Rung`], and
    /// [`Self::last_rung`] says which one served. In order:
    ///
    /// - [`Rung::CachedBlock`]: a free block of the request's pool, by best fit;
    /// - [`Rung::Growth`]: memory from the device, mapped into an expandable segment or in a
    ///   new segment;
    /// - [`Rung::AfterReleasingEnds`]: the cached memory no block lies beyond (unused plain
    ///   segments, the free ends of expandable ones) given back, then growth;
    /// - [`Rung::AnyPool`]: a free block of any pool;
    /// - [`Rung::AfterReleasingHoles`]: the free granules between live blocks of expandable
    ///   segments unmapped too (a request larger than every hole is then mapped from their
    ///   memory), then growth;
    /// - [`Rung::AfterOomHandler`]: if an out-of-memory handler is installed
    ///   ([`Self::set_oom_handler`]) and says it freed memory, the queued frees applied, then
    ///   a free block of the request's pool, everything cached given back and a free block of
    ///   any pool, and growth under the cap;
    /// - and when no rung gives a block, [`AllocError::OutOfMemory`], naming what refused the
    ///   last growth (the cap or the device).
    ///
    /// The growth rungs, from [`Rung::Growth`] to [`Rung::AfterReleasingHoles`], keep
    /// reserved memory within a ceiling, the cap. Under a growth limit
    /// ([`Self::set_growth_limit`]) they are climbed twice, before the handler is asked:
    ///
    /// - first with the limit as the ceiling (or the cap, if lower): [`Rung::AnyPool`] is
    ///   tried right after [`Rung::Growth`], before anything is given back, and the releasing
    ///   rungs give back only the bytes the request lacks, keeping the free blocks around the
    ///   unmapped range it would be mapped into;
    /// - then with the cap, as without a limit. An allocation that takes reserved memory past
    ///   the limit raises the limit to the bytes then reserved (counted in
    ///   [`Stats::growth_limit_passes`](crate::allocator::Stats::growth_limit_passes)).
    pub fn alloc(&mut self, size: u64) -> Result<BlockHandle, AllocError> {
        let reserved_before = self.st.reserved_bytes;
        let result = self.climb(size).map(|(handle, rung)| {
            self.last_rung = Some(rung);
            handle
        });
        if let Some(limit) = self.growth_limit
            && result.is_ok()
            && self.st.reserved_bytes > reserved_before.max(limit)
        {
            self.st.growth_limit_passes += 1;
            self.growth_limit = Some(self.st.reserved_bytes);
        }
        if let Some(trace) = &mut self.trace {
            match &result {
                Ok(handle) => trace.push(alloc_event(handle, size)),
                Err(AllocError::OutOfMemory {
                    requested,
                    reason,
                    cap,
                    reserved,
                    ..
                }) => trace.push(TraceEvent::Oom {
                    bytes: *requested,
                    free: match reason {
                        OomReason::Cap => cap.map_or(0, |cap| cap.saturating_sub(*reserved)),
                        OomReason::Device => 0,
                    },
                }),
                Err(_) => {}
            }
        }
        result
    }

    /// The rung that served the last successful allocation: of [`Self::alloc`], or a hit of
    /// [`Self::try_alloc_cached`] ([`Rung::CachedBlock`]). `None` before the first; a failed
    /// allocation leaves it as it was.
    pub fn last_rung(&self) -> Option<Rung> {
        self.last_rung
    }

    /// The ladder of [`Self::alloc`] (which records the outcome): the block and the rung that
    /// served it.
    fn climb(&mut self, size: u64) -> Result<(BlockHandle, Rung), AllocError> {
        self.flush();
        let rounded = round_size(size).ok_or(AllocError::SizeOverflow { requested: size })?;
        let pool = self.pool_for(rounded);
        let mut reason = OomReason::Device;
        if let Some(handle) = self.alloc_from_cache(pool, rounded) {
            return Ok((handle, Rung::CachedBlock));
        }
        // Under a growth limit the growth rungs are climbed twice: first with the limit as the
        // ceiling, so that cached memory is reused before more is reserved, then with the cap.
        let ceilings: &[Ceiling] = match self.growth_limit {
            Some(_) => &[Ceiling::GrowthLimit, Ceiling::Cap],
            None => &[Ceiling::Cap],
        };
        for &ceiling in ceilings {
            if let Some(served) = self.climb_to(pool, rounded, ceiling, &mut reason)? {
                return Ok(served);
            }
        }
        if self.ask_oom_handler(size, rounded, pool, reason) {
            self.flush();
            if let Some(handle) = self.alloc_from_cache(pool, rounded) {
                return Ok((handle, Rung::AfterOomHandler));
            }
            self.release_cached()?;
            if let Some(handle) = self.alloc_from_any_pool(rounded) {
                return Ok((handle, Rung::AfterOomHandler));
            }
            if let Some(handle) = self.try_grow(pool, rounded, Ceiling::Cap, &mut reason)? {
                return Ok((handle, Rung::AfterOomHandler));
            }
        }
        self.st.oom_count += 1;
        log::debug!(
            "frugal-cuda: allocation of {} failed ({reason:?}): {} reserved, {} allocated",
            format_bytes(rounded),
            format_bytes(self.st.reserved_bytes),
            format_bytes(self.st.allocated_bytes)
        );
        Err(AllocError::OutOfMemory {
            requested: size,
            rounded,
            pool,
            reason,
            cap: self.cap,
            reserved: self.st.reserved_bytes,
            allocated: self.st.allocated_bytes,
            largest_free_block: self.largest_free(pool),
        })
    }

    /// The growth rungs of [`Self::alloc`], from [`Rung::Growth`] to
    /// [`Rung::AfterReleasingHoles`], with reserved bytes kept within `ceiling`: the block and
    /// the rung that served it, or `None` with `reason` set to what refused the last growth.
    fn climb_to(
        &mut self,
        pool: Pool,
        rounded: u64,
        ceiling: Ceiling,
        reason: &mut OomReason,
    ) -> Result<Option<(BlockHandle, Rung)>, AllocError> {
        if let Some(handle) = self.try_grow(pool, rounded, ceiling, reason)? {
            return Ok(Some((handle, Rung::Growth)));
        }
        // Under the growth limit, memory already reserved is used first, and only what the
        // request lacks is given back: each granule given back is mapped again, one driver
        // call or more each. Where an expandable segment can take the request with the free
        // blocks around one of its unmapped ranges, those blocks stay and only the growth
        // they lack is given back elsewhere: giving them back too would map them again at
        // once.
        let mut keep = None;
        let enough = match (ceiling, self.growth_limit) {
            (Ceiling::GrowthLimit, Some(limit)) => {
                if let Some(handle) = self.alloc_from_any_pool(rounded) {
                    return Ok(Some((handle, Rung::AnyPool)));
                }
                let growth = match self.best_gap(pool, rounded) {
                    Some(best) => {
                        keep = Some(best.kept);
                        Some(best.growth)
                    }
                    None => rounded.checked_next_multiple_of(self.granularity.max(1)),
                };
                match growth.and_then(|g| self.st.reserved_bytes.checked_add(g)) {
                    Some(wanted) => wanted.saturating_sub(limit).max(1),
                    None => u64::MAX,
                }
            }
            _ => u64::MAX,
        };
        // Memory cached in unused segments (of either pool) may be what is missing.
        if self.release(Release::Ends, enough, keep)? > 0
            && let Some(handle) = self.try_grow(pool, rounded, ceiling, reason)?
        {
            return Ok(Some((handle, Rung::AfterReleasingEnds)));
        }
        // Free memory of the other pools (a hole in a huge segment, a large block for a small
        // request) is better than failing: pools separate sizes to limit fragmentation, not
        // to refuse memory that is there.
        if let Some(handle) = self.alloc_from_any_pool(rounded) {
            return Ok(Some((handle, Rung::AnyPool)));
        }
        // Holes between live blocks, each too small, may together hold the request.
        if self.release(Release::Holes, enough, keep)? > 0
            && let Some(handle) = self.try_grow(pool, rounded, ceiling, reason)?
        {
            return Ok(Some((handle, Rung::AfterReleasingHoles)));
        }
        Ok(None)
    }

    /// The growth every growth rung ends with: a new segment (or a segment's growth) within
    /// `ceiling`, or `None` with `reason` set to what refused it.
    fn try_grow(
        &mut self,
        pool: Pool,
        rounded: u64,
        ceiling: Ceiling,
        reason: &mut OomReason,
    ) -> Result<Option<BlockHandle>, AllocError> {
        match self.grow(pool, rounded, ceiling) {
            Ok(handle) => Ok(Some(handle)),
            Err(GrowError::Device(e)) => Err(e.into()),
            Err(GrowError::Cap) => {
                *reason = OomReason::Cap;
                Ok(None)
            }
            Err(GrowError::DeviceOom) => {
                *reason = OomReason::Device;
                Ok(None)
            }
        }
    }

    /// The start of [`Rung::AfterOomHandler`]: calls the out-of-memory handler, if any; whether
    /// it freed memory.
    fn ask_oom_handler(&mut self, size: u64, rounded: u64, pool: Pool, reason: OomReason) -> bool {
        if self.handler.is_none() {
            return false;
        }
        let info = OomInfo {
            requested: size,
            rounded,
            pool,
            reason,
            stats: self.stats(),
        };
        self.st.oom_handler_calls += 1;
        log::info!(
            "frugal-cuda: out of memory ({reason:?}) for {} with {} reserved and {} allocated: \
             calling the out-of-memory handler",
            format_bytes(rounded),
            format_bytes(self.st.reserved_bytes),
            format_bytes(self.st.allocated_bytes)
        );
        self.handler.as_mut().is_some_and(|handler| handler(&info))
    }

    /// Gets memory from the device for a request no cached block fits, and allocates it.
    fn grow(
        &mut self,
        pool: Pool,
        rounded: u64,
        ceiling: Ceiling,
    ) -> Result<BlockHandle, GrowError> {
        if pool != Pool::Small && self.expandable {
            return self.grow_expandable(pool, rounded, ceiling);
        }
        let size = plain_segment_size(rounded).ok_or(GrowError::DeviceOom)?;
        self.check_cap(size, ceiling)?;
        let base = self.device.alloc(size).map_err(grow_error)?;
        let id = self.new_segment(pool, base, None, size);
        Ok(self.take((size, id, 0), rounded))
    }
}
