//! Property tests: random sequences of allocations (from bytes to hundreds of MiB), frees,
//! cap changes, device capacity changes, cache releases and peak resets, checked after every
//! step against a shadow model (the list of live blocks the test holds) and the simulated
//! device's own books.

mod common;

use std::sync::{Arc, Mutex};

use common::{GIB, KIB, MIB, all_segments_free, check_invariants};
use frugal_cuda::allocator::{
    AllocError, AllocatorConfig, BlockHandle, CachingAllocator, DeviceMemory, OomReason,
    SimulatedDevice, round_size,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    /// Frees the live block at this index (modulo the number of live blocks).
    Free(usize),
    SetCap(Option<u64>),
    SetGrowthLimit(Option<u64>),
    SetDeviceCapacity(Option<u64>),
    Release,
    ResetPeak,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0..=4 * KIB,
        3 => 4 * KIB..=MIB + 4 * KIB,
        3 => MIB..=32 * MIB,
        2 => 32 * MIB..=400 * MIB,
    ]
}

fn cap() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![1 => Just(None), 3 => (16 * MIB..=2 * GIB).prop_map(Some)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => size().prop_map(Op::Alloc),
        9 => any::<usize>().prop_map(Op::Free),
        1 => cap().prop_map(Op::SetCap),
        1 => cap().prop_map(Op::SetGrowthLimit),
        1 => cap().prop_map(Op::SetDeviceCapacity),
        1 => Just(Op::Release),
        1 => Just(Op::ResetPeak),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    vmm: bool,
    expandable: bool,
    granularity: u64,
    device_capacity: Option<u64>,
    cap: Option<u64>,
    /// Install an out-of-memory handler that evicts the oldest live block.
    handler: bool,
    /// Requests from this size on go to the huge pool (with expandable segments).
    huge_threshold: Option<u64>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        any::<bool>(),
        prop_oneof![4 => Just(true), 1 => Just(false)],
        prop_oneof![Just(2 * MIB), Just(64 * KIB), Just(4 * MIB)],
        cap(),
        cap(),
        any::<bool>(),
        prop_oneof![Just(None), (MIB..=64 * MIB).prop_map(Some)],
    )
        .prop_map(
            |(vmm, expandable, granularity, device_capacity, cap, handler, huge_threshold)| Setup {
                vmm,
                expandable,
                granularity,
                device_capacity,
                cap,
                handler,
                huge_threshold,
            },
        )
}

fn run(setup: Setup, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut device = SimulatedDevice::new().with_granularity(setup.granularity);
    if !setup.vmm {
        device = device.without_vmm();
    }
    if let Some(c) = setup.device_capacity {
        device = device.with_capacity(c);
    }
    let config = AllocatorConfig {
        expandable_segments: setup.expandable,
        cap: setup.cap,
        huge_threshold: setup.huge_threshold,
        ..AllocatorConfig::default()
    };
    let mut a = CachingAllocator::with_config(device, config);
    prop_assert_eq!(a.expandable_segments(), setup.vmm && setup.expandable);

    // The live list is shared with the handler, which evicts from it like Frugal's budget.
    let live: Arc<Mutex<Vec<BlockHandle>>> = Arc::default();
    if setup.handler {
        let queue = a.free_queue();
        let live = live.clone();
        a.set_oom_handler(move |_| {
            let mut live = live.lock().unwrap();
            if live.is_empty() {
                false
            } else {
                queue.push(live.remove(0));
                true
            }
        });
    }

    let mut cap = setup.cap;
    let mut device_capacity = setup.device_capacity;
    let mut peak_allocated = 0;
    let mut peak_reserved = 0;
    for op in ops {
        let before = a.stats();
        match op {
            Op::Alloc(size) => match a.alloc(size) {
                Ok(h) => {
                    prop_assert_eq!(Some(h.size()), round_size(size));
                    live.lock().unwrap().push(h);
                }
                Err(AllocError::OutOfMemory {
                    requested, reason, ..
                }) => {
                    prop_assert_eq!(requested, size);
                    // Failure is only allowed when something limits memory.
                    match reason {
                        OomReason::Cap => prop_assert!(cap.is_some()),
                        OomReason::Device => prop_assert!(device_capacity.is_some()),
                    }
                    // A failed allocation leaves live blocks alone (only the handler evicts).
                    if !setup.handler {
                        prop_assert_eq!(a.stats().allocated_bytes, before.allocated_bytes);
                    }
                }
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            },
            Op::Free(i) => {
                let mut l = live.lock().unwrap();
                if !l.is_empty() {
                    let n = l.len();
                    let h = l.remove(i % n);
                    drop(l);
                    prop_assert_eq!(a.dealloc(h), Ok(()));
                    // And never twice.
                    let double_free = matches!(a.dealloc(h), Err(AllocError::DoubleFree { .. }));
                    prop_assert!(double_free);
                }
            }
            Op::SetCap(c) => {
                cap = c;
                a.set_cap(c)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::SetGrowthLimit(limit) => a.set_growth_limit(limit),
            Op::SetDeviceCapacity(c) => {
                device_capacity = c;
                a.device_mut().set_capacity(c);
            }
            Op::Release => {
                a.release_cached()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                // What remains is in use: every plain segment holds a live block, and an
                // expandable segment keeps at most the partial granule after its last live block.
                let g = a.device().granularity();
                for seg in a.snapshot().segments {
                    if seg.expandable {
                        if let Some(last) = seg.blocks.last()
                            && !last.allocated
                        {
                            prop_assert!(
                                last.offset + last.size - last.offset.next_multiple_of(g) == 0
                            );
                        }
                    } else {
                        prop_assert!(seg.blocks.iter().any(|b| b.allocated));
                    }
                }
            }
            Op::ResetPeak => {
                a.reset_peak();
                let st = a.stats();
                peak_allocated = st.allocated_bytes;
                peak_reserved = st.reserved_bytes;
            }
        }
        let st = a.stats();
        // The cap: nothing grows reserved memory above it.
        if let Some(c) = cap
            && st.reserved_bytes > before.reserved_bytes
        {
            prop_assert!(
                st.reserved_bytes <= c,
                "reserved {} above the cap {c}",
                st.reserved_bytes
            );
        }
        // The growth limit: passing it is counted, and it rises to what was reserved.
        if let Some(limit) = before.growth_limit
            && st.reserved_bytes > before.reserved_bytes.max(limit)
        {
            prop_assert_eq!(st.growth_limit_passes, before.growth_limit_passes + 1);
            prop_assert_eq!(st.growth_limit, Some(st.reserved_bytes));
        } else {
            prop_assert_eq!(st.growth_limit_passes, before.growth_limit_passes);
        }
        // Peaks: exactly the highest value seen after any step (within a step memory only
        // goes down then up, so the highest point is at an end).
        peak_allocated = peak_allocated.max(st.allocated_bytes);
        peak_reserved = peak_reserved.max(st.reserved_bytes);
        prop_assert_eq!(st.peak_allocated_bytes, peak_allocated);
        prop_assert_eq!(st.peak_reserved_bytes, peak_reserved);
        let l = live.lock().unwrap().clone();
        check_invariants(&a, &l).map_err(TestCaseError::fail)?;
    }

    // Free everything: every segment is one free block, and releasing the cache gives every
    // byte and every reservation back to the device.
    a.clear_oom_handler();
    let l = std::mem::take(&mut *live.lock().unwrap());
    for h in l {
        prop_assert_eq!(a.dealloc(h), Ok(()));
    }
    check_invariants(&a, &[]).map_err(TestCaseError::fail)?;
    all_segments_free(&a.snapshot()).map_err(TestCaseError::fail)?;
    let st = a.stats();
    prop_assert_eq!(st.allocated_bytes, 0);
    // One free block (free memory on both sides of an unmapped gap is two) is unfragmented.
    if st.segments <= 1 && a.snapshot().segments.iter().all(|s| s.blocks.len() <= 1) {
        prop_assert_eq!(st.fragmentation(), 0.0);
    }
    let reserved = st.reserved_bytes;
    prop_assert_eq!(a.release_cached(), Ok(reserved));
    let st = a.stats();
    prop_assert_eq!(st.reserved_bytes, 0);
    prop_assert_eq!(st.segments, 0);
    prop_assert_eq!(a.device().physical_in_use(), 0);
    prop_assert_eq!(a.device().plain_allocations(), 0);
    prop_assert_eq!(a.device().reservations(), 0);
    check_invariants(&a, &[]).map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(
        setup in setup(),
        ops in prop::collection::vec(op(), 1..160),
    ) {
        run(setup, ops)?;
    }

    #[test]
    fn lowering_the_cap_releases_down_to_live_memory(
        sizes in prop::collection::vec(size(), 1..40),
        keep in prop::collection::vec(any::<bool>(), 40),
        vmm in any::<bool>(),
    ) {
        let device = if vmm { SimulatedDevice::new() } else { SimulatedDevice::new().without_vmm() };
        let mut a = CachingAllocator::new(device);
        let mut live = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            let h = a.alloc(s).unwrap();
            if keep[i] {
                live.push(h);
            } else {
                a.dealloc(h).unwrap();
            }
        }
        let unreleasable = {
            // What release_cached cannot give back: segments with live blocks (plain) or the
            // mapped prefix up to the granule after the last live block (expandable).
            let snap = a.snapshot();
            snap.segments.iter().map(|s| {
                if s.expandable {
                    s.blocks.iter().filter(|b| b.allocated).map(|b| b.offset + b.size).max()
                        .map_or(0, |end| end.next_multiple_of(2 * MIB))
                } else if s.blocks.iter().any(|b| b.allocated) {
                    s.mapped_size
                } else {
                    0
                }
            }).sum::<u64>()
        };
        a.set_cap(Some(0)).unwrap();
        prop_assert_eq!(a.stats().reserved_bytes, unreleasable);
        check_invariants(&a, &live).map_err(TestCaseError::fail)?;
        // With the cap at 0 nothing can grow; only cached blocks can be used.
        let st = a.stats();
        if let Err(e) = a.alloc(500 * MIB) {
            let by_cap = matches!(e, AllocError::OutOfMemory { reason: OomReason::Cap, .. });
            prop_assert!(by_cap, "{}", e);
        }
        prop_assert!(a.stats().reserved_bytes <= st.reserved_bytes);
    }
}
