//! `--fit`: before training, choose the micro-batch, accumulation and memory policy that fit
//! the limit with the best measured throughput ([`frugal::AutoFit`]), probing on throwaway
//! copies of the model and optimizer with the first rows of the run's first batch.

use burn::tensor::backend::Backend;
use frugal::memory;
use frugal::{AutoFit, FitChoice, FitPolicy, FitProbe, LowPrecision};

use crate::Ad;
use crate::cli::{Precision, TrainArgs};
use crate::data::Batch;
use crate::diagnostics;
use crate::model::Gpt;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use crate::train::{self, Phase, StepOptions};
use burn::optim::Optimizer;

/// The policies worth probing on `B`: no budget, checkpointed blocks, a budget, and a budget
/// with bf16 storage where the device stores bf16.
fn policies<B: Backend>(device: &B::Device) -> Vec<FitPolicy> {
    let mut policies = vec![FitPolicy::Plain, FitPolicy::Scopes, FitPolicy::Budget];
    if memory::set_storage_precision::<B>(device, Some(LowPrecision::BF16)).is_ok() {
        policies.push(FitPolicy::BudgetCompressed(LowPrecision::BF16));
    }
    policies
}

/// Probes configurations of one step of `batch` under `limit` bytes and returns the choice.
pub fn choose<B: Backend>(
    args: &TrainArgs,
    limit: u64,
    model: &Gpt<Ad<B>>,
    batch: &Batch,
    device: &B::Device,
) -> Result<FitChoice, String> {
    let search = AutoFit::new(args.batch(), limit).with_policies(policies::<B>(device));
    // What is live with only the run's own model: a probe that failed is given back down to it.
    let live_outside_probes = memory::live_bytes(device);
    let last_probe_finished = Cell::new(true);
    let memory_state = |when: &str| {
        log::debug!(
            "--fit: {when}: live {} B; {}",
            memory::live_bytes(device),
            diagnostics::pool_line(device).unwrap_or_default()
        )
    };
    let choice = search.run(device, |probe: &FitProbe| {
        let candidate = &probe.candidate;
        if !last_probe_finished.get() {
            // A probe that failed in its forward pass left its graph, and the activations it
            // saved, in burn-autodiff; the device may hold errors recorded while it unwound
            // (a sync takes them, so that this probe's first read does not fail for them); and
            // the pool keeps the failed probe's pages cached. Give all three back first.
            memory_state("after a failed probe");
            let freed = frugal::release_abandoned_graph(model, device, live_outside_probes);
            let _ = frugal::catch_quietly(|| B::sync(device), || ());
            B::memory_cleanup(device);
            memory_state(&format!(
                "its graph given back ({freed} B), the device synced and its cache emptied"
            ));
        }
        memory_state(&format!("before {candidate:?}"));
        last_probe_finished.set(false);
        let storage = match candidate.policy {
            FitPolicy::BudgetCompressed(low) => Some(low),
            _ => None,
        };
        memory::set_storage_precision::<B>(device, storage).map_err(|e| e.to_string())?;
        let options = StepOptions {
            lr: args.lr,
            checkpoint_blocks: candidate.policy == FitPolicy::Scopes,
            micro_batches: probe.micro_batches,
        };
        let items = candidate.micro_batch * probe.micro_batches;
        let mut copy = model.clone();
        let mut optim = train::optimizer::<Ad<B>>(args.optimizer);
        let mut last = Duration::ZERO;
        for _ in 0..probe.steps {
            let started = Instant::now();
            // As the run holds a step's start to recover from, and lets go of it when the
            // update starts (see `run::train`): held through the update, it would keep a second
            // copy of the parameters and moments, a peak the run never reaches, which at small
            // micro-batches is the step's peak and hides the activations' growth.
            let held = RefCell::new(args.recovers().then(|| (copy.clone(), optim.to_record())));
            copy = train::step_accumulated(
                copy,
                &mut optim,
                batch.first_rows(items),
                &options,
                device,
                None,
                |phase| {
                    if phase == Phase::Update {
                        held.borrow_mut().take();
                    }
                },
            )
            .map_err(|e| e.to_string())?
            .0;
            last = started.elapsed();
        }
        last_probe_finished.set(true);
        Ok(last)
    });
    memory_state("after the probes");
    // Back to what the flags asked for, whatever the probes left.
    memory::set_storage_precision::<B>(device, args.store.low()).map_err(|e| e.to_string())?;
    choice.map_err(|e| format!("--fit: {e}"))
}

/// The flags that run `choice`: its accumulation, scopes, and budget or none.
pub fn apply<B: Backend>(
    choice: &FitChoice,
    args: &mut TrainArgs,
    device: &B::Device,
) -> Result<(), String> {
    let chosen = choice.chosen;
    args.accumulate = chosen.accumulation;
    args.checkpoint_blocks = chosen.policy == FitPolicy::Scopes;
    args.store = match chosen.policy {
        FitPolicy::BudgetCompressed(LowPrecision::BF16) => Precision::Bf16,
        FitPolicy::BudgetCompressed(LowPrecision::F16) => Precision::F16,
        _ => Precision::F32,
    };
    args.budget = chosen.budget;
    memory::set_budget(device, args.budget);
    memory::set_storage_precision::<B>(device, args.store.low()).map_err(|e| e.to_string())?;
    memory::reset_peak(device);
    Ok(())
}
