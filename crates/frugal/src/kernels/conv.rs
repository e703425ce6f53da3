//! The CubeCL side of a 2D convolution under [`super::ConvAlgorithm::OneKernel`]: the passes'
//! shapes and their launches through burn-cubecl's own convolution kernels with a fixed
//! strategy (implicit GEMM where it takes the problem, else the direct kernel), run through
//! the generic custom operation of [`super::custom`]. A strided pass's data gradient is the
//! unit-stride pass's on the output gradient spread out with zeros, so it too takes one GEMM
//! kernel (and one slice assignment) instead of burn-cubecl's autotuned transposed convolution.
//!
//! Burn's default strategy autotunes every pass of every new shape: it compiles and times
//! each of 8 forward, 6 data-gradient and 7 weight-gradient candidates, most of them
//! tensor-core matrix kernels that take NVRTC about half a second each, one after another. A
//! fixed strategy compiles one kernel per pass and shape.

use std::sync::atomic::Ordering::Relaxed;

use burn_backend::ops::ConvOptions;
use burn_backend::ops::FloatTensorOps;
use burn_backend::ops::conv::calculate_conv_output_size;
use burn_backend::{DType, Shape, Slice};
use burn_cubecl::kernel::conv::{
    ConvStrategy, conv_data_backward, conv_forward, conv_weight_backward,
};
use burn_cubecl::{CubeRuntime, tensor::CubeTensor};

use super::cube::{Cube, kernel_dtype};
use super::custom::CubeCall;
use super::{CONV_FALLBACKS, CONV_PASSES};

/// Which pass of a convolution, with what it needs beyond its inputs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ConvPass {
    /// `conv2d`: inputs x, the weight and, with a bias, the bias; output the convolution.
    Forward,
    /// `conv2d_x_backward`: inputs the output's gradient and the weight; output x's gradient,
    /// of x's shape.
    Data {
        /// The shape of x.
        x_shape: Shape,
    },
    /// `conv2d_weight_backward`: inputs x and the output's gradient; output the weight's
    /// gradient.
    Weight {
        /// The shape of the weight.
        weight_shape: Shape,
    },
}

/// One pass of a 2D convolution (NCHW, as Burn's `ModuleOps` takes it).
#[derive(Clone, Debug)]
pub(crate) struct ConvCall {
    pub(crate) pass: ConvPass,
    pub(crate) options: ConvOptions<2>,
}

impl ConvCall {
    /// The output's shape, if the inputs are what the pass takes: rank-4 tensors (and a
    /// rank-1 bias) of one float dtype whose channels agree with the weight's.
    fn output_shape(&self, inputs: &[(&Shape, DType)]) -> Option<Shape> {
        let dtype = inputs.first()?.1;
        if !dtype.is_float() || inputs.iter().any(|(_, d)| *d != dtype) {
            return None;
        }
        let rank_4 = |count: usize| inputs.iter().take(count).all(|(s, _)| s.num_dims() == 4);
        match &self.pass {
            ConvPass::Forward => {
                if !(2..=3).contains(&inputs.len()) || !rank_4(2) {
                    return None;
                }
                let (x, weight) = (inputs[0].0, inputs[1].0);
                if let Some((bias, _)) = inputs.get(2)
                    && bias.as_slice() != [weight[0]]
                {
                    return None;
                }
                let groups = self.options.groups;
                if groups == 0 || x[1] != weight[1] * groups || weight[0] % groups != 0 {
                    return None;
                }
                let mut out = [x[0], weight[0], 0, 0];
                for axis in 0..2 {
                    let reach = self.options.dilation[axis] * weight[2 + axis].checked_sub(1)? + 1;
                    if x[2 + axis] + 2 * self.options.padding[axis] < reach
                        || self.options.stride[axis] == 0
                    {
                        return None;
                    }
                    out[2 + axis] = calculate_conv_output_size(
                        weight[2 + axis],
                        self.options.stride[axis],
                        self.options.padding[axis],
                        self.options.dilation[axis],
                        x[2 + axis],
                    );
                }
                Some(Shape::new(out))
            }
            ConvPass::Data { x_shape: shape }
            | ConvPass::Weight {
                weight_shape: shape,
            } => (inputs.len() == 2 && rank_4(2) && shape.num_dims() == 4).then(|| shape.clone()),
        }
    }
}

impl CubeCall for ConvCall {
    const NAME: &'static str = "frugal_conv2d";

    fn outputs(&self, inputs: &[(&Shape, DType)]) -> Option<Vec<(Shape, DType)>> {
        let shape = self.output_shape(inputs)?;
        Some(vec![(shape, inputs[0].1)])
    }

    fn device_takes<R: CubeRuntime>(&self, device: &R::Device, inputs: &[(&Shape, DType)]) -> bool {
        self.output_shape(inputs).is_some()
            && kernel_dtype(inputs[0].1).is_some_and(|dtype| dtype.is_supported(&R::client(device)))
    }

    fn launch<R: CubeRuntime>(&self, inputs: &[CubeTensor<R>]) -> Option<Vec<CubeTensor<R>>> {
        // The implicit GEMM refuses problems its tiles do not take (and devices without
        // tensor cores) before it launches anything; the direct kernel takes every problem.
        let run = |strategy: ConvStrategy| {
            let options = self.options.clone();
            match &self.pass {
                ConvPass::Forward => conv_forward::<R, 2>(
                    inputs[0].clone(),
                    inputs[1].clone(),
                    inputs.get(2).cloned(),
                    options,
                    strategy,
                ),
                ConvPass::Data { x_shape } => {
                    // burn-cubecl's implicit GEMM takes only unit strides and hands others to
                    // its transposed convolution, whose autotune times two kernels and, for
                    // its im2col candidate, every matrix product kernel (about twenty, each
                    // compiled first); the gradient spread out on the unit-stride grid gives
                    // the same result from one GEMM kernel. The direct kernel takes strides
                    // as they are, so its fallback gets the gradient unspread.
                    let spread = matches!(strategy, ConvStrategy::ImplicitGemm)
                        .then(|| spread_for_unit_stride(&inputs[0], &inputs[1], x_shape, &options))
                        .flatten();
                    let (output_grad, options) =
                        spread.unwrap_or_else(|| (inputs[0].clone(), options));
                    conv_data_backward::<R, 2>(
                        output_grad,
                        inputs[1].clone(),
                        x_shape.clone(),
                        options,
                        strategy,
                    )
                }
                ConvPass::Weight { weight_shape } => conv_weight_backward::<R, 2>(
                    inputs[0].clone(),
                    inputs[1].clone(),
                    weight_shape.clone(),
                    options,
                    strategy,
                ),
            }
        };
        let out = match run(ConvStrategy::ImplicitGemm) {
            Ok(out) => out,
            Err(_) => {
                CONV_FALLBACKS.fetch_add(1, Relaxed);
                run(ConvStrategy::Direct).ok()?
            }
        };
        CONV_PASSES.fetch_add(1, Relaxed);
        Some(vec![out])
    }
}

/// For a strided, ungrouped convolution, the output's gradient spread onto the grid of the
/// same convolution at stride 1 (each value at `stride × index`, zeros between and after), and
/// that convolution's options: its data gradient is the strided one's, since every output
/// position of the strided convolution is the stride-1 convolution's at `stride × index`, and
/// the others have zero gradient. `None` for unit strides or groups (nothing to gain: unit
/// strides already take one kernel; grouped passes go to burn-cubecl's fallback either way).
fn spread_for_unit_stride<R: CubeRuntime>(
    output_grad: &CubeTensor<R>,
    weight: &CubeTensor<R>,
    x_shape: &Shape,
    options: &ConvOptions<2>,
) -> Option<(CubeTensor<R>, ConvOptions<2>)> {
    if options.groups != 1 || options.stride.iter().all(|&s| s == 1) {
        return None;
    }
    let grad_shape = output_grad.meta.shape();
    let weight_shape = weight.meta.shape();
    let mut spread_shape = [grad_shape[0], grad_shape[1], 0, 0];
    let mut slices = vec![Slice::full(), Slice::full()];
    for axis in 0..2 {
        let (stride, rows) = (options.stride[axis], grad_shape[2 + axis]);
        let reach = options.dilation[axis] * weight_shape[2 + axis].checked_sub(1)?;
        let unit_rows = (x_shape[2 + axis] + 2 * options.padding[axis]).checked_sub(reach)?;
        let last = stride * rows.checked_sub(1)?;
        if last >= unit_rows {
            return None;
        }
        spread_shape[2 + axis] = unit_rows;
        slices.push(Slice::new(0, Some(last as isize + 1), stride as isize));
    }
    let spread = burn_cubecl::ops::numeric::zeros_client(
        output_grad.client.clone(),
        output_grad.device.clone(),
        Shape::new(spread_shape),
        output_grad.dtype,
    );
    let spread = <Cube<R> as FloatTensorOps<Cube<R>>>::float_slice_assign(
        spread,
        &slices,
        output_grad.clone(),
    );
    let unit = ConvOptions::new([1, 1], options.padding, options.dilation, 1);
    Some((spread, unit))
}
