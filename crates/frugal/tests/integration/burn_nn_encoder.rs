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

use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use frugal::RematStats;

use crate::burn_nn_families::{Family, Managed, Plain, next_tokens, same_bits_within_budgets};

const BATCH: usize = 8;
const SEQ: usize = 32;
const VOCAB: usize = 128;

#[derive(Module, Debug)]
struct EncoderLm<B: Backend> {
    embed: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: AutodiffBackend> Family<B> for EncoderLm<B> {
    const SEED: u64 = 11;
    const STEPS: usize = 10;

    fn init(device: &B::Device) -> Self {
        Self {
            embed: EmbeddingConfig::new(VOCAB, 64).init(device),
            encoder: TransformerEncoderConfig::new(64, 256, 4, 2)
                .with_dropout(0.1)
                .init(device),
            head: LinearConfig::new(64, VOCAB).init(device),
        }
    }

    fn loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1> {
        let (input, targets) = next_tokens(2000 + step as u64, [BATCH, SEQ], VOCAB, device);
        let mask = generate_autoregressive_mask::<B>(BATCH, SEQ, device);
        let x = self.embed.forward(input);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let logits = self.head.forward(x).reshape([BATCH * SEQ, VOCAB]);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(logits, targets)
    }
}

#[test]
fn burn_nns_transformer_encoder_under_half_and_a_third_of_its_peak() {
    let _serial = crate::serial();
    let fractions = [0.5, 1.0 / 3.0];
    let runs =
        same_bits_within_budgets::<EncoderLm<Managed>, EncoderLm<Plain>>("the encoder", &fractions);
    for (fraction, steps) in fractions.into_iter().zip(runs) {
        let ratios: Vec<f64> = steps.iter().map(RematStats::recompute_ratio).collect();
        let packs: Vec<u64> = steps.iter().map(|s| s.packs).collect();
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
