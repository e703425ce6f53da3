//! `--precision` and `--store` on Flex (the CPU backend with bf16 and f16): bf16 autocast
//! follows the f32 run over 200 steps within a stated tolerance, f16 autocast with loss
//! scaling does not diverge, compressed storage under a budget trains within tolerance too,
//! and a backend without 16-bit types is refused with the flag named.

use burn::backend::{Flex, NdArray};
use gpt::run::{StepLog, train};

const STEPS: u64 = 200;

fn run(dir: &std::path::Path, extra: &[&str]) -> Vec<StepLog> {
    let mut all = vec!["--device", "flex"];
    all.extend_from_slice(extra);
    train::<Flex>(&crate::common::args(dir, STEPS, &all), Default::default()).unwrap()
}

/// Mean loss of the last `n` steps.
fn tail_mean(log: &[StepLog], n: usize) -> f32 {
    log[log.len() - n..].iter().map(|s| s.loss).sum::<f32>() / n as f32
}

/// Largest difference between two runs' losses, step by step.
fn max_gap(a: &[StepLog], b: &[StepLog]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a.loss - b.loss).abs())
        .fold(0.0, f32::max)
}

#[test]
fn low_precision_runs_track_f32() {
    let _serial = crate::serial();
    let dir = std::env::temp_dir().join(format!("frugal-gpt-precision-{}", std::process::id()));
    let f32_log = run(&dir.join("f32"), &[]);
    let bf16 = run(&dir.join("bf16"), &["--precision", "bf16"]);
    let f16 = run(&dir.join("f16"), &["--precision", "f16", "--loss-scale"]);
    let low_out = run(
        &dir.join("lowout"),
        &["--precision", "bf16", "--low-outputs"],
    );
    // Compression under a budget well below this model's peak (324 KiB peak live).
    let stored = run(
        &dir.join("store"),
        &["--budget", "230KB", "--store", "bf16"],
    );
    let _ = std::fs::remove_dir_all(&dir);

    let (start, end) = (f32_log[0].loss, tail_mean(&f32_log, 20));
    assert!(end < start - 0.5, "f32 learns: {start} -> {end}");
    for (name, log) in [
        ("bf16", &bf16),
        ("f16", &f16),
        ("bf16 low outputs", &low_out),
        ("store bf16", &stored),
    ] {
        assert_eq!(log.len(), STEPS as usize, "{name}");
        assert!(log.iter().all(|s| s.loss.is_finite()), "{name} diverged");
        assert_ne!(
            crate::common::bits(log),
            crate::common::bits(&f32_log),
            "{name} must differ from f32"
        );
        let gap = max_gap(log, &f32_log);
        let tail = tail_mean(log, 20);
        println!("{name}: max step gap {gap:.4}, last-20 mean {tail:.4} (f32 {end:.4})");
        // Stated tolerance: every step within 0.1 nats of f32 and the last 20 steps' mean
        // within 1% of f32's.
        assert!(gap <= 0.1, "{name}: a step's loss is {gap} from f32's");
        assert!(
            (tail - end).abs() <= 0.01 * end,
            "{name}: {tail} vs f32 {end}"
        );
    }
    // Loss scaling ran: every f16 step logged its scale, and most steps were taken.
    assert!(f16.iter().all(|s| s.loss_scale.is_some()));
    let skipped = f16.iter().filter(|s| s.skipped).count();
    assert!(skipped < 20, "{skipped} of {STEPS} f16 steps skipped");
}

#[test]
fn a_backend_without_16_bit_types_is_refused() {
    let _serial = crate::serial();
    let dir = std::env::temp_dir().join(format!("frugal-gpt-precision-nd-{}", std::process::id()));
    let err = train::<NdArray>(
        &crate::common::args(&dir, 2, &["--precision", "bf16"]),
        Default::default(),
    )
    .unwrap_err();
    assert!(
        err.contains("--precision") && err.contains("ndarray"),
        "{err}"
    );
    assert!(err.contains("--device flex"), "{err}");
    let err = train::<NdArray>(
        &crate::common::args(&dir, 2, &["--store", "f16"]),
        Default::default(),
    )
    .unwrap_err();
    assert!(
        err.contains("--store f16") && err.contains("--budget"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
