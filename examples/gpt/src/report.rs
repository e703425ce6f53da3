//! What a run shows and leaves behind: the header, the progress bar, the per-step log
//! (`steps.json`), the memory log (`memory.json`), the plot of the last step's memory, and the
//! closing report.

use burn::tensor::backend::DeviceOps;
use frugal::RematStats;
use frugal::memory::{self, format_bytes};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomic;
use crate::cli::{Evict, TrainArgs};
use crate::diagnostics::{AllocatorCounters, remat_summary, settings_summary};

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
    /// Micro-batches the step's batch was split into (`--accumulate`, doubled by each
    /// recovery from an out-of-memory).
    #[serde(default = "one")]
    pub micro_batches: usize,
    /// With `--loss-scale`: the scale this step's loss was multiplied by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f32>,
    /// With `--loss-scale`: the step was skipped (a gradient was inf or NaN).
    #[serde(default)]
    pub skipped: bool,
    /// Under a budget or scopes: what they did in this step (recomputed, offloaded and
    /// uploaded bytes, offload waits, eviction rounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remat: Option<RematStats>,
    /// On frugal-cuda: what its allocator did in this step (memory mapped and unmapped, waits
    /// for the device, growth-limit passes) and the bytes reserved at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorCounters>,
}

fn one() -> usize {
    1
}

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

/// Prints what is about to run on the backend called `backend` (unless `--quiet`).
pub fn print_header(args: &TrainArgs, parameters: usize, first: u64, backend: &str) {
    if args.quiet {
        return;
    }
    println!(
        "gpt: {} parameters ({} layers, d_model {}, {} heads), batch {} x {} tokens, steps {}..{} on {}",
        parameters,
        args.layers(),
        args.d_model(),
        args.heads(),
        args.batch(),
        args.seq(),
        first,
        args.steps,
        backend
    );
    if let Some(settings) = settings_summary(args) {
        println!("memory: {settings}");
    }
}

/// The progress bar (hidden with `--quiet`), at step `first`.
pub fn progress_bar(args: &TrainArgs, first: u64) -> ProgressBar {
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
    bar
}

/// Shows a finished step on the progress bar. Where the bar is not drawn (stderr is not a
/// terminal: a log file, a batch job) and `--quiet` is not given, the same line is printed as
/// text for the first and last step and then at most every `TEXT_PROGRESS_EVERY`, so a slow
/// run still shows that it moves.
pub fn show_step(bar: &ProgressBar, args: &TrainArgs, entry: &StepLog) {
    let budget = args
        .budget
        .map(|b| format!(" / budget {}", format_bytes(b)))
        .unwrap_or_default();
    let message = format!(
        "loss {:.3} | {:.0} tok/s | live {} | peak {}{budget}",
        entry.loss,
        entry.tokens_per_s,
        format_bytes(entry.live_bytes),
        format_bytes(entry.peak_bytes)
    );
    if bar.is_hidden() && !args.quiet {
        static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|at| at.elapsed() >= TEXT_PROGRESS_EVERY)
            || entry.step + 1 == args.steps;
        if due {
            eprintln!(
                "step {}/{} ({:.0} ms): {message}",
                entry.step + 1,
                args.steps,
                entry.step_ms
            );
            *last = Some(std::time::Instant::now());
        }
    }
    bar.set_message(message);
    bar.inc(1);
}

/// How often a run whose progress bar is not drawn prints a step line.
const TEXT_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes `steps.json`, `memory.json`, `memory_viz.pickle` and `step-memory.png` into `--out`.
/// Writes `--profile-kernels`' profile to `OUT/kernel-profile.json`.
pub fn write_kernel_profile(
    args: &TrainArgs,
    profile: &crate::kernel_profile::KernelProfile,
) -> Result<(), String> {
    write_atomic(
        &args.out.join("kernel-profile.json"),
        serde_json::to_string_pretty(profile)
            .expect("a profile always serialises")
            .as_bytes(),
    )
}

pub fn write_outputs(
    args: &TrainArgs,
    log: &[StepLog],
    snapshot: &memory::Snapshot,
    remat: RematStats,
) -> Result<(), String> {
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create --out {}: {e}", args.out.display()))?;
    write_atomic(
        &args.out.join("steps.json"),
        serde_json::to_string_pretty(log).unwrap().as_bytes(),
    )?;
    let memory_log = MemoryLog {
        budget: args.budget,
        checkpoint_blocks: args.checkpoint_blocks,
        evict: args.evict,
        remat_stats: remat,
        snapshot,
    };
    write_atomic(
        &args.out.join("memory.json"),
        serde_json::to_string_pretty(&memory_log)
            .expect("a memory log always serialises")
            .as_bytes(),
    )?;
    let viz = args.out.join("memory_viz.pickle");
    snapshot
        .write_memory_viz(&viz)
        .map_err(|e| format!("cannot write {}: {e}", viz.display()))?;
    crate::plot::step_memory(snapshot, &args.out.join("step-memory.png"))
}

/// What the budget moved in an average step of the `steps` run, or `None` if it did nothing.
fn per_step_summary(remat: &RematStats, steps: u64) -> Option<String> {
    let moved = remat.recomputed_bytes + remat.offloaded_bytes + remat.compressed_bytes;
    if steps == 0 || moved == 0 {
        return None;
    }
    let each = |bytes: u64| format_bytes(bytes / steps);
    let parked = match remat.parked_bytes {
        0 => String::new(),
        bytes => format!(
            " ({} of it optimizer state parked by the plan)",
            each(bytes)
        ),
    };
    Some(format!(
        "per step (mean of {steps}): {} recomputed, {} offloaded{parked}, {} compressed",
        each(remat.recomputed_bytes),
        each(remat.offloaded_bytes),
        each(remat.compressed_bytes)
    ))
}

/// Prints the closing report (unless `--quiet`): first and last loss, the memory report, what
/// the budget did, Frugal's kernel counters, what was compiled (`kernels_compiled`, see
/// [`crate::compile_progress::summary`]) and where the files went.
pub fn print_summary<D: DeviceOps + 'static>(
    args: &TrainArgs,
    log: &[StepLog],
    device: &D,
    remat: &RematStats,
    recovered: u32,
    steps_run: u64,
    kernels_compiled: Option<&str>,
) {
    if args.quiet {
        return;
    }
    if recovered > 0
        && let Some(last) = log.last()
    {
        println!(
            "recovered from {recovered} out-of-memory step(s): the run ended with {} \
             micro-batches of {} (start with --accumulate {} to skip the failed attempts)",
            last.micro_batches,
            args.batch() / last.micro_batches,
            last.micro_batches
        );
    }
    if recovered == 0
        && let (Some(first), Some(last)) = (log.first(), log.last())
        && first.micro_batches != last.micro_batches
    {
        println!(
            "the budget's recomputation split the batch: {} micro-batches of {} at the end, {} \
             at the start (--accumulate {} starts there; --keep-micro-batch keeps the split)",
            last.micro_batches,
            args.batch() / last.micro_batches,
            first.micro_batches,
            last.micro_batches
        );
    }
    if let (Some(first), Some(last)) = (log.first(), log.last()) {
        println!(
            "loss {:.3} (step {}) -> {:.3} (step {})",
            first.loss, first.step, last.loss, last.step
        );
    }
    println!("{}", memory::report(device));
    if let Some(peaks) = crate::diagnostics::allocator_peaks(device) {
        let (allocated, reserved) = (peaks.allocated, peaks.reserved);
        let share = args
            .budget
            .map(|budget| format!(" ({:.3}x the budget)", reserved as f64 / budget as f64))
            .unwrap_or_default();
        let growth = peaks
            .growth_limit
            .map(|limit| {
                format!(
                    "; growth limit {} ({limit} B), passed {} times, raised {} times for \
                     misses ({} taken back)",
                    format_bytes(limit),
                    peaks.growth_limit_passes,
                    peaks.growth_limit_raises,
                    peaks.growth_limit_reverts
                )
            })
            .unwrap_or_default();
        println!(
            "frugal-cuda's allocator: peak allocated {} ({allocated} B), peak reserved {} \
             ({reserved} B){share}{growth}",
            format_bytes(allocated),
            format_bytes(reserved)
        );
        if let Some(settled) = memory::settled_reserved(device) {
            let share = args
                .budget
                .map(|budget| {
                    format!(
                        " ({:.3}x the budget)",
                        settled.peak_reserved as f64 / budget as f64
                    )
                })
                .unwrap_or_default();
            println!(
                "  settled steps with no raise on trial: peak reserved {} ({} B){share}, under a \
                 growth limit of {} ({} B) known before they ran; {} passed their limit",
                format_bytes(settled.peak_reserved),
                settled.peak_reserved,
                format_bytes(settled.limit),
                settled.limit,
                settled.steps_over_limit
            );
        }
        if let Some(counters) = crate::diagnostics::allocator_counters(device) {
            println!(
                "  over the run: {} mapped in {} calls ({:.1} ms), {} unmapped ({} calls, \
                 {:.1} ms), {} waits for the device ({:.1} ms)",
                format_bytes(counters.mapped_bytes),
                counters.device_maps.count,
                counters.device_maps.ms,
                format_bytes(counters.unmapped_bytes),
                counters.device_unmaps.count,
                counters.device_unmaps.ms,
                counters.device_waits.count,
                counters.device_waits.ms
            );
        }
    }
    if let Some(settings) = settings_summary(args) {
        println!("{settings}; over the run: {}", remat_summary(remat));
        if let Some(per_step) = per_step_summary(remat, steps_run) {
            println!("{per_step}");
        }
    }
    let kernels = frugal::kernels::stats();
    if kernels != frugal::kernels::KernelStats::default() {
        println!(
            "Frugal's kernels: {} casts ({} in fusion), {} gradients unscaled in {} launches, \
             {} AdamW updates ({} in fusion), {} 8-bit AdamW updates ({} in fusion), \
             {} embedding backwards",
            kernels.casts,
            kernels.fused_casts,
            kernels.unscaled_tensors,
            kernels.unscale_launches,
            kernels.adamw_launches,
            kernels.fused_adamw,
            kernels.adamw8bit_launches,
            kernels.fused_adamw8bit,
            kernels.embedding_backwards
        );
    }
    if let Some(line) = kernels_compiled {
        println!("{line}");
    }
    println!(
        "wrote {}/steps.json, memory.json, memory_viz.pickle, step-memory.png; checkpoints in {}",
        args.out.display(),
        args.checkpoints().display()
    );
}

/// A duration as a person reads it: seconds (tenths under ten) under two minutes, minutes under two hours, then
/// hours.
pub fn format_duration(duration: std::time::Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds < 10.0 {
        format!("{seconds:.1} s")
    } else if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 7200.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}
