//! The allocator's own input recorded on an H100 by frugal-cuda (`peak-memory --device
//! frugal-cuda --only frugal --steps 6 --warmup 2 --allocator-trace FILE`): every block the
//! registry asked for and handed back while the reference GPT was built and trained for 6 steps,
//! in the order the device saw them under Burn's fusion. Replaying it through the allocator
//! reproduces the device's layout, so allocator policies can be compared here without a GPU.

mod common;

use common::trace::{Event, read_trace, replay, report};
use frugal_cuda::allocator::{AllocatorConfig, CachingAllocator, SimulatedDevice, Stats};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/gpt-reference-frugal-cuda-h100.alloc.gz"
);

fn run(events: &[Event], config: AllocatorConfig) -> Stats {
    let mut alloc = CachingAllocator::with_config(SimulatedDevice::new(), config);
    replay(events, &mut alloc, 4999).0
}

/// The trace was recorded with the allocator's defaults (no huge pool): replaying it gives the
/// device's own peak to the byte (9,288,286,208 B reserved on the H100), so the simulation is
/// faithful; the runtime's policy (huge requests in their own segments, from 32 MiB) reserves
/// less on the same input.
#[test]
fn the_device_trace_replays_as_recorded() {
    let events = read_trace(TRACE);
    let recorded = run(&events, AllocatorConfig::default());
    report("device trace, as recorded (no huge pool)", &recorded);
    assert_eq!(recorded.peak_reserved_bytes, 9_288_286_208);
    let huge = run(
        &events,
        AllocatorConfig {
            huge_threshold: Some(32 << 20),
            ..AllocatorConfig::default()
        },
    );
    report("device trace, huge pool from 32 MiB", &huge);
    assert!(huge.peak_reserved_bytes < recorded.peak_reserved_bytes);
}

/// Not a check: the figures of other policies on the same input, for the record.
#[test]
#[ignore = "policy comparison, run by hand with --ignored --nocapture"]
fn policies_on_the_device_trace() {
    let events = read_trace(TRACE);
    for threshold in [
        None,
        Some(8u64 << 20),
        Some(16 << 20),
        Some(32 << 20),
        Some(64 << 20),
        Some(96 << 20),
    ] {
        let st = run(
            &events,
            AllocatorConfig {
                huge_threshold: threshold,
                ..AllocatorConfig::default()
            },
        );
        report(&format!("huge threshold {threshold:?}"), &st);
    }
    let plain = run(
        &events,
        AllocatorConfig {
            expandable_segments: false,
            ..AllocatorConfig::default()
        },
    );
    report("plain segments", &plain);
}

/// Not a check: every growth of the reserved bytes while replaying, with what was live and
/// free at that moment.
#[test]
#[ignore = "diagnostic, run by hand with --ignored --nocapture"]
fn growths_on_the_device_trace() {
    use frugal_cuda::allocator::BlockHandle;
    let events = read_trace(TRACE);
    let threshold = std::env::var("HUGE_MIB")
        .ok()
        .map(|v| v.parse::<u64>().unwrap() << 20);
    let mut alloc = CachingAllocator::with_config(
        SimulatedDevice::new(),
        AllocatorConfig {
            huge_threshold: threshold,
            ..AllocatorConfig::default()
        },
    );
    let mut handles: Vec<Option<BlockHandle>> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match *e {
            Event::Alloc { id, bytes } => {
                let before = alloc.stats();
                let h = alloc.alloc(bytes).unwrap();
                let after = alloc.stats();
                if after.reserved_bytes > before.reserved_bytes {
                    println!(
                        "event {i}: request {:.1} MiB grew reserved {:.1} -> {:.1} MiB; allocated before {:.1} MiB, free {:.1} MiB, largest free {:.1} MiB",
                        bytes as f64 / 1048576.0,
                        before.reserved_bytes as f64 / 1048576.0,
                        after.reserved_bytes as f64 / 1048576.0,
                        before.allocated_bytes as f64 / 1048576.0,
                        before.free_bytes as f64 / 1048576.0,
                        before.largest_free_block as f64 / 1048576.0,
                    );
                }
                if handles.len() <= id {
                    handles.resize(id + 1, None);
                }
                handles[id] = Some(h);
            }
            Event::Free { id } => alloc.dealloc(handles[id].take().unwrap()).unwrap(),
        }
    }
}
