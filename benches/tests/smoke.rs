//! CPU smoke test of the peak-memory bench: it runs, prints one JSON line per configuration
//! with sane figures, and Frugal's runs (watching, under a third of its peak, with
//! checkpointed blocks) match plain Burn's loss for loss, bit for bit, with the same
//! written-out loss; with Frugal's fused loss, within rounding.

use std::process::Command;

/// Runs the bench on a tiny model with `configs`; returns its stdout and JSON lines.
fn bench(configs: &str) -> (String, Vec<serde_json::Value>) {
    bench_on("cpu", configs)
}

/// As [`bench`] on `device`.
fn bench_on(device: &str, configs: &str) -> (String, Vec<serde_json::Value>) {
    bench_with(device, configs, &[])
}

/// As [`bench_on`], with `extra` flags.
fn bench_with(device: &str, configs: &str, extra: &[&str]) -> (String, Vec<serde_json::Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_peak-memory"))
        .args([
            "--device",
            device,
            "--layers",
            "2",
            "--d-model",
            "32",
            "--heads",
            "4",
            "--vocab",
            "128",
            "--seq",
            "32",
            "--batch",
            "2",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--configs",
            configs,
        ])
        .args(extra)
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (stdout, lines)
}

#[test]
fn peak_memory_runs_on_the_cpu_with_sane_figures() {
    // Plain Burn has no fused loss: the same written-out loss on both sides, for equal bits.
    let (stdout, lines) = bench_with(
        "cpu",
        "plain,frugal,budget-1/3,frugal-scopes",
        &["--loss", "written-out"],
    );
    assert_eq!(lines.len(), 4, "{stdout}");
    let (plain, frugal, budget, scopes) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert_eq!(plain["config"], "plain");
    assert_eq!(frugal["config"], "frugal");
    assert_eq!(budget["config"], "budget-1/3");
    assert_eq!(scopes["config"], "frugal-scopes");
    for line in &lines {
        assert!(line["error"].is_null(), "{line}");
        assert_eq!(
            plain["losses"], line["losses"],
            "{} changed the losses",
            line["config"]
        );
        let tps = line["tokens_per_s"].as_f64().unwrap();
        assert!(tps.is_finite() && tps > 0.0, "tokens/s {tps}");
        assert_eq!(line["batch"], 2);
    }
    // Parameters alone are 4 bytes each; AdamW keeps two more copies and autodiff keeps
    // activations, so the peak must exceed 3x the parameter bytes.
    let params = frugal["parameters"].as_u64().unwrap();
    let peak = frugal["peak_allocated_bytes"].as_u64().unwrap();
    assert!(peak > 3 * 4 * params, "peak {peak} vs {params} parameters");
    assert!(plain["peak_allocated_bytes"].is_null());
    assert!(plain["budget_bytes"].is_null() && plain["recomputes"].is_null());
    assert_eq!(frugal["recomputes"], 0);
    assert_eq!(frugal["checkpoint_blocks"], false);
    let points = frugal["ledger_vs_pool"].as_array().unwrap();
    assert_eq!(points.len(), 4);

    // The budget is a third of frugal's peak, and holds at the phase boundaries.
    let budget_bytes = budget["budget_bytes"].as_u64().unwrap();
    assert_eq!(budget_bytes, peak / 3);
    for point in budget["ledger_vs_pool"].as_array().unwrap() {
        let live = point["ledger_live_bytes"].as_u64().unwrap();
        assert!(
            live <= budget_bytes,
            "live {live} over the budget at {point}"
        );
    }
    // Checkpointed blocks keep fewer activations.
    assert_eq!(scopes["checkpoint_blocks"], true);
    assert!(scopes["budget_bytes"].is_null());
    let scopes_peak = scopes["peak_allocated_bytes"].as_u64().unwrap();
    assert!(scopes_peak < peak, "scopes' peak {scopes_peak} vs {peak}");
    for line in [budget, scopes] {
        let recomputes = line["recomputes"].as_u64().unwrap();
        assert!(
            recomputes > 0,
            "{}: {recomputes} recomputes",
            line["config"]
        );
    }
    assert!(stdout.contains("vs plain") && stdout.contains("recomp"));
}

#[test]
fn the_fused_loss_follows_plain_burns_losses() {
    // `--loss fused` (the default): Frugal's chunked head and loss against plain Burn's
    // written-out one, equal but for the order of sums.
    let (stdout, lines) = bench("plain,frugal");
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[1]["fused_loss"], true);
    let losses = |line: &serde_json::Value| -> Vec<f64> {
        let values = line["losses"].as_array().unwrap();
        values.iter().map(|l| l.as_f64().unwrap()).collect()
    };
    let (plain, fused) = (losses(&lines[0]), losses(&lines[1]));
    assert_eq!(plain.len(), fused.len());
    for (p, f) in plain.iter().zip(&fused) {
        assert!(
            (p - f).abs() <= 1e-4 * p.abs(),
            "plain {plain:?}, fused {fused:?}"
        );
    }
}

#[test]
fn a_third_budget_lowers_the_peak_below_the_unconstrained_one() {
    // frugal is run first as the reference, though not asked for.
    let (stdout, lines) = bench("budget-1/3");
    assert_eq!(lines.len(), 2, "{stdout}");
    let (frugal, budget) = (&lines[0], &lines[1]);
    assert_eq!(frugal["config"], "frugal");
    assert_eq!(budget["config"], "budget-1/3");
    let peak = frugal["peak_allocated_bytes"].as_u64().unwrap();
    let budget_peak = budget["peak_allocated_bytes"].as_u64().unwrap();
    assert!(
        budget_peak < peak,
        "the peak under a budget of {} is {budget_peak} bytes, above the unconstrained {peak} \
         ({} recomputes): live bytes exceed the budget inside ops that restore evicted tensors",
        budget["budget_bytes"],
        budget["recomputes"]
    );
}

#[test]
fn bf16_configurations_run_on_flex() {
    let (stdout, lines) = bench_on("flex", "frugal,bf16,bf16-store-budget-1/3");
    assert_eq!(lines.len(), 3, "{stdout}");
    let (frugal, bf16, stored) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(bf16["config"], "bf16");
    for line in &lines {
        assert!(line["error"].is_null(), "{line}");
    }
    let losses = |l: &serde_json::Value| -> Vec<f64> {
        l["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let reference = losses(frugal);
    for line in [bf16, stored] {
        let got = losses(line);
        assert_ne!(
            got, reference,
            "{}: autocast must change the losses",
            line["config"]
        );
        for (g, r) in got.iter().zip(&reference) {
            assert!((g - r).abs() <= 0.01 * r, "{}: {g} vs {r}", line["config"]);
        }
    }
    assert!(stored["compressions"].as_u64().unwrap() > 0, "{stored}");
    assert!(
        stored["peak_allocated_bytes"].as_u64() < frugal["peak_allocated_bytes"].as_u64(),
        "{stored}"
    );
}

#[test]
fn flags_are_named_as_gpt_names_them_and_the_older_spellings_still_run() {
    let (stdout, lines) = bench_with("cpu", "frugal", &["--attention", "fused"]);
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["fused_attention"], true, "{stdout}");
    assert_eq!(lines[0]["d"], 32);
    // As recorded commands spell them: `--d` and `--fused-attention`.
    let out = Command::new(env!("CARGO_BIN_EXE_peak-memory"))
        .args([
            "--layers", "1", "--d", "16", "--heads", "2", "--vocab", "64",
        ])
        .args([
            "--seq", "8", "--batch", "2", "--steps", "3", "--warmup", "1",
        ])
        .args(["--fused-attention", "--no-segments", "--configs", "frugal"])
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("a JSON line");
    assert_eq!(
        (line["d"].as_u64(), line["layers"].as_u64()),
        (Some(16), Some(1))
    );
    assert_eq!(line["fused_attention"], true);
}

#[test]
fn a_device_this_build_lacks_is_refused_naming_it_and_the_build_that_has_it() {
    if cfg!(feature = "frugal-cuda") {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_peak-memory"))
        .args(["--device", "frugal-cuda"])
        .output()
        .expect("bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--device frugal-cuda: this build of peak-memory runs on cpu, flex")
            && stderr.contains("--features frugal-cuda"),
        "{stderr}"
    );
}
