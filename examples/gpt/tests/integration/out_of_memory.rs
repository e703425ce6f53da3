//! Training that does not die of out-of-memory: gradient accumulation gives the whole batch's
//! losses with a smaller peak, a step that runs out of memory mid-run is retried from its
//! start with half the micro-batch and then matches a run that used that micro-batch from
//! there on, bit for bit, and `--fit` picks a configuration that stays under its limit.
//!
//! One test function: NdArray's seed is process-wide, so runs must not interleave.

use crate::common::{args, bits};
use burn::backend::NdArray;
use frugal::memory;
use gpt::run::{StepLog, TrainArgs, train, train_observed};

/// A run with a batch of 8 (so it can be halved three times) and the given extra flags.
fn run(out: &std::path::Path, steps: u64, extra: &[&str]) -> TrainArgs {
    let mut flags = args(out, steps, extra);
    flags.batch = Some(8);
    flags
}

fn peak(log: &[StepLog]) -> u64 {
    log.iter().map(|s| s.peak_bytes).max().unwrap()
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn accumulation_recovery_and_fit() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-oom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let device = Default::default();

    // Accumulation: the same losses up to f32 summation order, less memory.
    let whole = train::<NdArray>(&run(&root.join("whole"), 3, &[]), device).unwrap();
    for n in ["2", "4"] {
        let split = train::<NdArray>(
            &run(&root.join(format!("acc{n}")), 3, &["--accumulate", n]),
            device,
        )
        .unwrap();
        for (a, b) in whole.iter().zip(&split) {
            assert!(
                (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs(),
                "--accumulate {n}, step {}: {} vs {}",
                a.step,
                a.loss,
                b.loss
            );
            assert_eq!(b.micro_batches, n.parse::<usize>().unwrap());
        }
        assert!(
            peak(&split) < peak(&whole),
            "--accumulate {n} peaked at {} B, the whole batch at {} B",
            peak(&split),
            peak(&whole)
        );
    }
    let err =
        train::<NdArray>(&run(&root.join("bad"), 1, &["--accumulate", "3"]), device).unwrap_err();
    assert!(
        err.contains("--accumulate 3") && err.contains("--batch 8"),
        "{err}"
    );

    // Recovery: from step 2 on, a budget too small for the whole batch. The run starts under a
    // large budget so that every tensor is managed, and only recomputes, so that what cannot
    // be recomputed (parameters, optimizer state, the residual stream) must stay: a budget
    // below that fails. Budgets are tried from large to small until one makes step 2 fail at
    // micro-batches of 8 and pass at 4 or less.
    let shrink_at = 2;
    let mut recovered = None;
    for kib in (16..=512u64).rev().step_by(4) {
        let out = root.join(format!("recover-{kib}"));
        let flags = [
            "--budget",
            "1GiB",
            "--evict",
            "recompute",
            "--save-every",
            "2",
        ];
        let result = train_observed::<NdArray>(&run(&out, 5, &flags), device, |step, device| {
            if step == shrink_at {
                memory::set_budget(device, Some(kib << 10));
            }
        });
        if let Ok(log) = result
            && log[shrink_at as usize].micro_batches > 1
        {
            recovered = Some((out, log));
            break;
        }
    }
    let (out, log) = recovered.expect("some budget makes step 2 recover");
    assert!(
        log[..shrink_at as usize]
            .iter()
            .all(|s| s.micro_batches == 1)
    );
    let after = log[shrink_at as usize].micro_batches;
    assert!(
        log[shrink_at as usize..]
            .iter()
            .all(|s| s.micro_batches == after)
    );
    // The same run resumed from its step-2 checkpoint with that micro-batch from the start:
    // the same losses, bit for bit.
    let saved = root.join("from-2");
    copy_dir(
        &out.join("checkpoints/step-00000002"),
        &saved.join("checkpoints/step-00000002"),
    );
    let resumed = train::<NdArray>(
        &run(&saved, 5, &["--resume", "--accumulate", &after.to_string()]),
        device,
    )
    .unwrap();
    assert_eq!(
        bits(&resumed[shrink_at as usize..]),
        bits(&log[shrink_at as usize..]),
        "losses after recovering at micro-batches of {}",
        8 / after
    );
    // Without recovery, the same failure ends the run with the message.
    let kib = out
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("recover-")
        .parse::<u64>()
        .unwrap();
    let err = train_observed::<NdArray>(
        &run(
            &root.join("no-recover"),
            5,
            &["--budget", "1GiB", "--evict", "recompute", "--no-recover"],
        ),
        device,
        |step, device| {
            if step == shrink_at {
                memory::set_budget(device, Some(kib << 10));
            }
        },
    )
    .unwrap_err();
    assert!(
        err.starts_with("step 2 failed") && err.contains("memory budget"),
        "{err}"
    );

    // --fit under 60% of the whole batch's peak: a configuration that stays under it.
    let limit = peak(&whole) * 6 / 10;
    let limit_flag = limit.to_string();
    let fitted = train::<NdArray>(
        &run(&root.join("fit"), 3, &["--fit", "--budget", &limit_flag]),
        device,
    )
    .unwrap();
    assert!(
        peak(&fitted) <= limit,
        "--fit peaked at {} B over its limit of {limit} B",
        peak(&fitted)
    );
    let err = train::<NdArray>(&run(&root.join("fit-bad"), 1, &["--fit"]), device).unwrap_err();
    assert!(err.contains("--fit") && err.contains("--budget"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

/// The step's starting state, held for recovery, is let go when the optimizer's update
/// begins: AdamW then updates in place, and the optimizer state's peak is the one of a run
/// that holds nothing (`--no-recover`), not two copies of the moments.
#[test]
fn the_state_held_for_recovery_leaves_the_update_in_place() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-held-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let device = Default::default();
    let optimizer_peak = |name: &str, extra: &[&str]| {
        let out = root.join(name);
        let log = train::<NdArray>(&run(&out, 3, extra), device).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("memory.json")).unwrap()).unwrap();
        let peak = json["report"]["peak_by_role"]["optimizer_state"]
            .as_u64()
            .unwrap();
        (bits(&log), peak)
    };
    let (held, held_peak) = optimizer_peak("held", &[]);
    let (free, free_peak) = optimizer_peak("free", &["--no-recover"]);
    assert_eq!(held, free, "holding the start changes no bit");
    assert!(free_peak > 0);
    assert_eq!(
        held_peak, free_peak,
        "optimizer state's peak with and without recovery"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// What a run prints when a step runs out of memory and goes on: one sentence with the step,
/// the micro-batch before and after, and the memory it met; never the error chain behind it
/// (CubeCL's, on CUDA, runs to kilobytes).
#[test]
fn an_out_of_memory_restart_is_one_line_naming_the_step_and_both_micro_batches() {
    use gpt::diagnostics::{failure_reason, is_out_of_memory, memory_limit, out_of_memory_line};
    let gib = 1u64 << 30;
    let gpu = memory::DeviceMemory {
        free: gib,
        total: 796 * gib / 10,
        reserved: 78 * gib,
        in_use: 77 * gib,
        cap: None,
        runtime: "burn-cuda",
    };
    let chain = "An execution error happened during profiling\nCaused by: The server is in an \
                 invalid state\nCaused by: [Io(couldn't find resource for that handle: out of \
                 memory)]"
        .repeat(40);
    let caught = frugal::catch_quietly(|| panic!("{chain}"), || ()).unwrap_err();
    let reason = failure_reason(&caught);
    assert!(is_out_of_memory(&reason));
    let line = out_of_memory_line(
        0,
        64,
        &memory_limit(&reason, None, Some(&gpu)),
        "restarting with",
        2,
        &reason,
    );
    assert_eq!(
        line,
        "step 0: out of memory at micro-batch 64 (GPU 79.60 GiB): restarting with micro-batch \
         32 × 2"
    );
    // Under a budget that the step could not keep, the budget is what it met.
    let budget = "frugal: the memory budget of 262144 B cannot hold the op's output";
    let line = out_of_memory_line(
        3,
        8,
        &memory_limit(budget, Some(256 << 10), Some(&gpu)),
        "retrying the step with",
        4,
        budget,
    );
    assert_eq!(
        line,
        "step 3: out of memory at micro-batch 8 (budget 256.00 KiB): retrying the step with \
         micro-batch 4 × 4"
    );
    // The budget's recompute limit: the line says how far over.
    let thrash = "the memory budget of 60.73 GiB recomputed 5.2x the forward pass's work in one \
                  pass (the limit set is 3x): the tensors it keeps do not fit; a smaller \
                  micro-batch does";
    assert!(is_out_of_memory(thrash));
    let line = out_of_memory_line(
        0,
        64,
        &memory_limit(thrash, Some(65_209_892_864), Some(&gpu)),
        "retrying the step with",
        2,
        thrash,
    );
    assert_eq!(
        line,
        "step 0: the budget recomputed 5.2x the forward pass's work at micro-batch 64 (budget \
         60.73 GiB): retrying the step with micro-batch 32 × 2"
    );
    let capped = memory::DeviceMemory {
        cap: Some(2 * gib),
        ..gpu
    };
    let line = out_of_memory_line(
        5,
        2,
        &memory_limit(&reason, None, Some(&capped)),
        "restarting from the checkpoint of step 5 with",
        8,
        &reason,
    );
    assert!(
        line.contains("(GPU 79.60 GiB, capped at 2.00 GiB)"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(!line.contains("Caused by"), "{line}");
    // No memory known (the CPU without a budget): the line goes without it.
    let line = out_of_memory_line(
        1,
        4,
        &memory_limit(&reason, None, None),
        "retrying with",
        4,
        &reason,
    );
    assert_eq!(
        line,
        "step 1: out of memory at micro-batch 4: retrying with micro-batch 2 × 4"
    );
    // The reason, as it goes into a final failure message, is cut between words.
    assert!(reason.chars().count() <= 602, "{reason}");
    assert!(reason.ends_with(" …"), "{reason}");
}

/// A device that cannot go on after running out of memory mid-run (Burn's CUDA device thread
/// stops): the run asks for a new process with half the micro-batch, going on from the newest
/// checkpoint, which the clock wrote without being asked (`--save-minutes`); the new process
/// loses no step, and its losses are those of a run that used the smaller micro-batch from the
/// checkpoint's step. The failure is injected as the device reports it.
#[test]
fn a_device_that_stops_mid_run_goes_on_from_the_newest_timed_checkpoint() {
    let _serial = crate::serial();
    let root = std::env::temp_dir().join(format!("gpt-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let device = Default::default();
    let steps = 6;
    let fail_at = 4;
    let uninterrupted = train::<NdArray>(&run(&root.join("whole"), steps, &[]), device).unwrap();
    // A clock so fast that a save is due after every step the last one's write allows.
    let out = root.join("stopped");
    let flags = ["--save-minutes", "0.00001"];
    let err = train_observed::<NdArray>(&run(&out, steps, &flags), device, |step, _| {
        if step == fail_at {
            panic!(
                "An execution error happened during profiling\nCaused by: The server is in an \
                 invalid state\nCaused by: out of memory: cannot reserve 64 MiB"
            );
        }
    })
    .unwrap_err();
    // The injected panic silenced the panic hook as a dead device does; later tests want it.
    let _ = std::panic::take_hook();
    let restart = gpt::run::take_restart().expect("a restart is asked for");
    assert_eq!(
        restart,
        gpt::run::Restart {
            accumulate: 2,
            resume: true
        }
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!("step {fail_at}: out of memory at micro-batch 8"))
            && lines[0].ends_with("restarting in a new process with micro-batch 4 × 2"),
        "{err}"
    );
    // One checkpoint on disk: each timed one replaced the one before.
    let on_disk: Vec<_> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(on_disk.len(), 1, "{on_disk:?}");
    let saved: u64 = on_disk[0].strip_prefix("step-").unwrap().parse().unwrap();
    assert!((1..=fail_at).contains(&saved), "{on_disk:?}");
    let redo = match fail_at - saved {
        0 => "nothing to redo".to_string(),
        1 => "1 step to redo".to_string(),
        n => format!("{n} steps to redo"),
    };
    assert!(
        lines[1].starts_with(&format!("going on at step {saved} from its checkpoint"))
            && lines[1].ends_with(&format!("{redo})")),
        "{err}"
    );
    // The new process: every step, the ones before the checkpoint as they were, the ones from
    // it on with micro-batches of 4 (the same gradient up to f32 summation order).
    let resumed = train::<NdArray>(
        &run(&out, steps, &["--resume", "--accumulate", "2"]),
        device,
    )
    .unwrap();
    assert_eq!(
        resumed.iter().map(|s| s.step).collect::<Vec<_>>(),
        (0..steps).collect::<Vec<_>>()
    );
    let saved = saved as usize;
    assert_eq!(bits(&resumed[..saved]), bits(&uninterrupted[..saved]));
    for (a, b) in uninterrupted[saved..].iter().zip(&resumed[saved..]) {
        assert_eq!(b.micro_batches, 2);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs(),
            "step {}: {} uninterrupted, {} after the restart",
            a.step,
            a.loss,
            b.loss
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
