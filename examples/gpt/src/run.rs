//! The training run behind the `gpt` binary: the loop. Its flags are in [`crate::cli`], the
//! memory settings it applies in [`crate::memory_settings`], checkpoints in
//! [`crate::checkpoint`], failure messages in [`crate::diagnostics`], and what it prints and
//! writes in [`crate::report`].

use std::panic::{AssertUnwindSafe, catch_unwind};
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
use crate::diagnostics::{non_finite_loss, probe_device, settings_refused, step_failure};
use crate::model::GptConfig;
use crate::report;
use crate::train::{self, Phase};

/// Runs training on `B` (wrapped as `Autodiff<Frugal<B>>`) and returns the per-step log.
pub fn train<B: Backend>(args: &TrainArgs, device: B::Device) -> Result<Vec<StepLog>, String> {
    args.validate()?;
    probe_device::<B>(args.device, &device)?;
    // Before the model exists, so that its parameters are managed too; cleared when the run
    // ends, however it ends.
    let _settings = args
        .memory_settings()
        .apply::<B>(&device)
        .map_err(settings_refused)?;
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
    let model = catch_unwind(AssertUnwindSafe(|| config.init::<Ad<B>>(&device)))
        .map_err(|panic| step_failure(args, "creating the model", panic, &device, &remat_start))?;
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
        checkpoint::resume::<B>(args, model, optim, &mut scaler, &device)?
    } else {
        Resumed {
            model,
            optim,
            first: 0,
            log: Vec::with_capacity(args.steps as usize),
        }
    };
    let backend = <Ad<B> as Backend>::name(&device);
    report::print_header(args, model.num_params(), first, &backend);

    let bar = report::progress_bar(args, first);
    for step in first..args.steps {
        if step == args.steps - 1 {
            // Record the timeline of the last step for the plot.
            memory::record_timeline(&device, 1 << 20);
        }
        let started = Instant::now();
        let batch = corpus.batch(args.seed, step, args.batch, args.seq)?;
        // A device out-of-memory surfaces as a panic deep inside the inner backend; catch it
        // to say what held the memory and which flags would help, instead of a backtrace.
        let outcome = catch_unwind(AssertUnwindSafe(|| {
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
        let (next, loss, scaled) = outcome.map_err(|panic| {
            step_failure(args, &format!("step {step}"), panic, &device, &remat_start)
        })?;
        model = next;
        if !loss.is_finite() {
            return Err(non_finite_loss(args, loss, step));
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
        report::show_step(&bar, args, &entry);
        log.push(entry);
        let done = step + 1;
        if args.save_every > 0 && done % args.save_every == 0 && done < args.steps {
            checkpoint::save_checkpoint::<B>(args, &model, &optim, scaler.as_ref(), done, &log)?;
        }
    }
    bar.finish();
    let snapshot = memory::snapshot(&device);
    let remat = memory::remat_stats(&device).since(&remat_start);
    memory::record_timeline(&device, 0);
    checkpoint::save_checkpoint::<B>(args, &model, &optim, scaler.as_ref(), args.steps, &log)?;
    report::write_outputs(args, &log, &snapshot, remat)?;
    report::print_summary(args, &log, &device, &remat);
    Ok(log)
}
