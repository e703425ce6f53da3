//! Auto-fit's search, on probes whose peak and time are known: a peak linear in the
//! micro-batch (fixed bytes plus a per-item share) and a time proportional to the number of
//! micro-batches.

use std::time::Duration;

use burn::backend::NdArray;
use burn::tensor::Tensor;
use frugal::{AutoFit, FitCandidate, FitError, FitOutcome, FitPolicy, FitProbe, Frugal, memory};

type B = Frugal<NdArray>;

/// Bytes per item of the micro-batch, and the fixed bytes, without and with scopes.
const PER_ITEM: usize = 40_000;
const FIXED: usize = 100_000;

/// A probe: holds FIXED + items × PER_ITEM bytes (half of it with scopes) at once, and sleeps
/// 10 ms per micro-batch run (15 ms with scopes, which recompute).
fn probe(run: &FitProbe) -> Result<Duration, String> {
    assert_eq!(run.steps, 2, "the default");
    let candidate = &run.candidate;
    assert_eq!(
        run.micro_batches,
        candidate.accumulation.min(2),
        "at most two micro-batches a probe step, by default"
    );
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let (share, per_micro) = match candidate.policy {
        FitPolicy::Scopes => (PER_ITEM / 2, 15),
        _ => (PER_ITEM, 10),
    };
    let floats = (FIXED + candidate.micro_batch * share) / 4;
    let held = Tensor::<B, 1>::zeros([floats], &device);
    let started = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(per_micro * run.micro_batches as u64));
    drop(held);
    Ok(started.elapsed())
}

#[test]
fn the_fastest_configuration_under_the_limit_is_chosen_without_running_what_cannot_fit() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    // Plain fits micro-batches up to 4 (100 kB + 4 × 40 kB = 260 kB), scopes up to 8.
    let limit = 300_000;
    let choice = AutoFit::new(16, limit)
        .with_policies(vec![FitPolicy::Plain, FitPolicy::Scopes])
        .run(&device, probe)
        .unwrap();
    let text = choice.to_string();
    // Scopes at 8 (2 micro-batches, 30 ms) beat plain at 4 (4 micro-batches, 40 ms).
    assert_eq!(
        choice.chosen,
        FitCandidate {
            micro_batch: 8,
            accumulation: 2,
            policy: FitPolicy::Scopes,
            budget: None,
        },
        "{text}"
    );
    let plain: Vec<_> = choice
        .rows
        .iter()
        .filter(|r| r.candidate.policy == FitPolicy::Plain)
        .collect();
    // Micro-batches 1 and 2 measured, 16 and 8 predicted over the limit and not run, 4 run.
    let outcome_of = |m: usize| {
        plain
            .iter()
            .find(|r| r.candidate.micro_batch == m)
            .map(|r| r.outcome.clone())
    };
    assert!(
        matches!(outcome_of(16), Some(FitOutcome::Predicted { peak_bytes }) if peak_bytes > limit),
        "{text}"
    );
    assert!(
        matches!(outcome_of(8), Some(FitOutcome::Predicted { .. })),
        "{text}"
    );
    match outcome_of(4) {
        Some(FitOutcome::Measured { peak_bytes, .. }) => {
            assert!(peak_bytes <= limit, "{text}");
            assert!(
                peak_bytes >= (FIXED + 4 * PER_ITEM) as u64,
                "the peak is the probe's: {text}"
            );
        }
        other => panic!("micro-batch 4 should have been measured, got {other:?}\n{text}"),
    }
    assert!(text.contains("chosen"), "{text}");
    assert!(text.contains("predicted over the limit"), "{text}");
    // Probing leaves the device as it found it.
    assert_eq!(memory::budget(&device), None);
}

#[test]
fn nothing_fitting_is_an_error_naming_the_smallest_peak() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let error = AutoFit::new(4, 50_000)
        .with_policies(vec![FitPolicy::Plain])
        .run(&device, probe)
        .unwrap_err();
    assert!(matches!(error, FitError::NothingFits { .. }), "{error}");
    assert!(error.to_string().contains("smallest peak"), "{error}");
    let error = AutoFit::new(0, 1).run(&device, probe).unwrap_err();
    assert!(
        error.to_string().contains("effective batch is 0"),
        "{error}"
    );
}

#[test]
fn a_probe_that_fails_is_recorded_and_passed_over() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    let failing = |run: &FitProbe| -> Result<Duration, String> {
        if run.candidate.policy == FitPolicy::Budget && run.candidate.micro_batch > 2 {
            panic!("frugal: the memory budget of 300 kB cannot be kept");
        }
        probe(run)
    };
    let choice = AutoFit::new(8, 300_000)
        .with_policies(vec![FitPolicy::Budget])
        .run(&device, failing)
        .unwrap();
    assert_eq!(choice.chosen.micro_batch, 2, "{choice}");
    assert!(
        choice.rows.iter().any(
            |r| matches!(&r.outcome, FitOutcome::Failed(why) if why.contains("cannot be kept"))
        ),
        "{choice}"
    );
}

#[test]
fn budgets_are_not_probed_where_the_plain_peak_is_too_far_over_the_limit() {
    let _one = crate::serial();
    let device: burn::backend::ndarray::NdArrayDevice = Default::default();
    // The plain peak is 100 kB + m × 40 kB: 740 kB at micro-batch 16, more than twice the
    // 300 kB limit; 420 kB at 8, less.
    let limit = 300_000;
    let mut probed = Vec::new();
    let choice = AutoFit::new(16, limit)
        .with_policies(vec![FitPolicy::Plain, FitPolicy::Budget])
        .run(&device, |run: &FitProbe| {
            probed.push(run.candidate);
            probe(run)
        })
        .unwrap();
    let text = choice.to_string();
    let budget_row = |m: usize| {
        choice
            .rows
            .iter()
            .find(|r| r.candidate.policy == FitPolicy::Budget && r.candidate.micro_batch == m)
    };
    match budget_row(16).map(|r| &r.outcome) {
        Some(FitOutcome::Oversubscribed { peak_bytes }) => {
            // The probe's bytes, and what else the device held (a few bytes).
            let held = (FIXED + 16 * PER_ITEM) as u64;
            assert!(
                (held..held + 1024).contains(peak_bytes) && *peak_bytes > 2 * limit,
                "{text}"
            )
        }
        other => panic!("micro-batch 16 under a budget should be skipped, got {other:?}\n{text}"),
    }
    assert!(
        !probed
            .iter()
            .any(|c| c.policy == FitPolicy::Budget && c.micro_batch == 16),
        "{text}"
    );
    assert!(
        probed
            .iter()
            .any(|c| c.policy == FitPolicy::Budget && c.micro_batch == 8),
        "micro-batch 8 is within twice the limit: {text}"
    );
    assert!(text.contains("too far over the budget"), "{text}");
}
