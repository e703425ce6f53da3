//! CPU smoke test of the peak-memory bench: it runs, prints one JSON line per configuration
//! with sane figures, and Frugal's run matches plain Burn's loss for loss.

use std::process::Command;

#[test]
fn peak_memory_runs_on_the_cpu_with_sane_figures() {
    let out = Command::new(env!("CARGO_BIN_EXE_peak-memory"))
        .args([
            "--device", "cpu", "--layers", "2", "--d", "32", "--heads", "4", "--vocab", "128",
            "--seq", "32", "--batch", "2", "--steps", "4", "--warmup", "1",
        ])
        .output()
        .expect("bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let (plain, frugal) = (&lines[0], &lines[1]);
    assert_eq!(plain["config"], "plain");
    assert_eq!(frugal["config"], "frugal");
    assert_eq!(
        plain["losses"], frugal["losses"],
        "Frugal changed the losses"
    );
    for line in &lines {
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
    let points = frugal["ledger_vs_pool"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    assert!(stdout.contains("vs plain"));
}
