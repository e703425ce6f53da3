//! Allocation traces: their events, and a replay through the allocator that checks its
//! invariants as it goes.

use frugal_cuda::allocator::{
    AllocatorConfig, BlockHandle, CachingAllocator, SimulatedDevice, Stats,
};

use std::io::Read;

use super::{MIB, check_invariants};

/// One event of the trace: allocate `bytes` as tensor `id`, or free tensor `id`.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Alloc { id: usize, bytes: u64 },
    Free { id: usize },
}

/// Replays `events`, checking the allocator's invariants every `check_every` events, and
/// returns its statistics and the trace's own peak of live (rounded) bytes.
pub fn replay(
    events: &[Event],
    alloc: &mut CachingAllocator<SimulatedDevice>,
    check_every: usize,
) -> (Stats, u64) {
    let mut handles: Vec<Option<BlockHandle>> = Vec::new();
    let mut live = 0u64;
    let mut peak = 0u64;
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::Alloc { id, bytes } => {
                let h = alloc
                    .alloc(bytes)
                    .unwrap_or_else(|e| panic!("event {i}: {e}"));
                if handles.len() <= id {
                    handles.resize(id + 1, None);
                }
                handles[id] = Some(h);
                live += h.size();
                peak = peak.max(live);
            }
            Event::Free { id } => {
                let h = handles[id].take().expect("trace frees a live tensor");
                live -= h.size();
                alloc.dealloc(h).unwrap();
            }
        }
        if check_every > 0 && i % check_every == 0 {
            let l: Vec<BlockHandle> = handles.iter().flatten().copied().collect();
            check_invariants(alloc, &l).unwrap();
        }
    }
    let l: Vec<BlockHandle> = handles.iter().flatten().copied().collect();
    check_invariants(alloc, &l).unwrap();
    (alloc.stats(), peak)
}

pub fn report(name: &str, st: &Stats) {
    println!(
        "{name}: peak allocated {} B ({:.1} MiB), peak reserved {} B ({:.1} MiB), ratio {:.4}; \
         segments {}, device allocations {}, cache hits {} of {} allocations",
        st.peak_allocated_bytes,
        st.peak_allocated_bytes as f64 / MIB as f64,
        st.peak_reserved_bytes,
        st.peak_reserved_bytes as f64 / MIB as f64,
        st.peak_ratio(),
        st.segments,
        st.device_allocs,
        st.cache_hits,
        st.alloc_count,
    );
}

/// Replays `events` with expandable segments (invariants checked every 997 events), asserts
/// the goal (peak reserved ≤ 1.1 × peak allocated, the trace's own peak), then
/// replays them with plain segments for comparison only. Returns the expandable run's
/// statistics.
pub fn replay_within_goal(events: &[Event]) -> Stats {
    let mut alloc = CachingAllocator::new(SimulatedDevice::new());
    let (st, trace_peak) = replay(events, &mut alloc, 997);
    report("expandable segments", &st);
    assert_eq!(st.peak_allocated_bytes, trace_peak);
    assert!(
        st.peak_ratio() <= 1.1,
        "peak reserved {} is {:.4}x peak allocated {}: above the 1.1x goal",
        st.peak_reserved_bytes,
        st.peak_ratio(),
        st.peak_allocated_bytes
    );

    // Not asserted: plain segments, as without virtual memory management.
    let config = AllocatorConfig {
        expandable_segments: false,
        ..AllocatorConfig::default()
    };
    let mut plain = CachingAllocator::with_config(SimulatedDevice::new(), config);
    let (plain_stats, _) = replay(events, &mut plain, 0);
    report("plain segments", &plain_stats);
    st
}

/// The reference step's trace recorded on an H100 (`tests/data/gpt-reference-h100.trace.gz`, see
/// `recorded_trace.rs`), with the ledger's allocation numbers renumbered from 0.
pub fn recorded_reference_trace() -> Vec<Event> {
    read_trace(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gpt-reference-h100.trace.gz"
    ))
}

/// A gzip'd text trace (`a <id> <bytes>` / `f <id>` lines), ids renumbered from 0 in order of
/// allocation.
pub fn read_trace(path: &str) -> Vec<Event> {
    let gz = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .expect("a gzip'd text trace");
    let mut ids = std::collections::HashMap::new();
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let number = |i: usize| -> u64 {
                fields[i]
                    .parse()
                    .unwrap_or_else(|_| panic!("bad trace line {line:?}"))
            };
            match fields[0] {
                "a" => {
                    let id = ids.len();
                    assert!(
                        ids.insert(number(1), id).is_none(),
                        "allocated twice: {line}"
                    );
                    Event::Alloc {
                        id,
                        bytes: number(2),
                    }
                }
                "f" => Event::Free {
                    id: ids[&number(1)],
                },
                other => panic!("unknown trace event {other:?}"),
            }
        })
        .collect()
}
