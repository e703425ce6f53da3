//! `gpt`: trains the GPT of `model.rs` on `Autodiff<Frugal<B>>` and reports its memory.
//!
//! The default configuration is small and runs on the CPU in a few minutes; `--device cuda`
//! (built with `--features cuda`) runs the same code on a GPU.

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::Module;
use burn::tensor::backend::Backend;
use clap::{Parser, ValueEnum};
use frugal::Frugal;
use frugal::memory::{self, format_bytes};
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::train::{self, Phase};
use gpt::GptConfig;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DeviceKind {
    /// NdArray on the CPU.
    Cpu,
    /// wgpu (Vulkan, Metal, DX12); build with `--features wgpu`.
    Wgpu,
    /// CUDA; build with `--features cuda`.
    Cuda,
}

/// Train a GPT-style model on Autodiff<Frugal<B>> and report exactly where its memory goes.
#[derive(Parser, Debug, Clone)]
#[command(version)]
struct Args {
    /// Where to run.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceKind,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Attention heads (must divide --d-model).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Context length in tokens.
    #[arg(long, default_value_t = 64)]
    seq: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// A UTF-8 text file to train on (default: a corpus generated from a small grammar).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Seed for the model, the corpus and the batches.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Folder for the per-step JSON log and the memory snapshot.
    #[arg(long, default_value = "runs/gpt")]
    out: PathBuf,
}

#[derive(Serialize)]
struct StepLog {
    step: u64,
    loss: f32,
    step_ms: f64,
    tokens_per_s: f64,
    live_bytes: u64,
    peak_bytes: u64,
}

fn main() {
    let args = Args::parse();
    let result = match args.device {
        DeviceKind::Cpu => run::<burn::backend::NdArray>(&args, Default::default()),
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => run::<burn::backend::Wgpu>(&args, Default::default()),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => run::<burn::backend::Cuda>(&args, Default::default()),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "--device {other:?} needs a build with `--features {}`; this binary has: cpu{}{}",
            format!("{other:?}").to_lowercase(),
            if cfg!(feature = "wgpu") { ", wgpu" } else { "" },
            if cfg!(feature = "cuda") { ", cuda" } else { "" },
        )),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}

fn run<B: Backend>(args: &Args, device: B::Device) -> Result<(), String> {
    type Ad<B> = Autodiff<Frugal<B>>;
    if args.heads == 0 || args.d_model % args.heads != 0 {
        return Err(format!(
            "--heads {} must divide --d-model {}",
            args.heads, args.d_model
        ));
    }
    for (name, value) in [("layers", args.layers as u64), ("seq", args.seq as u64), ("batch", args.batch as u64), ("steps", args.steps)] {
        if value == 0 {
            return Err(format!("--{name} must be at least 1"));
        }
    }
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::generated(400_000, args.seed),
    };
    corpus.batch(args.seed, 0, 1, args.seq)?;
    let config = GptConfig::new(BYTE_VOCAB, args.seq, args.d_model, args.heads, args.layers);
    <Ad<B> as Backend>::seed(&device, args.seed);
    let mut model = config.init::<Ad<B>>(&device);
    let mut optim = train::optimizer::<Ad<B>>();
    println!(
        "gpt: {} parameters ({} layers, d_model {}, {} heads), batch {} x {} tokens, {} steps on {}",
        model.num_params(),
        args.layers,
        args.d_model,
        args.heads,
        args.batch,
        args.seq,
        args.steps,
        <Ad<B> as Backend>::name(&device)
    );

    let bar = ProgressBar::new(args.steps);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] step {pos}/{len} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let mut log = Vec::with_capacity(args.steps as usize);
    let mut first_loss = None;
    for step in 0..args.steps {
        let started = Instant::now();
        let batch = corpus.batch(args.seed, step, args.batch, args.seq)?;
        let (next, loss) = train::step(model, &mut optim, batch, args.batch, args.seq, args.lr, &device, |_: Phase| {});
        model = next;
        let step_ms = started.elapsed().as_secs_f64() * 1e3;
        let tokens_per_s = (args.batch * args.seq) as f64 / (step_ms / 1e3);
        first_loss.get_or_insert(loss);
        let entry = StepLog {
            step,
            loss,
            step_ms,
            tokens_per_s,
            live_bytes: memory::live_bytes(&device),
            peak_bytes: memory::peak_bytes(&device),
        };
        bar.set_message(format!(
            "loss {:.3} | {:.0} tok/s | live {} | peak {}",
            loss,
            tokens_per_s,
            format_bytes(entry.live_bytes),
            format_bytes(entry.peak_bytes)
        ));
        bar.inc(1);
        log.push(entry);
    }
    bar.finish();

    let last = log.last().expect("at least one step");
    println!(
        "loss {:.3} -> {:.3} over {} steps",
        first_loss.unwrap_or(f32::NAN),
        last.loss,
        args.steps
    );
    println!("{}", memory::report(&device));
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create --out {}: {e}", args.out.display()))?;
    write_atomic(&args.out.join("steps.json"), &serde_json::to_string_pretty(&log).unwrap())?;
    write_atomic(&args.out.join("memory.json"), &memory::snapshot(&device).to_json())?;
    println!("wrote {}/steps.json and memory.json", args.out.display());
    Ok(())
}

/// Writes `contents` to a temporary file beside `path` and renames it over `path`, so a
/// crash never leaves a half-written file.
fn write_atomic(path: &std::path::Path, contents: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename to {}: {e}", path.display()))
}
