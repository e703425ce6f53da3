//! The CubeCL side of an embedding's backward: downcasts of the primitives, the kernel's
//! launch (`frugal_kernels::embedding_grad_add` into a zeroed f32 table), and the fusion
//! custom operation (through `super::custom::register_fused`).

use std::any::Any;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::FusionTensor;
use frugal_kernels::{EmbeddingGradBuffers, FloatDtype, IdDtype};

use super::custom::register_fused;
use super::{EMBEDDING_BACKWARDS, FUSED_EMBEDDING_BACKWARDS};
use crate::runtime::each_runtime;

/// An embedding backward's operands and, once run, its output, for the runtimes to
/// downcast. `F` and `I` are the backend's float and int primitives.
pub(crate) struct EmbeddingSlot<F, I> {
    /// The table's shape `[rows, width]`.
    pub(crate) table: [usize; 2],
    pub(crate) output_grad: Option<F>,
    pub(crate) indices: Option<I>,
    pub(crate) output: Option<F>,
}

/// Runs the backward with Frugal's kernel if the primitives are CubeCL ones of a runtime this
/// build knows and the dtypes fit; `true` when done (the output is in the slot).
pub(crate) fn run<F: 'static, I: 'static>(slot: &mut EmbeddingSlot<F, I>) -> bool {
    let any = slot as &mut dyn Any;
    each_runtime!(run_on(any)).unwrap_or(false)
}

/// Whether the kernel takes these dtypes: an f32 output gradient (the table's gradient has
/// its dtype, and the kernel adds in f32) and 32- or 64-bit ids.
fn ids_dtype(output_grad: DType, indices: DType) -> Option<IdDtype> {
    if output_grad != DType::F32 {
        return None;
    }
    match indices {
        DType::I32 => Some(IdDtype::I32),
        DType::I64 => Some(IdDtype::I64),
        _ => None,
    }
}

/// `None` if the primitives are not `R`'s; else whether the kernel ran.
fn run_on<R: CubeRuntime>(any: &mut dyn Any) -> Option<bool> {
    type Fused<R> = FusionTensor<FusionCubeRuntime<R>>;
    if let Some(slot) = any.downcast_mut::<EmbeddingSlot<CubeTensor<R>, CubeTensor<R>>>() {
        let (grad, ids) = (slot.output_grad.as_ref()?, slot.indices.as_ref()?);
        ids_dtype(grad.dtype, ids.dtype)?;
        let (grad, ids) = (slot.output_grad.take()?, slot.indices.take()?);
        slot.output = Some(direct(grad, ids, slot.table));
        return Some(true);
    }
    let slot = any.downcast_mut::<EmbeddingSlot<Fused<R>, Fused<R>>>()?;
    let (grad, ids) = (slot.output_grad.as_ref()?, slot.indices.as_ref()?);
    ids_dtype(grad.dtype, ids.dtype)?;
    let (grad, ids) = (slot.output_grad.take()?, slot.indices.take()?);
    slot.output = Some(fused(grad, ids, slot.table));
    Some(true)
}

/// The table's gradient from CubeCL tensors (dtypes already checked by [`ids_dtype`]).
fn direct<R: CubeRuntime>(
    output_grad: CubeTensor<R>,
    indices: CubeTensor<R>,
    [rows, width]: [usize; 2],
) -> CubeTensor<R> {
    let ids = ids_dtype(output_grad.dtype, indices.dtype).expect("checked by the caller");
    let output_grad = burn_cubecl::kernel::into_contiguous(output_grad);
    let indices = burn_cubecl::kernel::into_contiguous(indices);
    let grad = burn_cubecl::ops::numeric::zeros_client(
        output_grad.client.clone(),
        output_grad.device.clone(),
        Shape::new([rows, width]),
        DType::F32,
    );
    let buffers = EmbeddingGradBuffers {
        out_grad: &output_grad.handle,
        out_grad_dtype: FloatDtype::F32,
        ids: &indices.handle,
        ids_dtype: ids,
        grad: &grad.handle,
        tokens: indices.meta.shape().num_elements(),
        width,
        rows,
    };
    frugal_kernels::embedding_grad_add(&grad.client, buffers)
        .expect("contiguous buffers of the shapes and dtypes checked above");
    EMBEDDING_BACKWARDS.fetch_add(1, Relaxed);
    grad
}

/// Registers the backward as one custom operation of the fusion stream.
fn fused<R: CubeRuntime>(
    output_grad: FusionTensor<FusionCubeRuntime<R>>,
    indices: FusionTensor<FusionCubeRuntime<R>>,
    table: [usize; 2],
) -> FusionTensor<FusionCubeRuntime<R>> {
    FUSED_EMBEDDING_BACKWARDS.fetch_add(1, Relaxed);
    register_fused(
        "frugal_embedding_backward",
        vec![output_grad, indices],
        vec![(Shape::new(table), DType::F32)],
        move |inputs| {
            let [output_grad, indices]: [CubeTensor<R>; 2] = inputs.try_into().expect("two inputs");
            vec![direct(output_grad, indices, table)]
        },
    )
    .into_iter()
    .next()
    .expect("one output")
}
