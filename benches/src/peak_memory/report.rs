//! The report after the JSON lines: the table of every run's bytes, speed and ratio to
//! plain Burn, the bars of the chart, and the lines of `--torch` shown beside Burn's.
//! It reads the JSON lines back (Burn's and torch_gpt.py's alike), not Rust structs.

use std::fmt::Write as _;

use gpt::cli::ModelShape;

use crate::chart::Bars;

/// The table printed after the JSON lines: one row per line (a failed one with its error),
/// then the ledger beside the pool at each phase of the `frugal` configuration's last step.
pub fn table(lines: &[serde_json::Value]) -> String {
    let mut out = String::new();
    let gib = |v: &serde_json::Value| {
        v.as_u64()
            .map(|b| format!("{:.3}", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "-".into())
    };
    // Plain Burn's mean over its runs is the baseline of every ratio.
    let plain: Vec<f64> = lines
        .iter()
        .filter(|l| l["system"] == "burn" && l["config"] == "plain")
        .filter_map(|l| l["tokens_per_s"].as_f64())
        .collect();
    let base = (!plain.is_empty()).then(|| plain.iter().sum::<f64>() / plain.len() as f64);
    writeln!(out).unwrap();
    writeln!(
        out,
        "{:<29} {:>10} {:>9} {:>14} {:>14} {:>10} {:>10} {:>8} {:>8}",
        "system config",
        "budget GiB",
        "state GiB",
        "peak alloc GiB",
        "peak resv GiB",
        "step ms",
        "tokens/s",
        "vs plain",
        "recomp"
    )
    .unwrap();
    for l in lines {
        if let Some(error) = l["error"].as_str() {
            let error: String = error.chars().take(100).collect();
            writeln!(
                out,
                "{:<29} {:>10} FAILED: {error}",
                label(l),
                gib(&l["budget_bytes"])
            )
            .unwrap();
            continue;
        }
        let tps = l["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        writeln!(
            out,
            "{:<29} {:>10} {:>9} {:>14} {:>14} {:>10.1} {:>10.0} {:>8} {:>8}",
            label(l),
            gib(&l["budget_bytes"]),
            gib(&l["model_state_bytes"]),
            gib(&l["peak_allocated_bytes"]),
            gib(&l["peak_reserved_bytes"]),
            l["step_ms_median"].as_f64().unwrap_or(f64::NAN),
            tps,
            base.map(|b| format!("{:.3}", tps / b))
                .unwrap_or_else(|| "-".into()),
            l["recomputes"]
                .as_u64()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into())
        )
        .unwrap();
    }
    for l in lines
        .iter()
        .filter(|l| l["system"] == "burn" && l["config"] == "frugal" && l["error"].is_null())
    {
        writeln!(out, "\nledger vs pool ({}), last step:", l["config"]).unwrap();
        writeln!(
            out,
            "{:<10} {:>16} {:>16} {:>16} {:>10}",
            "phase", "ledger live", "pool in use", "pool reserved", "diff %"
        )
        .unwrap();
        for p in l["ledger_vs_pool"].as_array().into_iter().flatten() {
            let (ledger, pool) = (
                p["ledger_live_bytes"].as_u64(),
                p["pool_in_use_bytes"].as_u64(),
            );
            let diff = match (ledger, pool) {
                (Some(a), Some(b)) if b > 0 => {
                    format!("{:+.2}", 100.0 * (a as f64 - b as f64) / b as f64)
                }
                _ => "-".into(),
            };
            writeln!(
                out,
                "{:<10} {:>16} {:>16} {:>16} {:>10}",
                p["phase"].as_str().unwrap_or("?"),
                ledger.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                pool.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                p["pool_reserved_bytes"]
                    .as_u64()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into()),
                diff
            )
            .unwrap();
        }
    }
    out
}

/// A row's name: the system and configuration, and the optimizer where it is not AdamW's.
pub fn label(line: &serde_json::Value) -> String {
    let optimizer = match line["optimizer"].as_str() {
        Some("adamw8bit") => " 8bit",
        Some("adamwfused") => " fused-adamw",
        _ => "",
    };
    format!(
        "{} {}{optimizer}",
        line["system"].as_str().unwrap_or("?"),
        line["config"].as_str().unwrap_or("?")
    )
}

/// The chart's bars: one per label, in the order of the lines, with the allocated peak of its
/// first run and the highest reserved peak of all its runs; failed lines left out.
pub fn chart_bars(lines: &[serde_json::Value]) -> Vec<Bars> {
    let mut seen = std::collections::BTreeSet::new();
    lines
        .iter()
        .filter(|l| l["error"].is_null() && seen.insert(label(l)))
        .map(|l| Bars {
            label: label(l),
            allocated: l["peak_allocated_bytes"].as_u64(),
            reserved: lines
                .iter()
                .filter(|m| label(m) == label(l))
                .filter_map(|m| m["peak_reserved_bytes"].as_u64())
                .max(),
        })
        .collect()
}

/// The chart's title: the model and batch the runs share.
pub fn chart_title(shape: &ModelShape) -> String {
    format!(
        "Peak memory, GPT {} layers d{} batch {}x{}",
        shape.layers, shape.d_model, shape.batch, shape.seq
    )
}

/// The JSON lines of a `--torch` file (torch_gpt.py's output): other lines are its logs.
pub fn torch_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    fn lines() -> Vec<serde_json::Value> {
        vec![
            json!({"system": "burn", "config": "plain", "tokens_per_s": 1000.0,
                   "step_ms_median": 10.0, "peak_reserved_bytes": 2 * GIB}),
            json!({"system": "burn", "config": "plain", "tokens_per_s": 3000.0,
                   "step_ms_median": 5.0, "peak_reserved_bytes": 3 * GIB}),
            json!({"system": "burn", "config": "frugal", "optimizer": "adamw",
                   "tokens_per_s": 500.0, "step_ms_median": 20.04,
                   "model_state_bytes": GIB, "peak_allocated_bytes": 3 * GIB / 2,
                   "recomputes": 3,
                   "ledger_vs_pool": [
                       {"phase": "Forward", "ledger_live_bytes": 90, "pool_in_use_bytes": 100,
                        "pool_reserved_bytes": 200},
                       {"phase": "Backward", "ledger_live_bytes": 5}]}),
            json!({"system": "burn", "config": "budget-1/3", "optimizer": "adamw8bit",
                   "budget_bytes": GIB / 2, "error": "out of memory"}),
        ]
    }

    fn cells(row: &str) -> Vec<&str> {
        row.split_whitespace().collect()
    }

    #[test]
    fn a_row_shows_gib_and_the_ratio_to_plain_s_mean() {
        let table = table(&lines());
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows[0], "", "the table starts after a blank line");
        assert!(rows[1].starts_with("system config "), "{}", rows[1]);
        // The widths of the columns, as docs and scripts read them.
        assert_eq!(rows[1].len(), 29 + 10 + 9 + 14 + 14 + 10 + 10 + 8 + 8 + 8);
        assert_eq!(rows[2].len(), rows[1].len());
        assert_eq!(
            cells(rows[2]),
            [
                "burn", "plain", "-", "-", "-", "2.000", "10.0", "1000", "0.500", "-"
            ]
        );
        assert_eq!(
            cells(rows[4]),
            [
                "burn", "frugal", "-", "1.000", "1.500", "-", "20.0", "500", "0.250", "3"
            ]
        );
        assert_eq!(
            rows[5],
            format!(
                "{:<29} {:>10} FAILED: out of memory",
                "burn budget-1/3 8bit", "0.500"
            )
        );
    }

    #[test]
    fn the_ledger_is_set_beside_the_pool_for_frugal() {
        let table = table(&lines());
        let (_, ledger) = table
            .split_once("ledger vs pool (\"frugal\"), last step:\n")
            .unwrap();
        let rows: Vec<&str> = ledger.lines().collect();
        assert_eq!(
            cells(rows[0]),
            [
                "phase", "ledger", "live", "pool", "in", "use", "pool", "reserved", "diff", "%"
            ]
        );
        assert_eq!(cells(rows[1]), ["Forward", "90", "100", "200", "-10.00"]);
        assert_eq!(cells(rows[2]), ["Backward", "5", "-", "-", "-"]);
        assert_eq!(rows.len(), 3);
    }

    #[test]
    fn without_plain_there_is_no_ratio() {
        let table = table(&lines()[2..3]);
        let row = table.lines().nth(2).unwrap();
        assert_eq!(cells(row)[8], "-");
    }

    #[test]
    fn a_label_names_an_optimizer_other_than_adamw() {
        let lines = lines();
        assert_eq!(label(&lines[0]), "burn plain");
        assert_eq!(label(&lines[2]), "burn frugal");
        assert_eq!(label(&lines[3]), "burn budget-1/3 8bit");
        let fused = json!({"system": "torch", "config": "eager", "optimizer": "adamwfused"});
        assert_eq!(label(&fused), "torch eager fused-adamw");
    }

    #[test]
    fn a_bar_per_label_with_its_highest_reserved_peak() {
        let bars = chart_bars(&lines());
        let labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["burn plain", "burn frugal"]);
        assert_eq!((bars[0].allocated, bars[0].reserved), (None, Some(3 * GIB)));
        assert_eq!(
            (bars[1].allocated, bars[1].reserved),
            (Some(3 * GIB / 2), None)
        );
    }

    #[test]
    fn torch_s_logs_are_left_out_of_its_lines() {
        let text = "loading\n  {\"system\": \"torch\"}\n{broken\n{\"config\": \"x\"}\n";
        let lines = torch_lines(text);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["system"], "torch");
        assert_eq!(lines[1]["config"], "x");
    }

    #[test]
    fn the_chart_s_title_names_the_shape() {
        let shape = ModelShape {
            layers: 12,
            d_model: 768,
            heads: 12,
            seq: 512,
            batch: 8,
        };
        assert_eq!(
            chart_title(&shape),
            "Peak memory, GPT 12 layers d768 batch 8x512"
        );
    }
}
