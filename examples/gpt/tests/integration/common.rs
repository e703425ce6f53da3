//! Helpers shared by the example's run-level tests.

use clap::Parser;
use gpt::run::{StepLog, TrainArgs};

/// Arguments of a tiny run (1 layer, d_model 16) of `steps` steps writing to `out`, plus `extra`.
pub fn args(out: &std::path::Path, steps: u64, extra: &[&str]) -> TrainArgs {
    let steps = steps.to_string();
    let mut argv = vec![
        "gpt",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq",
        "16",
        "--batch",
        "2",
        "--lr",
        "1e-2",
        "--quiet",
        "--steps",
        &steps,
        "--out",
        out.to_str().unwrap(),
    ];
    argv.extend_from_slice(extra);
    TrainArgs::parse_from(argv)
}

/// Each step's number and loss bits.
pub fn bits(log: &[StepLog]) -> Vec<(u64, u32)> {
    log.iter().map(|s| (s.step, s.loss.to_bits())).collect()
}
