//! Fragmentation on an allocation trace recorded on a GPU: every tensor buffer Frugal's ledger
//! saw while `Autodiff<Frugal<Cuda>>` built the reference GPT (12 layers, d_model 768, 12 heads,
//! batch 8 × 512, vocab 8192, f32, AdamW) and trained it for 3 steps on an H100, in order.
//!
//! Recorded with `peak-memory --device cuda --only frugal --steps 3 --warmup 1 --trace
//! trace.txt` (`a <id> <bytes>` and `f <id>` lines, gzip'd). These are the buffers
//! Burn's ops produce above its fusion, so element-wise intermediates that fusion keeps in
//! registers are included: a trace at least as demanding as what reaches the device.

mod common;

use common::MIB;
use common::trace::{Event, recorded_reference_trace, replay_within_goal};

#[test]
fn recorded_reference_steps_reserve_at_most_1_1x_their_peak() {
    let events = recorded_reference_trace();
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
