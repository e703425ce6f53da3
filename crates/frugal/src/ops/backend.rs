//! Forwarding of Burn's `Backend` trait itself (its methods take no tensors, so they are
//! written out; their ids come from `crate::vocabulary::catalog::backend`).

use burn_backend::{Backend, DType, DTypeUsageSet, ExecutionError, TensorData, tensor::Device};

use crate::backend::Frugal;
use crate::device::DeviceState;
use crate::vocabulary::families::backend::{Op, op};

impl<B: Backend> Backend for Frugal<B> {
    fn ad_enabled(device: &Device<Self>) -> bool {
        DeviceState::of_device(device).count_call(op(Op::ad_enabled));
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
        DeviceState::of_device(device).count_call(op(Op::memory_persistent_allocations));
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Device<Self>) {
        DeviceState::of_device(device).count_call(op(Op::memory_cleanup));
        B::memory_cleanup(device)
    }

    fn name(device: &Device<Self>) -> String {
        DeviceState::of_device(device).count_call(op(Op::name));
        format!("frugal<{}>", B::name(device))
    }

    fn seed(device: &Device<Self>, seed: u64) {
        DeviceState::of_device(device).count_call(op(Op::seed));
        B::seed(device, seed)
    }

    fn sync(device: &Device<Self>) -> Result<(), ExecutionError> {
        DeviceState::of_device(device).count_call(op(Op::sync));
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Device<Self>)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        DeviceState::of_device(device).count_call(op(Op::staging));
        B::staging(data, device)
    }

    fn supports_dtype(device: &Device<Self>, dtype: DType) -> bool {
        DeviceState::of_device(device).count_call(op(Op::supports_dtype));
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Device<Self>, dtype: DType) -> DTypeUsageSet {
        DeviceState::of_device(device).count_call(op(Op::dtype_usage));
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        DeviceState::unattributed().count_call(op(Op::device_count));
        B::device_count(type_id)
    }
}
