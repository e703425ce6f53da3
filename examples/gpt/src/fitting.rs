//! `--fit`: before training, choose the micro-batch, accumulation and memory policy that fit
//! the limit with the best measured throughput ([`frugal::AutoFit`]), probing on throwaway
//! copies of the model and optimizer with the first rows of the run's first batch.

use burn::tensor::backend::Backend;
use frugal::memory;
use frugal::{AutoFit, FitChoice, FitPolicy, FitProbe, LowPrecision};

use crate::Ad;
use crate::cli::{Precision, TrainArgs};
use crate::data::Batch;
use crate::model::Gpt;
use std::time::{Duration, Instant};

use crate::train::{self, StepOptions};
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
    let choice = search.run(device, |probe: &FitProbe| {
        let candidate = &probe.candidate;
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
            // As the run holds a step's start to recover from (see `run::train`).
            let _held = args.recovers().then(|| (copy.clone(), optim.to_record()));
            copy = train::step_accumulated(
                copy,
                &mut optim,
                batch.first_rows(items),
                &options,
                device,
                None,
                |_| {},
            )
            .map_err(|e| e.to_string())?
            .0;
            last = started.elapsed();
        }
        Ok(last)
    });
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
