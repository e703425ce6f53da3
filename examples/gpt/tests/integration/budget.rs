//! The example's own budget run on the CPU (`gpt --steps 3 --budget 6MiB`, the default model,
//! whose step peaks at about 15 MiB without a budget): every op keeps the ledger within the
//! budget, the room for each product's output made from its operands' shapes.

use burn::backend::NdArray;
use clap::Parser;
use gpt::run::{TrainArgs, train};

#[test]
fn the_default_model_under_six_mib_stays_within_the_budget_in_every_step() {
    let _serial = crate::serial();
    let out = std::env::temp_dir().join(format!("gpt-budget-6mib-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = TrainArgs::parse_from([
        "gpt",
        "--steps",
        "3",
        "--budget",
        "6MiB",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    let log = train::<NdArray>(&args, Default::default()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let budget = 6u64 << 20;
    // A step's `peak_bytes` is the run's peak so far: the ledger's highest live bytes after
    // any allocation, an op's output beside its inputs included.
    for step in &log {
        assert!(
            step.peak_bytes <= budget,
            "step {}: peak {} B over the budget of {budget} B",
            step.step,
            step.peak_bytes
        );
    }
}
