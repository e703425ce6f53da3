//! `frugal::nn::LayerNorm` (one autodiff node) against burn-nn's `LayerNorm` (Burn's
//! written-out layer norm and its autodiff) with the same parameters: the output and the
//! gradients of the input, gamma and beta, on wgpu with Burn's fusion (`Wgpu`) and without
//! (`CubeBackend<WgpuRuntime>`), where Frugal's kernels run (the counters show it), and on
//! NdArray, where the node computes with `Frugal<NdArray>`'s own ops.
//!
//! Tolerance (f32): `2e-5 + 2e-4 * |want|` per element (another order of additions).
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuRuntime};
use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::nn::LayerNormConfig as BurnLayerNormConfig;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use frugal::Frugal;
use frugal::kernels::{self, KernelMode};
use frugal::nn::LayerNormConfig;

use crate::serial;

type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// Output, then the gradients of the input, gamma and beta (empty without a beta).
type Results = [Vec<f32>; 4];

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Random `[2, 7, width]` input, gamma and beta, and upstream gradient, the same on every
/// backend (drawn on the CPU).
fn inputs(width: usize) -> [Vec<f32>; 4] {
    type Cpu = NdArray;
    let device = Default::default();
    <Cpu as burn::tensor::backend::Backend>::seed(&device, 5);
    let draw = |n: usize, lo: f64, hi: f64| {
        values(Tensor::<Cpu, 1>::random(
            [n],
            Distribution::Uniform(lo, hi),
            &device,
        ))
    };
    [
        draw(14 * width, -2.0, 3.0),
        draw(width, 0.5, 1.5),
        draw(width, -0.5, 0.5),
        draw(14 * width, -1.0, 1.0),
    ]
}

fn run<B: AutodiffBackend>(width: usize, with_beta: bool, fused: bool) -> Results {
    let device = Default::default();
    let [x, gamma, beta, upstream] = inputs(width);
    let x = Tensor::<B, 1>::from_floats(x.as_slice(), &device)
        .reshape([2, 7, width])
        .require_grad();
    let upstream = Tensor::<B, 1>::from_floats(upstream.as_slice(), &device).reshape([2, 7, width]);
    let gamma = Param::from_tensor(Tensor::<B, 1>::from_floats(gamma.as_slice(), &device));
    let beta = with_beta
        .then(|| Param::from_tensor(Tensor::<B, 1>::from_floats(beta.as_slice(), &device)));
    let (out, gamma, beta) = if fused {
        let mut ln = LayerNormConfig::new(width)
            .with_bias(with_beta)
            .init::<B>(&device);
        ln.gamma = gamma;
        ln.beta = beta;
        (ln.forward(x.clone()), ln.gamma, ln.beta)
    } else {
        let mut ln = BurnLayerNormConfig::new(width)
            .with_bias(with_beta)
            .init::<B>(&device);
        ln.gamma = gamma;
        ln.beta = beta;
        (ln.forward(x.clone()), ln.gamma, ln.beta)
    };
    let grads = (out.clone() * upstream).sum().backward();
    let grad = |t: Tensor<B, 1>| values(t.grad(&grads).expect("a gradient"));
    [
        values(out),
        values(x.grad(&grads).expect("the input's gradient")),
        grad(gamma.val()),
        beta.map(|b| grad(b.val())).unwrap_or_default(),
    ]
}

fn assert_close(got: &Results, want: &Results, ctx: &str) {
    for (what, (g, w)) in ["output", "input grad", "gamma grad", "beta grad"]
        .iter()
        .zip(got.iter().zip(want))
    {
        assert_eq!(g.len(), w.len(), "{ctx}: {what} length");
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= 2e-5 + 2e-4 * w.abs(),
                "{ctx}: {what}[{i}]: {g} against burn-nn's {w}"
            );
        }
    }
}

/// Both widths (vectors of four, and one value per load) with and without beta; the kernels
/// ran once forward and once backward per call when `kernel` is set.
fn check<B: burn::tensor::backend::Backend>(name: &str, kernel: bool) {
    for width in [64, 13] {
        for with_beta in [true, false] {
            let ctx = format!("{name}, width {width}, beta {with_beta}");
            let want = run::<Autodiff<B>>(width, with_beta, false);
            let before = kernels::stats();
            let got = run::<Autodiff<Frugal<B>>>(width, with_beta, true);
            let after = kernels::stats();
            let ran = (
                after.layer_norm_forwards - before.layer_norm_forwards,
                after.layer_norm_backwards - before.layer_norm_backwards,
            );
            assert_eq!(
                ran,
                if kernel { (1, 1) } else { (0, 0) },
                "{ctx}: kernel runs"
            );
            assert_close(&got, &want, &ctx);
        }
    }
}

#[test]
fn the_kernels_give_burn_nns_layer_norm_fused_or_not() {
    let _serial = serial();
    kernels::set_mode(KernelMode::Auto);
    check::<Wgpu>("fused", true);
    check::<Unfused>("unfused", true);
}

#[test]
fn the_portable_node_gives_burn_nns_layer_norm_on_ndarray() {
    let _serial = serial();
    check::<NdArray>("ndarray", false);
}
