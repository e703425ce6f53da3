//! Conversions between Frugal's and the inner backend's composite types (tensor primitives,
//! quantization parameters, pooling outputs), used by the forwarding macro; autocast's cast; and
//! the float primitive of `Frugal<B>` to and from a tensor, for the composite ops written with
//! Burn's tensor API.

use burn_backend::{
    Backend, DType, TensorMetadata, TensorPrimitive,
    ops::{MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward, MaxPool2dWithIndices},
    quantization::QuantizationParametersPrimitive,
};
use std::sync::Arc;

use burn_std::FloatDType;
use burn_tensor::Tensor;

use crate::backend::Frugal;
use crate::device::DeviceState;
use crate::remat::{FloatKind, IntKind, Kind, QuantKind};
use crate::tensor::{FrugalTensor, Keep};
use crate::vocabulary::OpId;

pub(crate) fn split_primitive<B: Backend>(
    tensor: TensorPrimitive<Frugal<B>>,
) -> (TensorPrimitive<B>, Keep) {
    match tensor {
        TensorPrimitive::Float(t) => {
            let (inner, keep) = t.split();
            (TensorPrimitive::Float(inner), keep)
        }
        TensorPrimitive::QFloat(t) => {
            let (inner, keep) = t.split();
            (TensorPrimitive::QFloat(inner), keep)
        }
    }
}

pub(crate) fn primitive_state<B: Backend>(
    tensor: &TensorPrimitive<Frugal<B>>,
) -> &'static DeviceState {
    match tensor {
        TensorPrimitive::Float(t) => t.state(),
        TensorPrimitive::QFloat(t) => t.state(),
    }
}

pub(crate) fn split_qparams<B: Backend>(
    qparams: QuantizationParametersPrimitive<Frugal<B>>,
) -> (QuantizationParametersPrimitive<B>, Keep) {
    let (scales, keep) = qparams.scales.split();
    (QuantizationParametersPrimitive { scales }, keep)
}

pub(crate) fn track_opt<B: Backend, K: Kind<B>>(
    tensor: Option<K::Prim>,
    state: &'static DeviceState,
    op: OpId,
) -> Option<FrugalTensor<K::Prim>> {
    tensor.map(|t| FrugalTensor::track::<B, K>(t, state, op))
}

pub(crate) fn track_primitive<B: Backend>(
    tensor: TensorPrimitive<B>,
    state: &'static DeviceState,
    op: OpId,
) -> TensorPrimitive<Frugal<B>> {
    match tensor {
        TensorPrimitive::Float(t) => {
            TensorPrimitive::Float(FrugalTensor::track::<B, FloatKind>(t, state, op))
        }
        TensorPrimitive::QFloat(t) => {
            TensorPrimitive::QFloat(FrugalTensor::track::<B, QuantKind>(t, state, op))
        }
    }
}

pub(crate) fn track_max_pool1d<B: Backend>(
    out: MaxPool1dWithIndices<B>,
    state: &'static DeviceState,
    op: OpId,
) -> MaxPool1dWithIndices<Frugal<B>> {
    MaxPool1dWithIndices::new(
        FrugalTensor::track::<B, FloatKind>(out.output, state, op),
        FrugalTensor::track::<B, IntKind>(out.indices, state, op),
    )
}

pub(crate) fn track_max_pool2d<B: Backend>(
    out: MaxPool2dWithIndices<B>,
    state: &'static DeviceState,
    op: OpId,
) -> MaxPool2dWithIndices<Frugal<B>> {
    MaxPool2dWithIndices::new(
        FrugalTensor::track::<B, FloatKind>(out.output, state, op),
        FrugalTensor::track::<B, IntKind>(out.indices, state, op),
    )
}

pub(crate) fn track_max_pool1d_backward<B: Backend>(
    out: MaxPool1dBackward<B>,
    state: &'static DeviceState,
    op: OpId,
) -> MaxPool1dBackward<Frugal<B>> {
    MaxPool1dBackward::new(FrugalTensor::track::<B, FloatKind>(out.x_grad, state, op))
}

pub(crate) fn track_max_pool2d_backward<B: Backend>(
    out: MaxPool2dBackward<B>,
    state: &'static DeviceState,
    op: OpId,
) -> MaxPool2dBackward<Frugal<B>> {
    MaxPool2dBackward::new(FrugalTensor::track::<B, FloatKind>(out.x_grad, state, op))
}

pub(crate) fn track_deform_conv2d_backward<B: Backend>(
    out: burn_backend::ops::DeformConv2dBackward<B>,
    state: &'static DeviceState,
    op: OpId,
) -> burn_backend::ops::DeformConv2dBackward<Frugal<B>> {
    burn_backend::ops::DeformConv2dBackward::new(
        FrugalTensor::track::<B, FloatKind>(out.x_grad, state, op),
        FrugalTensor::track::<B, FloatKind>(out.offset_grad, state, op),
        FrugalTensor::track::<B, FloatKind>(out.weight_grad, state, op),
        track_opt::<B, FloatKind>(out.mask_grad, state, op),
        track_opt::<B, FloatKind>(out.bias_grad, state, op),
    )
}

/// `tensor` cast to `dtype` through Frugal's own `float_cast` (charged and recorded like any
/// op), or unchanged if it already has that type. A narrowing cast of a whole buffer held
/// directly is kept with the buffer while autocast keeps casts, and found there next time
/// (see [`crate::AutocastPolicy::with_kept_casts`]).
#[inline]
pub(crate) fn cast_to<B: Backend>(
    tensor: burn_backend::tensor::FloatTensor<Frugal<B>>,
    dtype: DType,
) -> burn_backend::tensor::FloatTensor<Frugal<B>> {
    let from = tensor.dtype();
    if from == dtype {
        return tensor;
    }
    let keeper = (dtype.size() < from.size())
        .then(|| tensor.whole_plain_storage())
        .flatten()
        .filter(|storage| storage.state.autocast.keeps_casts())
        .cloned();
    if let Some(storage) = &keeper
        && let Some(cast) = storage.kept_cast::<FrugalTensor<B::FloatTensorPrimitive>>(dtype)
    {
        storage.state.autocast.note_kept_cast_reused();
        return cast;
    }
    let cast = <Frugal<B> as burn_backend::ops::FloatTensorOps<Frugal<B>>>::float_cast(
        tensor,
        FloatDType::from(dtype),
    );
    // Only a buffer someone else still holds may be read again.
    if let Some(storage) = keeper
        && Arc::strong_count(&storage) > 1
        && cast.whole_plain_storage().is_some()
    {
        storage.keep_cast(dtype, cast.clone());
    }
    cast
}

/// A float primitive of `Frugal<B>` as a tensor of rank `D`.
pub(crate) fn frugal_tensor<B: Backend, const D: usize>(
    p: burn_backend::tensor::FloatTensor<Frugal<B>>,
) -> Tensor<Frugal<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// A tensor's float primitive of `Frugal<B>`.
pub(crate) fn frugal_primitive<B: Backend, const D: usize>(
    t: Tensor<Frugal<B>, D>,
) -> burn_backend::tensor::FloatTensor<Frugal<B>> {
    t.into_primitive().tensor()
}
