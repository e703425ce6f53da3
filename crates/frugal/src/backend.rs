//! Layer 7, the backend type: `Frugal<B>` and its tensor types. Its `Backend` methods and
//! op traits are in `crate::ops`. Imports: `tensor`.

use std::marker::PhantomData;

use burn_backend::{Backend, BackendTypes};

use crate::tensor::FrugalTensor;

/// A Burn backend that runs every op on `B` and keeps an exact ledger of the memory its tensors
/// hold. Swap `Autodiff<B>` for `Autodiff<Frugal<B>>`; read the figures with
/// [`crate::memory`].
#[derive(Clone, Copy, Default, Debug)]
pub struct Frugal<B> {
    _inner: PhantomData<B>,
}

impl<B: Backend> BackendTypes for Frugal<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = FrugalTensor<B::FloatTensorPrimitive>;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = FrugalTensor<B::IntTensorPrimitive>;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = FrugalTensor<B::BoolTensorPrimitive>;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = FrugalTensor<B::QuantizedTensorPrimitive>;
}
