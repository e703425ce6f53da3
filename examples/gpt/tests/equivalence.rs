//! Training under `Autodiff<Frugal<B>>` gives the same losses, bit for bit, as under
//! `Autodiff<B>`: 20 AdamW steps of a small GPT on NdArray.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::AutodiffBackend;
use frugal::Frugal;
use gpt::GptConfig;
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::train;

fn losses<B: AutodiffBackend>(steps: u64) -> Vec<f32> {
    let device = B::Device::default();
    B::seed(&device, 42);
    let (batch, seq) = (4, 32);
    let config = GptConfig::new(BYTE_VOCAB, seq, 32, 4, 2);
    let corpus = Corpus::generated(20_000, 1);
    let mut model = config.init::<B>(&device);
    let mut optim = train::optimizer::<B>();
    let mut out = Vec::new();
    for step in 0..steps {
        let data = corpus.batch(7, step, batch, seq).unwrap();
        let (next, loss) = train::step(model, &mut optim, data, 3e-3, &device, |_| {});
        model = next;
        out.push(loss);
    }
    out
}

#[test]
fn twenty_steps_give_identical_losses() {
    let plain = losses::<Autodiff<NdArray>>(20);
    let frugal = losses::<Autodiff<Frugal<NdArray>>>(20);
    assert!(
        plain.iter().all(|l| l.is_finite()),
        "losses not finite: {plain:?}"
    );
    assert_eq!(
        plain.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        frugal.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        "plain {plain:?}\nfrugal {frugal:?}"
    );
    assert!(plain[19] < plain[0], "loss did not fall: {plain:?}");
}
