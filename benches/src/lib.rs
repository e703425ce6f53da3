//! Shared helpers for the benches: robust timing by interleaved rounds and medians.

use std::time::Instant;

pub mod chart;
pub mod configs;
pub mod peak_memory;

/// Median of a slice of numbers (sorted in place).
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty(), "median of nothing");
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Nanoseconds per call of `f`, over `iters` calls.
pub fn ns_per_call(iters: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}
