//! The training run behind the `gpt` binary: the loop. Its flags are in [`crate::cli`], the
//! memory settings it applies in [`crate::memory_settings`], checkpoints in
//! [`crate::checkpoint`], failure messages in [`crate::diagnostics`], and what it prints and
//! writes in [`crate::report`].

use std::cell::RefCell;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::Backend;
use frugal::GradScaler;
use frugal::memory;

pub use crate::cli::{BudgetSize, DeviceKind, Evict, Precision, TrainArgs};
pub use crate::report::StepLog;

use crate::Ad;
use crate::checkpoint::{self, Resumed};
use crate::cli::AttentionKind;
use crate::data::{BYTE_VOCAB, Corpus};
use crate::diagnostics::{
    allocator_counters, device_stopped, failure_reason, halved_micro_batch, is_out_of_memory,
    memory_limit, non_finite_loss, out_of_memory_line, probe_device, quietly, settings_refused,
    step_failure,
};
use crate::fitting;
use crate::model::GptConfig;
use crate::report;
use crate::train::{self, Phase, StepOptions};
use burn::optim::Optimizer;

/// Runs training on `B` (wrapped as `Autodiff<Frugal<B>>`) and returns the per-step log.
pub fn train<B: Backend>(args: &TrainArgs, device: B::Device) -> Result<Vec<StepLog>, String> {
    train_observed::<B>(args, device, |_, _| {})
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

/// Whether a new process can go on from `step` losing nothing: the last checkpoint was written
/// at `step`, or nothing was done yet.
fn lossless_restart(args: &TrainArgs, step: u64) -> bool {
    let saved_at = checkpoint::latest_checkpoint(&args.checkpoints())
        .ok()
        .flatten()
        .and_then(|dir| {
            dir.file_name()?
                .to_str()?
                .strip_prefix("step-")?
                .parse::<u64>()
                .ok()
        });
    match saved_at {
        Some(saved) => saved == step,
        None => step == 0,
    }
}

/// As [`train()`], calling `before_step(step, device)` before each step (tests use it to change
/// the budget mid-run).
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
    .with_fused_attention(args.attention == AttentionKind::Fused);
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
    let mut micro_batches = args.accumulate;
    let mut recovered = 0u32;
    let mut step_start = memory::remat_stats(&device);
    let mut allocator_start = allocator_counters(&device).unwrap_or_default();
    for step in first..args.steps {
        before_step(step, &device);
        if step == args.steps - 1 {
            // Record the timeline of the last step for the plot.
            memory::record_timeline(&device, 1 << 20);
            record_allocator_trace(&device, true);
        }
        let started = Instant::now();
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
            let options = StepOptions {
                lr: args.lr,
                checkpoint_blocks: args.checkpoint_blocks,
                micro_batches,
            };
            // A device out-of-memory, or an op that cannot fit the budget, surfaces as a panic
            // deep inside the backend; catch it to recover, or to say what held the memory and
            // which flags would help, instead of a backtrace.
            let outcome = quietly(&device, || {
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
                    if device_stopped(&caught) {
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
                    match (start, halved_micro_batch(args.batch(), micro_batches)) {
                        (Some((at_start, record, scaler_at_start)), Some(more))
                            if is_out_of_memory(&reason) && !device_stopped(&caught) =>
                        {
                            micro_batches = more;
                            model = at_start;
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
                                        more
                                    )
                                )
                            });
                        }
                        (_, Some(more))
                            if is_out_of_memory(&reason)
                                && device_stopped(&caught)
                                && args.recovers()
                                && lossless_restart(&args, step) =>
                        {
                            let resume = step > 0;
                            *RESTART.lock().unwrap_or_else(|e| e.into_inner()) = Some(Restart {
                                accumulate: more,
                                resume,
                            });
                            // Burn's CUDA device threads stop on a runtime error, so the device
                            // does not answer in this process any more.
                            let next = if resume {
                                format!("restarting from the checkpoint of step {step} with")
                            } else {
                                "restarting with".to_string()
                            };
                            return Err(out_of_memory_line(step, rows, &limit, &next, more));
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
        report::show_step(&bar, &args, &entry);
        log.push(entry);
        let done = step + 1;
        if args.save_every > 0 && done % args.save_every == 0 && done < args.steps {
            checkpoint::save_checkpoint::<B>(&args, &model, &optim, scaler.as_ref(), done, &log)?;
        }
    }
    bar.finish();
    let snapshot = memory::snapshot(&device);
    let remat = memory::remat_stats(&device).since(&remat_start);
    memory::record_timeline(&device, 0);
    record_allocator_trace(&device, false);
    checkpoint::save_checkpoint::<B>(&args, &model, &optim, scaler.as_ref(), args.steps, &log)?;
    report::write_outputs(&args, &log, &snapshot, remat)?;
    report::print_summary(&args, &log, &device, &remat, recovered, args.steps - first);
    Ok(log)
}
