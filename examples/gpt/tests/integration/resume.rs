//! Checkpoints: a run stopped and resumed gives the same losses, bit for bit, as one that ran
//! straight through, with either optimizer; unfinished checkpoints are ignored; bad options get
//! clear errors.
//!
//! One test function: NdArray's seed is process-wide, so runs must not interleave.

use crate::common::{args, bits};
use burn::backend::NdArray;
use gpt::run::train;

#[test]
fn checkpoints_resume_exactly_and_errors_are_clear() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let straight = train::<NdArray>(&args(&root.join("a"), 8, &[]), Default::default()).unwrap();
    assert_eq!(straight.len(), 8);
    assert!(root.join("a/step-memory.png").exists());
    assert!(root.join("a/memory_viz.pickle").exists());
    assert!(root.join("a/steps.json").exists());

    // Stop after 5 steps (with periodic saves), then resume to 8.
    let first = train::<NdArray>(
        &args(&root.join("b"), 5, &["--save-every", "2"]),
        Default::default(),
    )
    .unwrap();
    assert_eq!(bits(&first), bits(&straight[..5]));
    let checkpoints = root.join("b/checkpoints");
    for step in ["step-00000002", "step-00000004", "step-00000005"] {
        assert!(
            checkpoints.join(step).join("state.json").exists(),
            "{step} missing"
        );
    }
    // A save that was interrupted leaves only a hidden temporary folder, which is ignored.
    std::fs::create_dir_all(checkpoints.join(".step-00000007.tmp")).unwrap();
    let resumed =
        train::<NdArray>(&args(&root.join("b"), 8, &["--resume"]), Default::default()).unwrap();
    assert_eq!(bits(&resumed), bits(&straight), "resumed losses differ");

    // Errors name the value and what is accepted.
    let err =
        train::<NdArray>(&args(&root.join("c"), 3, &["--resume"]), Default::default()).unwrap_err();
    assert!(err.contains("no checkpoint in"), "{err}");
    let err = train::<NdArray>(
        &args(&root.join("b"), 9, &["--resume", "--seed", "3"]),
        Default::default(),
    )
    .unwrap_err();
    assert!(err.contains("resume with the same values"), "{err}");
    let mut bad = args(&root.join("d"), 3, &[]);
    bad.heads = Some(3);
    let err = train::<NdArray>(&bad, Default::default()).unwrap_err();
    assert!(
        err.contains("--heads 3") && err.contains("--d-model 16"),
        "{err}"
    );

    // The 8-bit optimizer's state (codes and block absmax) resumes exactly too; the embedding
    // and the head (256 × 16 values) have 8-bit moments.
    let eight = ["--optimizer", "adamw8bit"];
    let straight8 =
        train::<NdArray>(&args(&root.join("e"), 8, &eight), Default::default()).unwrap();
    assert_ne!(
        bits(&straight8),
        bits(&straight),
        "the optimizer was not switched"
    );
    let stopped = [&eight[..], &["--save-every", "5"]].concat();
    train::<NdArray>(&args(&root.join("f"), 5, &stopped), Default::default()).unwrap();
    let resumed8 = train::<NdArray>(
        &args(&root.join("f"), 8, &[&eight[..], &["--resume"]].concat()),
        Default::default(),
    )
    .unwrap();
    assert_eq!(
        bits(&resumed8),
        bits(&straight8),
        "resumed 8-bit losses differ"
    );
    // Resuming with the other optimizer is refused before anything is loaded.
    let err =
        train::<NdArray>(&args(&root.join("f"), 9, &["--resume"]), Default::default()).unwrap_err();
    assert!(err.contains("--optimizer adamw8bit"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}
