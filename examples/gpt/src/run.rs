//! The training run behind the `gpt` binary: options, the loop, progress, logs, checkpoints.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use clap::{Parser, ValueEnum};
use frugal::memory::{self, format_bytes};
use frugal::{EvictionMode, Frugal, GradScaler, GradScalerState, Policy, RematStats};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::data::{BYTE_VOCAB, Corpus};
use crate::model::{Gpt, GptConfig};
use crate::train::{self, GptOptimizer, Phase};

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// NdArray on the CPU (f32 only).
    Cpu,
    /// Flex on the CPU: f32, and bf16/f16 for `--precision` and `--store`.
    Flex,
    /// wgpu (Vulkan, Metal, DX12); build with `--features wgpu`.
    Wgpu,
    /// CUDA; build with `--features cuda`.
    Cuda,
    /// CUDA through frugal-cuda's runtime (CubeCL's kernels on Frugal's caching allocator);
    /// build with `--features frugal-cuda`.
    FrugalCuda,
}

/// The precision of matrix products and convolutions (autocast), or of tensors the budget
/// stores compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (no autocast, no compression).
    #[default]
    #[value(alias = "none")]
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half (train with --loss-scale).
    F16,
}

impl Precision {
    /// The low type, or `None` for f32.
    pub fn low(self) -> Option<frugal::LowPrecision> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(frugal::LowPrecision::BF16),
            Precision::F16 => Some(frugal::LowPrecision::F16),
        }
    }

    /// The flag's value, as typed.
    pub fn label(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

/// How a memory budget frees device memory (see [`frugal::EvictionMode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Evict {
    /// Recompute or copy to host memory, whichever is estimated cheaper.
    #[default]
    Auto,
    /// Only recompute evicted tensors (those that cannot be recomputed stay).
    Recompute,
    /// Only copy evicted tensors to host memory and back.
    Offload,
}

impl Evict {
    /// The Frugal eviction mode.
    pub fn mode(self) -> EvictionMode {
        match self {
            Evict::Auto => EvictionMode::Auto,
            Evict::Recompute => EvictionMode::RecomputeOnly,
            Evict::Offload => EvictionMode::OffloadOnly,
        }
    }

    /// The flag's value, as typed.
    pub fn label(self) -> &'static str {
        match self {
            Evict::Auto => "auto",
            Evict::Recompute => "recompute",
            Evict::Offload => "offload",
        }
    }
}

/// Parses `--budget`: a byte size (`2GiB`, `1.5GB`, `800MB`, `123456`) or `none`.
fn parse_budget(value: &str) -> Result<Option<u64>, String> {
    if value.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    frugal::parse_bytes(value)
        .map(Some)
        .map_err(|e| format!("{e}; or none for no budget"))
}

/// Train a GPT-style model on Autodiff<Frugal<B>> and report exactly where its memory goes.
#[derive(Parser, Debug, Clone)]
#[command(name = "gpt", version)]
pub struct TrainArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceKind,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub d_model: usize,
    /// Attention heads (must divide --d-model).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Context length in tokens.
    #[arg(long, default_value_t = 64)]
    pub seq: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Total optimizer steps (a resumed run continues up to this number).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// A UTF-8 text file to train on (default: a corpus generated from a small grammar).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Seed for the model, the corpus and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for the per-step log (steps.json), the memory snapshot and plot.
    #[arg(long, default_value = "runs/gpt")]
    pub out: PathBuf,
    /// Folder for training checkpoints (default: OUT/checkpoints).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Continue from the latest checkpoint in the checkpoint folder.
    #[arg(long)]
    pub resume: bool,
    /// Keep live tensor memory under SIZE (e.g. 2GiB, 1.5GB, 800MB, or none) by evicting
    /// tensors and recomputing or offloading them when read.
    // The fully qualified `Option` keeps clap from treating the flag as optional-valued: the
    // parser gives `None` for `none`, and the default is no budget.
    #[arg(long, value_name = "SIZE", default_value = "none", value_parser = parse_budget)]
    pub budget: ::std::option::Option<u64>,
    /// Run each transformer block in a checkpoint scope: its activations are dropped after the
    /// forward pass and recomputed in the backward pass.
    #[arg(long)]
    pub checkpoint_blocks: bool,
    /// Dynamic loss scaling (`frugal::GradScaler`, PyTorch's defaults: scale 65536, doubled
    /// after 2,000 clean steps, halved and the step skipped when a gradient is inf or NaN).
    /// Meant for f16 training; in f32 the power-of-two scale gives the same losses. Its state
    /// is saved in the checkpoints.
    #[arg(long)]
    pub loss_scale: bool,
    /// How the budget frees memory: recompute, offload to host memory, or auto (the cheaper).
    #[arg(long, value_enum, default_value = "auto")]
    pub evict: Evict,
    /// Autocast: matrix products, convolutions and attention in bf16 or f16 with f32
    /// accumulation; exponentials, logs and reductions in f32; parameters, gradients and
    /// optimizer state stay f32 (frugal::precision). Needs a device with the type (flex,
    /// wgpu for f16, cuda); f16 wants --loss-scale.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: Precision,
    /// With --precision bf16|f16: products stay in that type, as in PyTorch's autocast (less
    /// activation memory and traffic), instead of coming back as f32. Parameter gradients
    /// are still cast to f32 before AdamW.
    #[arg(long)]
    pub low_outputs: bool,
    /// Let the budget keep f32 tensors it evicts compressed on the device in bf16 or f16, as
    /// a third action beside recompute and offload (lossy; needs --budget).
    #[arg(long, value_enum, default_value = "f32", value_name = "bf16|f16|none")]
    pub store: Precision,
    /// No progress bar (for logs and tests).
    #[arg(long)]
    pub quiet: bool,
}

impl TrainArgs {
    fn checkpoints(&self) -> PathBuf {
        self.checkpoint_dir
            .clone()
            .unwrap_or_else(|| self.out.join("checkpoints"))
    }

    fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            return Err(format!(
                "--heads {} must be at least 1 and divide --d-model {}",
                self.heads, self.d_model
            ));
        }
        for (name, value) in [
            ("layers", self.layers as u64),
            ("seq", self.seq as u64),
            ("batch", self.batch as u64),
            ("steps", self.steps),
        ] {
            if value == 0 {
                return Err(format!("--{name} must be at least 1, got 0"));
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("--lr must be a positive number, got {}", self.lr));
        }
        if self.low_outputs && self.precision == Precision::F32 {
            return Err("--low-outputs needs --precision bf16 or f16".to_string());
        }
        if self.store != Precision::F32 && self.budget.is_none() {
            return Err(format!(
                "--store {} compresses tensors the budget evicts: give a --budget too",
                self.store.label()
            ));
        }
        Ok(())
    }
}

/// Figures of one step, as written to `steps.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepLog {
    /// Step number, from 0.
    pub step: u64,
    /// Training loss.
    pub loss: f32,
    /// Wall time of the step.
    pub step_ms: f64,
    /// Tokens per second over the step.
    pub tokens_per_s: f64,
    /// Ledger live bytes after the step.
    pub live_bytes: u64,
    /// Ledger peak bytes since the start of the run.
    pub peak_bytes: u64,
    /// With `--loss-scale`: the scale this step's loss was multiplied by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f32>,
    /// With `--loss-scale`: the step was skipped (a gradient was inf or NaN).
    #[serde(default)]
    pub skipped: bool,
}

/// What a checkpoint holds besides the model and optimizer records.
#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    /// Steps done; the next step to run.
    next_step: u64,
    seed: u64,
    layers: usize,
    d_model: usize,
    heads: usize,
    seq: usize,
    /// The log so far, so a resumed run's log is the whole run's.
    log: Vec<StepLog>,
    /// The loss scaler's state, with `--loss-scale`.
    #[serde(default)]
    grad_scaler: Option<GradScalerState>,
}

type Ad<B> = Autodiff<Frugal<B>>;

/// What `memory.json` holds: the run's memory settings and remat counters beside the snapshot.
#[derive(Serialize)]
struct MemoryLog<'a> {
    budget: Option<u64>,
    checkpoint_blocks: bool,
    evict: Evict,
    /// What the budget and scopes did over this run.
    remat_stats: RematStats,
    #[serde(flatten)]
    snapshot: &'a memory::Snapshot,
}

/// Clears the device's budget and policy when a run ends, however it ends, so that the
/// caller's later work on the device is not managed by mistake.
struct BudgetGuard<'a, D: burn::tensor::backend::DeviceOps + 'static>(&'a D);

impl<D: burn::tensor::backend::DeviceOps + 'static> Drop for BudgetGuard<'_, D> {
    fn drop(&mut self) {
        memory::set_budget(self.0, None);
        memory::set_policy(self.0, Policy::default());
        frugal::precision::clear(self.0);
    }
}

/// Runs training on `B` (wrapped as `Autodiff<Frugal<B>>`) and returns the per-step log.
pub fn train<B: Backend>(args: &TrainArgs, device: B::Device) -> Result<Vec<StepLog>, String> {
    args.validate()?;
    probe_device::<B>(args.device, &device)?;
    // The budget must be on before the model exists, so that its parameters are managed too.
    memory::set_policy(
        &device,
        Policy {
            mode: args.evict.mode(),
            ..Policy::default()
        },
    );
    memory::set_budget(&device, args.budget);
    let _budget = BudgetGuard(&device);
    let refused = |flag: &str, e: frugal::PrecisionError| {
        format!("--{flag}: {e}; on the CPU, --device flex has bf16 and f16")
    };
    frugal::set_autocast::<B>(
        &device,
        args.precision
            .low()
            .map(|low| frugal::AutocastPolicy::new(low).with_low_outputs(args.low_outputs)),
    )
    .map_err(|e| refused("precision", e))?;
    memory::set_storage_precision::<B>(&device, args.store.low())
        .map_err(|e| refused("store", e))?;
    let remat_start = memory::remat_stats(&device);
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::generated(400_000, args.seed),
    };
    corpus.batch(args.seed, 0, 1, args.seq)?;
    let config = GptConfig::new(BYTE_VOCAB, args.seq, args.d_model, args.heads, args.layers);
    <Ad<B> as Backend>::seed(&device, args.seed);
    // Under a budget too small for the parameters and their first update, creating them
    // panics; say so as for a step.
    let created = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        config.init::<Ad<B>>(&device)
    }));
    let mut model = match created {
        Ok(model) => model,
        Err(panic) => {
            return Err(step_failure(
                args,
                "creating the model",
                panic,
                &device,
                &remat_start,
            ));
        }
    };
    let mut optim = train::optimizer::<Ad<B>>();
    let mut scaler = args
        .loss_scale
        .then(|| GradScaler::new(Default::default()).expect("PyTorch's defaults are valid"));
    let mut log = Vec::with_capacity(args.steps as usize);
    let mut first = 0;
    if args.resume {
        match latest_checkpoint(&args.checkpoints())? {
            Some(dir) => {
                let state;
                (model, optim, state) = load_checkpoint::<B>(&dir, model, optim, &device)?;
                if (
                    state.layers,
                    state.d_model,
                    state.heads,
                    state.seq,
                    state.seed,
                ) != (args.layers, args.d_model, args.heads, args.seq, args.seed)
                {
                    return Err(format!(
                        "checkpoint {} was made with --layers {} --d-model {} --heads {} --seq {} --seed {}; \
                         resume with the same values",
                        dir.display(),
                        state.layers,
                        state.d_model,
                        state.heads,
                        state.seq,
                        state.seed
                    ));
                }
                match (state.grad_scaler, args.loss_scale) {
                    (Some(saved), true) => {
                        scaler = Some(GradScaler::from_state(saved).map_err(|e| {
                            format!("checkpoint {}: loss scaler: {e}", dir.display())
                        })?);
                    }
                    (None, false) => {}
                    (saved, _) => {
                        return Err(format!(
                            "checkpoint {} was made {} --loss-scale; resume {} it",
                            dir.display(),
                            if saved.is_some() { "with" } else { "without" },
                            if saved.is_some() { "with" } else { "without" },
                        ));
                    }
                }
                first = state.next_step;
                log = state.log;
                if !args.quiet {
                    println!("resuming from {} at step {first}", dir.display());
                }
            }
            None => {
                return Err(format!(
                    "--resume: no checkpoint in {}",
                    args.checkpoints().display()
                ));
            }
        }
    }
    if !args.quiet {
        println!(
            "gpt: {} parameters ({} layers, d_model {}, {} heads), batch {} x {} tokens, steps {}..{} on {}",
            model.num_params(),
            args.layers,
            args.d_model,
            args.heads,
            args.batch,
            args.seq,
            first,
            args.steps,
            <Ad<B> as Backend>::name(&device)
        );
        if let Some(settings) = memory_settings(args) {
            println!("memory: {settings}");
        }
    }

    let bar = ProgressBar::new(args.steps);
    if args.quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] step {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_position(first);
    let profiled_step = args.steps - 1;
    for step in first..args.steps {
        if step == profiled_step {
            // Record the timeline of the last step for the plot.
            memory::record_timeline(&device, 1 << 20);
        }
        let started = Instant::now();
        let batch = corpus.batch(args.seed, step, args.batch, args.seq)?;
        // A device out-of-memory surfaces as a panic deep inside the inner backend; catch it
        // to say what held the memory and which flags would help, instead of a backtrace.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let on_phase = |phase: Phase| memory::mark(&device, phase.label());
            train::step_full(
                model,
                &mut optim,
                batch,
                args.lr,
                &device,
                args.checkpoint_blocks,
                scaler.as_mut(),
                on_phase,
            )
        }));
        let (next, loss, scaled) = match outcome {
            Ok(result) => result,
            Err(panic) => {
                return Err(step_failure(
                    args,
                    &format!("step {step}"),
                    panic,
                    &device,
                    &remat_start,
                ));
            }
        };
        model = next;
        if !loss.is_finite() {
            // The update from a non-finite loss has spoilt the parameters: keep the last good
            // checkpoint rather than overwrite it.
            let latest = latest_checkpoint(&args.checkpoints())?
                .map(|p| format!("the last good checkpoint is {}", p.display()))
                .unwrap_or_else(|| "no checkpoint was saved (use --save-every)".into());
            return Err(format!(
                "the loss became {loss} at step {step}; {latest}; try a lower --lr than {}",
                args.lr
            ));
        }
        let step_ms = started.elapsed().as_secs_f64() * 1e3;
        let entry = StepLog {
            step,
            loss,
            step_ms,
            tokens_per_s: (args.batch * args.seq) as f64 / (step_ms / 1e3),
            live_bytes: memory::live_bytes(&device),
            peak_bytes: memory::peak_bytes(&device),
            loss_scale: scaled.map(|s| s.scale),
            skipped: scaled.is_some_and(|s| s.skipped),
        };
        let budget = args
            .budget
            .map(|b| format!(" / budget {}", format_bytes(b)))
            .unwrap_or_default();
        bar.set_message(format!(
            "loss {:.3} | {:.0} tok/s | live {} | peak {}{budget}",
            loss,
            entry.tokens_per_s,
            format_bytes(entry.live_bytes),
            format_bytes(entry.peak_bytes)
        ));
        bar.inc(1);
        log.push(entry);
        let done = step + 1;
        if args.save_every > 0 && done % args.save_every == 0 && done < args.steps {
            save_checkpoint(args, &model, &optim, scaler.as_ref(), done, &log)?;
        }
    }
    bar.finish();
    let snapshot = memory::snapshot(&device);
    let remat = memory::remat_stats(&device).since(&remat_start);
    memory::record_timeline(&device, 0);
    save_checkpoint(args, &model, &optim, scaler.as_ref(), args.steps, &log)?;

    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create --out {}: {e}", args.out.display()))?;
    write_atomic(
        &args.out.join("steps.json"),
        serde_json::to_string_pretty(&log).unwrap().as_bytes(),
    )?;
    let memory_log = MemoryLog {
        budget: args.budget,
        checkpoint_blocks: args.checkpoint_blocks,
        evict: args.evict,
        remat_stats: remat,
        snapshot: &snapshot,
    };
    write_atomic(
        &args.out.join("memory.json"),
        serde_json::to_string_pretty(&memory_log)
            .expect("a memory log always serialises")
            .as_bytes(),
    )?;
    let plot = args.out.join("step-memory.png");
    crate::plot::step_memory(&snapshot, &plot)?;
    if !args.quiet {
        if let (Some(first), Some(last)) = (log.first(), log.last()) {
            println!(
                "loss {:.3} (step {}) -> {:.3} (step {})",
                first.loss, first.step, last.loss, last.step
            );
        }
        println!("{}", memory::report(&device));
        if let Some(settings) = memory_settings(args) {
            println!("{settings}; over the run: {}", remat_summary(&remat));
        }
        let kernels = frugal::kernels::stats();
        if kernels != frugal::kernels::KernelStats::default() {
            println!(
                "Frugal's kernels: {} casts ({} in fusion), {} gradients unscaled in {} launches",
                kernels.casts,
                kernels.fused_casts,
                kernels.unscaled_tensors,
                kernels.unscale_launches
            );
        }
        println!(
            "wrote {}/steps.json, memory.json, step-memory.png; checkpoints in {}",
            args.out.display(),
            args.checkpoints().display()
        );
    }
    Ok(log)
}

/// The budget, eviction mode and scopes of a run, or `None` for a run without either.
fn memory_settings(args: &TrainArgs) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(budget) = args.budget {
        parts.push(format!(
            "budget {} (evict {})",
            format_bytes(budget),
            args.evict.label()
        ));
    }
    if args.checkpoint_blocks {
        parts.push("checkpointed blocks".to_string());
    }
    if args.precision != Precision::F32 {
        parts.push(format!(
            "autocast {}{}",
            args.precision.label(),
            if args.low_outputs {
                " (products left in it)"
            } else {
                ""
            }
        ));
    }
    if args.store != Precision::F32 {
        parts.push(format!("evicted tensors stored in {}", args.store.label()));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// One line of what the budget and scopes did.
fn remat_summary(stats: &RematStats) -> String {
    format!(
        "{} evictions ({}), {} recomputes ({}), {} offloads ({}), {} uploads ({}), \
         host memory peak {}, {} compressed ({}), {} decompressed",
        stats.evictions,
        format_bytes(stats.evicted_bytes),
        stats.recomputes,
        format_bytes(stats.recomputed_bytes),
        stats.offloads,
        format_bytes(stats.offloaded_bytes),
        stats.uploads,
        format_bytes(stats.uploaded_bytes),
        format_bytes(stats.peak_host_bytes),
        stats.compressions,
        format_bytes(stats.compressed_bytes),
        stats.decompressions
    )
}

/// Runs one tiny op on the device, so a missing driver or GPU is reported as an error naming
/// the device rather than as a panic from a backend thread.
fn probe_device<B: Backend>(kind: DeviceKind, device: &B::Device) -> Result<(), String> {
    use std::sync::{Arc, Mutex};
    let messages = Arc::new(Mutex::new(Vec::<String>::new()));
    let previous = std::panic::take_hook();
    let sink = messages.clone();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        sink.lock().unwrap().push(text);
    }));
    let probe = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        burn::tensor::Tensor::<B, 1>::zeros([1], device).into_data();
    }));
    std::panic::set_hook(previous);
    probe.map_err(|_| {
        let first = messages
            .lock()
            .unwrap()
            .first()
            .cloned()
            .unwrap_or_default();
        let first: String = first.chars().take(200).collect();
        format!(
            "--device {} is not usable on this machine: {first}",
            format!("{kind:?}").to_lowercase()
        )
    })
}

/// The message for a step (or the model's creation) that panicked: typically the device running
/// out of memory, or an op that cannot fit in the budget.
fn step_failure<D: burn::tensor::backend::DeviceOps + 'static>(
    args: &TrainArgs,
    what: &str,
    panic: Box<dyn std::any::Any + Send>,
    device: &D,
    remat_start: &RematStats,
) -> String {
    let reason = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    let report = memory::report(device);
    let holders: Vec<String> = report
        .holders
        .iter()
        .take(5)
        .map(|h| format!("{} {}", h.op, format_bytes(h.bytes)))
        .collect();
    let saved = latest_checkpoint(&args.checkpoints())
        .ok()
        .flatten()
        .map(|p| {
            format!(
                "the last checkpoint is {} (continue with --resume)",
                p.display()
            )
        })
        .unwrap_or_else(|| "no checkpoint was saved (use --save-every N)".into());
    let (budget, hints) = match args.budget {
        Some(bytes) => (
            format!(
                "\n  the memory budget is {} (--budget, evicting by {}); so far: {}",
                format_bytes(bytes),
                args.evict.label(),
                remat_summary(&memory::remat_stats(device).since(remat_start))
            ),
            format!(
                "a larger --budget than {}{}, ",
                format_bytes(bytes),
                if args.evict == Evict::Auto {
                    ""
                } else {
                    " or --evict auto"
                }
            ),
        ),
        None => (
            String::new(),
            if args.checkpoint_blocks {
                "a --budget, ".to_string()
            } else {
                "--checkpoint-blocks, a --budget, ".to_string()
            },
        ),
    };
    format!(
        "{what} failed: {reason}\n  peak live tensor memory {} (now {}); biggest holders: {}{budget}\n  \
         {saved}\n  to need less memory: {hints}a smaller --batch (now {}) or --seq (now {}), or a smaller model \
         (--layers {}, --d-model {})",
        format_bytes(report.peak_bytes),
        format_bytes(report.live_bytes),
        holders.join(", "),
        args.batch,
        args.seq,
        args.layers,
        args.d_model
    )
}

/// Writes `contents` to a temporary file beside `path` and renames it over `path`, so a crash
/// never leaves a half-written file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename to {}: {e}", path.display()))
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::new()
}

/// Saves model, optimizer and state into `DIR/step-NNNNNNNN`: written into a temporary folder
/// first and renamed into place, so an interrupted save never shadows the previous one.
fn save_checkpoint<B: Backend>(
    args: &TrainArgs,
    model: &Gpt<Ad<B>>,
    optim: &GptOptimizer<Ad<B>>,
    scaler: Option<&GradScaler>,
    next_step: u64,
    log: &[StepLog],
) -> Result<PathBuf, String> {
    let root = args.checkpoints();
    let final_dir = root.join(format!("step-{next_step:08}"));
    let tmp_dir = root.join(format!(".step-{next_step:08}.tmp"));
    let io = |e: std::io::Error| format!("checkpoint {}: {e}", tmp_dir.display());
    if tmp_dir.exists() {
        std::fs::remove_dir_all(&tmp_dir).map_err(io)?;
    }
    std::fs::create_dir_all(&tmp_dir).map_err(io)?;
    model
        .clone()
        .save_file(tmp_dir.join("model"), &recorder())
        .map_err(|e| format!("saving the model: {e}"))?;
    recorder()
        .record(optim.to_record(), tmp_dir.join("optimizer"))
        .map_err(|e| format!("saving the optimizer: {e}"))?;
    let state = TrainState {
        next_step,
        seed: args.seed,
        layers: args.layers,
        d_model: args.d_model,
        heads: args.heads,
        seq: args.seq,
        log: log.to_vec(),
        grad_scaler: scaler.map(GradScaler::state),
    };
    std::fs::write(
        tmp_dir.join("state.json"),
        serde_json::to_string_pretty(&state).unwrap(),
    )
    .map_err(io)?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io)?;
    }
    std::fs::rename(&tmp_dir, &final_dir).map_err(io)?;
    Ok(final_dir)
}

/// The checkpoint with the highest step in `root`, ignoring unfinished ones.
fn latest_checkpoint(root: &Path) -> Result<Option<PathBuf>, String> {
    if !root.exists() {
        return Ok(None);
    }
    let entries =
        std::fs::read_dir(root).map_err(|e| format!("reading {}: {e}", root.display()))?;
    Ok(entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-"))
                && p.join("state.json").exists()
        })
        .max())
}

type Loaded<B> = (Gpt<Ad<B>>, GptOptimizer<Ad<B>>, TrainState);

fn load_checkpoint<B: Backend>(
    dir: &Path,
    model: Gpt<Ad<B>>,
    optim: GptOptimizer<Ad<B>>,
    device: &B::Device,
) -> Result<Loaded<B>, String> {
    let state: TrainState = serde_json::from_str(
        &std::fs::read_to_string(dir.join("state.json"))
            .map_err(|e| format!("reading {}: {e}", dir.display()))?,
    )
    .map_err(|e| format!("{}/state.json: {e}", dir.display()))?;
    let model = model
        .load_file(dir.join("model"), &recorder(), device)
        .map_err(|e| format!("loading the model from {}: {e}", dir.display()))?;
    let record = recorder()
        .load(dir.join("optimizer"), device)
        .map_err(|e| format!("loading the optimizer from {}: {e}", dir.display()))?;
    Ok((model, optim.load_record(record), state))
}
