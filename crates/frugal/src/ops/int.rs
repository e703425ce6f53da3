//! Forwarding of Burn's `IntTensorOps`.

use burn_backend::Backend;
use burn_backend::BoolDType;
use burn_backend::Distribution;
use burn_backend::FloatDType;
use burn_backend::IntDType;
use burn_backend::Scalar;
use burn_backend::Shape;
use burn_backend::Slice;
use burn_backend::TensorData;
use burn_backend::ops::IntTensorOps;
use burn_backend::tensor::IndexingUpdateOp;
use core::ops::Range;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::int::int_methods!(forward_ops! {{
        crate::ops::into_data!(int_into_data, IntTensor);
        crate::ops::device_of!(int_device, IntTensor);
        crate::ops::to_device!(int_to_device, IntTensor, IntKind);
}});
