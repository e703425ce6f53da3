//! Training a small CNN with dropout under `Autodiff<Frugal<NdArray>>` gives the same losses
//! and parameters, bit for bit, as under `Autodiff<NdArray>`: 20 Adam steps without a budget,
//! under a third of the unconstrained peak (default policy, then host offload only), and with
//! the convolutional block in a checkpoint scope.
//!
//! The model: Conv2d → ReLU → MaxPool2d → Conv2d → ReLU → AdaptiveAvgPool2d → Dropout(0.3) →
//! Linear, on 8×1×16×16 inputs with integer class targets and a cross-entropy loss.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use frugal::{EvictionMode, Frugal, Policy, RematStats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Plain = Autodiff<NdArray>;
type Managed = Autodiff<Frugal<NdArray>>;

const STEPS: usize = 20;
const BATCH: usize = 8;
const SIDE: usize = 16;
const CLASSES: usize = 10;

#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    pool: MaxPool2d,
    conv2: Conv2d<B>,
    avg: AdaptiveAvgPool2d,
    dropout: Dropout,
    head: Linear<B>,
}

impl<B: Backend> Cnn<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, 8], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            conv2: Conv2dConfig::new([8, 16], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            avg: AdaptiveAvgPool2dConfig::new([4, 4]).init(),
            dropout: DropoutConfig::new(0.3).init(),
            head: LinearConfig::new(16 * 4 * 4, CLASSES).init(device),
        }
    }

    /// Conv2d → ReLU → MaxPool2d → Conv2d → ReLU → AdaptiveAvgPool2d.
    fn features(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = self.pool.forward(relu(self.conv1.forward(x)));
        self.avg.forward(relu(self.conv2.forward(x)))
    }

    fn forward(&self, x: Tensor<B, 4>, checkpoint: bool) -> Tensor<B, 2> {
        let features = if checkpoint {
            let device = x.device();
            frugal::checkpoint(&device, || self.features(x))
        } else {
            self.features(x)
        };
        let features = self.dropout.forward(features);
        self.head.forward(features.flatten(1, 3))
    }
}

/// Step `step`'s batch: inputs in [-1, 1) and class targets, drawn on the host so that the
/// backend's random stream (parameter init, dropout masks) is the same in every run.
fn batch(step: usize) -> (TensorData, TensorData) {
    let mut rng = StdRng::seed_from_u64(1000 + step as u64);
    let inputs: Vec<f32> = (0..BATCH * SIDE * SIDE)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let targets: Vec<i64> = (0..BATCH)
        .map(|_| rng.random_range(0..CLASSES as i64))
        .collect();
    (
        TensorData::new(inputs, [BATCH, 1, SIDE, SIDE]),
        TensorData::new(targets, [BATCH]),
    )
}

struct Bits(Vec<u32>);

impl<B: Backend> ModuleVisitor<B> for Bits {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data();
        self.0.extend(data.iter::<f32>().map(f32::to_bits));
    }
}

/// Losses of 20 Adam steps and the final parameters, as bits. `after_phase` runs after the
/// model's creation and after each step's forward pass, backward pass and update.
fn train<B: AutodiffBackend>(
    checkpoint: bool,
    mut after_phase: impl FnMut(&B::Device),
) -> (Vec<u32>, Vec<u32>) {
    let device = B::Device::default();
    B::seed(&device, 7);
    let mut model = Cnn::<B>::new(&device);
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    after_phase(&device);
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let (inputs, targets) = batch(step);
        let inputs = Tensor::<B, 4>::from_data(inputs, &device);
        let targets = Tensor::<B, 1, Int>::from_data(targets, &device);
        let logits = model.forward(inputs, checkpoint);
        let loss = loss_fn.forward(logits, targets);
        after_phase(&device);
        let grads = loss.backward();
        let value = loss.into_scalar().elem::<f32>();
        after_phase(&device);
        let grads = GradientsParams::from_grads(grads, &model);
        model = optim.step(1e-2, model, grads);
        after_phase(&device);
        losses.push(value.to_bits());
    }
    let mut params = Bits(Vec::new());
    model.visit(&mut params);
    (losses, params.0)
}

fn reference() -> (Vec<u32>, Vec<u32>) {
    let (losses, params) = train::<Plain>(false, |_| {});
    let floats: Vec<f32> = losses.iter().map(|b| f32::from_bits(*b)).collect();
    assert!(floats.iter().all(|l| l.is_finite()), "{floats:?}");
    assert!(
        floats[STEPS - 5..].iter().sum::<f32>() < floats[..5].iter().sum::<f32>(),
        "loss did not fall: {floats:?}"
    );
    (losses, params)
}

/// Peak live bytes of an unconstrained run (model, optimizer state and activations).
fn unconstrained_peak() -> u64 {
    let device = NdArrayDevice::Cpu;
    frugal::memory::set_budget(&device, None);
    let before = frugal::memory::live_bytes(&device);
    frugal::memory::reset_peak(&device);
    let mut peak = 0;
    train::<Managed>(false, |d| {
        peak = peak.max(frugal::memory::peak_bytes(d));
    });
    assert!(peak > before, "peak {peak}, before {before}");
    assert_eq!(frugal::memory::live_bytes(&device), before, "a run leaked");
    peak
}

/// Trains under `fraction` of the unconstrained peak with `mode`, checking that live bytes are
/// within the budget after every phase, and that nothing is left on the device or the host.
fn budgeted(
    fraction: (u64, u64),
    mode: EvictionMode,
    checkpoint: bool,
) -> ((Vec<u32>, Vec<u32>), RematStats, u64) {
    let device = NdArrayDevice::Cpu;
    let budget = unconstrained_peak() * fraction.0 / fraction.1;
    let live_before = frugal::memory::live_bytes(&device);
    let before = frugal::memory::remat_stats(&device);
    frugal::memory::set_policy(
        &device,
        Policy {
            mode,
            ..Policy::default()
        },
    );
    frugal::memory::set_budget(&device, Some(budget));
    let mut phases = 0;
    let out = train::<Managed>(checkpoint, |d| {
        let live = frugal::memory::live_bytes(d);
        assert!(
            live <= budget,
            "phase {phases}: live {live} over the budget {budget}"
        );
        phases += 1;
    });
    frugal::memory::set_budget(&device, None);
    frugal::memory::set_policy(&device, Policy::default());
    let stats = frugal::memory::remat_stats(&device).since(&before);
    eprintln!("{mode:?}, checkpoint {checkpoint}: budget {budget} B, {stats:?}");
    assert_eq!(
        frugal::memory::live_bytes(&device),
        live_before,
        "device bytes left after the run: {stats:?}"
    );
    assert_eq!(
        stats.host_bytes, before.host_bytes,
        "host bytes left: {stats:?}"
    );
    (out, stats, budget)
}

#[test]
fn without_a_budget_no_bit_changes() {
    let _serial = crate::serial();
    let plain = reference();
    let device = NdArrayDevice::Cpu;
    let before = frugal::memory::remat_stats(&device);
    let frugal = train::<Managed>(false, |_| {});
    let stats = frugal::memory::remat_stats(&device).since(&before);
    assert_eq!(stats.evictions + stats.offloads + stats.recomputes, 0);
    assert_eq!(plain, frugal);
}

#[test]
fn the_default_policy_under_a_third_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats, budget) = budgeted((1, 3), EvictionMode::Auto, false);
    assert!(
        stats.evictions > 0 && stats.recomputes > 0,
        "budget {budget}: {stats:?}"
    );
    assert_eq!(plain.0, out.0, "losses, budget {budget}: {stats:?}");
    assert_eq!(plain.1, out.1, "parameters, budget {budget}: {stats:?}");
}

#[test]
fn host_offload_under_a_third_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats, budget) = budgeted((1, 3), EvictionMode::OffloadOnly, false);
    assert!(
        stats.offloads > 0 && stats.uploads > 0,
        "budget {budget}: {stats:?}"
    );
    assert_eq!(stats.evictions + stats.recomputes, 0, "{stats:?}");
    assert_eq!(plain.0, out.0, "losses, budget {budget}: {stats:?}");
    assert_eq!(plain.1, out.1, "parameters, budget {budget}: {stats:?}");
}

#[test]
fn a_checkpointed_conv_block_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let device = NdArrayDevice::Cpu;
    let live_before = frugal::memory::live_bytes(&device);
    let before = frugal::memory::remat_stats(&device);
    let out = train::<Managed>(true, |_| {});
    let stats = frugal::memory::remat_stats(&device).since(&before);
    assert!(stats.evictions > 0 && stats.recomputes > 0, "{stats:?}");
    // Without a budget, a scope only evicts for recomputation.
    assert_eq!(stats.offloads, 0, "{stats:?}");
    assert_eq!(frugal::memory::live_bytes(&device), live_before);
    assert_eq!(plain.0, out.0, "losses: {stats:?}");
    assert_eq!(plain.1, out.1, "parameters: {stats:?}");
}

#[test]
fn a_checkpointed_conv_block_saves_memory() {
    // The scope evicts the block's activations saved for the backward pass: the peak after
    // the forward pass is lower than without it.
    let _serial = crate::serial();
    let mut after_forward = [0u64; 2];
    for (checkpoint, slot) in [false, true].into_iter().zip(&mut after_forward) {
        let mut phase = 0;
        let mut most = 0;
        train::<Managed>(checkpoint, |d| {
            // Phases: 0 init, then (forward, backward, update) per step.
            if phase % 3 == 1 {
                most = most.max(frugal::memory::live_bytes(d));
            }
            phase += 1;
        });
        *slot = most;
    }
    assert!(
        after_forward[1] < after_forward[0],
        "live bytes after the forward pass: {after_forward:?} (plain, checkpointed)"
    );
}

#[test]
fn a_checkpointed_block_under_a_quarter_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats, budget) = budgeted((1, 4), EvictionMode::Auto, true);
    assert!(
        stats.evictions + stats.offloads > 0,
        "budget {budget}: {stats:?}"
    );
    assert_eq!(plain.0, out.0, "losses, budget {budget}: {stats:?}");
    assert_eq!(plain.1, out.1, "parameters, budget {budget}: {stats:?}");
}
