//! Forwarding of Burn's `BoolTensorOps`.

use burn_backend::Backend;
use burn_backend::BoolDType;
use burn_backend::FloatDType;
use burn_backend::IntDType;
use burn_backend::Scalar;
use burn_backend::Shape;
use burn_backend::Slice;
use burn_backend::TensorData;
use burn_backend::ops::BoolTensorOps;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::bool::bool_methods!(forward_ops! {{
        crate::ops::into_data!(bool_into_data, BoolTensor);
        crate::ops::device_of!(bool_device, BoolTensor);
        crate::ops::to_device!(bool_to_device, BoolTensor, BoolKind);

        fn bool_argwhere(
            tensor: burn_backend::tensor::BoolTensor<Self>,
            out_dtype: IntDType,
        ) -> impl core::future::Future<Output = burn_backend::tensor::IntTensor<Self>> + 'static + Send {
            let state = tensor.state();
            let id = op(Op::bool_argwhere);
            state.count_call(id);
            let indices = B::bool_argwhere(tensor.into_inner(), out_dtype);
            async move {
                crate::tensor::FrugalTensor::track::<B, crate::remat::IntKind>(indices.await, state, id)
            }
        }
}});
