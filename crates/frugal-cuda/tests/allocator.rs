//! Unit tests of the caching allocator on a simulated device (no GPU needed).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{GIB, KIB, MIB, all_segments_free, check_invariants};
use frugal_cuda::allocator::{
    AllocError, AllocatorConfig, BlockHandle, CachingAllocator, LARGE_SEGMENT, MIN_BLOCK_SIZE,
    OomInfo, OomReason, Pool, Rung, SMALL_SEGMENT, SMALL_SIZE, SimulatedDevice, format_bytes,
    plain_segment_size, round_size,
};

fn plain() -> CachingAllocator<SimulatedDevice> {
    CachingAllocator::new(SimulatedDevice::new().without_vmm())
}

fn expandable() -> CachingAllocator<SimulatedDevice> {
    let a = CachingAllocator::new(SimulatedDevice::new());
    assert!(a.expandable_segments());
    a
}

fn ok(a: &CachingAllocator<SimulatedDevice>, live: &[BlockHandle]) {
    if let Err(e) = check_invariants(a, live) {
        panic!("invariant broken: {e}\n{:#?}", a.snapshot());
    }
}

#[test]
fn rounding_and_pools() {
    assert_eq!(round_size(0), Some(MIN_BLOCK_SIZE));
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(u64::MAX), None);
    assert_eq!(Pool::for_size(SMALL_SIZE), Pool::Small);
    assert_eq!(Pool::for_size(SMALL_SIZE + 512), Pool::Large);
    assert_eq!(plain_segment_size(512), Some(SMALL_SEGMENT));
    assert_eq!(plain_segment_size(SMALL_SIZE), Some(SMALL_SEGMENT));
    assert_eq!(plain_segment_size(SMALL_SIZE + 512), Some(LARGE_SEGMENT));
    assert_eq!(plain_segment_size(10 * MIB - 512), Some(LARGE_SEGMENT));
    assert_eq!(plain_segment_size(10 * MIB), Some(10 * MIB));
    assert_eq!(plain_segment_size(11 * MIB), Some(12 * MIB));

    let mut a = plain();
    let zero = a.alloc(0).unwrap();
    let one = a.alloc(1).unwrap();
    let odd = a.alloc(1000).unwrap();
    assert_eq!((zero.size(), one.size(), odd.size()), (512, 512, 1024));
    // Zero-byte blocks are real blocks: distinct addresses.
    assert_ne!(zero.address(), one.address());
    assert_eq!(a.alignment(), 512);
    ok(&a, &[zero, one, odd]);
    assert_eq!(a.stats().allocated_bytes, 2048);
    assert_eq!(a.stats().reserved_bytes, SMALL_SEGMENT);
}

#[test]
fn best_fit_chooses_the_smallest_fitting_block() {
    let mut a = plain();
    // One small segment: holes of 100, 300 and 200 KiB separated by live 4 KiB blocks.
    let h100 = a.alloc(100 * KIB).unwrap();
    let s1 = a.alloc(4 * KIB).unwrap();
    let h300 = a.alloc(300 * KIB).unwrap();
    let s2 = a.alloc(4 * KIB).unwrap();
    let h200 = a.alloc(200 * KIB).unwrap();
    let s3 = a.alloc(4 * KIB).unwrap();
    assert_eq!(a.stats().segments, 1);
    for h in [h100, h300, h200] {
        a.dealloc(h).unwrap();
    }
    ok(&a, &[s1, s2, s3]);
    let hits = a.stats().cache_hits;

    // 150 KiB fits the 200 and 300 KiB holes and the tail (over 1 MiB): the 200 KiB one wins.
    let x = a.alloc(150 * KIB).unwrap();
    assert_eq!(x.address(), h200.address());
    // 250 KiB: only the 300 KiB hole and the tail fit; the hole is smaller.
    let y = a.alloc(250 * KIB).unwrap();
    assert_eq!(y.address(), h300.address());
    // 100 KiB: exactly the 100 KiB hole.
    let z = a.alloc(100 * KIB).unwrap();
    assert_eq!(z.address(), h100.address());
    assert_eq!(a.stats().cache_hits, hits + 3);
    assert_eq!(a.stats().segments, 1);
    ok(&a, &[s1, s2, s3, x, y, z]);
}

#[test]
fn splitting_follows_the_pool_rules() {
    // Small pool: any remainder of at least 512 B is split off.
    let mut a = plain();
    let h = a.alloc(1000).unwrap();
    let seg = &a.snapshot().segments[0];
    assert_eq!(seg.blocks.len(), 2);
    assert_eq!((seg.blocks[0].size, seg.blocks[0].allocated), (1024, true));
    assert_eq!(
        (seg.blocks[1].size, seg.blocks[1].allocated),
        (SMALL_SEGMENT - 1024, false)
    );
    ok(&a, &[h]);

    // Plain large segment: 3 MiB in a 20 MiB segment leaves 17 MiB, which is split off.
    let mut a = plain();
    let h = a.alloc(3 * MIB).unwrap();
    let seg = &a.snapshot().segments[0];
    assert_eq!(seg.mapped_size, LARGE_SEGMENT);
    assert_eq!(seg.blocks[0].size, 3 * MIB);
    assert_eq!(seg.blocks[1].size, 17 * MIB);
    ok(&a, &[h]);

    // Plain large segment: a remainder of at most 1 MiB stays inside the block. 19.5 MiB gets
    // a 20 MiB segment; the block is 20 MiB, the handle and `allocated` say 19.5 MiB.
    let mut a = plain();
    let h = a.alloc(19 * MIB + 512 * KIB).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].size, 20 * MIB);
    assert_eq!(h.size(), 19 * MIB + 512 * KIB);
    assert_eq!(snap.stats.allocated_bytes, 19 * MIB + 512 * KIB);
    assert_eq!(snap.stats.unused_reserved_bytes(), 512 * KIB);
    ok(&a, &[h]);

    // Expandable segment: 3 MiB + 512 B maps 4 MiB; the remainder is split off even though it
    // is below 1 MiB, so it can merge with the next growth.
    let mut a = expandable();
    let h = a.alloc(3 * MIB + 512).unwrap();
    let seg = &a.snapshot().segments[0];
    assert_eq!(seg.mapped_size, 4 * MIB);
    assert_eq!(seg.blocks[1].size, MIB - 512);
    ok(&a, &[h]);
}

#[test]
fn coalescing_restores_one_free_block_per_segment() {
    for mut a in [plain(), expandable()] {
        let sizes = [
            700 * KIB,
            3 * KIB,
            64 * KIB,
            2 * MIB,
            5 * MIB,
            3 * MIB,
            12 * MIB,
            1,
        ];
        let mut live: Vec<BlockHandle> = sizes.iter().map(|&s| a.alloc(s).unwrap()).collect();
        // Enough neighbours in each pool to exercise merging with the previous block, the
        // next block and both.
        live.extend(sizes.iter().map(|&s| a.alloc(s).unwrap()));
        ok(&a, &live);
        // Free every other block, then the rest: the second pass merges on both sides.
        let (even, odd): (Vec<_>, Vec<_>) = live.iter().enumerate().partition(|(i, _)| i % 2 == 0);
        let odd: Vec<BlockHandle> = odd.into_iter().map(|(_, h)| *h).collect();
        for (_, h) in even {
            a.dealloc(*h).unwrap();
        }
        ok(&a, &odd);
        for (i, h) in odd.iter().enumerate() {
            a.dealloc(*h).unwrap();
            ok(&a, &odd[i + 1..]);
        }
        all_segments_free(&a.snapshot()).unwrap();
        a.release_cached().unwrap();
        assert_eq!(a.stats().reserved_bytes, 0);
        assert_eq!(a.stats().segments, 0);
        ok(&a, &[]);
    }
}

#[test]
fn a_freed_middle_block_merges_with_both_neighbours() {
    let mut a = plain();
    let x = a.alloc(10 * KIB).unwrap();
    let y = a.alloc(10 * KIB).unwrap();
    let z = a.alloc(10 * KIB).unwrap();
    let keep = a.alloc(10 * KIB).unwrap();
    a.dealloc(x).unwrap();
    a.dealloc(z).unwrap();
    assert_eq!(a.snapshot().segments[0].blocks.len(), 5);
    a.dealloc(y).unwrap();
    let blocks = &a.snapshot().segments[0].blocks;
    assert_eq!(blocks.len(), 3);
    assert_eq!((blocks[0].size, blocks[0].allocated), (30 * KIB, false));
    ok(&a, &[keep]);
}

#[test]
fn small_and_large_pools_are_separate() {
    let mut a = plain();
    let small = a.alloc(SMALL_SIZE).unwrap();
    let large = a.alloc(SMALL_SIZE + 1).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 2);
    let pool_of = |h: &BlockHandle| snap.segments.iter().find(|s| s.id == h.segment()).unwrap();
    assert_eq!(pool_of(&small).pool, Pool::Small);
    assert_eq!(pool_of(&large).pool, Pool::Large);
    assert_eq!(pool_of(&small).mapped_size, SMALL_SEGMENT);
    assert_eq!(pool_of(&large).mapped_size, LARGE_SEGMENT);
    ok(&a, &[small, large]);

    // A free small segment is not used for a large request, nor a large one for small.
    a.dealloc(small).unwrap();
    a.dealloc(large).unwrap();
    let big = a.alloc(SMALL_SIZE + 512).unwrap();
    assert_eq!(big.segment(), large.segment());
    let little = a.alloc(4 * KIB).unwrap();
    assert_eq!(little.segment(), small.segment());
    // The small segment has 2 MiB - 4 KiB free: one more 1 MiB block fits there, the next
    // one gets a new small segment rather than a piece of the large segment's 19 MiB.
    let mut live = vec![big, little];
    for _ in 0..2 {
        live.push(a.alloc(SMALL_SIZE).unwrap());
    }
    assert_eq!(a.stats().segments, 3);
    ok(&a, &live);
}

#[test]
fn expandable_segment_grows_instead_of_adding_segments() {
    let mut a = expandable();
    let sizes = [
        3 * MIB,
        5 * MIB,
        50 * MIB,
        100 * MIB,
        7 * MIB + 3,
        300 * MIB,
    ];
    let mut live = Vec::new();
    for &s in &sizes {
        live.push(a.alloc(s).unwrap());
        ok(&a, &live);
    }
    let st = a.stats();
    assert_eq!(st.segments, 1, "{st:?}");
    assert_eq!(st.expandable_segments, 1);
    assert_eq!(a.device().reservations(), 1);
    assert_eq!(a.device().plain_allocations(), 0);
    assert_eq!(st.segment_growths, sizes.len() as u64 - 1);
    // Growth is by whole granules, and a free tail is reused: reserved is within one granule
    // of what is allocated.
    assert!(
        st.reserved_bytes - st.allocated_bytes < 2 * MIB,
        "reserved {} allocated {}",
        st.reserved_bytes,
        st.allocated_bytes
    );

    // Freeing the last block and asking for a bigger one extends the free tail in place.
    let last = live.pop().unwrap();
    a.dealloc(last).unwrap();
    let bigger = a.alloc(310 * MIB).unwrap();
    assert_eq!(bigger.address(), last.address());
    assert_eq!(a.stats().segments, 1);
    live.push(bigger);
    ok(&a, &live);

    // Releasing the cache unmaps the free granules at the end only.
    let bigger = live.pop().unwrap();
    a.dealloc(bigger).unwrap();
    let released = a.release_cached().unwrap();
    assert!(released >= 310 * MIB);
    let end = live.iter().map(|h| h.offset() + h.size()).max().unwrap();
    assert_eq!(a.stats().reserved_bytes, end.next_multiple_of(2 * MIB));
    ok(&a, &live);

    // The same sequence without virtual memory management takes four segments: one of 20 MiB
    // (shared by the 3, 5 and 7 MiB requests) and one each for 50, 100 and 300 MiB.
    let mut p = plain();
    let live: Vec<_> = sizes.iter().map(|&s| p.alloc(s).unwrap()).collect();
    assert_eq!(p.stats().segments, 4);
    ok(&p, &live);
}

#[test]
fn release_above_gives_back_only_down_to_the_limit_and_never_live_memory() {
    for mut a in [plain(), expandable()] {
        let live: Vec<_> = (0..8).map(|_| a.alloc(64 * MIB).unwrap()).collect();
        let (kept, freed) = live.split_at(4);
        for &block in freed {
            a.dealloc(block).unwrap();
        }
        let reserved = a.stats().reserved_bytes;
        assert_eq!(
            a.release_above(reserved).unwrap(),
            0,
            "nothing above the limit"
        );
        let limit = reserved - 100 * MIB;
        let released = a.release_above(limit).unwrap();
        let after = a.stats().reserved_bytes;
        assert_eq!(after, reserved - released);
        assert!(
            after <= limit,
            "{after} B reserved over the {limit} B limit"
        );
        ok(&a, kept);
        // Below what is live, all that is cached goes and the live blocks stay.
        a.release_above(0).unwrap();
        assert!(a.stats().reserved_bytes >= 4 * 64 * MIB);
        assert_eq!(a.stats().allocated_bytes, 4 * 64 * MIB);
        ok(&a, kept);
    }
}

#[test]
fn expandable_segments_can_be_turned_off() {
    let config = AllocatorConfig {
        expandable_segments: false,
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(SimulatedDevice::new(), config);
    assert!(!a.expandable_segments());
    let h = a.alloc(30 * MIB).unwrap();
    assert_eq!(a.device().reservations(), 0);
    assert_eq!(a.device().plain_allocations(), 1);
    ok(&a, &[h]);
}

#[test]
fn cap_refuses_with_a_clear_message() {
    let config = AllocatorConfig {
        cap: Some(64 * MIB),
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(SimulatedDevice::new(), config);
    let held = a.alloc(40 * MIB).unwrap();
    let err = a.alloc(30 * MIB).unwrap_err();
    match &err {
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
            assert_eq!(*requested, 30 * MIB);
            assert_eq!(*rounded, 30 * MIB);
            assert_eq!(*pool, Pool::Large);
            assert_eq!(*reason, OomReason::Cap);
            assert_eq!(*cap, Some(64 * MIB));
            assert_eq!(*reserved, 40 * MIB);
            assert_eq!(*allocated, 40 * MIB);
            assert_eq!(*largest_free_block, 0);
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    let msg = err.to_string();
    for part in [
        "30.00 MiB",
        "cap of 64.00 MiB",
        "reserved 40.00 MiB",
        "allocated 40.00 MiB",
        "largest free block 0 B",
    ] {
        assert!(msg.contains(part), "{part:?} missing from {msg:?}");
    }
    println!("{msg}");
    assert_eq!(a.stats().oom_count, 1);
    assert_eq!(a.stats().reserved_bytes, 40 * MIB);
    ok(&a, &[held]);
}

#[test]
fn cap_changes_at_run_time() {
    for mut a in [plain(), expandable()] {
        a.set_cap(Some(64 * MIB)).unwrap();
        let x = a.alloc(40 * MIB).unwrap();
        assert!(a.alloc(40 * MIB).is_err());
        a.set_cap(Some(128 * MIB)).unwrap();
        let y = a.alloc(40 * MIB).unwrap();
        a.set_cap(None).unwrap();
        let z = a.alloc(GIB).unwrap();
        ok(&a, &[x, y, z]);
        assert!(a.stats().reserved_bytes > 128 * MIB);

        // Lowering the cap below what is reserved releases what is cached, keeps what is live,
        // and stops growth.
        a.dealloc(z).unwrap();
        a.set_cap(Some(100 * MIB)).unwrap();
        assert!(a.stats().reserved_bytes <= 100 * MIB, "{:?}", a.stats());
        assert!(a.alloc(30 * MIB).is_err());
        a.dealloc(y).unwrap();
        let w = a.alloc(30 * MIB).unwrap();
        assert!(a.stats().reserved_bytes <= 100 * MIB);
        ok(&a, &[x, w]);
        assert_eq!(a.cap(), Some(100 * MIB));
        assert_eq!(a.stats().cap, Some(100 * MIB));
    }
}

#[test]
fn a_growth_limit_reuses_the_holes_between_live_blocks_before_reserving_more() {
    // Two 30 MiB holes between live blocks: a 50 MiB request fits neither.
    let fragment = |a: &mut CachingAllocator<SimulatedDevice>| {
        let blocks: Vec<_> = (0..4).map(|_| a.alloc(30 * MIB).unwrap()).collect();
        a.dealloc(blocks[0]).unwrap();
        a.dealloc(blocks[2]).unwrap();
        [blocks[1], blocks[3]]
    };
    let mut free_growth = expandable();
    let [b, d] = fragment(&mut free_growth);
    let big = free_growth.alloc(50 * MIB).unwrap();
    ok(&free_growth, &[b, d, big]);
    assert_eq!(
        free_growth.stats().reserved_bytes,
        170 * MIB,
        "plain growth"
    );

    let mut limited = expandable();
    limited.set_growth_limit(Some(130 * MIB));
    let [b, d] = fragment(&mut limited);
    let big = limited.alloc(50 * MIB).unwrap();
    ok(&limited, &[b, d, big]);
    let st = limited.stats();
    // Only the 40 MiB the request lacked were given back (and mapped again for it); the
    // other 20 MiB of the holes stay cached.
    assert_eq!(st.reserved_bytes, 130 * MIB, "{st:?}");
    assert_eq!(st.allocated_bytes, 110 * MIB);
    assert_eq!(
        (st.growth_limit, st.growth_limit_passes),
        (Some(130 * MIB), 0)
    );
    assert_eq!(st.peak_reserved_bytes, 130 * MIB);
}

#[test]
fn a_growth_limit_keeps_the_free_end_a_request_grows_into_and_gives_back_only_the_growth() {
    // [hole 20 MiB | x 30 MiB live | free end 50 MiB]: a 60 MiB request fits no block, but
    // the free end and 10 MiB more would hold it. Giving the free end back to map it again
    // at once would move 60 MiB; only the 10 MiB lacked should move, out of the hole.
    let mut a = expandable();
    let h = a.alloc(20 * MIB).unwrap();
    let x = a.alloc(30 * MIB).unwrap();
    let y = a.alloc(50 * MIB).unwrap();
    a.dealloc(h).unwrap();
    a.dealloc(y).unwrap();
    a.set_growth_limit(Some(100 * MIB));
    let z = a.alloc(60 * MIB).unwrap();
    ok(&a, &[x, z]);
    assert_eq!(
        z.address(),
        x.address() + 30 * MIB,
        "the request took the free end"
    );
    let st = a.stats();
    assert_eq!(st.reserved_bytes, 100 * MIB, "{st:?}");
    assert_eq!(st.growth_limit_passes, 0);
    assert_eq!(st.unmapped_bytes, 10 * MIB, "{st:?}");
    assert_eq!(st.mapped_bytes, 110 * MIB, "{st:?}");
}

#[test]
fn a_growth_limit_never_fails_an_allocation_and_rises_to_what_was_needed() {
    for mut a in [plain(), expandable()] {
        a.set_growth_limit(Some(50 * MIB));
        let x = a.alloc(40 * MIB).unwrap();
        let y = a.alloc(40 * MIB).unwrap();
        ok(&a, &[x, y]);
        let st = a.stats();
        assert!(st.reserved_bytes >= 80 * MIB, "{st:?}");
        assert_eq!(st.growth_limit_passes, 1);
        assert_eq!(a.growth_limit(), Some(st.reserved_bytes));
        assert_eq!(st.oom_count, 0);
        // The hard cap still refuses.
        a.set_cap(Some(st.reserved_bytes)).unwrap();
        assert!(matches!(
            a.alloc(40 * MIB),
            Err(AllocError::OutOfMemory {
                reason: OomReason::Cap,
                ..
            })
        ));
    }
}

#[test]
fn oom_handler_is_called_and_retry_succeeds_when_it_frees() {
    let mut a = expandable();
    a.set_cap(Some(100 * MIB)).unwrap();
    let victim = a.alloc(60 * MIB).unwrap();
    let queue = a.free_queue();
    let seen: Arc<Mutex<Vec<OomInfo>>> = Arc::default();
    let seen2 = seen.clone();
    // Like Frugal's budget: evict a tensor (queue its block for freeing) and say so.
    let mut to_evict = Some(victim);
    a.set_oom_handler(move |info| {
        seen2.lock().unwrap().push(info.clone());
        match to_evict.take() {
            Some(h) => {
                queue.push(h);
                true
            }
            None => false,
        }
    });
    let h = a.alloc(60 * MIB).unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].requested, 60 * MIB);
        assert_eq!(seen[0].reason, OomReason::Cap);
        assert_eq!(seen[0].stats.allocated_bytes, 60 * MIB);
    }
    let st = a.stats();
    assert_eq!(st.oom_handler_calls, 1);
    assert_eq!(st.oom_count, 0);
    assert_eq!(st.allocated_bytes, 60 * MIB);
    assert!(st.reserved_bytes <= 100 * MIB);
    ok(&a, &[h]);

    // Nothing left to evict: the handler says so, and the allocation fails after one call.
    let err = a.alloc(60 * MIB).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory { .. }));
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(a.stats().oom_count, 1);
    // A double free pushed on the queue is refused and counted, not fatal.
    a.free_queue().push(victim);
    assert_eq!(a.flush(), 0);
    assert_eq!(a.stats().rejected_queued_frees, 1);
    ok(&a, &[h]);
}

#[test]
fn handler_not_called_when_cached_memory_is_enough() {
    let mut a = plain();
    a.set_cap(Some(64 * MIB)).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    a.set_oom_handler(move |_| {
        c.fetch_add(1, Ordering::Relaxed);
        false
    });
    // 40 MiB cached in its own segment; a 50 MiB request needs that segment released first.
    let x = a.alloc(40 * MIB).unwrap();
    a.dealloc(x).unwrap();
    let y = a.alloc(50 * MIB).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    assert_eq!(a.stats().reserved_bytes, 50 * MIB);
    ok(&a, &[y]);
    a.clear_oom_handler();
}

#[test]
fn driver_oom_releases_cached_segments_and_retries() {
    // Plain segments: 30 MiB cached, 64 MiB device, a 40 MiB request.
    let mut a = CachingAllocator::new(SimulatedDevice::new().without_vmm().with_capacity(64 * MIB));
    let x = a.alloc(30 * MIB).unwrap();
    a.dealloc(x).unwrap();
    let y = a.alloc(40 * MIB).unwrap();
    let c = a.device().counters();
    assert_eq!(c.out_of_memory, 1, "{c:?}");
    assert_eq!(c.frees, 1);
    assert_eq!(a.stats().reserved_bytes, 40 * MIB);
    ok(&a, &[y]);

    // Expandable: cached small segments hold the memory the large pool needs.
    let mut a = CachingAllocator::new(SimulatedDevice::new().with_capacity(64 * MIB));
    // 32 blocks of 1 MiB fill 16 small segments of 2 MiB.
    let smalls: Vec<_> = (0..32).map(|_| a.alloc(SMALL_SIZE).unwrap()).collect();
    assert_eq!(a.stats().reserved_bytes, 32 * MIB);
    for h in smalls {
        a.dealloc(h).unwrap();
    }
    let big = a.alloc(50 * MIB).unwrap();
    let c = a.device().counters();
    assert!(c.out_of_memory >= 1, "{c:?}");
    assert_eq!(c.frees, 16);
    ok(&a, &[big]);

    // When nothing is cached, the device's refusal is reported as such.
    let err = a.alloc(30 * MIB).unwrap_err();
    match err {
        AllocError::OutOfMemory { reason, .. } => assert_eq!(reason, OomReason::Device),
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("device has no memory left"),
        "{err}"
    );

    // The device gets more memory (another process exited): the same request now works.
    a.device_mut().set_capacity(Some(GIB));
    let more = a.alloc(30 * MIB).unwrap();
    ok(&a, &[big, more]);
}

#[test]
fn double_free_and_foreign_handles_are_refused() {
    let mut a = expandable();
    let x = a.alloc(5 * MIB).unwrap();
    a.dealloc(x).unwrap();
    let before = a.stats();
    assert!(matches!(a.dealloc(x), Err(AllocError::DoubleFree { .. })));
    assert_eq!(a.stats(), before);

    // A stale handle whose bytes now belong to someone else is refused too.
    let y = a.alloc(5 * MIB).unwrap();
    assert_eq!(y.address(), x.address());
    let err = a.dealloc(x).unwrap_err();
    assert!(matches!(err, AllocError::DoubleFree { .. }));
    assert!(err.to_string().contains("double free"), "{err}");
    ok(&a, &[y]);

    // A handle from another allocator.
    let mut b = expandable();
    let foreign = b.alloc(5 * MIB).unwrap();
    assert!(matches!(
        a.dealloc(foreign),
        Err(AllocError::UnknownBlock { .. })
    ));
    // After the segment is released.
    a.dealloc(y).unwrap();
    a.release_cached().unwrap();
    assert!(matches!(a.dealloc(y), Err(AllocError::DoubleFree { .. })));
    ok(&a, &[]);
    ok(&b, &[foreign]);
}

#[test]
fn huge_requests_fail_cleanly() {
    for mut a in [plain(), expandable()] {
        assert!(matches!(
            a.alloc(u64::MAX),
            Err(AllocError::SizeOverflow { .. })
        ));
        assert!(matches!(
            a.alloc(u64::MAX - 1000),
            Err(AllocError::OutOfMemory { .. })
        ));
        assert!(a.try_alloc_cached(u64::MAX).is_none());
        ok(&a, &[]);
    }
    let mut a = CachingAllocator::new(SimulatedDevice::new().with_capacity(GIB));
    let err = a.alloc(1 << 40).unwrap_err();
    assert!(matches!(
        err,
        AllocError::OutOfMemory {
            reason: OomReason::Device,
            ..
        }
    ));
    assert_eq!(a.stats().segments, 0);
    ok(&a, &[]);
}

#[test]
fn statistics_count_hits_device_calls_and_peaks() {
    let mut a = expandable();
    let x = a.alloc(10 * MIB).unwrap();
    let y = a.alloc(KIB).unwrap();
    a.dealloc(x).unwrap();
    let z = a.alloc(8 * MIB).unwrap();
    let st = a.stats();
    assert_eq!(st.alloc_count, 3);
    assert_eq!(st.free_count, 1);
    assert_eq!(st.cache_hits, 1);
    assert_eq!(st.device_allocs, 2);
    assert_eq!(st.peak_allocated_bytes, 10 * MIB + KIB);
    assert_eq!(st.allocated_bytes, 8 * MIB + KIB);
    assert_eq!(st.peak_reserved_bytes, 10 * MIB + SMALL_SEGMENT);
    // 2 MiB free at the end of the large segment plus the rest of the small segment: the
    // largest is the 2 MiB tail.
    assert_eq!(st.free_bytes, 2 * MIB + SMALL_SEGMENT - KIB);
    assert_eq!(st.largest_free_block, 2 * MIB);
    let frag = 1.0 - (2 * MIB) as f64 / (4 * MIB - KIB) as f64;
    assert!((st.fragmentation() - frag).abs() < 1e-12);

    a.reset_peak();
    let st = a.stats();
    assert_eq!(st.peak_allocated_bytes, st.allocated_bytes);
    assert_eq!(st.peak_reserved_bytes, st.reserved_bytes);
    ok(&a, &[y, z]);

    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments.iter().any(|s| s.expandable));
    assert_eq!(format_bytes(512), "512 B");
    assert_eq!(format_bytes(3 * MIB / 2), "1.50 MiB");
}

#[test]
fn try_alloc_cached_never_calls_the_device() {
    let mut a = expandable();
    assert!(a.try_alloc_cached(MIB).is_none());
    assert_eq!(a.stats().segments, 0);
    let x = a.alloc(MIB).unwrap();
    a.dealloc(x).unwrap();
    let y = a.try_alloc_cached(100 * KIB).unwrap();
    assert_eq!(y.segment(), x.segment());
    ok(&a, &[y]);
}

/// The failure the GPU stress test found with the huge pool on: under a cap, a small request
/// found no room to grow its pool while a hole inside a huge segment sat free. Before failing,
/// the allocator now takes the best fit from any pool.
#[test]
fn under_the_cap_a_hole_in_another_pool_serves_the_request() {
    let config = AllocatorConfig {
        cap: Some(81 * MIB),
        huge_threshold: Some(32 * MIB),
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(SimulatedDevice::new(), config);
    let first = a.alloc(40 * MIB).unwrap();
    let second = a.alloc(40 * MIB).unwrap();
    assert_eq!(a.snapshot().segments[0].pool, Pool::Huge);
    // A hole inside the huge segment: the live block after it keeps it mapped.
    a.dealloc(first).unwrap();
    assert_eq!(a.stats().reserved_bytes, 80 * MIB);
    // A small segment (2 MiB) and a large request (10 MiB) would both pass the cap.
    let small = a
        .alloc(512 * KIB)
        .expect("served from the huge segment's hole");
    let large = a
        .alloc(10 * MIB)
        .expect("served from the huge segment's hole");
    let st = a.stats();
    assert_eq!(st.cross_pool_allocs, 2);
    assert_eq!(st.oom_count, 0);
    assert!(st.reserved_bytes <= 81 * MIB);
    ok(&a, &[second, small, large]);
    // Freed, they merge back into the huge segment's hole.
    a.dealloc(small).unwrap();
    a.dealloc(large).unwrap();
    ok(&a, &[second]);
    assert_eq!(a.snapshot().segments.len(), 1);
}

/// The failure the 1.2 B-parameter GPT met on the GPU: the device was full, the huge pool held
/// gigabytes of free holes between live blocks, and a request larger than every hole failed.
/// Unmapping the holes' granules gives their memory back to the driver, and the request is
/// mapped from it (here in a new address range, since the first spans the device's 200 MiB).
#[test]
fn holes_too_small_each_are_unmapped_to_map_a_larger_request() {
    // 200 MiB: the four blocks fit, and the segment's range has 40 MiB left after them.
    let device = SimulatedDevice::new().with_capacity(200 * MIB);
    let config = AllocatorConfig {
        huge_threshold: Some(32 * MIB),
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(device, config);
    let blocks: Vec<_> = (0..4).map(|_| a.alloc(40 * MIB).unwrap()).collect();
    assert_eq!(
        a.snapshot().segments.len(),
        1,
        "one huge expandable segment"
    );
    let [first, second, third, fourth] = blocks.try_into().unwrap();
    a.dealloc(first).unwrap();
    a.dealloc(third).unwrap();
    assert_eq!(a.stats().largest_free_block, 40 * MIB);
    let big = a.alloc(60 * MIB).expect("mapped from the holes' memory");
    let st = a.stats();
    assert_eq!(st.oom_count, 0);
    assert_eq!(
        st.reserved_bytes,
        140 * MIB,
        "two 40 MiB blocks and the new 60 MiB"
    );
    assert_eq!(a.device().physical_in_use(), 140 * MIB);
    ok(&a, &[second, fourth, big]);
    // The gaps are mapped again when a request fits them.
    let again = a.alloc(36 * MIB).expect("a gap mapped again");
    assert_eq!(
        again.segment(),
        second.segment(),
        "{:#?}",
        a.snapshot().segments
    );
    assert_eq!(again.offset(), 0, "in the first gap");
    ok(&a, &[second, fourth, big, again]);
    for h in [second, fourth, big, again] {
        a.dealloc(h).unwrap();
    }
    ok(&a, &[]);
    assert!(a.release_cached().unwrap() > 0);
    assert_eq!(a.stats().reserved_bytes, 0);
    assert_eq!(a.device().physical_in_use(), 0);
    assert_eq!(
        a.snapshot().segments.len(),
        0,
        "the address range is given back"
    );
}

/// Freeing a block next to an unmapped gap does not merge across the gap, and mapping the gap
/// again merges it with the free blocks on both sides.
#[test]
fn free_blocks_merge_across_a_gap_only_once_it_is_mapped() {
    let config = AllocatorConfig {
        huge_threshold: Some(32 * MIB),
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(SimulatedDevice::new(), config);
    let blocks: Vec<_> = (0..3).map(|_| a.alloc(40 * MIB).unwrap()).collect();
    let [first, second, third] = blocks.try_into().unwrap();
    a.dealloc(second).unwrap();
    assert_eq!(a.release_cached().unwrap(), 40 * MIB);
    ok(&a, &[first, third]);
    a.dealloc(first).unwrap();
    ok(&a, &[third]);
    let seg = &a.snapshot().segments[0];
    assert_eq!(seg.blocks.len(), 2, "first and third stay apart: {seg:?}");
    // 70 MiB fits the first block (40) and part of the gap (30 more).
    let big = a.alloc(70 * MIB).unwrap();
    assert_eq!(big.offset(), 0);
    assert_eq!(
        a.stats().reserved_bytes,
        110 * MIB,
        "only 30 MiB of the gap mapped"
    );
    ok(&a, &[third, big]);
}

// The allocation ladder, rung by rung: each test builds a state in which the rung under test
// and a later one could both serve, and checks that the earlier one does, so that a change of
// the ladder's order fails here.

/// An out-of-memory handler that counts its calls and frees nothing.
fn counting_handler(a: &mut CachingAllocator<SimulatedDevice>) -> Arc<AtomicU64> {
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    a.set_oom_handler(move |_| {
        c.fetch_add(1, Ordering::Relaxed);
        false
    });
    calls
}

/// An allocator whose requests of 32 MiB or more go to the huge pool.
fn with_huge_pool(cap: Option<u64>, device: SimulatedDevice) -> CachingAllocator<SimulatedDevice> {
    let config = AllocatorConfig {
        cap,
        huge_threshold: Some(32 * MIB),
        ..AllocatorConfig::default()
    };
    CachingAllocator::with_config(device, config)
}

#[test]
fn ladder_a_cached_block_comes_before_growth() {
    for mut a in [plain(), expandable()] {
        assert_eq!(a.last_rung(), None, "nothing allocated yet");
        let x = a.alloc(4 * KIB).unwrap();
        assert_eq!(a.last_rung(), Some(Rung::Growth));
        a.dealloc(x).unwrap();
        // Nothing stops growth (no cap), yet the cached block serves.
        let y = a.alloc(4 * KIB).unwrap();
        assert_eq!(a.last_rung(), Some(Rung::CachedBlock));
        assert_eq!(y.address(), x.address());
        // A failed allocation leaves the record as it was.
        assert!(a.alloc(u64::MAX - 1000).is_err());
        assert_eq!(a.last_rung(), Some(Rung::CachedBlock));
        ok(&a, &[y]);
    }
    // The cache-only path records its hits as the same rung.
    let mut a = expandable();
    let x = a.alloc(3 * MIB).unwrap();
    let y = a.alloc(5 * MIB).unwrap();
    assert_eq!(
        a.last_rung(),
        Some(Rung::Growth),
        "growth of the expandable segment"
    );
    assert_eq!(a.stats().segment_growths, 1);
    a.dealloc(x).unwrap();
    let z = a.try_alloc_cached(2 * MIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::CachedBlock));
    ok(&a, &[y, z]);
}

#[test]
fn ladder_growth_comes_before_another_pool_and_before_releasing() {
    // A 20 MiB large segment sits unused: a small request could take a piece of it (any
    // pool), or it could be given back first; with room to grow, a new small segment serves.
    let mut a = plain();
    let large = a.alloc(3 * MIB).unwrap();
    a.dealloc(large).unwrap();
    let small = a.alloc(512 * KIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::Growth));
    let st = a.stats();
    assert_eq!((st.segments, st.cross_pool_allocs), (2, 0), "{st:?}");
    assert_eq!(a.device().counters().frees, 0, "nothing given back");
    ok(&a, &[small]);
}

#[test]
fn ladder_releasing_the_ends_comes_before_another_pool() {
    // Plain segments: the small segment is full, a 20 MiB large segment is unused, and the
    // cap leaves no room for a new small segment. Its free block would fit the request, but
    // the unused segment is given back first and a small segment made in its place.
    let mut a = plain();
    let s1 = a.alloc(SMALL_SIZE).unwrap();
    let s2 = a.alloc(SMALL_SIZE).unwrap();
    let large = a.alloc(3 * MIB).unwrap();
    a.dealloc(large).unwrap();
    a.set_cap(Some(SMALL_SEGMENT + LARGE_SEGMENT)).unwrap();
    let small = a.alloc(512 * KIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::AfterReleasingEnds));
    let st = a.stats();
    assert_eq!(st.cross_pool_allocs, 0, "{st:?}");
    assert_eq!(st.reserved_bytes, 2 * SMALL_SEGMENT);
    assert_eq!(a.device().counters().frees, 1);
    ok(&a, &[s1, s2, small]);

    // Expandable: the free end of a large segment is unmapped rather than split.
    let mut a = expandable();
    let x = a.alloc(30 * MIB).unwrap();
    let y = a.alloc(30 * MIB).unwrap();
    a.dealloc(y).unwrap();
    a.set_cap(Some(60 * MIB)).unwrap();
    let small = a.alloc(512 * KIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::AfterReleasingEnds));
    let st = a.stats();
    assert_eq!(st.cross_pool_allocs, 0, "{st:?}");
    assert_eq!(st.unmapped_bytes, 30 * MIB);
    assert_eq!(st.reserved_bytes, 30 * MIB + SMALL_SEGMENT);
    ok(&a, &[x, small]);
}

#[test]
fn ladder_another_pool_comes_before_releasing_holes_and_the_handler() {
    // A 40 MiB hole inside a huge segment, the cap 1 MiB above what is reserved: a small
    // segment cannot be made. Unmapping the hole would make room for one, and the handler
    // could be asked, but the hole itself serves first.
    let mut a = with_huge_pool(Some(81 * MIB), SimulatedDevice::new());
    let calls = counting_handler(&mut a);
    let first = a.alloc(40 * MIB).unwrap();
    let second = a.alloc(40 * MIB).unwrap();
    a.dealloc(first).unwrap();
    let small = a.alloc(512 * KIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::AnyPool));
    assert_eq!(small.address(), first.address(), "in the hole");
    let st = a.stats();
    assert_eq!((st.cross_pool_allocs, st.unmapped_bytes), (1, 0), "{st:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    ok(&a, &[second, small]);
}

#[test]
fn ladder_releasing_holes_comes_before_the_handler() {
    // Two 40 MiB holes between live blocks on a full 200 MiB device: a 60 MiB request fits
    // neither, and the device has no room for it until the holes are unmapped.
    let mut a = with_huge_pool(None, SimulatedDevice::new().with_capacity(200 * MIB));
    let calls = counting_handler(&mut a);
    let blocks: Vec<_> = (0..4).map(|_| a.alloc(40 * MIB).unwrap()).collect();
    let [first, second, third, fourth] = blocks.try_into().unwrap();
    a.dealloc(first).unwrap();
    a.dealloc(third).unwrap();
    let big = a.alloc(60 * MIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::AfterReleasingHoles));
    let st = a.stats();
    assert_eq!(st.unmapped_bytes, 80 * MIB, "{st:?}");
    assert_eq!((st.oom_handler_calls, st.oom_count), (0, 0));
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    ok(&a, &[second, fourth, big]);
}

#[test]
fn ladder_the_handler_comes_last() {
    // Under a cap of 100 MiB with 60 MiB live, a 60 MiB request has nothing to take but what
    // the handler frees.
    let mut a = expandable();
    a.set_cap(Some(100 * MIB)).unwrap();
    let victim = a.alloc(60 * MIB).unwrap();
    let queue = a.free_queue();
    let mut to_evict = Some(victim);
    a.set_oom_handler(move |_| match to_evict.take() {
        Some(h) => {
            queue.push(h);
            true
        }
        None => false,
    });
    let h = a.alloc(60 * MIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::AfterOomHandler));
    assert_eq!(h.address(), victim.address(), "the freed block, cached");
    assert_eq!(a.stats().oom_handler_calls, 1);
    ok(&a, &[h]);
    // The next hit of the cache is recorded as such again.
    a.dealloc(h).unwrap();
    let again = a.alloc(60 * MIB).unwrap();
    assert_eq!(a.last_rung(), Some(Rung::CachedBlock));
    ok(&a, &[again]);
}

#[test]
fn ladder_under_a_growth_limit_another_pool_comes_before_releasing_ends() {
    // A hole and a free end of 40 MiB each in a huge segment; reserved memory at the limit.
    // Without the limit a small segment is made; with it, the hole serves rather than
    // growth after the free end is given back.
    let setup = |limit: Option<u64>| {
        let mut a = with_huge_pool(None, SimulatedDevice::new());
        let blocks: Vec<_> = (0..3).map(|_| a.alloc(40 * MIB).unwrap()).collect();
        a.dealloc(blocks[0]).unwrap();
        a.dealloc(blocks[2]).unwrap();
        a.set_growth_limit(limit);
        let small = a.alloc(512 * KIB).unwrap();
        ok(&a, &[blocks[1], small]);
        (a, blocks[0], small)
    };
    let (free_growth, _, _) = setup(None);
    assert_eq!(free_growth.last_rung(), Some(Rung::Growth));

    let (limited, hole, small) = setup(Some(120 * MIB));
    assert_eq!(limited.last_rung(), Some(Rung::AnyPool));
    assert_eq!(small.address(), hole.address());
    let st = limited.stats();
    assert_eq!(
        (st.reserved_bytes, st.unmapped_bytes),
        (120 * MIB, 0),
        "{st:?}"
    );
    assert_eq!(st.growth_limit_passes, 0);
}

#[test]
fn ladder_under_a_growth_limit_the_growth_rungs_are_climbed_within_it_first() {
    // [hole 20 MiB | x 30 MiB live | free end 50 MiB] and a 60 MiB request: without a limit
    // the end grows by 10 MiB; under a limit of 100 MiB, 10 MiB of the hole is unmapped first
    // and the end grows within the limit.
    let setup = |limit: Option<u64>| {
        let mut a = expandable();
        let h = a.alloc(20 * MIB).unwrap();
        let x = a.alloc(30 * MIB).unwrap();
        let y = a.alloc(50 * MIB).unwrap();
        a.dealloc(h).unwrap();
        a.dealloc(y).unwrap();
        a.set_growth_limit(limit);
        let z = a.alloc(60 * MIB).unwrap();
        ok(&a, &[x, z]);
        a
    };
    let free_growth = setup(None);
    assert_eq!(free_growth.last_rung(), Some(Rung::Growth));
    assert_eq!(free_growth.stats().reserved_bytes, 110 * MIB);

    let limited = setup(Some(100 * MIB));
    assert_eq!(limited.last_rung(), Some(Rung::AfterReleasingHoles));
    let st = limited.stats();
    assert_eq!(
        (st.reserved_bytes, st.unmapped_bytes),
        (100 * MIB, 10 * MIB),
        "{st:?}"
    );
    assert_eq!(st.growth_limit_passes, 0);
}

#[test]
fn ladder_under_a_growth_limit_a_request_past_it_grows_under_the_cap() {
    // Plain segments: 40 MiB live, a 20 MiB segment unused, a cap of 80 MiB, a 30 MiB request.
    // Without a limit the unused segment is given back and the request grows after it. Under
    // a limit of 60 MiB the climb within the limit gives the unused segment back but cannot
    // grow; the climb under the cap then grows at once, past the limit, and the handler is
    // never asked.
    let setup = |limit: Option<u64>| {
        let mut a = plain();
        a.set_cap(Some(80 * MIB)).unwrap();
        let calls = counting_handler(&mut a);
        let x = a.alloc(40 * MIB).unwrap();
        let unused = a.alloc(3 * MIB).unwrap();
        a.dealloc(unused).unwrap();
        a.set_growth_limit(limit);
        let y = a.alloc(30 * MIB).unwrap();
        ok(&a, &[x, y]);
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        assert_eq!(
            a.device().counters().frees,
            1,
            "the unused segment given back"
        );
        assert_eq!(a.stats().reserved_bytes, 70 * MIB);
        a
    };
    let free_growth = setup(None);
    assert_eq!(free_growth.last_rung(), Some(Rung::AfterReleasingEnds));

    let limited = setup(Some(60 * MIB));
    assert_eq!(limited.last_rung(), Some(Rung::Growth));
    let st = limited.stats();
    assert_eq!(st.growth_limit_passes, 1, "{st:?}");
    assert_eq!(
        limited.growth_limit(),
        Some(70 * MIB),
        "raised to what was reserved"
    );

    // With nothing cached at all, the same: growth under the cap, past the limit.
    for mut a in [plain(), expandable()] {
        a.set_growth_limit(Some(50 * MIB));
        let x = a.alloc(40 * MIB).unwrap();
        let y = a.alloc(40 * MIB).unwrap();
        assert_eq!(a.last_rung(), Some(Rung::Growth));
        assert_eq!(a.stats().growth_limit_passes, 1);
        ok(&a, &[x, y]);
    }
}
