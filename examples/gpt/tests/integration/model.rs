//! The model is causal and has PyTorch's parameter count for the same configuration.

use burn::backend::NdArray;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData, Tolerance};
use gpt::GptConfig;

type B = NdArray;

#[test]
fn changing_a_future_token_leaves_earlier_logits_unchanged() {
    let _serial = crate::serial();
    let device = Default::default();
    let model = GptConfig::new(16, 8, 16, 2, 2).init::<B>(&device);
    let a: Vec<i64> = vec![1, 2, 3, 4, 5, 6, 7, 8];
    let mut b = a.clone();
    b[5] = 15;
    let logits = |tokens: Vec<i64>| {
        model.forward(Tensor::<B, 2, Int>::from_data(
            TensorData::new(tokens, [1, 8]),
            &device,
        ))
    };
    let (la, lb) = (logits(a), logits(b));
    la.clone()
        .slice([0..1, 0..5])
        .into_data()
        .assert_approx_eq::<f32>(
            &lb.clone().slice([0..1, 0..5]).into_data(),
            Tolerance::default(),
        );
    let later = (la.slice([0..1, 5..8]) - lb.slice([0..1, 5..8]))
        .abs()
        .max()
        .into_scalar();
    assert!(later > 1e-6, "position 5 onwards should see the change");
}

#[test]
fn parameter_count_matches_pytorch() {
    let _serial = crate::serial();
    let config = GptConfig::new(64, 16, 32, 4, 3);
    let model = config.init::<B>(&Default::default());
    assert_eq!(model.num_params(), config.parameters());
    // torch_gpt.py's reference model: 12 layers, d 768, vocab 8192, seq 512.
    assert_eq!(GptConfig::reference().parameters(), 98_040_320);
}
