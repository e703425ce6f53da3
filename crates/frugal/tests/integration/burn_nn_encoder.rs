//! burn-nn's `TransformerEncoder` as it comes (written-out attention with a causal mask,
//! dropout after every sublayer, post-norm), as a user writes a language model with it, under
//! budgets on `Autodiff<Frugal<NdArray>>`: the same losses, bit for bit, as
//! `Autodiff<NdArray>`, live bytes within the budget after every phase, and once the step plan
//! has learned the step, recomputation below the forward pass's work. The phases are set (as
//! burn-train's `Learner` does) only so that the counters tell forward work apart.
//!
//! Its attention computes `softmax(mask_fill(q·kᵀ / √d))` one op at a time, and its dropout
//! keeps each random draw for the backward pass: at the step's peak, many held bytes are
//! random draws, never recomputed but packed into booleans (exactly: they hold only 0 and 1),
//! and outputs NdArray wrote over their inputs.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use frugal::{Frugal, RematStats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Plain = Autodiff<NdArray>;
type Managed = Autodiff<Frugal<NdArray>>;

const STEPS: usize = 10;
const BATCH: usize = 8;
const SEQ: usize = 32;
const VOCAB: usize = 128;

#[derive(Module, Debug)]
struct EncoderLm<B: Backend> {
    embed: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> EncoderLm<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(VOCAB, 64).init(device),
            encoder: TransformerEncoderConfig::new(64, 256, 4, 2)
                .with_dropout(0.1)
                .init(device),
            head: LinearConfig::new(64, VOCAB).init(device),
        }
    }

    fn loss(&self, input: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let device = input.device();
        let mask = generate_autoregressive_mask::<B>(BATCH, SEQ, &device);
        let x = self.embed.forward(input);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let logits = self.head.forward(x).reshape([BATCH * SEQ, VOCAB]);
        CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets.reshape([BATCH * SEQ]))
    }
}

/// Step `step`'s tokens and their next tokens, drawn on the host so that the backend's random
/// stream (parameter init, dropout masks) is the same in every run.
fn batch(step: usize) -> (TensorData, TensorData) {
    let mut rng = StdRng::seed_from_u64(2000 + step as u64);
    let tokens: Vec<i64> = (0..BATCH * (SEQ + 1))
        .map(|_| rng.random_range(0..VOCAB as i64))
        .collect();
    let row = |r: usize, from: usize| tokens[r * (SEQ + 1) + from..][..SEQ].to_vec();
    let input: Vec<i64> = (0..BATCH).flat_map(|r| row(r, 0)).collect();
    let targets: Vec<i64> = (0..BATCH).flat_map(|r| row(r, 1)).collect();
    (
        TensorData::new(input, [BATCH, SEQ]),
        TensorData::new(targets, [BATCH, SEQ]),
    )
}

/// The losses of `STEPS` Adam steps, as bits; `after_phase` runs after each step's forward
/// pass, backward pass and update, `after_step` after each step.
fn train<B: AutodiffBackend>(
    mut after_phase: impl FnMut(&B::Device),
    mut after_step: impl FnMut(&B::Device),
) -> Vec<u32> {
    let device = B::Device::default();
    B::seed(&device, 11);
    let mut model = EncoderLm::<B>::new(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::with_capacity(STEPS);
    for step in 0..STEPS {
        let (input, targets) = batch(step);
        let input = Tensor::<B, 2, Int>::from_data(input, &device);
        let targets = Tensor::<B, 2, Int>::from_data(targets, &device);
        frugal::memory::set_phase(&device, frugal::memory::Phase::Forward);
        let loss = model.loss(input, targets);
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

/// Peak live bytes of a run without a budget.
fn unconstrained_peak() -> u64 {
    let device = NdArrayDevice::Cpu;
    frugal::memory::set_budget(&device, None);
    frugal::memory::reset_peak(&device);
    let mut peak = 0;
    train::<Managed>(|d| peak = peak.max(frugal::memory::peak_bytes(d)), |_| {});
    peak
}

/// Trains under `fraction` of the unconstrained peak: the losses and each step's counters.
fn budgeted(fraction: f64) -> (Vec<u32>, Vec<RematStats>) {
    let device = NdArrayDevice::Cpu;
    let budget = (unconstrained_peak() as f64 * fraction) as u64;
    frugal::memory::set_budget(&device, Some(budget));
    let mut phase = 0;
    let mut steps = Vec::new();
    let mut last = frugal::memory::remat_stats(&device);
    let losses = train::<Managed>(
        |d| {
            let live = frugal::memory::live_bytes(d);
            assert!(
                live <= budget,
                "phase {phase}: live {live} B over the budget {budget} B"
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
    (losses, steps)
}

#[test]
fn burn_nns_transformer_encoder_under_half_and_a_third_of_its_peak() {
    let _serial = crate::serial();
    let plain = train::<Plain>(|_| {}, |_| {});
    for fraction in [0.5, 1.0 / 3.0] {
        let (losses, steps) = budgeted(fraction);
        assert_eq!(losses, plain, "losses at {fraction:.2} of the peak");
        let ratios: Vec<f64> = steps.iter().map(RematStats::recompute_ratio).collect();
        let packs: Vec<u64> = steps.iter().map(|s| s.packs).collect();
        eprintln!(
            "encoder at {fraction:.2} of its peak: recomputed / forward work by step {ratios:.2?}, \
             masks packed by step {packs:?}, selected {} B, segments {}",
            steps.last().map_or(0, |s| s.plan_selected_bytes),
            steps.last().map_or(0, |s| s.plan_segments),
        );
        // At half its peak the plan recomputes single tensors (through the chains of ops
        // burn-nn's attention and dropout write out), not whole segments.
        if fraction == 0.5 {
            assert!(
                steps.last().is_some_and(|s| s.plan_selected_bytes > 0),
                "at half of its peak the plan chose no tensors to recompute alone"
            );
        }
        // Dropout's masks cannot be recomputed; under the plan they are packed.
        assert!(
            packs[4..].iter().all(|&packs| packs > 0),
            "at {fraction:.2} of the peak no dropout mask was packed under the plan: {packs:?}"
        );
        // Steps 0 to 2 run before the plan knows the step, the fourth under its first cuts;
        // if the budget still evicted under them, the fifth tries smaller segments once (and
        // the plan goes back if they evict no less).
        assert!(
            ratios[5..]
                .iter()
                .all(|&ratio| ratio <= frugal::RECOMPUTE_RATIO_LIMIT),
            "at {fraction:.2} of the peak the steps under the plan recompute more than their \
             forward pass: {ratios:.2?}"
        );
    }
}
