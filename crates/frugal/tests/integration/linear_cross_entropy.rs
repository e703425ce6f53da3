//! `frugal::nn::linear_cross_entropy` against the written-out head and loss (Burn's `linear`,
//! burn-nn's cross-entropy arithmetic): the same loss and gradients in every chunking, with and
//! without a bias, under autodiff and without it, and no logits held after the forward pass.

use burn::backend::{Autodiff, NdArray, ndarray::NdArrayDevice};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use frugal::nn::{linear_cross_entropy, linear_cross_entropy_written_out};
use frugal::{Frugal, memory};

use crate::serial;

type B = Autodiff<Frugal<NdArray>>;

struct Head<Bk: Backend> {
    x: Tensor<Bk, 2>,
    weight: Tensor<Bk, 2>,
    bias: Tensor<Bk, 1>,
    targets: Tensor<Bk, 1, Int>,
}

fn head<Bk: Backend>(
    rows: usize,
    features: usize,
    classes: usize,
    device: &Bk::Device,
) -> Head<Bk> {
    Bk::seed(device, 7);
    let uniform = Distribution::Uniform(-1.0, 1.0);
    let targets: Vec<i64> = (0..rows).map(|i| ((i * 7919) % classes) as i64).collect();
    Head {
        // Wide logits (up to ±features), so the log-sum-exp's shift matters.
        x: Tensor::random([rows, features], uniform, device) * 2.0,
        weight: Tensor::random([features, classes], uniform, device),
        bias: Tensor::random([classes], uniform, device),
        targets: Tensor::from_data(TensorData::new(targets, [rows]), device),
    }
}

fn values<Bk: Backend, const D: usize>(t: Tensor<Bk, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 + 1e-4 * w.abs(),
            "{ctx}: [{i}] fused {g}, written out {w}"
        );
    }
    assert!(want.iter().any(|w| w.abs() > 1e-4), "{ctx}: all but zero");
}

/// The loss and the gradients of x, the weight and the bias (when used).
fn run<Bk: AutodiffBackend>(
    h: &Head<Bk>,
    with_bias: bool,
    chunk_rows: Option<usize>,
    fused: bool,
) -> Vec<Vec<f32>> {
    let x = h.x.clone().require_grad();
    let weight = h.weight.clone().require_grad();
    let bias = with_bias.then(|| h.bias.clone().require_grad());
    let loss = if fused {
        linear_cross_entropy(
            x.clone(),
            weight.clone(),
            bias.clone(),
            h.targets.clone(),
            chunk_rows,
        )
    } else {
        linear_cross_entropy_written_out(x.clone(), weight.clone(), bias.clone(), h.targets.clone())
    };
    // A loss gradient other than one, as a loss scaler's.
    let grads = (loss.clone() * 8.0).backward();
    let mut out = vec![
        values(loss.inner()),
        values(x.grad(&grads).unwrap()),
        values(weight.grad(&grads).unwrap()),
    ];
    if let Some(bias) = bias {
        out.push(values(bias.grad(&grads).unwrap()));
    }
    out
}

#[test]
fn fused_matches_written_out_in_every_chunking() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let h = head::<B>(37, 24, 53, &device);
    for with_bias in [true, false] {
        let want = run(&h, with_bias, None, false);
        for chunk_rows in [Some(1), Some(5), Some(36), Some(37), Some(1000), None] {
            let got = run(&h, with_bias, chunk_rows, true);
            for (name, (g, w)) in ["loss", "grad x", "grad weight", "grad bias"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_close(
                    g,
                    w,
                    &format!("{name}, bias {with_bias}, chunks {chunk_rows:?}"),
                );
            }
        }
    }
}

#[test]
fn written_out_is_burn_nns_cross_entropy() {
    // NdArray's seed is process-wide.
    let _serial = serial();
    let device = NdArrayDevice::default();
    let h = head::<Autodiff<NdArray>>(19, 8, 11, &device);
    let logits = burn::tensor::module::linear(h.x.clone(), h.weight.clone(), Some(h.bias.clone()));
    let burn_nn = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(logits, h.targets.clone());
    let ours = linear_cross_entropy_written_out(h.x, h.weight, Some(h.bias), h.targets);
    assert_eq!(values(ours), values(burn_nn));
}

#[test]
fn plain_backends_and_frugal_without_autodiff_give_the_same_loss() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let plain = head::<Autodiff<NdArray>>(29, 16, 41, &device);
    let want = values(linear_cross_entropy_written_out(
        plain.x.clone(),
        plain.weight.clone(),
        Some(plain.bias.clone()),
        plain.targets.clone(),
    ));
    // On a backend without Frugal the call is the written-out loss, bit for bit.
    let got = values(linear_cross_entropy(
        plain.x,
        plain.weight,
        Some(plain.bias),
        plain.targets,
        Some(4),
    ));
    assert_eq!(got, want);
    let inference = head::<Frugal<NdArray>>(29, 16, 41, &device);
    let got = values(linear_cross_entropy(
        inference.x,
        inference.weight,
        Some(inference.bias),
        inference.targets,
        Some(4),
    ));
    assert_close(&got, &want, "Frugal<NdArray>, no autodiff");
}

#[test]
fn forward_keeps_no_logits_and_no_step_holds_them_all() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let (rows, features, classes) = (256, 32, 512);
    let h = head::<B>(rows, features, classes, &device);
    // Bytes kept by the forward pass, and the peak above the start over forward and backward.
    let measure = |fused: bool| {
        let x = h.x.clone().require_grad();
        let weight = h.weight.clone().require_grad();
        let bias = Some(h.bias.clone().require_grad());
        let before = memory::live_bytes(&device);
        memory::reset_peak(&device);
        let loss = if fused {
            linear_cross_entropy(x.clone(), weight.clone(), bias, h.targets.clone(), Some(64))
        } else {
            linear_cross_entropy_written_out(x.clone(), weight.clone(), bias, h.targets.clone())
        };
        let kept = memory::live_bytes(&device) - before;
        let grads = loss.backward();
        assert!(x.grad(&grads).is_some() && weight.grad(&grads).is_some());
        (kept, memory::peak_bytes(&device) - before)
    };
    let (fused, fused_peak) = measure(true);
    let (written, written_peak) = measure(false);
    let logits = (rows * classes * 4) as u64;
    let gradients = ((rows * features + features * classes + classes) * 4) as u64;
    // Fused: the gradients it made and the loss, no logits.
    assert!(
        fused <= gradients + 64,
        "fused kept {fused} B, the gradients {gradients} B"
    );
    // Written out: the logits' log-softmax at least.
    assert!(
        written >= logits,
        "written out kept {written} B, the logits {logits} B"
    );
    // At its peak the written-out loss holds three logit-sized tensors at least; the fused one
    // a quarter's (64 of 256 rows) few temporaries beside the gradients.
    assert!(
        written_peak >= 3 * logits && fused_peak <= gradients + logits,
        "peaks: written out {written_peak} B, fused {fused_peak} B, the logits {logits} B"
    );
}

#[test]
#[should_panic(expected = "the weight must be [16, classes]")]
fn a_weight_of_another_width_is_named() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let h = head::<B>(8, 16, 10, &device);
    let weight = Tensor::<B, 2>::zeros([12, 10], &device);
    let _ = linear_cross_entropy(h.x, weight, None, h.targets, None);
}
