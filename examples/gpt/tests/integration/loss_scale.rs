//! `--loss-scale`: in f32 the power-of-two scale gives the same losses, bit for bit, as no
//! scaling; the scaler's state is saved in checkpoints and a resumed run continues it exactly;
//! resuming with a different `--loss-scale` setting is refused with a clear error.
//!
//! One test function: NdArray's seed is process-wide, so runs must not interleave.

use crate::common::{args, bits};
use burn::backend::NdArray;
use gpt::run::train;

#[test]
fn loss_scaling_is_exact_in_f32_and_resumes_exactly() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-loss-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let plain = train::<NdArray>(&args(&root.join("plain"), 6, &[]), Default::default()).unwrap();
    let scaled = train::<NdArray>(
        &args(&root.join("scaled"), 6, &["--loss-scale"]),
        Default::default(),
    )
    .unwrap();
    assert_eq!(bits(&scaled), bits(&plain), "scaled losses differ in f32");
    assert!(
        scaled
            .iter()
            .all(|s| s.loss_scale == Some(65536.0) && !s.skipped)
    );
    assert!(plain.iter().all(|s| s.loss_scale.is_none()));

    // Stop at 3 with the scaler's state in the checkpoint, resume to 6.
    train::<NdArray>(
        &args(&root.join("resumed"), 3, &["--loss-scale"]),
        Default::default(),
    )
    .unwrap();
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("resumed/checkpoints/step-00000003/state.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(state["grad_scaler"]["scale"], 65536.0);
    assert_eq!(state["grad_scaler"]["clean_steps"], 3);
    let resumed = train::<NdArray>(
        &args(&root.join("resumed"), 6, &["--loss-scale", "--resume"]),
        Default::default(),
    )
    .unwrap();
    assert_eq!(bits(&resumed), bits(&scaled), "resumed losses differ");

    // Resuming a loss-scaled checkpoint without the flag (or the reverse) is refused.
    let err = train::<NdArray>(
        &args(&root.join("resumed"), 7, &["--resume"]),
        Default::default(),
    )
    .unwrap_err();
    assert!(err.contains("with --loss-scale; resume with it"), "{err}");
    let err = train::<NdArray>(
        &args(&root.join("plain"), 7, &["--resume", "--loss-scale"]),
        Default::default(),
    )
    .unwrap_err();
    assert!(
        err.contains("without --loss-scale; resume without it"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
