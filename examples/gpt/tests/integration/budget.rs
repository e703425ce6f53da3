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

/// `gpt --quiet` with `flags`, its output in `root/name`.
fn quiet_run(root: &std::path::Path, name: &str, flags: &[&[&str]]) -> Vec<gpt::run::StepLog> {
    let out = root.join(name);
    let _ = std::fs::remove_dir_all(&out);
    let mut argv = vec!["gpt", "--quiet", "--out", out.to_str().unwrap()];
    argv.extend(flags.iter().flat_map(|f| f.iter().copied()));
    train::<NdArray>(&TrainArgs::parse_from(argv), Default::default()).unwrap()
}

/// `gpt --steps 8 --budget 4MiB`: the budget alone recomputes more than the forward pass's work
/// at the whole batch of 16, so the batch is split (2 micro-batches, then 4 once the plan
/// learned for 2 recomputes past the limit within a pass) until the steps recompute little;
/// the losses stay those of the plain run up to f32 summation order. `--keep-micro-batch`
/// keeps the batch whole.
#[test]
fn a_budget_that_recomputes_more_than_the_forward_pass_splits_the_batch() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-budget-split-{}", std::process::id()));
    let run = |name: &str, extra: &[&str]| quiet_run(&root, name, &[&["--steps", "8"], extra]);
    let plain = run("plain", &[]);
    let split = run("split", &["--budget", "4MiB"]);
    let kept = run("kept", &["--budget", "4MiB", "--keep-micro-batch"]);
    let _ = std::fs::remove_dir_all(&root);
    let ratio = |step: &gpt::run::StepLog| step.remat.unwrap().recompute_ratio();
    assert!(kept.iter().all(|step| step.micro_batches == 1));
    assert!(
        kept[2..]
            .iter()
            .any(|step| ratio(step) > frugal::RECOMPUTE_RATIO_LIMIT),
        "the batch kept whole recomputes more than its forward pass: {:?}",
        kept.iter().map(ratio).collect::<Vec<_>>()
    );
    // The split only grows: after a step over the limit, or within a step whose backward
    // pass passed the recompute limit (retried from its start with smaller micro-batches).
    for pair in split.windows(2) {
        assert!(pair[1].micro_batches >= pair[0].micro_batches, "{split:?}");
    }
    let last = split.last().unwrap();
    assert!(last.micro_batches >= 2, "never split: {split:?}");
    assert!(
        ratio(last) <= frugal::RECOMPUTE_RATIO_LIMIT,
        "still recomputing {:.2}x the forward pass at {} micro-batches",
        ratio(last),
        last.micro_batches
    );
    for (a, b) in plain.iter().zip(&split) {
        assert!(
            (a.loss - b.loss).abs() <= 1e-4 * a.loss.abs(),
            "step {}: {} plain, {} split into {}",
            a.step,
            a.loss,
            b.loss,
            b.micro_batches
        );
    }
}

/// `gpt --steps 6 --accumulate 2 --budget 6MiB --keep-micro-batch`: a step of two
/// micro-batches runs two forward passes, and once the plan has learned the step it cuts each
/// of them alike (taken as one pass from the step's start to its peak, the first micro-batch's
/// forward and backward passes and the second's forward pass leave it no place to cut, and
/// the budget alone recomputes about 4x the forward work). The steps under the plan recompute
/// at most half their forward passes' work, the losses are the plain accumulated run's, bit for
/// bit, and the ledger stays within the budget.
#[test]
fn a_budget_cuts_every_micro_batchs_forward_pass() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-budget-accumulate-{}", std::process::id()));
    let common: &[&str] = &["--steps", "6", "--accumulate", "2"];
    let run = |name: &str, extra: &[&str]| quiet_run(&root, name, &[common, extra]);
    let plain = run("plain", &[]);
    let budgeted = run("budgeted", &["--budget", "6MiB", "--keep-micro-batch"]);
    let _ = std::fs::remove_dir_all(&root);
    let budget = 6u64 << 20;
    for (a, b) in plain.iter().zip(&budgeted) {
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "step {}", a.step);
        assert!(
            b.peak_bytes <= budget,
            "step {}: peak {} B",
            b.step,
            b.peak_bytes
        );
    }
    let ratios: Vec<f64> = budgeted
        .iter()
        .map(|step| step.remat.unwrap().recompute_ratio())
        .collect();
    // Steps 0 to 2 run before the plan knows the step (the budget alone).
    assert!(
        ratios[3..].iter().all(|&ratio| ratio <= 0.5),
        "recomputed / forward work by step: {ratios:?}"
    );
}
