//! `step-memory.png`'s phase labels: one per phase mark of the recorded step, none over
//! another, though "backward done" and "update starts" are marked a few events apart.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use frugal::Frugal;
use frugal::memory;
use gpt::GptConfig;
use gpt::data::{BYTE_VOCAB, Corpus};
use gpt::plot::phase_labels;
use gpt::train::{self, OptimizerKind, StepOptions};

type B = Autodiff<Frugal<NdArray>>;

#[test]
fn phase_labels_never_overlap() {
    let _serial = crate::serial();
    let device = Default::default();
    B::seed(&device, 0);
    let model = GptConfig::new(BYTE_VOCAB, 16, 16, 2, 1).init::<B>(&device);
    let corpus = Corpus::generated(20_000, 0);
    let mut optim = train::optimizer::<B>(OptimizerKind::AdamW);
    for micro_batches in [1, 2] {
        memory::record_timeline(&device, 1 << 20);
        let options = StepOptions {
            lr: 1e-3,
            checkpoint_blocks: false,
            micro_batches,
        };
        let batch = corpus.batch(0, 0, 4, 16).unwrap();
        train::step_accumulated(
            model.clone(),
            &mut optim,
            batch,
            &options,
            &device,
            None,
            |phase| memory::mark(&device, phase.label()),
        )
        .unwrap();
        let snapshot = memory::snapshot(&device);
        memory::record_timeline(&device, 0);
        let x_end = snapshot.events.len() as f64;
        // About the bundled font's width at 14 pixels.
        let width = |text: &str| 7 * text.len() as u32;
        let labels = phase_labels(&snapshot, x_end, width);
        assert_eq!(labels.len(), 3 * micro_batches + 2, "{labels:?}");
        // The last micro-batch's backward pass ends right before the update starts.
        let at = |text: &str| labels.iter().rev().find(|l| l.text == text).unwrap();
        let (backward, update) = (at("backward done"), at("update starts"));
        assert!(
            (update.x - backward.x) * gpt::plot::PLOT_WIDTH / x_end < width("backward done") as f64,
            "the marks are close enough to test: {backward:?} {update:?}"
        );
        let span = |l: &gpt::plot::PhaseLabel| {
            (
                l.label_x,
                l.label_x + width(&l.text) as f64 * x_end / gpt::plot::PLOT_WIDTH,
            )
        };
        for (i, a) in labels.iter().enumerate() {
            let (a0, a1) = span(a);
            assert!(a0 >= 0.0 && a1 <= x_end, "{a:?} leaves the plot");
            for b in &labels[i + 1..] {
                let (b0, b1) = span(b);
                assert!(
                    a.row != b.row || a1 <= b0 || b1 <= a0,
                    "{a:?} and {b:?} overlap"
                );
            }
        }
    }
}
