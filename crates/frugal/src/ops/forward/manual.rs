//! Helpers of the methods written by hand beside a `forward_ops!` invocation (device moves,
//! the device of a tensor, reads into host data).

/// Forwards a `*_to_device` method: the output is charged to the target device's ledger.
macro_rules! to_device {
    ($name:ident, $ty:ident, $kind:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
            device: &burn_backend::tensor::Device<Self>,
        ) -> burn_backend::tensor::$ty<Self> {
            let target = $crate::device::DeviceState::of_device(device);
            let id = op(Op::$name);
            target.count_call(id);
            if std::ptr::eq(tensor.state(), target) {
                // To its own device the inner backends hand the same buffer back (AdamW moves
                // its moments "to" their device every step, while it still holds them): the
                // result shares the input's charge rather than counting the buffer twice. It
                // gets a cell of its own without a recipe, as a new tensor would, so that a
                // moment does not keep the history it was computed from.
                let view = tensor.is_plain_view();
                let (inner, storage) = tensor.split_view();
                let out = B::$name(inner, device);
                return if target.managing() {
                    $crate::tensor::FrugalTensor::managed_alias::<B, $crate::remat::$kind>(
                        out, storage, id,
                    )
                } else {
                    $crate::tensor::FrugalTensor::plain_view(out, storage, view)
                };
            }
            let (inner, keep) = tensor.split();
            let out = B::$name(inner, device);
            let out =
                $crate::tensor::FrugalTensor::track::<B, $crate::remat::$kind>(out, target, id);
            drop(keep);
            target.reclaim($crate::engine::Reclaim::AfterOp {
                op: Some(id),
                needed: 0,
            });
            out
        }
    };
}
pub(crate) use to_device;

/// Forwards a `*_device` method. A managed tensor answers from its cell, so asking an
/// evicted tensor for its device does not restore it.
macro_rules! device_of {
    ($name:ident, $ty:ident) => {
        fn $name(tensor: &burn_backend::tensor::$ty<Self>) -> burn_backend::tensor::Device<Self> {
            tensor.state().count_call(op(Op::$name));
            match tensor.managed_device::<burn_backend::tensor::Device<Self>>() {
                Some(device) => device,
                None => B::$name(&*tensor.prim_ref()),
            }
        }
    };
}
pub(crate) use device_of;

/// Forwards a `*_into_data` method, whose result is a future.
macro_rules! into_data {
    ($name:ident, $ty:ident) => {
        fn $name(
            tensor: burn_backend::tensor::$ty<Self>,
        ) -> impl core::future::Future<
            Output = Result<burn_backend::TensorData, burn_backend::ExecutionError>,
        > + Send {
            let state = tensor.state();
            state.count_call(op(Op::$name));
            let inner = tensor.into_inner();
            // Reading an evicted tensor restored it.
            state.reclaim($crate::engine::Reclaim::AfterOp {
                op: Some(op(Op::$name)),
                needed: 0,
            });
            B::$name(inner)
        }
    };
}
pub(crate) use into_data;
