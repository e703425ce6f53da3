//! `Frugal<B>` itself: the backend types and the `Backend` methods, each forwarded to `B`.

use std::marker::PhantomData;

use burn_backend::{
    Backend, BackendTypes, DType, DTypeUsageSet, ExecutionError, TensorData, tensor::Device,
};

use crate::ledger::Ledger;
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

crate::ops::op_family!(
    crate::ops::BACKEND_BASE;
    ad_enabled,
    memory_persistent_allocations,
    memory_cleanup,
    name,
    seed,
    sync,
    staging,
    supports_dtype,
    dtype_usage,
    device_count,
);

impl<B: Backend> Backend for Frugal<B> {
    fn ad_enabled(device: &Device<Self>) -> bool {
        Ledger::of_device(device).count_call(op(Op::ad_enabled));
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Device<Self>,
        input: Input,
        func: Func,
    ) -> Output {
        Ledger::of_device(device).count_call(op(Op::memory_persistent_allocations));
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Device<Self>) {
        Ledger::of_device(device).count_call(op(Op::memory_cleanup));
        B::memory_cleanup(device)
    }

    fn name(device: &Device<Self>) -> String {
        Ledger::of_device(device).count_call(op(Op::name));
        format!("frugal<{}>", B::name(device))
    }

    fn seed(device: &Device<Self>, seed: u64) {
        Ledger::of_device(device).count_call(op(Op::seed));
        B::seed(device, seed)
    }

    fn sync(device: &Device<Self>) -> Result<(), ExecutionError> {
        Ledger::of_device(device).count_call(op(Op::sync));
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Device<Self>)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        Ledger::of_device(device).count_call(op(Op::staging));
        B::staging(data, device)
    }

    fn supports_dtype(device: &Device<Self>, dtype: DType) -> bool {
        Ledger::of_device(device).count_call(op(Op::supports_dtype));
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Device<Self>, dtype: DType) -> DTypeUsageSet {
        Ledger::of_device(device).count_call(op(Op::dtype_usage));
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        Ledger::unattributed().count_call(op(Op::device_count));
        B::device_count(type_id)
    }
}
