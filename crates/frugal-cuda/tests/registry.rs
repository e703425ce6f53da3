//! The CubeCL glue (`storage`): CubeCL's `MemoryManagement` as the handle registry, the caching
//! allocator below it, free slots handed back on a miss. Runs on the simulated device, through
//! the same code the CUDA server runs.
//!
//! A "tensor" here is what the CUDA server makes of a client allocation: `reserve`, then `bind`
//! the slot to a fresh client handle; dropping the client handle frees it (CubeCL notices
//! lazily, which is what the registry has to cope with).

mod common;

use std::sync::Arc;

use common::MIB;
use common::trace::{Event, recorded_reference_trace};
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryHandle};
use frugal_cuda::allocator::{
    AllocError, AllocatorConfig, CachingAllocator, SimulatedDevice, round_size,
};
use frugal_cuda::storage::{BASELINE_STEPS, HandleRegistry, TRIAL_STEPS};
use proptest::prelude::*;

fn registry(config: AllocatorConfig) -> HandleRegistry<SimulatedDevice> {
    HandleRegistry::new(
        CachingAllocator::with_config(SimulatedDevice::new(), config),
        Arc::new(ServerLogger::default()),
    )
}

/// A live tensor: the client's handle and the bytes it asked for.
struct Tensor {
    handle: ManagedMemoryHandle,
    bytes: u64,
}

fn allocate(reg: &mut HandleRegistry<SimulatedDevice>, bytes: u64) -> Result<Tensor, AllocError> {
    let reserved = reg.reserve(bytes)?;
    let handle = ManagedMemoryHandle::new();
    reg.bind(reserved, handle.clone(), 0).expect("bind");
    Ok(Tensor { handle, bytes })
}

/// Device address range of a live tensor, through CubeCL's lookup.
fn range(reg: &mut HandleRegistry<SimulatedDevice>, t: &Tensor) -> (u64, u64) {
    let resource = reg
        .get_resource(MemoryHandle::binding(t.handle.clone()), None, None)
        .expect("a live tensor resolves");
    assert_eq!(resource.size, t.bytes, "the resource covers what was asked");
    (resource.ptr, resource.ptr + t.bytes.max(1))
}

fn assert_disjoint(reg: &mut HandleRegistry<SimulatedDevice>, live: &[Tensor]) {
    let mut ranges: Vec<(u64, u64)> = live.iter().map(|t| range(reg, t)).collect();
    ranges.sort();
    for pair in ranges.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "live tensors overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
}

#[test]
fn freed_slots_are_merged_before_the_device_is_asked() {
    let mut reg = registry(AllocatorConfig::default());
    let a = allocate(&mut reg, 4 * MIB).unwrap();
    let b = allocate(&mut reg, 4 * MIB).unwrap();
    let reserved = reg.stats().reserved_bytes;
    // Both found nothing cached: each was a miss that grew the segment.
    assert_eq!(reg.counters().misses, 2);
    drop((a, b));
    // CubeCL still holds two free 4 MiB slots; an 8 MiB request needs them merged.
    let c = allocate(&mut reg, 8 * MIB).unwrap();
    let st = reg.stats();
    assert_eq!(
        st.reserved_bytes, reserved,
        "no growth: the freed slots were reused"
    );
    assert_eq!(reg.counters().misses, 3);
    assert_eq!(st.allocated_bytes, 8 * MIB);
    // The same size again is served by CubeCL's exact-size slot without the allocator.
    drop(c);
    let hits = reg.stats().alloc_count;
    let _d = allocate(&mut reg, 8 * MIB).unwrap();
    assert_eq!(
        reg.stats().alloc_count,
        hits,
        "an exact-size free slot was reused"
    );
}

#[test]
fn the_cap_gives_an_error_naming_it_and_the_registry_stays_usable() {
    let mut reg = registry(AllocatorConfig {
        cap: Some(64 * MIB),
        ..AllocatorConfig::default()
    });
    let mut live: Vec<Tensor> = (0..6)
        .map(|_| allocate(&mut reg, 10 * MIB).unwrap())
        .collect();
    let err = allocate(&mut reg, 10 * MIB).err().expect("over the cap");
    let text = err.to_string();
    assert!(text.contains("the cap of 64.00 MiB"), "{text}");
    assert_eq!(reg.counters().failures, 1);
    // Freeing one makes room again, through the miss path.
    live.remove(0);
    live.push(allocate(&mut reg, 10 * MIB).unwrap());
    assert!(reg.stats().reserved_bytes <= 64 * MIB);
    assert_disjoint(&mut reg, &live);
    drop(live);
    reg.cleanup().unwrap();
    let st = reg.stats();
    assert_eq!(
        (st.allocated_bytes, st.reserved_bytes),
        (0, 0),
        "nothing leaks"
    );
}

/// What the CUDA server does with a client allocation that fails: the client's handle is
/// never bound. Before the registry held its first slot, CubeCL resolved such a handle to the
/// first tensor's memory, so a kernel writing the failed tensor wrote over (and past) another
/// one: the illegal address of issue 19.
#[test]
fn a_handle_whose_allocation_failed_resolves_to_an_error_not_to_another_tensor() {
    let mut reg = registry(AllocatorConfig {
        cap: Some(64 * MIB),
        ..AllocatorConfig::default()
    });
    let first = allocate(&mut reg, 4 * MIB).unwrap();
    let second = allocate(&mut reg, 4 * MIB).unwrap();
    assert!(reg.reserve(100 * MIB).is_err(), "over the cap");
    let never_bound = ManagedMemoryHandle::new();
    let err = reg
        .get_resource(MemoryHandle::binding(never_bound.clone()), None, None)
        .expect_err("an unbound handle has no memory");
    assert!(format!("{err:?}").contains("allocation failed"), "{err:?}");
    // After a cleanup (which renumbers CubeCL's slots) it still resolves to nothing, and the
    // live tensors to themselves.
    drop(second);
    reg.cleanup().unwrap();
    assert!(
        reg.get_resource(MemoryHandle::binding(never_bound), None, None)
            .is_err()
    );
    assert_disjoint(&mut reg, std::slice::from_ref(&first));
    // The first slot is the registry's, not a tensor: usage counts the one live tensor only.
    let usage = reg.memory_usage();
    assert_eq!((usage.bytes_in_use, usage.number_allocs), (4 * MIB, 1));
}

#[test]
fn an_oom_handler_that_frees_tensors_lets_the_allocation_succeed() {
    let mut reg = registry(AllocatorConfig {
        cap: Some(32 * MIB),
        ..AllocatorConfig::default()
    });
    let victims: Arc<std::sync::Mutex<Vec<Tensor>>> = Default::default();
    for _ in 0..3 {
        let t = allocate(&mut reg, 10 * MIB).unwrap();
        victims.lock().unwrap().push(t);
    }
    let pool = victims.clone();
    reg.set_oom_handler(move |_| {
        // What Frugal's budget does: drop a tensor it can recompute.
        pool.lock().unwrap().pop().is_some()
    });
    let t = allocate(&mut reg, 10 * MIB).expect("the handler made room");
    assert_eq!(victims.lock().unwrap().len(), 2);
    assert_eq!(reg.stats().oom_handler_calls, 1);
    drop(t);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![1u64..4096, 4096u64..(2 * MIB), (2 * MIB)..(24 * MIB)].prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random allocations and frees under a random cap: live tensors never overlap, the cap is
    /// never exceeded, a refusal happens only when the growth the request needs would pass the
    /// cap (free memory of the other pool, or between live blocks, is not what it needs), and
    /// after everything is freed and cleaned up nothing is left.
    #[test]
    fn random_sequences_keep_the_cap_and_never_overlap(
        ops in prop::collection::vec(op(), 1..120),
        cap_mib in 32u64..256,
        expandable in any::<bool>(),
    ) {
        let cap = cap_mib * MIB;
        let mut reg = registry(AllocatorConfig {
            cap: Some(cap),
            expandable_segments: expandable,
            ..AllocatorConfig::default()
        });
        let mut live: Vec<Tensor> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(bytes) => match allocate(&mut reg, bytes) {
                    Ok(t) => live.push(t),
                    Err(AllocError::OutOfMemory { .. }) => {
                        // Refused only if growing by what the request needs (a 2 MiB small
                        // segment or granule, or a 20 MiB plain large segment) would pass the
                        // cap, after CubeCL's free slots and the cached segments went back.
                        let st = reg.stats();
                        let rounded = round_size(bytes).unwrap();
                        let growth = if !expandable && rounded > MIB && rounded < 10 * MIB {
                            20 * MIB
                        } else {
                            rounded.next_multiple_of(2 * MIB)
                        };
                        prop_assert!(
                            st.reserved_bytes + growth > cap,
                            "refused {bytes} B with {} B reserved under a {cap} B cap",
                            st.reserved_bytes
                        );
                    }
                    Err(other) => prop_assert!(false, "unexpected error {other}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    live.swap_remove(i % live.len());
                }
                Op::Free(_) => {}
            }
            let st = reg.stats();
            prop_assert!(st.reserved_bytes <= cap, "reserved {} over the cap {cap}", st.reserved_bytes);
        }
        assert_disjoint(&mut reg, &live);
        drop(live);
        reg.cleanup().unwrap();
        let st = reg.stats();
        prop_assert_eq!((st.allocated_bytes, st.reserved_bytes, st.active_blocks), (0, 0, 0));
        prop_assert_eq!(reg.storage().held_blocks(), 0);
    }
}

/// The recorded reference step through the whole glue, CubeCL's slot caching included: what
/// the device would reserve on frugal-cuda.
#[test]
fn recorded_reference_steps_through_cubecl_reserve_at_most_1_1x_their_live_peak() {
    let events = recorded_reference_trace();
    let mut reg = registry(AllocatorConfig::default());
    let mut tensors: Vec<Option<Tensor>> = Vec::new();
    let (mut live, mut peak_live) = (0u64, 0u64);
    for e in events {
        match e {
            Event::Alloc { id, bytes } => {
                let t = allocate(&mut reg, bytes).unwrap();
                if tensors.len() <= id {
                    tensors.resize_with(id + 1, || None);
                }
                live += bytes;
                peak_live = peak_live.max(live);
                tensors[id] = Some(t);
            }
            Event::Free { id } => {
                let t = tensors[id].take().expect("the trace frees live tensors");
                live -= t.bytes;
            }
        }
    }
    let st = reg.stats();
    let ratio = st.peak_reserved_bytes as f64 / peak_live as f64;
    println!(
        "through CubeCL's registry: peak live {peak_live} B, peak reserved {} B ({ratio:.4}x), \
         peak allocated {} B; {:?}",
        st.peak_reserved_bytes,
        st.peak_allocated_bytes,
        reg.counters()
    );
    assert!(
        ratio <= 1.1,
        "peak reserved {ratio:.4}x the live peak: above the 1.1x goal"
    );
}

/// Drops the oldest of `live` tensors and reserves one of a size no freed slot has, for
/// `duration`: under a growth limit at what is reserved, every reservation misses (the freed
/// slot is CubeCL's until it hands it back). Returns the reservations made.
fn churn_missing(
    reg: &mut HandleRegistry<SimulatedDevice>,
    live: &mut std::collections::VecDeque<Tensor>,
    duration: std::time::Duration,
) -> u64 {
    let started = std::time::Instant::now();
    let mut made = 0u64;
    while started.elapsed() < duration {
        live.pop_front();
        let bytes = 4 * MIB - 512 * (1 + made % 2000);
        live.push_back(allocate(reg, bytes).unwrap());
        made += 1;
    }
    made
}

/// Asserts the growth limit was raised `raises` times for misses.
#[track_caller]
fn assert_raises(reg: &HandleRegistry<SimulatedDevice>, raises: u64) {
    let counters = reg.counters();
    assert_eq!(counters.growth_limit_raises, raises, "{counters:?}");
}

/// A registry whose growth limit is what 64 live 4 MiB tensors reserve, with those tensors.
fn tight_registry() -> (
    HandleRegistry<SimulatedDevice>,
    std::collections::VecDeque<Tensor>,
) {
    let mut reg = registry(AllocatorConfig::default());
    let live: std::collections::VecDeque<Tensor> = (0..64)
        .map(|_| allocate(&mut reg, 4 * MIB).unwrap())
        .collect();
    let reserved = reg.stats().reserved_bytes;
    reg.set_growth_limit(Some(reserved));
    (reg, live)
}

/// Has the settled step begun pass the growth limit (tensors made and dropped past it, as a
/// kernel autotuned late would), so that the allocator lifts it by itself, and marks the next:
/// the first lift under a plan is taken back at that mark, with its memory, and the lifting
/// step is not timed; later lifts (the churn's) stay.
fn past_the_first_lift(reg: &mut HandleRegistry<SimulatedDevice>) {
    let limit = reg.storage().allocator().growth_limit();
    let trims = reg.counters().settle_trims;
    warm_up_past_the_limit(reg);
    assert!(
        reg.storage().allocator().growth_limit() > limit,
        "the step should lift the limit"
    );
    reg.mark_step(true);
    assert_eq!(
        reg.counters().settle_trims,
        trims + 1,
        "{:?}",
        reg.counters()
    );
    assert_eq!(reg.storage().allocator().growth_limit(), limit);
}

/// Marks settled steps that each spend 50 ms missing: a raise waits for [`BASELINE_STEPS`] of
/// them before the one it is judged on. Returns the reservations made.
fn steps_spent_missing(
    reg: &mut HandleRegistry<SimulatedDevice>,
    live: &mut std::collections::VecDeque<Tensor>,
) -> u64 {
    let mut made = 0;
    for _ in 0..=BASELINE_STEPS {
        made += churn_missing(reg, live, std::time::Duration::from_millis(50));
        reg.mark_step(true);
    }
    made
}

#[test]
fn a_marked_step_that_spent_its_time_missing_raises_the_growth_limit() {
    let (mut reg, mut live) = tight_registry();
    let limit = reg.stats().reserved_bytes;
    reg.mark_step(true);
    past_the_first_lift(&mut reg);
    let made = steps_spent_missing(&mut reg, &mut live);
    let counters = reg.counters();
    assert!(
        counters.misses * 20 > made,
        "the churn should miss often: {} of {made} reservations",
        counters.misses
    );
    assert_eq!(
        (counters.marked_steps, counters.growth_limit_raises),
        (BASELINE_STEPS as u64 + 3, 1),
        "misses were nearly all of the step, yet the limit was not raised once: {counters:?}"
    );
    // The raise adds an eighth; the allocator's own passes may lift the limit further.
    let raised = reg.storage().allocator().growth_limit().unwrap();
    assert!(raised >= limit + limit / 8, "{raised} B from {limit} B");
}

#[test]
fn misses_hidden_behind_the_devices_queued_work_keep_the_growth_limit() {
    let (mut reg, mut live) = tight_registry();
    reg.storage().allocator_mut().device_mut().set_busy(true);
    let before = reg.counters();
    reg.mark_step(true);
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(50));
    reg.mark_step(true);
    let counters = reg.counters();
    assert!(counters.misses > before.misses + 20, "{counters:?}");
    assert_eq!(
        counters.miss_idle_nanos, before.miss_idle_nanos,
        "the device never waited: {counters:?}"
    );
    assert_eq!(counters.growth_limit_raises, 0);
}

#[test]
fn a_marked_step_whose_misses_took_little_of_it_keeps_the_growth_limit() {
    let (mut reg, mut live) = tight_registry();
    reg.mark_step(true);
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(1));
    // The rest of the step is the device's work, not the allocator's.
    std::thread::sleep(std::time::Duration::from_millis(200));
    reg.mark_step(true);
    assert!(reg.counters().misses > 0);
    assert_eq!(reg.counters().growth_limit_raises, 0);
}

#[test]
fn a_step_that_began_unsettled_is_not_judged() {
    let (mut reg, mut live) = tight_registry();
    reg.mark_step(false);
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(50));
    reg.mark_step(true);
    assert_raises(&reg, 0);
    past_the_first_lift(&mut reg);
    steps_spent_missing(&mut reg, &mut live);
    assert_raises(&reg, 1);
    assert_eq!(reg.counters().marked_steps, BASELINE_STEPS as u64 + 3);
}

#[test]
fn without_marks_or_without_a_share_the_growth_limit_stays_however_much_misses_cost() {
    let (mut reg, mut live) = tight_registry();
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(50));
    assert_eq!(reg.counters().growth_limit_raises, 0, "no step was marked");
    reg.set_miss_time_share(None);
    reg.mark_step(true);
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(50));
    reg.mark_step(true);
    assert_eq!(reg.counters().growth_limit_raises, 0, "no share was set");
}

/// A tight registry whose growth limit was raised once for a settled step spent missing,
/// with its live tensors, the limit before the raise and the raised one.
fn raised_on_trial() -> (
    HandleRegistry<SimulatedDevice>,
    std::collections::VecDeque<Tensor>,
    u64,
    u64,
) {
    let (mut reg, mut live) = tight_registry();
    reg.mark_step(true);
    past_the_first_lift(&mut reg);
    steps_spent_missing(&mut reg, &mut live);
    assert_raises(&reg, 1);
    let raised = reg.storage().allocator().growth_limit().unwrap();
    // The raise adds an eighth to the limit as it was then (the allocator's own passes may
    // have lifted it while the steps ran).
    let before = (raised * 8 / 9 - 2..=raised * 8 / 9 + 2)
        .find(|before| before + before / 8 == raised)
        .expect("a raise by an eighth");
    (reg, live, before, raised)
}

/// Runs settled steps of `step` each (the device's work, no misses): the skipped one, which
/// reserves beyond the limit `before` the raise for tensors it drops, then the trial's.
fn steps_after_the_raise(
    reg: &mut HandleRegistry<SimulatedDevice>,
    before: u64,
    step: std::time::Duration,
) {
    let mut extra = Vec::new();
    while reg.stats().reserved_bytes <= before {
        extra.push(allocate(reg, 4 * MIB).unwrap());
        assert!(
            extra.len() < 64,
            "the raised limit should let reserved grow"
        );
    }
    drop(extra);
    for _ in 0..=TRIAL_STEPS {
        std::thread::sleep(step);
        reg.mark_step(true);
    }
}

#[test]
fn a_raise_after_which_steps_are_no_faster_is_taken_back_with_its_memory() {
    let (mut reg, mut live, limit, _) = raised_on_trial();
    steps_after_the_raise(&mut reg, limit, std::time::Duration::from_millis(100));
    let counters = reg.counters();
    assert_eq!(counters.growth_limit_reverts, 1, "{counters:?}");
    assert!(counters.reverted_bytes > 0, "{counters:?}");
    assert_eq!(reg.storage().allocator().growth_limit(), Some(limit));
    let reserved = reg.stats().reserved_bytes;
    assert!(
        reserved <= limit,
        "{reserved} B reserved over the {limit} B limit"
    );
    // Refuted: misses as costly as before no longer raise the limit.
    churn_missing(&mut reg, &mut live, std::time::Duration::from_millis(50));
    reg.mark_step(true);
    assert_raises(&reg, 1);
    // Until the limit is set anew.
    reg.set_growth_limit(Some(limit));
    past_the_first_lift(&mut reg);
    steps_spent_missing(&mut reg, &mut live);
    assert_raises(&reg, 2);
}

#[test]
fn a_raise_after_which_steps_are_faster_stays() {
    let (mut reg, _live, before, raised) = raised_on_trial();
    steps_after_the_raise(&mut reg, before, std::time::Duration::from_millis(5));
    let counters = reg.counters();
    assert_eq!(counters.growth_limit_reverts, 0, "{counters:?}");
    assert!(reg.storage().allocator().growth_limit().unwrap() >= raised);
}

/// Kernels autotuned on trial buffers in a warm-up step: 32 tensors of 4 MiB made and
/// dropped, past a tight registry's growth limit, which the allocator lifts.
fn warm_up_past_the_limit(reg: &mut HandleRegistry<SimulatedDevice>) {
    let trial_buffers: Vec<Tensor> = (0..32).map(|_| allocate(reg, 4 * MIB).unwrap()).collect();
    drop(trial_buffers);
}

#[test]
fn the_first_settled_step_gives_back_what_the_warm_up_reserved_past_the_limit() {
    let (mut reg, _live) = tight_registry();
    let limit = reg.storage().allocator().growth_limit().unwrap();
    reg.mark_step(false);
    warm_up_past_the_limit(&mut reg);
    assert!(reg.storage().allocator().growth_limit().unwrap() > limit);
    reg.mark_step(false);
    assert_eq!(reg.counters().settle_trims, 0, "still warming up");
    reg.mark_step(true);
    let counters = reg.counters();
    assert_eq!(counters.settle_trims, 1, "{counters:?}");
    assert!(
        counters.settle_trimmed_bytes >= 32 * 4 * MIB,
        "{counters:?}"
    );
    assert_eq!(reg.storage().allocator().growth_limit(), Some(limit));
    assert!(reg.stats().reserved_bytes <= limit);
    reg.mark_step(true);
    assert_eq!(reg.counters().settle_trims, 1, "only when settling");
}

#[test]
fn settled_steps_off_trial_report_their_peak_beside_the_limit_they_began_under() {
    let (mut reg, mut live) = tight_registry();
    let limit = reg.storage().allocator().growth_limit().unwrap();
    reg.mark_step(false);
    // Not a settled step: its peak is not counted.
    warm_up_past_the_limit(&mut reg);
    reg.mark_step(true);
    for _ in 0..8 {
        live.pop_front();
        live.push_back(allocate(&mut reg, 4 * MIB).unwrap());
    }
    reg.mark_step(true);
    let counters = reg.counters();
    assert_eq!(counters.settled_peak_limit_bytes, limit, "{counters:?}");
    assert_eq!(counters.settled_steps_over_limit, 0, "{counters:?}");
    assert!(
        (1..=limit).contains(&counters.settled_peak_reserved_bytes),
        "{counters:?}"
    );
    // A settled step that passes its limit (a kernel compiled late) is counted.
    past_the_first_lift(&mut reg);
    let counters = reg.counters();
    assert_eq!(counters.settled_steps_over_limit, 1, "{counters:?}");
    assert!(counters.settled_peak_reserved_bytes > limit, "{counters:?}");
    assert_eq!(counters.settled_peak_limit_bytes, limit, "{counters:?}");
    reg.reset_peaks();
    let counters = reg.counters();
    assert_eq!(
        (
            counters.settled_peak_reserved_bytes,
            counters.settled_steps_over_limit
        ),
        (0, 0)
    );
}
