//! Fragmentation on an allocation trace recorded on a GPU: every tensor buffer Frugal's ledger
//! saw while `Autodiff<Frugal<Cuda>>` built the reference GPT (12 layers, d_model 768, 12 heads,
//! batch 8 × 512, vocab 8192, f32, AdamW) and trained it for 3 steps on an H100, in order.
//!
//! Recorded with `peak-memory --device cuda --only frugal --steps 3 --warmup 1 --trace
//! trace.txt` (session 5; `a <id> <bytes>` and `f <id>` lines, gzip'd). These are the buffers
//! Burn's ops produce above its fusion, so element-wise intermediates that fusion keeps in
//! registers are included: a trace at least as demanding as what reaches the device.

mod common;

use std::io::Read;

use common::MIB;
use common::trace::{Event, replay_within_goal};

/// The recorded trace, with the ledger's allocation numbers renumbered from 0.
fn recorded() -> Vec<Event> {
    let gz = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gpt-reference-h100.trace.gz"
    ))
    .expect("the trace ships with the tests");
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

#[test]
fn recorded_reference_steps_reserve_at_most_1_1x_their_peak() {
    let events = recorded();
    let allocs = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    println!(
        "recorded trace: {} events, {allocs} allocations",
        events.len()
    );
    // Model creation and three steps: far more than a handful of events.
    assert!(allocs > 10_000, "{allocs} allocations");

    let st = replay_within_goal(&events);
    println!(
        "peak allocated {:.1} MiB (the ledger's peak live, rounded to 512 B blocks)",
        st.peak_allocated_bytes as f64 / MIB as f64
    );
}
