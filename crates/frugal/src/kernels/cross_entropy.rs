//! The CubeCL side of the cross-entropy of rows of logits: the call's shapes and the launch of
//! `frugal_kernels::cross_entropy_rows`, run through the generic custom operation of
//! [`super::custom`].

use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, tensor::CubeTensor};
use frugal_kernels::{CrossEntropyShape, FloatDtype, IdDtype};

use super::CROSS_ENTROPY_ROWS;
use super::cube::kernel_dtype;
use super::custom::{CubeCall, contiguous, wrap};

/// Each row's loss (f32 `[rows]`) and, with `with_grad`, the logits' gradient (the logits'
/// shape and dtype), from inputs `[logits [rows, classes], targets [rows]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CrossEntropyCall {
    pub(crate) with_grad: bool,
}

impl CrossEntropyCall {
    /// The kernel's shape and dtypes for these inputs, if it takes them.
    fn plan(inputs: &[(&Shape, DType)]) -> Option<(CrossEntropyShape, FloatDtype, IdDtype)> {
        let [(logits, dtype), (targets, ids)] = inputs else {
            return None;
        };
        let [rows, classes] = logits.as_slice() else {
            return None;
        };
        let ids = match ids {
            DType::I32 => IdDtype::I32,
            DType::I64 => IdDtype::I64,
            _ => return None,
        };
        if targets.num_elements() != *rows || *classes == 0 {
            return None;
        }
        let shape = CrossEntropyShape {
            rows: *rows,
            classes: *classes,
        };
        Some((shape, kernel_dtype(*dtype)?, ids))
    }
}

impl CubeCall for CrossEntropyCall {
    const NAME: &'static str = "frugal_cross_entropy_rows";

    fn outputs(&self, inputs: &[(&Shape, DType)]) -> Option<Vec<(Shape, DType)>> {
        let (shape, _, _) = Self::plan(inputs)?;
        let mut outputs = vec![(Shape::new([shape.rows]), DType::F32)];
        if self.with_grad {
            outputs.push((inputs[0].0.clone(), inputs[0].1));
        }
        Some(outputs)
    }

    fn device_takes<R: CubeRuntime>(&self, device: &R::Device, inputs: &[(&Shape, DType)]) -> bool {
        let Some((shape, dtype, _)) = Self::plan(inputs) else {
            return false;
        };
        let client = R::client(device);
        let (max_x, max_y, _) = client.properties().hardware.max_cube_count;
        dtype.is_supported(&client)
            && shape.len() <= u32::MAX as usize
            && shape.rows <= max_x as usize * max_y as usize
    }

    fn launch<R: CubeRuntime>(&self, inputs: &[CubeTensor<R>]) -> Option<Vec<CubeTensor<R>>> {
        let described: Vec<(&Shape, DType)> =
            inputs.iter().map(|t| (t.meta.shape(), t.dtype)).collect();
        let (shape, dtype, ids) = Self::plan(&described)?;
        let inputs: Vec<CubeTensor<R>> = inputs.iter().map(contiguous).collect();
        let [logits, targets] = inputs.as_slice() else {
            return None;
        };
        let out = frugal_kernels::cross_entropy_rows(
            &logits.client,
            &logits.handle,
            &targets.handle,
            shape,
            dtype,
            ids,
            self.with_grad,
        )
        .ok()?;
        CROSS_ENTROPY_ROWS.fetch_add(1, Relaxed);
        let mut outputs = vec![wrap(logits, out.loss, Shape::new([shape.rows]), DType::F32)];
        outputs.extend(
            out.grad
                .map(|grad| wrap(logits, grad, logits.meta.shape().clone(), logits.dtype)),
        );
        Some(outputs)
    }
}
