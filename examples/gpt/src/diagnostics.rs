//! What the run says when something is wrong or worth knowing: a device that cannot be used, a
//! step that failed (with what held the memory and which flags would help), a loss that became
//! non-finite, and one-line summaries of the memory settings and of what the budget did.

use burn::tensor::backend::{Backend, DeviceOps};
use frugal::RematStats;
use frugal::memory::{self, format_bytes};

use crate::checkpoint::latest_checkpoint;
use crate::cli::{DeviceKind, Evict, Precision, TrainArgs};
use crate::memory_settings::SettingsError;

/// A memory setting the device refused, naming the flag that asked for it.
pub fn settings_refused(error: SettingsError) -> String {
    let flag = match error {
        SettingsError::Autocast(_) => "precision",
        SettingsError::Storage(_) => "store",
    };
    format!(
        "--{flag}: {}; on the CPU, --device flex has bf16 and f16",
        error.precision_error()
    )
}

/// The message for a loss that became inf or NaN at `step`. The update from it has spoilt the
/// parameters, so the run stops and points at the last good checkpoint rather than overwrite
/// it (or says why the checkpoint folder could not be read).
pub fn non_finite_loss(args: &TrainArgs, loss: f32, step: u64) -> String {
    let latest = match latest_checkpoint(&args.checkpoints()) {
        Ok(latest) => latest,
        Err(e) => return e,
    };
    let latest = latest
        .map(|p| format!("the last good checkpoint is {}", p.display()))
        .unwrap_or_else(|| "no checkpoint was saved (use --save-every)".into());
    format!(
        "the loss became {loss} at step {step}; {latest}; try a lower --lr than {}",
        args.lr
    )
}

/// The memory settings of a run in one line, or `None` for a run where Frugal only watches.
pub fn settings_summary(args: &TrainArgs) -> Option<String> {
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
pub fn remat_summary(stats: &RematStats) -> String {
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
pub fn probe_device<B: Backend>(kind: DeviceKind, device: &B::Device) -> Result<(), String> {
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

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// The first line of `text`, at most `max` characters.
pub fn first_line(text: &str, max: usize) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(max)
        .collect()
}

/// Whether a step failed for memory: the budget could not be kept, or the device (or its
/// allocator) could not allocate.
pub fn is_out_of_memory(reason: &str) -> bool {
    let reason = reason.to_lowercase();
    [
        "memory budget",
        "out of memory",
        "outofmemory",
        "out_of_memory",
        "can't allocate",
        "cannot allocate",
    ]
    .iter()
    .any(|sign| reason.contains(sign))
}

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Runs `work`, catching a panic without printing it (the run reports it in a few lines);
/// panics of other threads print as before.
pub fn quietly<T>(work: impl FnOnce() -> T) -> std::thread::Result<T> {
    use std::sync::Arc;
    let previous: Arc<PanicHook> = Arc::new(std::panic::take_hook());
    let quiet = std::thread::current().id();
    let others = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() != quiet {
            others(info)
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    // Ours is dropped here, releasing its share of the previous hook.
    drop(std::panic::take_hook());
    match Arc::try_unwrap(previous) {
        Ok(hook) => std::panic::set_hook(hook),
        Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
    }
    result
}

/// The message for a step (or the model's creation) that panicked: typically the device running
/// out of memory, or an op that cannot fit in the budget.
pub fn step_failure<D: DeviceOps + 'static>(
    args: &TrainArgs,
    what: &str,
    panic: Box<dyn std::any::Any + Send>,
    device: &D,
    remat_start: &RematStats,
) -> String {
    let reason = panic_message(panic.as_ref());
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
