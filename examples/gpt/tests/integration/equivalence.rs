//! Training under `Autodiff<Frugal<B>>` gives the same losses and parameters, bit for bit, as
//! under `Autodiff<B>`: 20 AdamW steps of a small GPT on NdArray, without a budget, under
//! budgets enforced by recomputation or host offload, and with checkpointed blocks (attention
//! and layer norms written out, as Burn computes them). With the fused ops
//! (`frugal::nn::attention`, its block-wise path on NdArray, and `frugal::nn::layer_norm`, one
//! autodiff node) a budget or checkpointed blocks change no bit either, and the losses follow
//! the written-out ones within f32 rounding.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use frugal::{EvictionMode, Frugal, Policy};
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::{Gpt, GptConfig, train};

type Managed = Autodiff<Frugal<NdArray>>;

struct Bits(Vec<u32>);

impl<B: Backend> ModuleVisitor<B> for Bits {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data();
        self.0.extend(data.iter::<f32>().map(f32::to_bits));
    }
}

/// Losses of 20 steps, and the final parameters as bits (attention and layer norms written
/// out).
fn train<B: AutodiffBackend>(
    checkpoint_blocks: bool,
    after_phase: impl FnMut(&B::Device),
) -> (Vec<u32>, Vec<u32>) {
    train_with::<B>(false, checkpoint_blocks, after_phase)
}

/// As [`train`], with attention, layer norms and the loss through `frugal::nn::attention`,
/// `frugal::nn::layer_norm` and `frugal::nn::linear_cross_entropy` if `fused`.
fn train_with<B: AutodiffBackend>(
    fused: bool,
    checkpoint_blocks: bool,
    mut after_phase: impl FnMut(&B::Device),
) -> (Vec<u32>, Vec<u32>) {
    let device = B::Device::default();
    B::seed(&device, 42);
    let (batch, seq) = (4, 32);
    let config = GptConfig::new(BYTE_VOCAB, seq, 32, 4, 2)
        .with_fused_attention(fused)
        .with_fused_norm(fused)
        .with_fused_loss(fused);
    let corpus = Corpus::generated(20_000, 1);
    let mut model: Gpt<B> = config.init::<B>(&device);
    let mut optim = train::optimizer::<B>(train::OptimizerKind::AdamW);
    let mut losses = Vec::new();
    for step in 0..20 {
        let data = corpus.batch(7, step, batch, seq).unwrap();
        let (next, loss) = train::step_with(
            model,
            &mut optim,
            data,
            3e-3,
            &device,
            checkpoint_blocks,
            |_| after_phase(&device),
        );
        model = next;
        losses.push(loss.to_bits());
    }
    let mut params = Bits(Vec::new());
    model.visit(&mut params);
    (losses, params.0)
}

fn reference() -> (Vec<u32>, Vec<u32>) {
    let (losses, params) = train::<Autodiff<NdArray>>(false, |_| {});
    let floats: Vec<f32> = losses.iter().map(|b| f32::from_bits(*b)).collect();
    assert!(floats.iter().all(|l| l.is_finite()), "{floats:?}");
    assert!(floats[19] < floats[0], "loss did not fall: {floats:?}");
    (losses, params)
}

/// Peak live bytes of one unconstrained step (after the model exists).
fn unconstrained_peak(fused_attention: bool) -> u64 {
    let device = burn::backend::ndarray::NdArrayDevice::Cpu;
    frugal::memory::set_budget(&device, None);
    let mut peak = 0;
    let before = frugal::memory::live_bytes(&device);
    frugal::memory::reset_peak(&device);
    train_with::<Managed>(fused_attention, false, |d| {
        peak = peak.max(frugal::memory::peak_bytes(d))
    });
    assert!(peak > before);
    peak
}

/// Trains under `budget` with `mode`, checking live bytes stay within it at each phase.
fn budgeted(
    fraction: (u64, u64),
    mode: EvictionMode,
    checkpoint_blocks: bool,
) -> ((Vec<u32>, Vec<u32>), frugal::RematStats) {
    budgeted_with(false, fraction, mode, checkpoint_blocks)
}

/// As [`budgeted`], with the fused attention and layer norms if `fused_attention`.
fn budgeted_with(
    fused_attention: bool,
    fraction: (u64, u64),
    mode: EvictionMode,
    checkpoint_blocks: bool,
) -> ((Vec<u32>, Vec<u32>), frugal::RematStats) {
    let device = burn::backend::ndarray::NdArrayDevice::Cpu;
    let budget = unconstrained_peak(fused_attention) * fraction.0 / fraction.1;
    let before = frugal::memory::remat_stats(&device);
    frugal::memory::set_policy(
        &device,
        Policy {
            mode,
            ..Policy::default()
        },
    );
    frugal::memory::set_budget(&device, Some(budget));
    let out = train_with::<Managed>(fused_attention, checkpoint_blocks, |d| {
        let live = frugal::memory::live_bytes(d);
        assert!(live <= budget, "live {live} over the budget {budget}");
    });
    frugal::memory::set_budget(&device, None);
    frugal::memory::set_policy(&device, Policy::default());
    let after = frugal::memory::remat_stats(&device);
    let stats = after.since(&before);
    (out, stats)
}

#[test]
fn twenty_steps_give_identical_losses() {
    let _serial = crate::serial();
    let plain = reference();
    let frugal = train::<Managed>(false, |_| {});
    assert_eq!(plain, frugal);
}

#[test]
fn recomputation_alone_under_two_thirds_of_the_peak_changes_no_bit() {
    // Gradients come from ops that consume their last input, so they cannot be recomputed:
    // with recomputation alone, the budget must leave room for them.
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats) = budgeted((2, 3), EvictionMode::RecomputeOnly, false);
    assert!(stats.evictions > 0 && stats.recomputes > 0, "{stats:?}");
    assert_eq!(plain, out, "{stats:?}");
}

#[test]
fn the_default_policy_under_a_third_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats) = budgeted((1, 3), EvictionMode::Auto, false);
    assert!(stats.evictions > 0 && stats.recomputes > 0, "{stats:?}");
    assert_eq!(plain, out, "{stats:?}");
}

#[test]
fn host_offload_under_a_third_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats) = budgeted((1, 3), EvictionMode::OffloadOnly, false);
    assert!(stats.offloads > 0 && stats.uploads > 0, "{stats:?}");
    assert_eq!(plain, out, "{stats:?}");
}

#[test]
fn checkpointed_blocks_change_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let device = burn::backend::ndarray::NdArrayDevice::Cpu;
    let before = frugal::memory::remat_stats(&device);
    let out = train::<Managed>(true, |_| {});
    let after = frugal::memory::remat_stats(&device);
    assert!(after.evictions > before.evictions, "{after:?}");
    assert!(after.recomputes > before.recomputes, "{after:?}");
    assert_eq!(plain, out);
}

#[test]
fn scopes_and_a_quarter_budget_together_change_no_bit() {
    let _serial = crate::serial();
    let plain = reference();
    let (out, stats) = budgeted((1, 4), EvictionMode::Auto, true);
    assert!(stats.evictions + stats.offloads > 0, "{stats:?}");
    assert_eq!(plain, out, "{stats:?}");
}

#[test]
fn fused_attention_under_a_third_of_the_peak_changes_no_bit() {
    let _serial = crate::serial();
    let free = train_with::<Managed>(true, false, |_| {});
    let (out, stats) = budgeted_with(true, (1, 3), EvictionMode::Auto, false);
    assert!(stats.evictions > 0, "{stats:?}");
    assert_eq!(free, out, "{stats:?}");
}

#[test]
fn fused_ops_with_checkpointed_blocks_change_no_bit() {
    let _serial = crate::serial();
    let free = train_with::<Managed>(true, false, |_| {});
    let scoped = train_with::<Managed>(true, true, |_| {});
    assert_eq!(free, scoped);
}

#[test]
fn fused_attention_follows_the_written_out_losses() {
    let _serial = crate::serial();
    let (written, _) = reference();
    let (fused, _) = train_with::<Managed>(true, false, |_| {});
    let (written, fused): (Vec<f32>, Vec<f32>) = (
        written.iter().map(|b| f32::from_bits(*b)).collect(),
        fused.iter().map(|b| f32::from_bits(*b)).collect(),
    );
    // The block-wise softmax, the layer norm node and the chunked loss sum in another order:
    // the losses differ by rounding only.
    for (step, (w, f)) in written.iter().zip(&fused).enumerate() {
        assert!(
            (w - f).abs() <= 1e-4 * w.abs(),
            "step {step}: written out {w}, fused {f}\n{written:?}\n{fused:?}"
        );
    }
}
