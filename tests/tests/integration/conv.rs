//! 2D convolutions under `Autodiff<Frugal<_>>` on wgpu, with Burn's fusion (`Wgpu`) and
//! without (`CubeBackend<WgpuRuntime>`): one kernel a pass (`ConvAlgorithm::OneKernel`, a
//! custom operation under fusion) against the inner backend's own convolution
//! (`ConvAlgorithm::Autotune`), on a strided, padded, dilated convolution with a bias, grouped
//! (burn-cubecl's fallback for the data pass) and not (a unit-stride pass on the spread
//! gradient, with rows of zeros after the last strided one). The output and the gradients of the input, weight and bias agree within the rounding
//! of another order of additions, and the counters show that every pass ran through Frugal.
//!
//! Tolerance (f32): `1e-5 + 1e-4 * |want|` per element.
use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuRuntime};
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2dConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use frugal::Frugal;
use frugal::kernels::{self, ConvAlgorithm};

use crate::serial;

type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        kernels::set_conv_algorithm(ConvAlgorithm::default());
    }
}

/// A convolution's shape: groups, stride, padding and dilation.
#[derive(Clone, Copy)]
struct Case {
    groups: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

/// x `[3, 4, 9, 8]` into 6 channels in 2 groups, kernel 3 × 2, stride [2, 1].
const GROUPED: Case = Case {
    groups: 2,
    stride: [2, 1],
    padding: [1, 1],
    dilation: [1, 2],
};

/// Ungrouped, strided on both axes; on the second the last strided column (4) falls short of
/// the unit-stride output's 6 columns.
const STRIDED: Case = Case {
    groups: 1,
    stride: [2, 2],
    padding: [1, 0],
    dilation: [1, 2],
};

/// The convolution's output and the gradients of x, the weight and the bias, flattened, for
/// a random upstream gradient: x `[3, 4, 9, 8]` into 6 channels, kernel 3 × 2.
fn conv_and_grads<B: AutodiffBackend>(case: Case) -> [Vec<f32>; 4] {
    let device = Default::default();
    B::seed(&device, 5);
    let [ph, pw] = case.padding;
    let conv = Conv2dConfig::new([4, 6], [3, 2])
        .with_stride(case.stride)
        .with_padding(PaddingConfig2d::Explicit(ph, pw, ph, pw))
        .with_dilation(case.dilation)
        .with_groups(case.groups)
        .init::<B>(&device);
    let x = Tensor::<B, 4>::random([3, 4, 9, 8], Distribution::Uniform(-1.0, 1.0), &device)
        .require_grad();
    let out = conv.forward(x.clone());
    let upstream = Tensor::<B, 4>::random(out.dims(), Distribution::Uniform(-1.0, 1.0), &device);
    let grads = (out.clone() * upstream).sum().backward();
    let read = |t: Tensor<B::InnerBackend, 4>| t.into_data().to_vec::<f32>().unwrap();
    let bias = conv
        .bias
        .as_ref()
        .expect("a bias")
        .grad(&grads)
        .expect("its gradient");
    [
        read(out.inner()),
        read(x.grad(&grads).expect("x's gradient")),
        read(conv.weight.grad(&grads).expect("the weight's gradient")),
        bias.into_data().to_vec::<f32>().unwrap(),
    ]
}

fn check<B: Backend>(name: &str, case: Case) {
    kernels::set_conv_algorithm(ConvAlgorithm::Autotune);
    let before = kernels::stats().conv_passes;
    let want = conv_and_grads::<Autodiff<Frugal<B>>>(case);
    assert_eq!(
        kernels::stats().conv_passes,
        before,
        "{name}: Burn's own convolution ran"
    );
    kernels::set_conv_algorithm(ConvAlgorithm::OneKernel);
    let got = conv_and_grads::<Autodiff<Frugal<B>>>(case);
    let ran = kernels::stats().conv_passes - before;
    assert_eq!(
        ran, 3,
        "{name}: the forward, data and weight passes ran through Frugal"
    );
    let names = [
        "output",
        "x's gradient",
        "the weight's gradient",
        "the bias's gradient",
    ];
    for ((got, want), what) in got.iter().zip(&want).zip(names) {
        assert_eq!(got.len(), want.len(), "{name}: {what}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{name}: {what}, element {i}: {g} against Burn's {w}"
            );
        }
    }
}

#[test]
fn one_kernel_a_pass_gives_burns_convolution_fused_or_not() {
    let _serial = serial();
    let _reset = Reset;
    check::<Wgpu>("fused, grouped", GROUPED);
    check::<Unfused>("unfused, grouped", GROUPED);
    check::<Wgpu>("fused, strided", STRIDED);
    check::<Unfused>("unfused, strided", STRIDED);
}
