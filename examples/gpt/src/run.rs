//! The training run behind the `gpt` binary: the loop. Its flags are in [`crate::cli`], the
//! memory settings it applies in [`crate::memory_settings`], checkpoints in
//! [`crate::checkpoint`], failure messages in [`crate::diagnostics`], and what it prints and
//! writes in [`crate::report`].

use std::cell::RefCell;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::Backend;
use frugal::memory;
use frugal::{GradScaler, MicroBatching};

pub use crate::cli::{BudgetSize, DeviceKind, Evict, Precision, TrainArgs};
pub use crate::report::StepLog;

use crate::Ad;
use crate::autosave::Autosave;
use crate::checkpoint::{self, Resumed};
use crate::cli::{AttentionKind, LossKind, NormKind};
use crate::compile_progress;
use crate::data::{BYTE_VOCAB, Corpus};
use crate::diagnostics::{
    allocator_counters, device_gone, device_stopped, failure_reason, halved_micro_batch,
    is_out_of_memory, memory_limit, non_finite_loss, out_of_memory_line, probe_device, quietly,
    settings_refused, step_failure,
};
use crate::fitting;
use crate::kernel_profile;
use crate::model::GptConfig;
use crate::report;
use crate::train::{self, Phase, StepOptions};
use burn::optim::Optimizer;

/// Runs training on `B` (wrapped as `Autodiff<Frugal<B>>`) and returns the per-step log.
pub fn train<B: Backend>(args: &TrainArgs, device: B::Device) -> Result<Vec<StepLog>, String> {
    train_observed::<B>(args, device, |_, _| {})
}

/// The devices this build of the `gpt` example runs on (its build features decide).
pub const BUILT: &[DeviceKind] = &[
    DeviceKind::Cpu,
    DeviceKind::Flex,
    #[cfg(feature = "wgpu")]
    DeviceKind::Wgpu,
    #[cfg(feature = "cuda")]
    DeviceKind::Cuda,
    #[cfg(feature = "frugal-cuda")]
    DeviceKind::FrugalCuda,
];

/// Runs training on the device `args.device` names, with its default device: what the `gpt`
/// binary does. The concrete backends are chosen here rather than in the binary so that the
/// binary, the tests and the benches link one build of each training stack.
pub fn train_on_device(args: &TrainArgs) -> Result<Vec<StepLog>, String> {
    match args.device {
        DeviceKind::Cpu => train::<burn::backend::NdArray>(args, Default::default()),
        DeviceKind::Flex => train::<burn::backend::Flex>(args, Default::default()),
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => train::<burn::backend::Wgpu>(args, Default::default()),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => train::<burn::backend::Cuda>(args, Default::default()),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => frugal_cuda::check_device(&Default::default())
            .map_err(|e| e.to_string())
            .and_then(|()| match args.memory_cap {
                Some(cap) => frugal_cuda::set_memory_cap(&Default::default(), Some(cap))
                    .map_err(|e| format!("--memory-cap {cap}: {e}")),
                None => Ok(()),
            })
            .and_then(|()| match args.fuses() {
                true => train::<frugal_cuda::FrugalCuda>(args, Default::default()),
                false => train::<frugal_cuda::FrugalCudaUnfused>(args, Default::default()),
            }),
        #[allow(unreachable_patterns)]
        other => Err(other.refused("gpt", BUILT)),
    }
}

/// Why a first step on `device` may run for minutes, for the line that says it still runs.
fn first_step_why(device: DeviceKind) -> &'static str {
    match device {
        DeviceKind::Cuda | DeviceKind::Wgpu => {
            "Burn compiles each kernel at its first launch and keeps none between runs; \
             --device frugal-cuda keeps a kernel cache on disk"
        }
        DeviceKind::Cpu | DeviceKind::Flex | DeviceKind::FrugalCuda => {
            "the first step also builds what later steps reuse"
        }
    }
}

/// Turns frugal-cuda's allocator trace on or off if `device` is a frugal-cuda device: on for
/// the recorded step, memory_viz.pickle gets the allocator's own events with its segments.
#[allow(unused_variables)]
fn record_allocator_trace<D: 'static>(device: &D, on: bool) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::record_allocation_trace(device, on);
    }
}

/// What a run that stopped for a device out-of-memory asks of the next process, so that it
/// goes on where this one stopped with half the micro-batch (see [`take_restart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart {
    /// `--accumulate` for the new process.
    pub accumulate: usize,
    /// Whether it resumes from the last checkpoint (else it starts over: nothing was done).
    pub resume: bool,
}

static RESTART: std::sync::Mutex<Option<Restart>> = std::sync::Mutex::new(None);

static DEVICE_STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a run in this process saw its device stop answering (see
/// [`crate::diagnostics::device_stopped`]): the process should end without the CUDA driver's
/// exit handlers, which can wait on the device's dead threads.
pub fn device_stopped_in_this_process() -> bool {
    DEVICE_STOPPED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The restart the last failed run asked for, if any: after a device out-of-memory on CUDA
/// the device does not answer in this process, so `gpt` goes on in a new one.
pub fn take_restart() -> Option<Restart> {
    RESTART.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The second line of a restart's message: where the new process goes on, and what it redoes.
fn restart_point(checkpoints: &std::path::Path, step: u64) -> (bool, String) {
    let newest = checkpoint::latest_checkpoint(checkpoints).ok().flatten();
    let Some((saved, dir)) = newest.and_then(|dir| Some((checkpoint::checkpoint_step(&dir)?, dir)))
    else {
        return (
            false,
            format!("starting over: no checkpoint was written yet ({step} steps to redo)"),
        );
    };
    let age = std::fs::metadata(dir.join("state.json"))
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|written| written.elapsed().ok())
        .map_or(String::new(), |age| {
            format!(", written {} ago", report::format_duration(age))
        });
    let redo = match step.saturating_sub(saved) {
        0 => "nothing to redo".to_string(),
        1 => "1 step to redo".to_string(),
        n => format!("{n} steps to redo"),
    };
    (
        true,
        format!(
            "going on at step {saved} from its checkpoint ({}{age}; {redo})",
            dir.display()
        ),
    )
}

/// Holds all of the GPU's free memory but `leave` bytes from the driver, outside the pool, as
/// another process would (`--take-memory`); the pool first gives back what it holds unused.
/// Held until the returned value is dropped.
#[allow(unused_variables)]
fn take_memory<B: Backend>(
    device: &B::Device,
    leave: u64,
) -> Result<Box<dyn std::any::Any>, String> {
    B::memory_cleanup(device);
    let gpu = memory::device_memory(device)
        .and_then(Result::ok)
        .ok_or("--take-memory: the device does not report its free memory")?;
    let take = gpu.free.saturating_sub(leave);
    #[cfg(feature = "frugal-cuda")]
    {
        // `gpt` runs on the GPU of index 0 (its devices are the default ones).
        let held =
            frugal_cuda::hold_device_memory(0, take).map_err(|e| format!("--take-memory: {e}"))?;
        println!(
            "--take-memory: holding {} of the GPU's {} free, as another process would",
            memory::format_bytes(take),
            memory::format_bytes(gpu.free),
        );
        Ok(Box::new(held))
    }
    #[cfg(not(feature = "frugal-cuda"))]
    Err(
        "--take-memory: this gpt was built without the frugal-cuda feature, which holds the \
         memory"
            .to_string(),
    )
}

/// As [`train()`], calling `before_step(step, device)` at the start of each attempt at a step,
/// as part of it: tests use it to change the budget mid-run, or panic in it to make the step
/// fail as a device would.
pub fn train_observed<B: Backend>(
    args: &TrainArgs,
    device: B::Device,
    mut before_step: impl FnMut(u64, &B::Device),
) -> Result<Vec<StepLog>, String> {
    args.validate()?;
    probe_device::<B>(args.device, &device)?;
    let mut args = args.clone();
    args.budget = match args.budget_size {
        None => None,
        Some(BudgetSize::Bytes(bytes)) => Some(bytes),
        Some(BudgetSize::Auto) => {
            let auto = memory::auto_budget(&device).map_err(|e| format!("--budget auto: {e}"))?;
            if !args.quiet {
                println!("--budget auto: {auto}");
            }
            Some(auto.bytes)
        }
    };
    // Before the model exists, so that its parameters are managed too; cleared when the run
    // ends, however it ends.
    let _settings = args
        .memory_settings()
        .apply::<B>(&device)
        .map_err(settings_refused)?;
    let mut remat_start = memory::remat_stats(&device);
    // Read once, while the device answers: after an out-of-memory on CUDA it may not.
    let gpu = memory::device_memory(&device).and_then(Result::ok);
    // Peaks are of this run (a process may run several, as the tests do).
    memory::reset_peak(&device);
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::generated(400_000, args.seed),
    };
    corpus.batch(args.seed, 0, 1, args.seq())?;
    let config = GptConfig::new(
        BYTE_VOCAB,
        args.seq(),
        args.d_model(),
        args.heads(),
        args.layers(),
    )
    .with_fused_attention(args.attention == AttentionKind::Fused)
    .with_fused_norm(args.norm == NormKind::Fused)
    .with_fused_loss(args.loss == LossKind::Fused);
    <Ad<B> as Backend>::seed(&device, args.seed);
    // Under a budget too small for the parameters and their first update, creating them
    // panics; say so as for a step.
    let model = quietly(&device, || config.init::<Ad<B>>(&device))
        .map_err(|panic| step_failure(&args, "creating the model", panic, &device, &remat_start))?;
    let optim = train::optimizer::<Ad<B>>(args.optimizer);
    let mut scaler = args
        .loss_scale
        .then(|| GradScaler::new(Default::default()).expect("PyTorch's defaults are valid"));
    let Resumed {
        mut model,
        mut optim,
        first,
        mut log,
    } = if args.resume {
        checkpoint::resume::<B>(&args, model, optim, &mut scaler, &device)?
    } else {
        Resumed {
            model,
            optim,
            first: 0,
            log: Vec::with_capacity(args.steps as usize),
        }
    };
    // The ledger's roles: the parameters, through Burn's module visitor (again after each
    // step, whose update makes new parameter tensors).
    memory::tag_parameters(&model);
    if args.fit {
        let limit = args.budget.expect("validate() asks --fit for a --budget");
        let batch = corpus.batch(args.seed, first, args.batch(), args.seq())?;
        let choice = fitting::choose::<B>(&args, limit, &model, &batch, &device)?;
        if !args.quiet {
            print!("{choice}");
        }
        fitting::apply::<B>(&choice, &mut args, &device)?;
        // The run's figures leave the probes out.
        remat_start = memory::remat_stats(&device);
    }
    let backend = <Ad<B> as Backend>::name(&device);
    report::print_header(&args, model.num_params(), first, &backend);

    let bar = report::progress_bar(&args, first);
    let kernel_counts = compile_progress::reader(&device);
    let counts_at_start = kernel_counts.map(|read| read());
    let mut first_step_kernels = None;
    let compile_watch = kernel_counts.map(|read| {
        compile_progress::CompileWatch::start(&bar, read, !args.quiet && bar.is_hidden())
    });
    let mut slow_first_step = (kernel_counts.is_none() && !args.quiet && first < args.steps)
        .then(|| compile_progress::SlowFirstStep::start(&bar, first, first_step_why(args.device)));
    let mut micro_batches = args.accumulate;
    // Under a budget (and not --fit, whose probes chose the split), the split follows what
    // the steps cost.
    let mut split = match args.splits_batch() {
        true => Some(
            MicroBatching::new(args.batch(), micro_batches)
                .map_err(|e| format!("--accumulate {micro_batches}: {e}"))?,
        ),
        false => None,
    };
    let mut recovered = 0u32;
    let mut step_start = memory::remat_stats(&device);
    let mut allocator_start = allocator_counters(&device).unwrap_or_default();
    let mut autosave = Autosave::new(&args);
    let mut _taken: Option<Box<dyn std::any::Any>> = None;
    let run_started = Instant::now();
    let profiled_from = kernel_profile::first_profiled_step(first, args.steps);
    for step in first..args.steps {
        if args.profile_kernels && step == profiled_from {
            kernel_profile::start(&device);
        }
        if let Some(take) = args.take_memory.filter(|take| take.step == step) {
            _taken = Some(take_memory::<B>(&device, take.leave)?);
        }
        if step == args.steps - 1 {
            // Record the timeline of the last step for the plot.
            memory::record_timeline(&device, 1 << 20);
            record_allocator_trace(&device, true);
        }
        let started = Instant::now();
        if let Some(split) = &mut split {
            split.begin_step(&device);
        }
        let batch = corpus.batch(args.seed, step, args.batch(), args.seq())?;
        let (next, loss, scaled) = loop {
            // The step's starting state, to go back to if the forward or backward pass runs
            // out of memory. Clones share the tensors, but holding them would keep AdamW from
            // updating in place: two copies of the parameters and moments at once. So it is
            // let go when the update starts; an update that fails cannot be taken back.
            let start = RefCell::new(
                args.recovers()
                    .then(|| (model.clone(), optim.to_record(), scaler.clone())),
            );
            let live_at_start = memory::live_bytes(&device);
            let options = StepOptions {
                lr: args.lr,
                checkpoint_blocks: args.checkpoint_blocks,
                micro_batches,
            };
            // A device out-of-memory, or an op that cannot fit the budget, surfaces as a panic
            // deep inside the backend; catch it to recover, or to say what held the memory and
            // which flags would help, instead of a backtrace.
            let outcome = quietly(&device, || {
                before_step(step, &device);
                let on_phase = |phase: Phase| {
                    if phase == Phase::Update {
                        start.borrow_mut().take();
                    }
                    memory::mark(&device, phase.label());
                };
                train::step_accumulated(
                    model,
                    &mut optim,
                    batch.clone(),
                    &options,
                    &device,
                    scaler.as_mut(),
                    on_phase,
                )
            });
            let start = start.into_inner();
            match outcome {
                Ok(Ok(done)) => break done,
                Ok(Err(refused)) => return Err(refused.to_string()),
                Err(caught) => {
                    let reason = failure_reason(&caught);
                    // frugal-cuda's server reports a failed allocation at the next read and
                    // clears it, so its device goes on in this process: the step is retried
                    // there with half the micro-batch, as long as each failure is an
                    // out-of-memory (at most log2(batch) times). Burn's CUDA server stops its
                    // device thread on a runtime error.
                    let in_process = !device_gone(args.device, &caught);
                    let halved = halved_micro_batch(args.batch(), micro_batches);
                    let retry_here = in_process
                        && is_out_of_memory(&reason)
                        && start.is_some()
                        && halved.is_some();
                    if device_stopped(&caught) && !retry_here {
                        // Every op that still reaches the device (dropping this run's tensors)
                        // panics on its dead threads: the message below says it all.
                        std::panic::set_hook(Box::new(|_| {}));
                        DEVICE_STOPPED.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    let rows = args.batch() / micro_batches;
                    // The whole chain of errors is for debugging: the line printed says what
                    // happened and what the run does about it.
                    for message in caught.messages() {
                        log::debug!("step {step} failed: {message}");
                    }
                    // The device's budget now, which is `--budget` unless a caller changed it
                    // (`train_observed`).
                    let limit = memory_limit(&reason, memory::budget(&device), gpu.as_ref());
                    match (start, halved) {
                        (Some((at_start, record, scaler_at_start)), Some(more)) if retry_here => {
                            micro_batches = more;
                            if let Some(split) = &mut split {
                                split.set_micro_batches(more).map_err(|e| e.to_string())?;
                                split.begin_step(&device);
                            }
                            model = at_start;
                            // The failed attempt's graph would otherwise hold its activations
                            // through the retry's forward pass.
                            let freed =
                                frugal::release_abandoned_graph(&model, &device, live_at_start);
                            log::debug!(
                                "step {step}: the failed attempt's graph gave back {freed} B"
                            );
                            optim = optim.load_record(record);
                            scaler = scaler_at_start;
                            recovered += 1;
                            bar.suspend(|| {
                                eprintln!(
                                    "{}",
                                    out_of_memory_line(
                                        step,
                                        rows,
                                        &limit,
                                        "retrying the step with",
                                        more,
                                        &reason
                                    )
                                )
                            });
                        }
                        (_, Some(more))
                            if is_out_of_memory(&reason)
                                && device_stopped(&caught)
                                && args.recovers() =>
                        {
                            // Burn's CUDA device threads stop on a runtime error, so the device
                            // does not answer in this process any more; the checkpoint being
                            // written is host memory by now.
                            autosave.wait();
                            let (resume, from) = restart_point(&args.checkpoints(), step);
                            *RESTART.lock().unwrap_or_else(|e| e.into_inner()) = Some(Restart {
                                accumulate: more,
                                resume,
                            });
                            let line = out_of_memory_line(
                                step,
                                rows,
                                &limit,
                                "restarting in a new process with",
                                more,
                                &reason,
                            );
                            return Err(format!("{line}\n{from}"));
                        }
                        _ => {
                            args.accumulate = micro_batches;
                            return Err(step_failure(
                                &args,
                                &format!("step {step}"),
                                caught,
                                &device,
                                &remat_start,
                            ));
                        }
                    }
                }
            }
        };
        model = next;
        memory::tag_parameters(&model);
        if !loss.is_finite() {
            return Err(non_finite_loss(&args, loss, step));
        }
        let step_ms = started.elapsed().as_secs_f64() * 1e3;
        let entry = StepLog {
            step,
            loss,
            step_ms,
            tokens_per_s: (args.batch() * args.seq()) as f64 / (step_ms / 1e3),
            live_bytes: memory::live_bytes(&device),
            peak_bytes: memory::peak_bytes(&device),
            micro_batches,
            loss_scale: scaled.map(|s| s.scale),
            skipped: scaled.is_some_and(|s| s.skipped),
            remat: {
                let now = memory::remat_stats(&device);
                let step = now.since(&step_start);
                step_start = now;
                (args.budget.is_some() || args.checkpoint_blocks).then_some(step)
            },
            allocator: allocator_counters(&device).map(|now| {
                let step = now.since(&allocator_start);
                allocator_start = now;
                step
            }),
        };
        drop(slow_first_step.take());
        if step == first
            && let (Some(read), Some(start)) = (kernel_counts, counts_at_start)
        {
            first_step_kernels = Some((entry.step_ms, read().since(&start)));
        }
        report::show_step(&bar, &args, &entry);
        if let Some(change) = split
            .as_mut()
            .and_then(|split| split.end_step(&device, started.elapsed()))
        {
            micro_batches = change.to;
            if !args.quiet {
                bar.suspend(|| println!("step {step}: {change}"));
            }
        }
        log.push(entry);
        autosave.after_step::<B>(&args, &model, &optim, scaler.as_ref(), step + 1, &log);
    }
    drop(compile_watch);
    bar.finish();
    let profile = args.profile_kernels.then(|| {
        let timed: Vec<f64> = log
            .iter()
            .filter(|entry| entry.step >= profiled_from)
            .map(|entry| entry.step_ms)
            .collect();
        kernel_profile::finish(&device, &timed)
    });
    let snapshot = memory::snapshot(&device);
    let remat = memory::remat_stats(&device).since(&remat_start);
    memory::record_timeline(&device, 0);
    record_allocator_trace(&device, false);
    autosave.wait();
    checkpoint::save_checkpoint::<B>(&args, &model, &optim, scaler.as_ref(), args.steps, &log)?;
    report::write_outputs(&args, &log, &snapshot, remat)?;
    let kernels = kernel_counts
        .zip(counts_at_start)
        .and_then(|(read, start)| {
            compile_progress::summary(&read().since(&start), first_step_kernels)
        });
    report::print_summary(
        &args,
        &log,
        &device,
        &remat,
        recovered,
        args.steps - first,
        kernels.as_deref(),
    );
    if let Some(profile) = profile.flatten() {
        report::write_kernel_profile(&args, &profile)?;
        if !args.quiet {
            print!("{profile}");
        }
    }
    if let Some(line) = autosave.summary(run_started.elapsed())
        && !args.quiet
    {
        println!("{line}");
    }
    Ok(log)
}
