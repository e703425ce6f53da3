//! Model families written from burn-nn's modules as a user writes them, trained with Adam
//! under budgets of a share of their peak on `Autodiff<Frugal<NdArray>>`: the same losses, bit
//! for bit, as `Autodiff<NdArray>`, and live bytes within the budget after every phase
//! (forward, backward, update) of every step. [`same_bits_within_budgets`] is the harness;
//! `burn_nn_encoder.rs` runs burn-nn's `TransformerEncoder` on it. Here:
//!
//! - A language model over two stacked `Lstm`s: its forward pass is a long chain of small
//!   per-timestep ops (gates, `sigmoid`, `tanh`, a slice of the sequence each step), which the
//!   backward pass reads back in reverse.
//! - A residual CNN with `BatchNorm` after every convolution (its running statistics are
//!   updated in the forward pass, so a recomputation must not update them twice) and strided
//!   1 × 1 projections, in three stages of two blocks, pooled into a linear classifier.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{
    BatchNorm, BatchNormConfig, Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig,
    PaddingConfig2d,
};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use frugal::{Frugal, RematStats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The inner backend alone.
pub type Plain = Autodiff<NdArray>;
/// The same under Frugal.
pub type Managed = Autodiff<Frugal<NdArray>>;

const BATCH: usize = 4;

/// A model with its data: the loss of step `step`'s batch, drawn on the host so that the
/// backend's random stream (parameter init, dropout) is the same in every run.
pub trait Family<B: AutodiffBackend>: AutodiffModule<B> {
    /// The backend's seed, set before the model is made.
    const SEED: u64;
    /// Adam steps per run.
    const STEPS: usize;
    fn init(device: &B::Device) -> Self;
    fn loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1>;
}

/// `batch` rows of `seq` random tokens below `vocab` and, for each, the token after it (the
/// targets, flattened), drawn on the host from `seed`.
pub fn next_tokens<B: Backend>(
    seed: u64,
    [batch, seq]: [usize; 2],
    vocab: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let tokens: Vec<i64> = (0..batch * (seq + 1))
        .map(|_| rng.random_range(0..vocab as i64))
        .collect();
    let row = |r: usize, from: usize| tokens[r * (seq + 1) + from..][..seq].to_vec();
    let input: Vec<i64> = (0..batch).flat_map(|r| row(r, 0)).collect();
    let targets: Vec<i64> = (0..batch).flat_map(|r| row(r, 1)).collect();
    (
        Tensor::from_data(TensorData::new(input, [batch, seq]), device),
        Tensor::from_data(TensorData::new(targets, [batch * seq]), device),
    )
}

const VOCAB: usize = 64;
const SEQ: usize = 16;

#[derive(Module, Debug)]
struct LstmLm<B: Backend> {
    embed: Embedding<B>,
    lower: Lstm<B>,
    upper: Lstm<B>,
    head: Linear<B>,
}

impl<B: AutodiffBackend> Family<B> for LstmLm<B> {
    const SEED: u64 = 17;
    const STEPS: usize = 6;

    fn init(device: &B::Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(VOCAB, 16).init(device),
            lower: LstmConfig::new(16, 32, true).init(device),
            upper: LstmConfig::new(32, 32, true).init(device),
            head: LinearConfig::new(32, VOCAB).init(device),
        }
    }

    fn loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1> {
        let (input, targets) = next_tokens(3000 + step as u64, [BATCH, SEQ], VOCAB, device);
        let x = self.embed.forward(input);
        let (x, _) = self.lower.forward(x, None);
        let (x, _) = self.upper.forward(x, None);
        let logits = self.head.forward(x).reshape([BATCH * SEQ, VOCAB]);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, targets)
    }
}

const SIDE: usize = 16;
const CLASSES: usize = 10;

#[derive(Module, Debug)]
struct BasicBlock<B: Backend> {
    conv1: Conv2d<B>,
    norm1: BatchNorm<B>,
    conv2: Conv2d<B>,
    norm2: BatchNorm<B>,
    project: Option<Conv2d<B>>,
}

fn conv3(channels: [usize; 2], stride: usize) -> Conv2dConfig {
    Conv2dConfig::new(channels, [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
}

impl<B: Backend> BasicBlock<B> {
    fn new(input: usize, output: usize, stride: usize, device: &B::Device) -> Self {
        Self {
            conv1: conv3([input, output], stride).init(device),
            norm1: BatchNormConfig::new(output).init(device),
            conv2: conv3([output, output], 1).init(device),
            norm2: BatchNormConfig::new(output).init(device),
            project: (input != output || stride != 1).then(|| {
                Conv2dConfig::new([input, output], [1, 1])
                    .with_stride([stride, stride])
                    .with_bias(false)
                    .init(device)
            }),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let shortcut = match &self.project {
            Some(project) => project.forward(x.clone()),
            None => x.clone(),
        };
        let y = relu(self.norm1.forward(self.conv1.forward(x)));
        let y = self.norm2.forward(self.conv2.forward(y));
        relu(y + shortcut)
    }
}

#[derive(Module, Debug)]
struct ResNet<B: Backend> {
    stem: Conv2d<B>,
    stem_norm: BatchNorm<B>,
    blocks: Vec<BasicBlock<B>>,
    head: Linear<B>,
}

impl<B: AutodiffBackend> Family<B> for ResNet<B> {
    const SEED: u64 = 17;
    const STEPS: usize = 6;

    fn init(device: &B::Device) -> Self {
        Self {
            stem: conv3([3, 8], 1).init(device),
            stem_norm: BatchNormConfig::new(8).init(device),
            blocks: vec![
                BasicBlock::new(8, 8, 1, device),
                BasicBlock::new(8, 8, 1, device),
                BasicBlock::new(8, 16, 2, device),
                BasicBlock::new(16, 16, 1, device),
                BasicBlock::new(16, 32, 2, device),
                BasicBlock::new(32, 32, 1, device),
            ],
            head: LinearConfig::new(32, CLASSES).init(device),
        }
    }

    fn loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1> {
        let mut rng = StdRng::seed_from_u64(4000 + step as u64);
        let pixels: Vec<f32> = (0..BATCH * 3 * SIDE * SIDE)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let labels: Vec<i64> = (0..BATCH)
            .map(|_| rng.random_range(0..CLASSES as i64))
            .collect();
        let images =
            Tensor::<B, 4>::from_data(TensorData::new(pixels, [BATCH, 3, SIDE, SIDE]), device);
        let labels = Tensor::<B, 1, Int>::from_data(TensorData::new(labels, [BATCH]), device);
        let mut x = relu(self.stem_norm.forward(self.stem.forward(images)));
        for block in &self.blocks {
            x = block.forward(x);
        }
        let [b, c, _, _] = x.dims();
        let pooled = x.mean_dim(3).mean_dim(2).reshape([b, c]);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(self.head.forward(pooled), labels)
    }
}

/// The losses of `M::STEPS` Adam steps of `M`, as bits; `after_phase` runs after each step's
/// forward pass, backward pass and update, `after_step` after each step.
fn train<B: AutodiffBackend, M: Family<B>>(
    mut after_phase: impl FnMut(&B::Device),
    mut after_step: impl FnMut(&B::Device),
) -> Vec<u32> {
    let device = B::Device::default();
    B::seed(&device, M::SEED);
    let mut model = M::init(&device);
    let mut optim = AdamConfig::new().init::<B, M>();
    let mut losses = Vec::with_capacity(M::STEPS);
    for step in 0..M::STEPS {
        frugal::memory::set_phase(&device, frugal::memory::Phase::Forward);
        let loss = model.loss(step, &device);
        after_phase(&device);
        frugal::memory::set_phase(&device, frugal::memory::Phase::Backward);
        let grads = loss.backward();
        let value = loss.into_scalar().elem::<f32>();
        after_phase(&device);
        let grads = GradientsParams::from_grads(grads, &model);
        frugal::memory::set_phase(&device, frugal::memory::Phase::Optimizer);
        model = optim.step(1e-3, model, grads);
        after_phase(&device);
        losses.push(value.to_bits());
        after_step(&device);
    }
    losses
}

/// Trains `M` without a budget, then under each of `fractions` of that run's peak: the losses
/// must be the same bits, and live bytes within the budget after every phase. Returns each
/// budgeted run's counters, step by step, for the caller's own checks.
pub fn same_bits_within_budgets<M: Family<Managed>, P: Family<Plain>>(
    name: &str,
    fractions: &[f64],
) -> Vec<Vec<RematStats>> {
    let device = NdArrayDevice::Cpu;
    let plain = train::<Plain, P>(|_| {}, |_| {});
    frugal::memory::set_budget(&device, None);
    frugal::memory::reset_peak(&device);
    let mut peak = 0;
    let unbudgeted =
        train::<Managed, M>(|d| peak = peak.max(frugal::memory::peak_bytes(d)), |_| {});
    assert_eq!(unbudgeted, plain, "{name} without a budget");
    let mut runs = Vec::new();
    for &fraction in fractions {
        let budget = (peak as f64 * fraction) as u64;
        frugal::memory::set_budget(&device, Some(budget));
        let mut phase = 0;
        let mut steps = Vec::new();
        let mut last = frugal::memory::remat_stats(&device);
        let losses = train::<Managed, M>(
            |d| {
                let live = frugal::memory::live_bytes(d);
                assert!(
                    live <= budget,
                    "{name} at {fraction:.2} of its peak ({peak} B), phase {phase}: live {live} B \
                     over the budget {budget} B"
                );
                phase += 1;
            },
            |d| {
                let now = frugal::memory::remat_stats(d);
                steps.push(now.since(&last));
                last = now;
            },
        );
        frugal::memory::set_budget(&device, None);
        assert_eq!(
            losses, plain,
            "{name}'s losses at {fraction:.2} of its peak"
        );
        let ratios: Vec<f64> = steps.iter().map(RematStats::recompute_ratio).collect();
        let packs: Vec<u64> = steps.iter().map(|s| s.packs).collect();
        eprintln!(
            "{name} at {fraction:.2} of its peak ({peak} B): recomputed / forward work by step \
             {ratios:.2?}, masks packed by step {packs:?}, selected {} B, segments {}",
            steps.last().map_or(0, |s| s.plan_selected_bytes),
            steps.last().map_or(0, |s| s.plan_segments),
        );
        runs.push(steps);
    }
    runs
}

#[test]
fn two_stacked_lstms_under_half_and_a_third_of_their_peak() {
    let _serial = crate::serial();
    same_bits_within_budgets::<LstmLm<Managed>, LstmLm<Plain>>("the Lstm model", &[0.5, 1.0 / 3.0]);
}

/// Three stages of two blocks, each stage's activations half the last's, as the bench's
/// ResNet: the fewest bytes cross the smallest stage's block boundaries alone, so at a third
/// of the peak the plan also cuts each stage at its own boundaries, and its steps under the
/// plan recompute less than twice their forward work (2.58x with cuts in the smallest stage
/// alone).
#[test]
fn a_residual_cnn_with_batch_norm_under_half_and_a_third_of_its_peak() {
    let _serial = crate::serial();
    let runs =
        same_bits_within_budgets::<ResNet<Managed>, ResNet<Plain>>("the ResNet", &[0.5, 1.0 / 3.0]);
    let third: Vec<f64> = runs[1].iter().map(RematStats::recompute_ratio).collect();
    assert!(
        third[4..].iter().all(|&ratio| ratio < 2.0),
        "at a third of its peak the ResNet's planned steps recompute {third:.2?} of their \
         forward work"
    );
}
