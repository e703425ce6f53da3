//! The CubeCL side of a layer norm: the call's shapes and the launches of
//! `frugal_kernels::layer_norm_forward` and `layer_norm_backward`, run through the generic
//! custom operation of [`super::custom`].

use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, tensor::CubeTensor};
use frugal_kernels::{FloatDtype, LayerNormShape};

use super::cube::kernel_dtype;
use super::custom::{CubeCall, contiguous, wrap};
use super::{LAYER_NORM_BACKWARDS, LAYER_NORM_FORWARDS};

/// A layer norm over the last dimension: the forward (inputs x, gamma and, with a beta, beta;
/// outputs y, mean and rstd, the statistics f32 `[rows]`) or the backward (inputs the
/// output's gradient, x, gamma, mean and rstd; outputs the gradients of x, gamma and, with a
/// beta, beta).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LayerNormCall {
    pub(crate) backward: bool,
    pub(crate) with_beta: bool,
    pub(crate) epsilon: f32,
}

impl LayerNormCall {
    /// The kernels' shape and dtype for these inputs, if they take them.
    fn plan(&self, inputs: &[(&Shape, DType)]) -> Option<(LayerNormShape, FloatDtype)> {
        let expected = match (self.backward, self.with_beta) {
            (false, with_beta) => 2 + with_beta as usize,
            (true, _) => 5,
        };
        if inputs.len() != expected {
            return None;
        }
        let (x, dtype) = inputs[self.backward as usize];
        let dims = x.as_slice();
        let width = *dims.last()?;
        let shape = LayerNormShape {
            rows: x.num_elements() / width.max(1),
            width,
        };
        let kernel = kernel_dtype(dtype)?;
        let params = if self.backward {
            &inputs[2..3]
        } else {
            &inputs[1..]
        };
        if params
            .iter()
            .any(|(s, d)| *d != dtype || s.as_slice() != [width])
        {
            return None;
        }
        if self.backward {
            let (grad, grad_dtype) = inputs[0];
            let stats_ok = inputs[3..]
                .iter()
                .all(|(s, d)| *d == DType::F32 && s.num_elements() == shape.rows);
            if grad != x || grad_dtype != dtype || !stats_ok {
                return None;
            }
        }
        (width > 0).then_some((shape, kernel))
    }
}

impl CubeCall for LayerNormCall {
    const NAME: &'static str = "frugal_layer_norm";

    fn outputs(&self, inputs: &[(&Shape, DType)]) -> Option<Vec<(Shape, DType)>> {
        let (shape, _) = self.plan(inputs)?;
        let (x, dtype) = inputs[self.backward as usize];
        let width = Shape::new([shape.width]);
        Some(if self.backward {
            let mut outputs = vec![(x.clone(), dtype), (width.clone(), dtype)];
            if self.with_beta {
                outputs.push((width, dtype));
            }
            outputs
        } else {
            let rows = Shape::new([shape.rows]);
            vec![
                (x.clone(), dtype),
                (rows.clone(), DType::F32),
                (rows, DType::F32),
            ]
        })
    }

    fn device_takes<R: CubeRuntime>(&self, device: &R::Device, inputs: &[(&Shape, DType)]) -> bool {
        let Some((_, dtype)) = self.plan(inputs) else {
            return false;
        };
        dtype.is_supported(&R::client(device))
    }

    fn launch<R: CubeRuntime>(&self, inputs: &[CubeTensor<R>]) -> Option<Vec<CubeTensor<R>>> {
        let described: Vec<(&Shape, DType)> =
            inputs.iter().map(|t| (t.meta.shape(), t.dtype)).collect();
        let (shape, dtype) = self.plan(&described)?;
        let inputs: Vec<CubeTensor<R>> = inputs.iter().map(contiguous).collect();
        let x = &inputs[self.backward as usize];
        let client = &x.client;
        let x_shape = x.meta.shape().clone();
        let width = Shape::new([shape.width]);
        if self.backward {
            let grads = frugal_kernels::layer_norm_backward(
                client,
                &inputs[0].handle,
                &x.handle,
                &inputs[2].handle,
                &inputs[3].handle,
                &inputs[4].handle,
                shape,
                dtype,
                self.with_beta,
            )
            .ok()?;
            LAYER_NORM_BACKWARDS.fetch_add(1, Relaxed);
            let mut outputs = vec![
                wrap(x, grads.input, x_shape, x.dtype),
                wrap(x, grads.gamma, width.clone(), x.dtype),
            ];
            outputs.extend(grads.beta.map(|beta| wrap(x, beta, width, x.dtype)));
            Some(outputs)
        } else {
            let out = frugal_kernels::layer_norm_forward(
                client,
                &x.handle,
                &inputs[1].handle,
                self.with_beta.then(|| &inputs[2].handle),
                shape,
                dtype,
                self.epsilon,
            )
            .ok()?;
            LAYER_NORM_FORWARDS.fetch_add(1, Relaxed);
            let rows = Shape::new([shape.rows]);
            Some(vec![
                wrap(x, out.output, x_shape, x.dtype),
                wrap(x, out.mean, rows.clone(), DType::F32),
                wrap(x, out.rstd, rows, DType::F32),
            ])
        }
    }
}
