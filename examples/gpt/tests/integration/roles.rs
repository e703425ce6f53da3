//! The ledger's roles on the example GPT, trained by the example's own step function on
//! `Autodiff<Frugal<NdArray>>`: parameters are 4 bytes per parameter, AdamW's state twice
//! that, and what the forward pass saved and backward made shows up as activations and
//! gradients while the step runs.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::tensor::backend::Backend;
use frugal::Frugal;
use frugal::memory;
use gpt::GptConfig;
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::train::{self, OptimizerKind, StepOptions};

type B = Autodiff<Frugal<NdArray>>;

#[test]
fn parameters_optimizer_state_gradients_and_activations_are_told_apart() {
    let _serial = crate::serial();
    let device = Default::default();
    B::seed(&device, 0);
    let config = GptConfig::new(BYTE_VOCAB, 32, 32, 4, 2);
    let corpus = Corpus::generated(20_000, 0);
    let mut model = config.init::<B>(&device);
    let parameter_bytes = 4 * model.num_params() as u64;
    memory::tag_parameters(&model);
    assert_eq!(
        memory::live_by_role(&device).parameters,
        parameter_bytes,
        "parameters after init"
    );

    let mut optim = train::optimizer::<B>(OptimizerKind::AdamW);
    let options = StepOptions {
        lr: 1e-3,
        checkpoint_blocks: false,
        micro_batches: 1,
    };
    for step in 0..3 {
        memory::reset_peak(&device);
        let batch = corpus.batch(0, step, 4, 32).unwrap();
        let (next, loss, _) =
            train::step_accumulated(model, &mut optim, batch, &options, &device, None, |_| {})
                .unwrap();
        assert!(loss.is_finite());
        model = next;
        memory::tag_parameters(&model);

        let live = memory::live_by_role(&device);
        assert_eq!(live.parameters, parameter_bytes, "step {step}: parameters");
        assert_eq!(
            live.optimizer_state,
            2 * parameter_bytes,
            "step {step}: AdamW's two moments"
        );
        assert_eq!(live.gradients, 0, "step {step}: gradients are gone");
        assert_eq!(live.activations, 0, "step {step}: activations are gone");
        assert_eq!(live.total(), memory::live_bytes(&device));

        let peak = memory::peak_by_role(&device);
        // Every gradient is live when the optimizer step starts.
        assert!(
            peak.gradients >= parameter_bytes,
            "step {step}: peak gradients {} < {parameter_bytes}",
            peak.gradients
        );
        // The forward pass saves at least the logits (batch × seq × vocab floats).
        let logits = 4 * 4 * 32 * BYTE_VOCAB as u64;
        assert!(
            peak.activations >= logits,
            "step {step}: peak activations {} < {logits}",
            peak.activations
        );
        assert!(
            memory::report(&device)
                .to_string()
                .contains("optimizer state")
        );
    }
}
