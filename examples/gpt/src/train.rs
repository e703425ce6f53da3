//! One training step, generic over the autodiff backend, and the optimizer used by both the
//! example and the benches (AdamW with PyTorch's defaults, as in `torch_gpt.py`).

use burn::optim::{
    AdamW, AdamWConfig, GradientsParams, LearningRate, MultiGradientsParams, Optimizer,
    adaptor::OptimizerAdaptor,
};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use clap::ValueEnum;
use frugal::optim::{AdamW8bit, AdamW8bitConfig};
use frugal::{AccumulationError, GradScaler, GradientAccumulation, ScaledStep, memory};
use serde::{Deserialize, Serialize};

use crate::data::Batch;
use crate::model::Gpt;

/// The optimizers the example trains with (`--optimizer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// burn-optim's AdamW, f32 moments.
    #[default]
    #[value(name = "adamw")]
    AdamW,
    /// Frugal's AdamW with block-wise 8-bit moments (`frugal::optim::AdamW8bit`).
    #[value(name = "adamw8bit")]
    AdamW8bit,
    /// burn-optim's AdamW arithmetic with f32 moments, one fused launch per parameter on
    /// CubeCL backends (`frugal::optim::AdamW8bitConfig::full_precision`).
    #[value(name = "adamw-fused")]
    #[serde(rename = "adamw-fused")]
    AdamWFused,
}

/// The example's optimizer: one of [`OptimizerKind`], with PyTorch's AdamW defaults (eps 1e-8,
/// weight decay 0.01) either way.
#[derive(Clone)]
pub enum GptOptimizer<B: AutodiffBackend> {
    /// burn-optim's AdamW.
    AdamW(OptimizerAdaptor<AdamW, Gpt<B>, B>),
    /// Frugal's 8-bit AdamW.
    AdamW8bit(OptimizerAdaptor<AdamW8bit, Gpt<B>, B>),
    /// Frugal's AdamW with f32 moments, fused (the same type as the 8-bit one, every moment
    /// kept in f32).
    AdamWFused(OptimizerAdaptor<AdamW8bit, Gpt<B>, B>),
}

type AdamWRecord<B> = <OptimizerAdaptor<AdamW, Gpt<B>, B> as Optimizer<Gpt<B>, B>>::Record;
type AdamW8bitRecord<B> = <OptimizerAdaptor<AdamW8bit, Gpt<B>, B> as Optimizer<Gpt<B>, B>>::Record;

impl<B: AutodiffBackend> GptOptimizer<B> {
    /// Which optimizer this is.
    pub fn kind(&self) -> OptimizerKind {
        match self {
            Self::AdamW(_) => OptimizerKind::AdamW,
            Self::AdamW8bit(_) => OptimizerKind::AdamW8bit,
            Self::AdamWFused(_) => OptimizerKind::AdamWFused,
        }
    }
}

impl<B: AutodiffBackend> Optimizer<Gpt<B>, B> for GptOptimizer<B> {
    /// The record of whichever optimizer this is, the other `None`.
    type Record = (Option<AdamWRecord<B>>, Option<AdamW8bitRecord<B>>);

    fn step(&mut self, lr: LearningRate, module: Gpt<B>, grads: GradientsParams) -> Gpt<B> {
        match self {
            Self::AdamW(optim) => optim.step(lr, module, grads),
            Self::AdamW8bit(optim) | Self::AdamWFused(optim) => optim.step(lr, module, grads),
        }
    }

    fn step_multi(
        &mut self,
        lr: LearningRate,
        module: Gpt<B>,
        grads: MultiGradientsParams,
    ) -> Gpt<B> {
        match self {
            Self::AdamW(optim) => optim.step_multi(lr, module, grads),
            Self::AdamW8bit(optim) | Self::AdamWFused(optim) => optim.step_multi(lr, module, grads),
        }
    }

    fn to_record(&self) -> Self::Record {
        match self {
            Self::AdamW(optim) => (Some(optim.to_record()), None),
            Self::AdamW8bit(optim) | Self::AdamWFused(optim) => (None, Some(optim.to_record())),
        }
    }

    /// # Panics
    ///
    /// If the record is the other optimizer's: checkpoints name their optimizer, and resuming
    /// refuses another one before loading (see `checkpoint::resume`).
    fn load_record(self, record: Self::Record) -> Self {
        match (self, record) {
            (Self::AdamW(optim), (Some(record), _)) => Self::AdamW(optim.load_record(record)),
            (Self::AdamW8bit(optim), (_, Some(record))) => {
                Self::AdamW8bit(optim.load_record(record))
            }
            (Self::AdamWFused(optim), (_, Some(record))) => {
                Self::AdamWFused(optim.load_record(record))
            }
            (optim, _) => panic!("the record is not {:?}'s", optim.kind()),
        }
    }
}

/// The optimizer `kind` with PyTorch's AdamW defaults (eps 1e-8, weight decay 0.01), and
/// bitsandbytes' 8-bit defaults for [`OptimizerKind::AdamW8bit`] (blocks of 256, tensors under
/// 4,096 values kept in f32).
pub fn optimizer<B: AutodiffBackend>(kind: OptimizerKind) -> GptOptimizer<B> {
    match kind {
        OptimizerKind::AdamW => GptOptimizer::AdamW(
            AdamWConfig::new()
                .with_epsilon(1e-8)
                .with_weight_decay(0.01)
                .init(),
        ),
        OptimizerKind::AdamW8bit => GptOptimizer::AdamW8bit(
            AdamW8bitConfig::new()
                .with_epsilon(1e-8)
                .with_weight_decay(0.01)
                .init(),
        ),
        OptimizerKind::AdamWFused => GptOptimizer::AdamWFused(
            AdamW8bitConfig::full_precision()
                .with_epsilon(1e-8)
                .with_weight_decay(0.01)
                .init(),
        ),
    }
}

/// Phases of a step, reported to a callback so callers can read memory between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Inputs are on the device.
    Start,
    /// The forward pass and loss are computed.
    Forward,
    /// Gradients are computed.
    Backward,
    /// Every micro-batch's gradients are in; the optimizer is about to update the parameters
    /// (a caller holding the step's starting state lets go of it here, or the update could
    /// not be made in place and would hold two copies of the parameters and the optimizer's
    /// state).
    Update,
    /// Parameters are updated.
    Optimizer,
}

impl Phase {
    /// What has just finished, as shown in plots.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Start => "inputs ready",
            Phase::Forward => "forward done",
            Phase::Backward => "backward done",
            Phase::Update => "update starts",
            Phase::Optimizer => "optimizer done",
        }
    }
}

/// One step: forward, backward, AdamW update. Returns the new model and the loss (read back
/// to the host, which also synchronises the device).
pub fn step<B: AutodiffBackend>(
    model: Gpt<B>,
    optim: &mut GptOptimizer<B>,
    batch: Batch,
    lr: f64,
    device: &B::Device,
    on_phase: impl FnMut(Phase),
) -> (Gpt<B>, f32) {
    step_with(model, optim, batch, lr, device, false, on_phase)
}

/// As [`step`], with the model's blocks in checkpoint scopes if `checkpoint_blocks`.
pub fn step_with<B: AutodiffBackend>(
    model: Gpt<B>,
    optim: &mut GptOptimizer<B>,
    batch: Batch,
    lr: f64,
    device: &B::Device,
    checkpoint_blocks: bool,
    on_phase: impl FnMut(Phase),
) -> (Gpt<B>, f32) {
    let (model, loss, _) = step_full(
        model,
        optim,
        batch,
        lr,
        device,
        checkpoint_blocks,
        None,
        on_phase,
    );
    (model, loss)
}

/// As [`step_with`], with dynamic loss scaling when `scaler` is given: the loss is multiplied
/// by its scale before the backward pass and the gradients divided back before AdamW; a step
/// whose gradients hold an inf or NaN is skipped and the scale backs off. The loss returned
/// is the unscaled one; the outcome is the scaler's (`None` without one).
#[allow(clippy::too_many_arguments)]
pub fn step_full<B: AutodiffBackend>(
    model: Gpt<B>,
    optim: &mut GptOptimizer<B>,
    batch: Batch,
    lr: f64,
    device: &B::Device,
    checkpoint_blocks: bool,
    scaler: Option<&mut GradScaler>,
    on_phase: impl FnMut(Phase),
) -> (Gpt<B>, f32, Option<ScaledStep>) {
    let options = StepOptions {
        lr,
        checkpoint_blocks,
        micro_batches: 1,
    };
    step_accumulated(model, optim, batch, &options, device, scaler, on_phase)
        .expect("one micro-batch always divides a batch")
}

/// How [`step_accumulated`] runs a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOptions {
    /// AdamW's learning rate.
    pub lr: f64,
    /// Each block in a checkpoint scope.
    pub checkpoint_blocks: bool,
    /// Micro-batches the batch is split into, each run forward and backward on its own
    /// (gradient accumulation); 1 runs the batch whole.
    pub micro_batches: usize,
}

/// As [`step_full`], with the batch split into `options.micro_batches` equal micro-batches
/// whose gradients are summed ([`frugal::GradientAccumulation`]) before one AdamW update: the
/// gradient of the whole batch, with the peak memory of one micro-batch. The loss returned is
/// the mean of the micro-batches' losses (the whole batch's mean). Refuses a micro-batch count
/// that does not divide the batch.
pub fn step_accumulated<B: AutodiffBackend>(
    model: Gpt<B>,
    optim: &mut GptOptimizer<B>,
    batch: Batch,
    options: &StepOptions,
    device: &B::Device,
    scaler: Option<&mut GradScaler>,
    mut on_phase: impl FnMut(Phase),
) -> Result<(Gpt<B>, f32, Option<ScaledStep>), AccumulationError> {
    let parts = batch.split(options.micro_batches)?;
    let mut accumulation = GradientAccumulation::new(parts.len())?;
    let mut loss_sum = 0.0f32;
    for part in parts {
        let shape = [part.batch, part.seq];
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(part.inputs, shape), device);
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(part.targets, shape), device);
        on_phase(Phase::Start);
        // The ledger's roles: what the forward pass makes is activations, what backward makes
        // gradients, what the optimizer makes its state (the parameters are tagged after the
        // step, by the caller that knows the backend).
        memory::set_phase(device, memory::Phase::Forward);
        let loss = model.loss_with(tokens, targets, options.checkpoint_blocks);
        on_phase(Phase::Forward);
        memory::set_phase(device, memory::Phase::Backward);
        match &scaler {
            Some(scaler) => {
                let scaled = scaler.scale_loss(scale(loss.clone(), accumulation.loss_factor()));
                let grads = GradientsParams::from_grads(scaled.backward(), &model);
                accumulation.add(&model, grads)?;
            }
            None => accumulation.backward(&model, loss.clone())?,
        }
        // Read after the backward pass, as a step without accumulation does: reading syncs.
        loss_sum += loss.into_scalar().elem::<f32>();
        on_phase(Phase::Backward);
        memory::set_phase(device, memory::Phase::Outside);
    }
    let micro_batches = accumulation.micro_batches();
    let mut grads = accumulation.finish()?;
    // Under autocast with 16-bit outputs, some gradients come out 16-bit: AdamW's state must
    // be built in f32, the parameters' type (a no-op otherwise).
    frugal::precision::match_param_dtypes(&model, &mut grads);
    let lr = options.lr;
    on_phase(Phase::Update);
    memory::set_phase(device, memory::Phase::Optimizer);
    let (model, outcome) = match scaler {
        Some(scaler) => {
            let (model, outcome) = scaler.step(lr, model, optim, grads);
            (model, Some(outcome))
        }
        None => (optim.step(lr, model, grads), None),
    };
    memory::set_phase(device, memory::Phase::Outside);
    on_phase(Phase::Optimizer);
    Ok((model, loss_sum / micro_batches as f32, outcome))
}

/// `loss` times `factor`, without an op when the factor is 1 (so one micro-batch gives the
/// same graph, and bits, as no accumulation).
fn scale<B: AutodiffBackend>(loss: Tensor<B, 1>, factor: f64) -> Tensor<B, 1> {
    if factor == 1.0 {
        loss
    } else {
        loss.mul_scalar(factor)
    }
}
