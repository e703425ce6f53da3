//! What the run says when something is wrong or worth knowing: a device that cannot be used, a
//! step that failed (with what held the memory and which flags would help), a loss that became
//! non-finite, and one-line summaries of the memory settings and of what the budget did.

use burn::tensor::backend::{Backend, DeviceOps};
use frugal::memory::{self, format_bytes};
use frugal::{CaughtPanic, RematStats};
use serde::{Deserialize, Serialize};

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
    let mut line = format!(
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
    );
    if stats.allocation_rescues > 0 {
        line += &format!(
            "; the allocator, out of memory, asked the budget {} times ({} dropped)",
            stats.allocation_rescues,
            format_bytes(stats.rescued_bytes)
        );
    }
    line
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
            kind.name()
        )
    })
}

/// What a step that ran out of memory met, for [`out_of_memory_line`]: the budget, when the
/// failure names it, else the GPU's memory (read when the run started) and frugal-cuda's cap;
/// `None` when neither is known.
pub fn memory_limit(
    reason: &str,
    budget: Option<u64>,
    gpu: Option<&memory::DeviceMemory>,
) -> Option<String> {
    let budget = budget.map(|bytes| format!("budget {}", format_bytes(bytes)));
    if reason.to_lowercase().contains("memory budget") && budget.is_some() {
        return budget;
    }
    gpu.map(|gpu| match gpu.cap {
        Some(cap) => format!(
            "GPU {}, capped at {}",
            format_bytes(gpu.total),
            format_bytes(cap)
        ),
        None => format!("GPU {}", format_bytes(gpu.total)),
    })
    .or(budget)
}

/// The one line a run prints when step `step` ran out of memory with micro-batches of `rows`
/// rows and goes on (`next`, e.g. "retrying the step with") with `micro_batches` of half that.
pub fn out_of_memory_line(
    step: u64,
    rows: usize,
    limit: &Option<String>,
    next: &str,
    micro_batches: usize,
    reason: &str,
) -> String {
    let limit = limit
        .as_ref()
        .map(|limit| format!(" ({limit})"))
        .unwrap_or_default();
    // The budget's recompute limit (`frugal::memory::set_recompute_limit`) says how far over.
    let what = match reason.find(" recomputed ") {
        Some(at) if reason.contains("the forward pass's work in one pass") => {
            let ratio = reason[at..].split_whitespace().nth(1).unwrap_or("");
            format!("the budget recomputed {ratio} the forward pass's work")
        }
        _ => "out of memory".to_string(),
    };
    format!(
        "step {step}: {what} at micro-batch {rows}{limit}: {next} micro-batch {} × \
         {micro_batches}",
        rows / 2
    )
}

/// Whether a step failed for memory: the budget could not be kept, or the device (or its
/// allocator) could not allocate.
pub fn is_out_of_memory(reason: &str) -> bool {
    let reason = reason.to_lowercase();
    OUT_OF_MEMORY_SIGNS.iter().any(|sign| reason.contains(sign))
}

/// Words that mark a failure for memory, in lower case.
const OUT_OF_MEMORY_SIGNS: [&str; 7] = [
    "memory budget",
    "out of memory",
    "out of device memory",
    "outofmemory",
    "out_of_memory",
    "can't allocate",
    "cannot allocate",
];

/// A failed step's panic, with what held the device's memory when it failed.
pub type StepPanic = CaughtPanic<Vec<frugal::memory::Holder>>;

/// Runs `work`, catching its panic, and the backend threads' panics meanwhile, without printing
/// them (the run reports them in a few lines); the caught panic carries what held `device`'s
/// memory at that moment, read before unwinding dropped the step's tensors.
pub fn quietly<D: DeviceOps + Clone + Send + Sync + 'static, T>(
    device: &D,
    work: impl FnOnce() -> T,
) -> Result<T, StepPanic> {
    let device = device.clone();
    frugal::catch_quietly(work, move || memory::holders(&device))
}

/// Why a step failed, in a few hundred characters: the first message that names memory (on
/// CUDA the device thread's own error: the step's thread sees only that the device stopped
/// answering), else the step's own message.
pub fn failure_reason<S>(caught: &CaughtPanic<S>) -> String {
    // A bare `CallError` only says the device stopped answering: a device thread's own
    // message says why.
    let telling = caught
        .messages()
        .find(|m| is_out_of_memory(m))
        .or_else(|| {
            caught
                .message()
                .contains("CallError")
                .then(|| caught.other_threads.first().cloned())
                .flatten()
        })
        .unwrap_or_else(|| caught.message());
    // CubeCL nests errors in `Debug` text: start at the out-of-memory words, unescaped.
    let lower = telling.to_lowercase();
    let start = OUT_OF_MEMORY_SIGNS
        .iter()
        .filter_map(|sign| lower.find(sign))
        .min()
        .map(|at| {
            // Back to the start of that sentence (the `frugal-cuda:` or `frugal:` prefix).
            lower[..at].rfind(['"', '\n']).map_or(0, |quote| quote + 1)
        })
        .unwrap_or(0);
    let text = telling[start..].replace("\\n", " ").replace("\\\"", "\"");
    let text = text
        .split("\", backtrace")
        .next()
        .unwrap_or(&text)
        .trim_end_matches('"');
    if text.chars().count() > 600 {
        // At the last word that fits, so that no word is cut.
        let head: String = text.chars().take(600).collect();
        let head = head
            .rsplit_once(' ')
            .map_or(head.as_str(), |(words, _)| words);
        format!("{} …", head.trim_end())
    } else {
        text.to_string()
    }
}

/// Whether the device stopped answering after a failure: Burn 0.21's CUDA device threads (the
/// autotuner, fusion's stream) panic on a runtime error, after which every op on the device
/// fails, so the step cannot be retried in this process.
pub fn device_stopped<S>(caught: &CaughtPanic<S>) -> bool {
    device_thread_gone(caught)
        || caught
            .messages()
            .any(|m| m.contains("server is in an invalid state"))
}

/// Whether `device` can run nothing more in this process after `caught`: on frugal-cuda a
/// failed allocation is reported and cleared by its server, which goes on, so only a device
/// thread that is gone counts there; on Burn's CUDA runtime, also a server in an invalid state.
pub fn device_gone<S>(device: crate::cli::DeviceKind, caught: &CaughtPanic<S>) -> bool {
    match device {
        crate::cli::DeviceKind::FrugalCuda => device_thread_gone(caught),
        _ => device_stopped(caught),
    }
}

/// Whether the device's own thread is gone (a call to it failed, or its channel is down),
/// rather than its server having reported errors: then nothing more runs on the device in
/// this process, on any runtime.
pub fn device_thread_gone<S>(caught: &CaughtPanic<S>) -> bool {
    caught
        .messages()
        .any(|m| m.contains("CallError") || m.contains("channel with the server is down"))
}

/// The number of micro-batches that halves the micro-batch of `batch` split `micro_batches`
/// ways; `None` when a micro-batch is one row or an odd number of rows.
pub fn halved_micro_batch(batch: usize, micro_batches: usize) -> Option<usize> {
    let micro_batches = micro_batches.max(1);
    let rows = batch / micro_batches;
    (rows >= 2 && rows.is_multiple_of(2)).then_some(micro_batches * 2)
}

/// What frugal-cuda's allocator says about its peaks and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorPeaks {
    /// Peak bytes in live blocks.
    pub allocated: u64,
    /// Peak bytes reserved from the device.
    pub reserved: u64,
    /// The hard cap on reserved bytes (`--memory-cap`).
    pub cap: Option<u64>,
    /// The growth limit now (it rises when passed).
    pub growth_limit: Option<u64>,
    /// Allocations that reserved beyond the growth limit.
    pub growth_limit_passes: u64,
    /// Times misses that cost the device time raised the growth limit, and times such raises
    /// were taken back (the steps after them were no faster).
    pub growth_limit_raises: u64,
    pub growth_limit_reverts: u64,
}

/// frugal-cuda's memory report on `device` (allocator statistics and registry counters);
/// `None` on other devices (and in builds without frugal-cuda).
#[cfg(feature = "frugal-cuda")]
fn frugal_cuda_report<D: 'static>(device: &D) -> Option<frugal_cuda::MemoryReport> {
    let device = (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()?;
    Some(frugal_cuda::memory_report(device))
}

/// frugal-cuda's allocator peaks on `device`; `None` on other devices.
pub fn allocator_peaks<D: 'static>(device: &D) -> Option<AllocatorPeaks> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(report) = frugal_cuda_report(device) {
        let stats = report.stats;
        return Some(AllocatorPeaks {
            allocated: stats.peak_allocated_bytes,
            reserved: stats.peak_reserved_bytes,
            cap: stats.cap,
            growth_limit: stats.growth_limit,
            growth_limit_passes: stats.growth_limit_passes,
            growth_limit_raises: report.registry.growth_limit_raises,
            growth_limit_reverts: report.registry.growth_limit_reverts,
        });
    }
    let _ = device;
    None
}

/// Calls of one kind and the milliseconds they took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CallsMs {
    /// Number of calls.
    pub count: u64,
    /// Milliseconds in them.
    pub ms: f64,
}

impl CallsMs {
    fn since(&self, start: &Self) -> Self {
        Self {
            count: self.count.saturating_sub(start.count),
            ms: self.ms - start.ms,
        }
    }
}

/// frugal-cuda's allocator counters that say what keeping reserved memory near the budget
/// cost: memory moved between addresses, driver calls and waits for the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorCounters {
    /// Bytes mapped into expandable segments.
    pub mapped_bytes: u64,
    /// Bytes unmapped from them.
    pub unmapped_bytes: u64,
    /// Host waits for the device before memory was given back.
    pub device_waits: CallsMs,
    /// Mappings (physical memory, map, access).
    pub device_maps: CallsMs,
    /// Unmappings of granules given back.
    pub device_unmaps: CallsMs,
    /// Allocations that reserved beyond the growth limit.
    pub growth_limit_passes: u64,
    /// Reserved bytes at the end (not a difference in [`Self::since`]).
    pub reserved_bytes: u64,
}

impl AllocatorCounters {
    /// The counts since `start` (reserved bytes stay as they are now).
    pub fn since(&self, start: &Self) -> Self {
        Self {
            mapped_bytes: self.mapped_bytes.saturating_sub(start.mapped_bytes),
            unmapped_bytes: self.unmapped_bytes.saturating_sub(start.unmapped_bytes),
            device_waits: self.device_waits.since(&start.device_waits),
            device_maps: self.device_maps.since(&start.device_maps),
            device_unmaps: self.device_unmaps.since(&start.device_unmaps),
            growth_limit_passes: self
                .growth_limit_passes
                .saturating_sub(start.growth_limit_passes),
            reserved_bytes: self.reserved_bytes,
        }
    }
}

#[cfg(feature = "frugal-cuda")]
fn calls_ms(calls: frugal_cuda::allocator::CallTime) -> CallsMs {
    CallsMs {
        count: calls.count,
        ms: calls.nanos as f64 / 1e6,
    }
}

/// frugal-cuda's pool on `device` in one line (allocated bytes and blocks, reserved, cached
/// free and its largest block, failed allocations so far); `None` on other devices.
pub fn pool_line<D: 'static>(device: &D) -> Option<String> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let report = frugal_cuda::memory_report(device);
        let stats = report.stats;
        // The largest live blocks by size, with how many there are of each: what holds memory
        // that no tensor of the ledger accounts for.
        let mut sizes = std::collections::BTreeMap::<u64, u64>::new();
        for segment in frugal_cuda::allocator_snapshot(device).segments {
            for block in segment.blocks.iter().filter(|b| b.allocated) {
                *sizes.entry(block.requested).or_default() += 1;
            }
        }
        let largest: Vec<String> = sizes
            .iter()
            .rev()
            .take(6)
            .map(|(size, count)| format!("{count} x {size} B"))
            .collect();
        return Some(format!(
            "pool: allocated {} B in {} blocks, reserved {} B, cached free {} B (largest {} B), \
             {} failed allocations; CubeCL: {} B in {} buffers; largest live blocks: {}",
            stats.allocated_bytes,
            stats.active_blocks,
            stats.reserved_bytes,
            stats.free_bytes,
            stats.largest_free_block,
            stats.oom_count,
            report.bytes_in_use,
            report.buffers_in_use,
            largest.join(", ")
        ));
    }
    let _ = device;
    None
}

/// frugal-cuda's allocator counters on `device`; `None` on other devices.
pub fn allocator_counters<D: 'static>(device: &D) -> Option<AllocatorCounters> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(stats) = frugal_cuda_report(device).map(|report| report.stats) {
        return Some(AllocatorCounters {
            mapped_bytes: stats.mapped_bytes,
            unmapped_bytes: stats.unmapped_bytes,
            device_waits: calls_ms(stats.device_times.waits),
            device_maps: calls_ms(stats.device_times.maps),
            device_unmaps: calls_ms(stats.device_times.unmaps),
            growth_limit_passes: stats.growth_limit_passes,
            reserved_bytes: stats.reserved_bytes,
        });
    }
    let _ = device;
    None
}

/// What the device's own pool says, for a failure message: reserved and in-use bytes, and on
/// frugal-cuda its allocator's exact peak.
fn device_figures<D: 'static>(device: &D) -> String {
    if let Some(peaks) = allocator_peaks(device) {
        return format!(
            "\n  the device (frugal-cuda): peak allocated {}, peak reserved {}{}",
            format_bytes(peaks.allocated),
            format_bytes(peaks.reserved),
            peaks
                .cap
                .map(|cap| format!(" (--memory-cap {})", format_bytes(cap)))
                .unwrap_or_default()
        );
    }
    match memory::pool_usage(device) {
        Some(pool) => format!(
            "\n  the device's pool now: {} reserved, {} in use",
            format_bytes(pool.bytes_reserved),
            format_bytes(pool.bytes_in_use)
        ),
        None => String::new(),
    }
}

/// The message for a step (or the model's creation) that panicked: typically the device running
/// out of memory, or an op that cannot fit in the budget.
pub fn step_failure<D: DeviceOps + 'static>(
    args: &TrainArgs,
    what: &str,
    caught: StepPanic,
    device: &D,
    remat_start: &RematStats,
) -> String {
    let reason = failure_reason(&caught);
    let report = memory::report(device);
    let holders: Vec<String> = caught
        .at_panic
        .as_ref()
        .unwrap_or(&report.holders)
        .iter()
        .take(5)
        .map(|h| format!("{} {}", h.op, format_bytes(h.bytes)))
        .collect();
    // After a device out-of-memory on CUDA the device is gone for this process: say so, and
    // how to go on from disk with half the micro-batch.
    let stopped = device_gone(args.device, &caught) && is_out_of_memory(&reason);
    let resume = if stopped {
        format!(
            "--resume --accumulate {}",
            halved_micro_batch(args.batch(), args.accumulate).unwrap_or(args.accumulate)
        )
    } else {
        "--resume".to_string()
    };
    let saved = latest_checkpoint(&args.checkpoints())
        .ok()
        .flatten()
        .map(|p| {
            format!(
                "the last checkpoint is {} (continue with {resume})",
                p.display()
            )
        })
        .unwrap_or_else(|| "no checkpoint was saved (use --save-every N)".into());
    let saved = if stopped {
        format!(
            "the device stopped answering after running out of memory (Burn's CUDA device \
             threads do not survive a runtime error), so the step cannot be retried in this \
             process; {saved}"
        )
    } else {
        saved
    };
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
        "{what} failed: {reason}\n  peak live tensor bytes as Frugal counts them {} (now {}); \
         biggest holders {}: {}{}{budget}\n  \
         {saved}\n  to need less memory: {hints}a smaller --batch (now {}) or --seq (now {}), or a smaller model \
         (--layers {}, --d-model {})",
        format_bytes(report.peak_bytes),
        format_bytes(report.live_bytes),
        if caught.at_panic.is_some() {
            "when it failed"
        } else {
            "now"
        },
        holders.join(", "),
        device_figures(device),
        args.batch(),
        args.seq(),
        args.layers(),
        args.d_model()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_a_micro_batch_needs_an_even_number_of_rows() {
        assert_eq!(halved_micro_batch(8, 1), Some(2));
        assert_eq!(halved_micro_batch(8, 2), Some(4));
        assert_eq!(halved_micro_batch(8, 8), None, "one row");
        assert_eq!(halved_micro_batch(12, 4), None, "three rows");
        assert_eq!(
            halved_micro_batch(6, 0),
            Some(2),
            "no split yet is one micro-batch"
        );
    }

    #[test]
    fn a_bare_call_error_gives_way_to_a_device_threads_message() {
        let caught = frugal::catch_quietly(
            || {
                let device =
                    std::thread::spawn(|| panic!("can't allocate buffer of size: 5313593344"));
                assert!(device.join().is_err());
                panic!("failed to read: CallError")
            },
            || 3usize,
        )
        .unwrap_err();
        assert_eq!(caught.at_panic, Some(3));
        assert!(device_stopped(&caught));
        let reason = failure_reason(&caught);
        assert!(reason.starts_with("can't allocate buffer"), "{reason}");
        assert!(is_out_of_memory(&reason));
    }
}
