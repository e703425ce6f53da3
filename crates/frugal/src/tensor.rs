//! The tensor primitive of [`Frugal`](crate::Frugal): the inner backend's primitive plus a
//! shared record of the storage it occupies.

use std::sync::Arc;

use burn_backend::quantization::{QuantStore, QuantValue};
use burn_backend::{
    Backend, DType, QTensorPrimitive, Shape, TensorMetadata, TensorPrimitive,
    ops::{MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward, MaxPool2dWithIndices},
    quantization::QuantizationParametersPrimitive,
};

use crate::Frugal;
use crate::ledger::Ledger;
use crate::ops::OpId;

/// One device buffer as the ledger sees it. Views of a tensor share its record through the
/// `Arc`, so a buffer is counted once however many tensors point into it; the bytes leave the
/// ledger when the last of them is dropped.
pub(crate) struct Storage {
    pub(crate) ledger: &'static Ledger,
    pub(crate) bytes: u64,
    pub(crate) op: OpId,
    pub(crate) seq: u64,
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.ledger.release(self);
    }
}

/// A tensor of [`Frugal<B>`](crate::Frugal): the inner backend's primitive and the ledger record
/// of the storage behind it.
#[derive(Clone)]
pub struct FrugalTensor<P> {
    pub(crate) inner: P,
    pub(crate) storage: Arc<Storage>,
}

impl<P: TensorMetadata> FrugalTensor<P> {
    /// Wraps a freshly produced inner tensor, charging its bytes to `op` on `ledger`.
    #[inline]
    pub(crate) fn track(inner: P, ledger: &'static Ledger, op: OpId) -> Self {
        let storage = ledger.charge(&inner, op);
        Self {
            inner,
            storage: Arc::new(storage),
        }
    }
}

impl<P> FrugalTensor<P> {
    /// The inner backend's tensor, with the ledger record dropped.
    pub fn into_inner(self) -> P {
        self.inner
    }

    /// The inner backend's tensor, by reference.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Bytes of the storage this tensor points into (shared with its views).
    pub fn storage_bytes(&self) -> u64 {
        self.storage.bytes
    }

    /// Whether two tensors share one storage record (one is a view of the other).
    pub fn shares_storage_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    #[inline]
    pub(crate) fn ledger(&self) -> &'static Ledger {
        self.storage.ledger
    }
}

impl<P: std::fmt::Debug> std::fmt::Debug for FrugalTensor<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrugalTensor")
            .field("inner", &self.inner)
            .field("storage_bytes", &self.storage.bytes)
            .finish()
    }
}

impl<P: TensorMetadata> TensorMetadata for FrugalTensor<P> {
    fn dtype(&self) -> DType {
        self.inner.dtype()
    }

    fn shape(&self) -> Shape {
        self.inner.shape()
    }

    fn rank(&self) -> usize {
        self.inner.rank()
    }
}

impl<P: QTensorPrimitive> QTensorPrimitive for FrugalTensor<P> {
    fn scheme(&self) -> &burn_backend::quantization::QuantScheme {
        self.inner.scheme()
    }

    fn acc_precision(&self) -> burn_std::quantization::QuantAcc {
        self.inner.acc_precision()
    }

    fn propagation(&self) -> burn_std::quantization::QuantPropagation {
        self.inner.propagation()
    }

    fn default_scheme() -> burn_backend::quantization::QuantScheme {
        P::default_scheme()
    }
}

/// Bytes a tensor of this shape and dtype occupies on the device, without allocator padding.
pub(crate) fn tensor_bytes(shape: &Shape, dtype: DType) -> u64 {
    let elements = shape.num_elements() as u64;
    match dtype {
        DType::QFloat(scheme) => {
            // Sub-byte quantized values report a size of 0; count their packed bits instead.
            let bits = match (scheme.store, scheme.value) {
                (_, QuantValue::Q8F | QuantValue::Q8S) => 8,
                (_, QuantValue::E4M3 | QuantValue::E5M2) => 8,
                (QuantStore::Native, QuantValue::E2M1) => 8,
                (_, QuantValue::E2M1 | QuantValue::Q4F | QuantValue::Q4S) => 4,
                (_, QuantValue::Q2F | QuantValue::Q2S) => 2,
            };
            (elements * bits).div_ceil(8)
        }
        other => elements * other.size() as u64,
    }
}

// Conversions used by the forwarding macro. Each `split_*` hands the inner value to the inner
// backend and keeps the storage records alive until the op's outputs are charged, so the
// ledger's peak includes inputs and outputs together, as the device's does.

pub(crate) fn split_vec<P>(tensors: Vec<FrugalTensor<P>>) -> (Vec<P>, Vec<Arc<Storage>>) {
    tensors.into_iter().map(|t| (t.inner, t.storage)).unzip()
}

pub(crate) fn split_opt<P>(tensor: Option<FrugalTensor<P>>) -> (Option<P>, Option<Arc<Storage>>) {
    match tensor {
        Some(t) => (Some(t.inner), Some(t.storage)),
        None => (None, None),
    }
}

pub(crate) fn split_primitive<B: Backend>(
    tensor: TensorPrimitive<Frugal<B>>,
) -> (TensorPrimitive<B>, Arc<Storage>) {
    match tensor {
        TensorPrimitive::Float(t) => (TensorPrimitive::Float(t.inner), t.storage),
        TensorPrimitive::QFloat(t) => (TensorPrimitive::QFloat(t.inner), t.storage),
    }
}

pub(crate) fn primitive_ledger<B: Backend>(tensor: &TensorPrimitive<Frugal<B>>) -> &'static Ledger {
    match tensor {
        TensorPrimitive::Float(t) => t.ledger(),
        TensorPrimitive::QFloat(t) => t.ledger(),
    }
}

pub(crate) fn split_qparams<B: Backend>(
    qparams: QuantizationParametersPrimitive<Frugal<B>>,
) -> (QuantizationParametersPrimitive<B>, Arc<Storage>) {
    (
        QuantizationParametersPrimitive {
            scales: qparams.scales.inner,
        },
        qparams.scales.storage,
    )
}

pub(crate) fn track_opt<P: TensorMetadata>(
    tensor: Option<P>,
    ledger: &'static Ledger,
    op: OpId,
) -> Option<FrugalTensor<P>> {
    tensor.map(|t| FrugalTensor::track(t, ledger, op))
}

pub(crate) fn track_primitive<B: Backend>(
    tensor: TensorPrimitive<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> TensorPrimitive<Frugal<B>> {
    match tensor {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(FrugalTensor::track(t, ledger, op)),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(FrugalTensor::track(t, ledger, op)),
    }
}

pub(crate) fn track_max_pool1d<B: Backend>(
    out: MaxPool1dWithIndices<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> MaxPool1dWithIndices<Frugal<B>> {
    MaxPool1dWithIndices::new(
        FrugalTensor::track(out.output, ledger, op),
        FrugalTensor::track(out.indices, ledger, op),
    )
}

pub(crate) fn track_max_pool2d<B: Backend>(
    out: MaxPool2dWithIndices<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> MaxPool2dWithIndices<Frugal<B>> {
    MaxPool2dWithIndices::new(
        FrugalTensor::track(out.output, ledger, op),
        FrugalTensor::track(out.indices, ledger, op),
    )
}

pub(crate) fn track_max_pool1d_backward<B: Backend>(
    out: MaxPool1dBackward<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> MaxPool1dBackward<Frugal<B>> {
    MaxPool1dBackward::new(FrugalTensor::track(out.x_grad, ledger, op))
}

pub(crate) fn track_max_pool2d_backward<B: Backend>(
    out: MaxPool2dBackward<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> MaxPool2dBackward<Frugal<B>> {
    MaxPool2dBackward::new(FrugalTensor::track(out.x_grad, ledger, op))
}

pub(crate) fn track_deform_conv2d_backward<B: Backend>(
    out: burn_backend::ops::DeformConv2dBackward<B>,
    ledger: &'static Ledger,
    op: OpId,
) -> burn_backend::ops::DeformConv2dBackward<Frugal<B>> {
    burn_backend::ops::DeformConv2dBackward::new(
        FrugalTensor::track(out.x_grad, ledger, op),
        FrugalTensor::track(out.offset_grad, ledger, op),
        FrugalTensor::track(out.weight_grad, ledger, op),
        track_opt(out.mask_grad, ledger, op),
        track_opt(out.bias_grad, ledger, op),
    )
}
