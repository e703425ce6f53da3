//! The example GPT trained on the CPU with burn-optim's `AdamW` and with Frugal's 8-bit
//! `AdamW8bit` (`frugal::optim`): the losses, and the optimizer state in Frugal's ledger.
//!
//! Tolerance, stated before the comparison was first run: both runs start from the same
//! model and see the same batches, with the example's defaults (2 layers, d_model 64, 4 heads,
//! seq 64, batch 16, lr 2e-3, 300 steps, the generated corpus, seed 0) and the example's AdamW
//! settings (eps 1e-8, weight decay 0.01, betas 0.9/0.999) for both optimizers. Then
//! (a) the mean loss of AdamW8bit's last 50 steps is within 2% of AdamW's, and
//! (b) at every one of the 300 steps AdamW8bit's loss is within 5% of AdamW's at that step.
//! The run takes minutes on two cores, so it is ignored by default:
//! `cargo test --release -p gpt --test integration adamw8bit:: -- --ignored --nocapture`.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use frugal::Frugal;
use frugal::optim::AdamW8bitConfig;
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::{Gpt, GptConfig};

type B = Autodiff<Frugal<NdArray>>;

/// Losses of `steps` steps from the model `config` builds after seeding with `seed`, and the
/// live bytes the optimizer's state holds after the last step (from the ledger).
fn train<O: Optimizer<Gpt<B>, B>>(
    config: &GptConfig,
    optim: &mut O,
    steps: u64,
    batch: usize,
    lr: f64,
    seed: u64,
) -> (Vec<f32>, u64) {
    let device = Default::default();
    B::seed(&device, seed);
    let corpus = Corpus::generated(400_000, seed);
    let mut model: Gpt<B> = config.init(&device);
    initialise(&model);
    let model_bytes = frugal::memory::live_bytes(&device);
    let mut losses = Vec::new();
    for step in 0..steps {
        let data = corpus.batch(seed, step, batch, config.seq).unwrap();
        let shape = [data.batch, data.seq];
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(data.inputs, shape), &device);
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(data.targets, shape), &device);
        let loss = model.loss(tokens, targets);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        losses.push(loss.into_scalar().elem::<f32>());
        model = optim.step(lr, model, grads);
    }
    let state = frugal::memory::live_bytes(&device) - model_bytes;
    drop(model);
    (losses, state)
}

/// Initialises every parameter now (Burn does it lazily, on first use), so that the ledger
/// counts the model before the optimizer's first step.
fn initialise<Bk: Backend, M: Module<Bk>>(model: &M) {
    struct Touch;
    impl<Bk: Backend> ModuleVisitor<Bk> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            let _ = param.val();
        }
    }
    model.visit(&mut Touch);
}

fn mean(values: &[f32]) -> f64 {
    values.iter().map(|v| *v as f64).sum::<f64>() / values.len() as f64
}

#[test]
#[ignore = "300 steps twice: minutes on two cores"]
fn three_hundred_steps_with_adamw8bit_stay_within_tolerance_of_adamw() {
    let _serial = crate::serial();
    let config = GptConfig::new(BYTE_VOCAB, 64, 64, 4, 2);
    let (steps, batch, lr, seed) = (300, 16, 2e-3, 0);
    let start = std::time::Instant::now();
    let mut adamw = AdamWConfig::new()
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init();
    let (reference, adamw_state) = train(&config, &mut adamw, steps, batch, lr, seed);
    let adamw_time = start.elapsed();
    let start = std::time::Instant::now();
    let mut ours = AdamW8bitConfig::new()
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init();
    let (losses, state) = train(&config, &mut ours, steps, batch, lr, seed);
    let ours_time = start.elapsed();

    let tail = steps as usize - 50;
    let (ref_tail, our_tail) = (mean(&reference[tail..]), mean(&losses[tail..]));
    let worst = reference
        .iter()
        .zip(&losses)
        .enumerate()
        .map(|(step, (a, b))| (step, ((b - a) / a).abs()))
        .fold((0, 0f32), |w, x| if x.1 > w.1 { x } else { w });
    println!(
        "AdamW: first loss {:.4}, mean of the last 50 {ref_tail:.4}, state {adamw_state} B, {:.1} s",
        reference[0],
        adamw_time.as_secs_f64()
    );
    println!(
        "AdamW8bit: first loss {:.4}, mean of the last 50 {our_tail:.4}, state {state} B \
         ({:.2}% of AdamW's), {:.1} s",
        losses[0],
        100.0 * state as f64 / adamw_state as f64,
        ours_time.as_secs_f64()
    );
    println!(
        "last-50 difference {:.3}%; largest per-step difference {:.3}% at step {}",
        100.0 * (our_tail - ref_tail) / ref_tail,
        100.0 * worst.1,
        worst.0
    );
    for step in (0..steps as usize).step_by(25).chain([steps as usize - 1]) {
        println!(
            "step {step:3}: AdamW {:.4}  AdamW8bit {:.4}",
            reference[step], losses[step]
        );
    }
    assert!(
        reference[tail..].iter().all(|l| l.is_finite()) && ref_tail < reference[0] as f64 * 0.8,
        "AdamW did not train"
    );
    assert!(
        (our_tail - ref_tail).abs() <= 0.02 * ref_tail,
        "(a) mean loss of the last 50 steps: AdamW8bit {our_tail} vs AdamW {ref_tail}"
    );
    assert!(
        worst.1 <= 0.05,
        "(b) step {}: AdamW8bit {} vs AdamW {}",
        worst.0,
        losses[worst.0],
        reference[worst.0]
    );
}

/// Elements of each parameter of a model.
fn parameter_sizes<Bk: Backend, M: Module<Bk>>(model: &M) -> Vec<usize> {
    struct Sizes(Vec<usize>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            self.0.push(param.shape().num_elements());
        }
    }
    let mut sizes = Sizes(Vec::new());
    model.visit(&mut sizes);
    sizes.0
}

/// One optimizer step on the model `config` builds, with gradients of ones (no forward pass):
/// the live bytes the optimizer's state holds afterwards, from the ledger.
fn state_after_one_step<O: Optimizer<Gpt<B>, B>>(config: &GptConfig, optim: &mut O) -> u64 {
    let device = Default::default();
    let model: Gpt<B> = config.init(&device);
    initialise(&model);
    let before = frugal::memory::live_bytes(&device);
    struct Ones<'a> {
        grads: &'a mut GradientsParams,
    }
    impl ModuleVisitor<B> for Ones<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let ones = param.val().inner().ones_like();
            self.grads
                .register::<<B as AutodiffBackend>::InnerBackend, D>(param.id, ones);
        }
    }
    let mut grads = GradientsParams::new();
    model.visit(&mut Ones { grads: &mut grads });
    let model = optim.step(1e-4, model, grads);
    let state = frugal::memory::live_bytes(&device) - before;
    drop(model);
    state
}

#[test]
#[ignore = "allocates the reference model (98M parameters) and its AdamW state"]
fn reference_shapes_state_bytes() {
    let _serial = crate::serial();
    let config = GptConfig::reference();
    let device = Default::default();
    let sizes = parameter_sizes::<B, _>(&config.init::<B>(&device));
    let params: usize = sizes.iter().sum();
    let small = sizes.iter().filter(|s| **s < 4096).count();
    let mut adamw = AdamWConfig::new().init();
    let adamw_state = state_after_one_step(&config, &mut adamw);
    drop(adamw);
    let mut ours = AdamW8bitConfig::new().init();
    let state = state_after_one_step(&config, &mut ours);
    println!(
        "reference GPT: {params} parameters in {} tensors ({small} under 4096 elements); \
         optimizer state: AdamW {adamw_state} B, AdamW8bit {state} B ({:.2}%)",
        sizes.len(),
        100.0 * state as f64 / adamw_state as f64
    );
    assert_eq!(adamw_state, 8 * params as u64);
    assert!(state as f64 <= 0.26 * adamw_state as f64);
}
