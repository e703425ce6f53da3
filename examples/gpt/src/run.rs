//! The training run behind the `gpt` binary: the loop. Its flags are in [`crate::cli`], the
//! memory settings it applies in [`crate::memory_settings`], checkpoints in
//! [`crate::checkpoint`], failure messages in [`crate::diagnostics`], and what it prints and
//! writes in [`crate::report`].

use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::Backend;
use frugal::GradScaler;
use frugal::memory;

pub use crate::cli::{DeviceKind, Evict, Precision, TrainArgs};
pub use crate::report::StepLog;

use crate::Ad;
use crate::checkpoint::{self, Resumed};
use crate::data::{BYTE_VOCAB, Corpus};
use crate::diagnostics::{
    first_line, is_out_of_memory, non_finite_loss, panic_message, probe_device, quietly,
    settings_refused, step_failure,
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

/// As [`train`], calling `before_step(step, device)` before each step (tests use it to change
/// the budget mid-run).
pub fn train_observed<B: Backend>(
    args: &TrainArgs,
    device: B::Device,
    mut before_step: impl FnMut(u64, &B::Device),
) -> Result<Vec<StepLog>, String> {
    args.validate()?;
    probe_device::<B>(args.device, &device)?;
    let mut args = args.clone();
    // Before the model exists, so that its parameters are managed too; cleared when the run
    // ends, however it ends.
    let _settings = args
        .memory_settings()
        .apply::<B>(&device)
        .map_err(settings_refused)?;
    let mut remat_start = memory::remat_stats(&device);
    // Peaks are of this run (a process may run several, as the tests do).
    memory::reset_peak(&device);
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::generated(400_000, args.seed),
    };
    corpus.batch(args.seed, 0, 1, args.seq)?;
    let config = GptConfig::new(BYTE_VOCAB, args.seq, args.d_model, args.heads, args.layers);
    <Ad<B> as Backend>::seed(&device, args.seed);
    // Under a budget too small for the parameters and their first update, creating them
    // panics; say so as for a step.
    let model = quietly(|| config.init::<Ad<B>>(&device))
        .map_err(|panic| step_failure(&args, "creating the model", panic, &device, &remat_start))?;
    let optim = train::optimizer::<Ad<B>>();
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
    if args.fit {
        let limit = args.budget.expect("validate() asks --fit for a --budget");
        let batch = corpus.batch(args.seed, first, args.batch, args.seq)?;
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
    for step in first..args.steps {
        before_step(step, &device);
        if step == args.steps - 1 {
            // Record the timeline of the last step for the plot.
            memory::record_timeline(&device, 1 << 20);
        }
        let started = Instant::now();
        let batch = corpus.batch(args.seed, step, args.batch, args.seq)?;
        let (next, loss, scaled) = loop {
            // The step's starting state, to go back to if it runs out of memory: clones share
            // the tensors, but holding them keeps AdamW from updating in place.
            let start =
                (!args.no_recover).then(|| (model.clone(), optim.to_record(), scaler.clone()));
            let options = StepOptions {
                lr: args.lr,
                checkpoint_blocks: args.checkpoint_blocks,
                micro_batches,
            };
            // A device out-of-memory, or an op that cannot fit the budget, surfaces as a panic
            // deep inside the backend; catch it to recover, or to say what held the memory and
            // which flags would help, instead of a backtrace.
            let outcome = quietly(|| {
                let on_phase = |phase: Phase| memory::mark(&device, phase.label());
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
            match outcome {
                Ok(Ok(done)) => break done,
                Ok(Err(refused)) => return Err(refused.to_string()),
                Err(panic) => {
                    let reason = panic_message(panic.as_ref());
                    let rows = args.batch / micro_batches;
                    match start {
                        Some((at_start, record, scaler_at_start))
                            if is_out_of_memory(&reason) && rows.is_multiple_of(2) =>
                        {
                            micro_batches *= 2;
                            model = at_start;
                            optim = optim.load_record(record);
                            scaler = scaler_at_start;
                            recovered += 1;
                            bar.suspend(|| {
                                eprintln!(
                                    "step {step}: out of memory with micro-batches of {rows} ({}); \
                                     back to the step's start, going on with {micro_batches} \
                                     micro-batches of {}",
                                    first_line(&reason, 160),
                                    rows / 2
                                )
                            });
                        }
                        _ => {
                            return Err(step_failure(
                                &args,
                                &format!("step {step}"),
                                panic,
                                &device,
                                &remat_start,
                            ));
                        }
                    }
                }
            }
        };
        model = next;
        if !loss.is_finite() {
            return Err(non_finite_loss(&args, loss, step));
        }
        let step_ms = started.elapsed().as_secs_f64() * 1e3;
        let entry = StepLog {
            step,
            loss,
            step_ms,
            tokens_per_s: (args.batch * args.seq) as f64 / (step_ms / 1e3),
            live_bytes: memory::live_bytes(&device),
            peak_bytes: memory::peak_bytes(&device),
            micro_batches,
            loss_scale: scaled.map(|s| s.scale),
            skipped: scaled.is_some_and(|s| s.skipped),
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
    checkpoint::save_checkpoint::<B>(&args, &model, &optim, scaler.as_ref(), args.steps, &log)?;
    report::write_outputs(&args, &log, &snapshot, remat)?;
    report::print_summary(&args, &log, &device, &remat, recovered, args.steps - first);
    Ok(log)
}
