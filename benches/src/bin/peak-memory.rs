//! `peak-memory`: the reference GPT training step (the twin of `shared/anchors/torch_gpt.py`)
//! under named configurations, one child process each so that no configuration inherits
//! another's device pool. Prints one JSON line per configuration with torch_gpt.py's fields,
//! then a table.
//!
//! Figures:
//! - `peak_allocated_bytes`: Frugal's peak live tensor bytes over the timed steps (absent for
//!   plain Burn, which has no ledger).
//! - `peak_reserved_bytes`: the highest reserved bytes of the CubeCL pool seen at the phase
//!   boundaries of each step (start, after forward, after backward, after the optimizer),
//!   after a sync; a lower bound of the true peak, since CubeCL keeps no peak counter.
//! - `step_ms_median`, `tokens_per_s`: over the steps after warm-up.
//! - `ledger_vs_pool`: for Frugal, the ledger's live bytes beside the pool's `bytes_in_use` at
//!   each phase boundary of the last step.

use std::process::Command;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::{Parser, ValueEnum};
use frugal::Frugal;
use frugal::memory;
use frugal_benches::median;
use gpt::GptConfig;
use gpt::data::random_tokens;
use gpt::train::{self, Phase};
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum DeviceKind {
    Cpu,
    Wgpu,
    Cuda,
}

/// Peak memory and speed of the reference GPT step under named configurations.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Where to run (`cuda` and `wgpu` need the matching build feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceKind,
    /// Comma-separated configurations: plain (Autodiff<B>), frugal (Autodiff<Frugal<B>>,
    /// watching only).
    #[arg(long, default_value = "plain,frugal")]
    configs: String,
    /// Run only this configuration in this process (used for the child processes).
    #[arg(long, hide = true)]
    only: Option<String>,
    #[arg(long, default_value_t = 12)]
    layers: usize,
    #[arg(long, default_value_t = 768)]
    d: usize,
    #[arg(long, default_value_t = 12)]
    heads: usize,
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    #[arg(long, default_value_t = 512)]
    seq: usize,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Steps per configuration, warm-up included.
    #[arg(long, default_value_t = 6)]
    steps: usize,
    /// Steps left out of the timing.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Run the configurations in this order this many times, alternating, to spread drift.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// JSON lines from `torch_gpt.py` run in the same session, shown beside Burn's figures.
    #[arg(long)]
    torch: Option<std::path::PathBuf>,
    /// Write a bar chart of peak memory per configuration to this PNG.
    #[arg(long)]
    chart: Option<std::path::PathBuf>,
}

const CONFIGS: [&str; 2] = ["plain", "frugal"];

#[derive(Serialize, Clone, Debug)]
struct PhasePoint {
    step: usize,
    phase: String,
    ledger_live_bytes: Option<u64>,
    pool_in_use_bytes: Option<u64>,
    pool_reserved_bytes: Option<u64>,
}

#[derive(Serialize, Debug)]
struct Line {
    system: &'static str,
    device: String,
    config: String,
    batch: usize,
    seq: usize,
    layers: usize,
    d: usize,
    heads: usize,
    vocab: usize,
    parameters: usize,
    peak_allocated_bytes: Option<u64>,
    peak_reserved_bytes: Option<u64>,
    step_ms_median: f64,
    tokens_per_s: f64,
    losses: Vec<f32>,
    ledger_vs_pool: Vec<PhasePoint>,
}

fn main() {
    let args = Args::parse();
    if args.steps < args.warmup + 2 {
        eprintln!(
            "error: --steps {} must be at least --warmup {} + 2 (timed steps, then one probed step)",
            args.steps, args.warmup
        );
        std::process::exit(2);
    }
    let names: Vec<String> = args
        .configs
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    for name in &names {
        if !CONFIGS.contains(&name.as_str()) {
            eprintln!(
                "error: unknown configuration {name:?}; known: {}",
                CONFIGS.join(", ")
            );
            std::process::exit(2);
        }
    }
    if let Some(only) = &args.only {
        let line = match args.device {
            DeviceKind::Cpu => run_named::<burn::backend::NdArray>(only, &args),
            #[cfg(feature = "wgpu")]
            DeviceKind::Wgpu => run_named::<burn::backend::Wgpu>(only, &args),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda => run_named::<burn::backend::Cuda>(only, &args),
            #[allow(unreachable_patterns)]
            other => {
                eprintln!("error: --device {other:?} needs a build with that feature");
                std::process::exit(2);
            }
        };
        println!("{}", serde_json::to_string(&line).unwrap());
        return;
    }

    // Parent: one child process per configuration and repeat.
    let exe = std::env::current_exe().expect("own path");
    let mut lines: Vec<serde_json::Value> = Vec::new();
    for repeat in 0..args.repeats {
        let order: Vec<&String> = if repeat % 2 == 0 {
            names.iter().collect()
        } else {
            names.iter().rev().collect()
        };
        for name in order {
            let mut cmd = Command::new(&exe);
            cmd.args(std::env::args().skip(1)).args(["--only", name]);
            let out = cmd.output().expect("child runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                eprintln!(
                    "configuration {name} failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                std::process::exit(1);
            }
            let line = stdout.lines().last().unwrap_or_default().to_string();
            println!("{line}");
            lines.push(serde_json::from_str(&line).expect("child prints JSON"));
        }
    }
    if let Some(path) = &args.torch {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("error: cannot read --torch {}: {e}", path.display());
            std::process::exit(2);
        });
        lines.extend(
            text.lines()
                .filter(|l| l.trim_start().starts_with('{'))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    print_table(&lines);
    if let Some(path) = &args.chart {
        let mut seen = std::collections::BTreeSet::new();
        let bars: Vec<frugal_benches::chart::Bars> = lines
            .iter()
            .filter(|l| seen.insert(label(l)))
            .map(|l| frugal_benches::chart::Bars {
                label: label(l),
                allocated: l["peak_allocated_bytes"].as_u64(),
                reserved: lines
                    .iter()
                    .filter(|m| label(m) == label(l))
                    .filter_map(|m| m["peak_reserved_bytes"].as_u64())
                    .max(),
            })
            .collect();
        let title = format!(
            "Peak memory, GPT {} layers d{} batch {}x{}",
            args.layers, args.d, args.batch, args.seq
        );
        match frugal_benches::chart::peak_memory(&title, &bars, path) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn label(line: &serde_json::Value) -> String {
    format!(
        "{} {}",
        line["system"].as_str().unwrap_or("?"),
        line["config"].as_str().unwrap_or("?")
    )
}

fn run_named<B: Backend>(name: &str, args: &Args) -> Line {
    match name {
        "plain" => run::<Autodiff<B>>(name, args, false),
        "frugal" => run::<Autodiff<Frugal<B>>>(name, args, true),
        _ => unreachable!("checked in main"),
    }
}

fn run<A: AutodiffBackend>(name: &str, args: &Args, ledger: bool) -> Line {
    let device = A::Device::default();
    let config = GptConfig::new(args.vocab, args.seq, args.d, args.heads, args.layers);
    A::seed(&device, 0);
    let mut model = config.init::<A>(&device);
    let mut optim = train::optimizer::<A>();
    let mut times = Vec::new();
    let mut losses = Vec::new();
    let mut peak_reserved: Option<u64> = None;
    let mut points = Vec::new();
    for step in 0..args.steps {
        let data = random_tokens(0, step as u64, args.batch, args.seq, args.vocab);
        if step == args.warmup {
            memory::reset_peak(&device);
        }
        A::sync(&device).expect("sync");
        let timed = step >= args.warmup;
        let started = Instant::now();
        let (next, loss) = train::step(model, &mut optim, data, 1e-4, &device, |phase: Phase| {
            // Only the last step is probed: a sync at each phase would slow the others.
            if step + 1 == args.steps {
                A::sync(&device).expect("sync");
                let pool = memory::pool_usage(&device);
                if let Some(pool) = pool {
                    peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
                }
                points.push(PhasePoint {
                    step,
                    phase: format!("{phase:?}"),
                    ledger_live_bytes: ledger.then(|| memory::live_bytes(&device)),
                    pool_in_use_bytes: pool.map(|p| p.bytes_in_use),
                    pool_reserved_bytes: pool.map(|p| p.bytes_reserved),
                });
            }
        });
        A::sync(&device).expect("sync");
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        model = next;
        losses.push(loss);
        if timed && step + 1 != args.steps {
            times.push(elapsed);
        }
        if let Some(pool) = memory::pool_usage(&device) {
            peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
        }
    }
    let step_ms = median(&mut times);
    Line {
        system: "burn",
        device: A::name(&device),
        config: name.to_string(),
        batch: args.batch,
        seq: args.seq,
        layers: args.layers,
        d: args.d,
        heads: args.heads,
        vocab: args.vocab,
        parameters: config.parameters(),
        peak_allocated_bytes: ledger.then(|| memory::peak_bytes(&device)),
        peak_reserved_bytes: peak_reserved,
        step_ms_median: step_ms,
        tokens_per_s: (args.batch * args.seq) as f64 / (step_ms / 1e3),
        losses,
        ledger_vs_pool: points,
    }
}

fn print_table(lines: &[serde_json::Value]) {
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
    println!();
    println!(
        "{:<22} {:>16} {:>16} {:>12} {:>12} {:>10}",
        "system config", "peak alloc GiB", "peak resv GiB", "step ms", "tokens/s", "vs plain"
    );
    for l in lines {
        let tps = l["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<22} {:>16} {:>16} {:>12.1} {:>12.0} {:>10}",
            label(l),
            gib(&l["peak_allocated_bytes"]),
            gib(&l["peak_reserved_bytes"]),
            l["step_ms_median"].as_f64().unwrap_or(f64::NAN),
            tps,
            base.map(|b| format!("{:.3}", tps / b))
                .unwrap_or_else(|| "-".into())
        );
    }
    for l in lines
        .iter()
        .filter(|l| l["system"] == "burn" && l["config"] == "frugal")
    {
        println!("\nledger vs pool ({}), last step:", l["config"]);
        println!(
            "{:<10} {:>16} {:>16} {:>16} {:>10}",
            "phase", "ledger live", "pool in use", "pool reserved", "diff %"
        );
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
            println!(
                "{:<10} {:>16} {:>16} {:>16} {:>10}",
                p["phase"].as_str().unwrap_or("?"),
                ledger.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                pool.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                p["pool_reserved_bytes"]
                    .as_u64()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into()),
                diff
            );
        }
    }
}
