//! The CubeCL side of the cast: downcasts of the primitive, the kernel's launch, and the
//! fusion custom operation (through `super::custom::register_fused`).

use std::any::Any;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, FloatDType, ops::FloatTensorOps};
use burn_cubecl::{CubeBackend, CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::FusionTensor;
use frugal_kernels::FloatDtype;

use super::custom::register_fused;
use super::{CASTS, CastPurpose, FUSED_CASTS, KernelMode};
use crate::runtime::each_runtime;

/// The `frugal-kernels` dtype of a Burn dtype, if the kernels take it.
pub(crate) fn kernel_dtype(dtype: DType) -> Option<FloatDtype> {
    match dtype {
        DType::F32 => Some(FloatDtype::F32),
        DType::F16 => Some(FloatDtype::F16),
        DType::BF16 => Some(FloatDtype::BF16),
        _ => None,
    }
}

/// A CubeCL backend whose float primitive is `CubeTensor<R>` whatever its element types
/// (tensors carry their dtype), used to move tensors in and out of fusion's handles.
pub(crate) type Cube<R> = CubeBackend<R, f32, i32, u8>;

/// Casts `slot`'s tensor into `dtype` with Frugal's kernel if it is a CubeCL primitive of
/// a known runtime and `mode`/`purpose` allow; `true` when done (the output is in `slot`).
pub(crate) fn try_cast<P: Any>(
    slot: &mut Option<P>,
    dtype: DType,
    mode: KernelMode,
    purpose: CastPurpose,
) -> bool {
    let any = slot as &mut dyn Any;
    each_runtime!(try_cast_on(any, dtype, mode, purpose)).unwrap_or(false)
}

/// `None` if the primitive is not `R`'s; else whether it was cast.
fn try_cast_on<R: CubeRuntime>(
    any: &mut dyn Any,
    dtype: DType,
    mode: KernelMode,
    purpose: CastPurpose,
) -> Option<bool> {
    if let Some(slot) = any.downcast_mut::<Option<CubeTensor<R>>>() {
        let tensor = slot.as_ref().expect("a tensor to cast");
        let Some(out) = cast_direct(tensor, dtype) else {
            return Some(false);
        };
        *slot = Some(out);
        return Some(true);
    }
    let slot = any.downcast_mut::<Option<FusionTensor<FusionCubeRuntime<R>>>>()?;
    if mode == KernelMode::Auto && purpose == CastPurpose::Op {
        return Some(false);
    }
    let tensor = slot.as_ref().expect("a tensor to cast");
    if !castable(tensor.dtype, dtype) {
        return Some(false);
    }
    let tensor = slot.take().expect("checked");
    *slot = Some(cast_fused(tensor, dtype));
    Some(true)
}

/// Whether the kernels take a cast from `from` to `to` (a same-type cast is left to the
/// backend, which returns the tensor itself).
fn castable(from: DType, to: DType) -> bool {
    from != to && kernel_dtype(from).is_some() && kernel_dtype(to).is_some()
}

/// Casts a contiguous `CubeTensor` with Frugal's kernel; `None` if the kernel does not
/// apply (layout, dtypes, device support, length).
pub(crate) fn cast_direct<R: CubeRuntime>(
    tensor: &CubeTensor<R>,
    dtype: DType,
) -> Option<CubeTensor<R>> {
    let (Some(from), Some(to)) = (kernel_dtype(tensor.dtype), kernel_dtype(dtype)) else {
        return None;
    };
    if from == to || !tensor.is_contiguous() {
        return None;
    }
    let shape = tensor.meta.shape().clone();
    let len = shape.num_elements();
    let handle = frugal_kernels::cast(&tensor.client, &tensor.handle, len, from, to).ok()?;
    CASTS.fetch_add(1, Relaxed);
    Some(CubeTensor::new_contiguous(
        tensor.client.clone(),
        tensor.device.clone(),
        shape,
        handle,
        dtype,
    ))
}

/// Registers the cast as a custom operation of the fusion stream: it runs when the stream
/// is flushed, on the `CubeTensor` fusion holds by then.
fn cast_fused<R: CubeRuntime>(
    tensor: FusionTensor<FusionCubeRuntime<R>>,
    dtype: DType,
) -> FusionTensor<FusionCubeRuntime<R>> {
    let output = (tensor.shape.clone(), dtype);
    FUSED_CASTS.fetch_add(1, Relaxed);
    register_fused("frugal_cast", vec![tensor], vec![output], move |inputs| {
        let [tensor]: [CubeTensor<R>; 1] = inputs.try_into().expect("one input");
        // A strided input (fusion may hand back a view) goes through CubeCL's own cast.
        let out = cast_direct(&tensor, dtype)
            .unwrap_or_else(|| Cube::<R>::float_cast(tensor, FloatDType::from(dtype)));
        vec![out]
    })
    .into_iter()
    .next()
    .expect("one output")
}
