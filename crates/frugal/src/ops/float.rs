//! Forwarding of Burn's `FloatTensorOps`.

use burn_backend::Backend;
use burn_backend::BoolDType;
use burn_backend::Distribution;
use burn_backend::FloatDType;
use burn_backend::IntDType;
use burn_backend::Scalar;
use burn_backend::Shape;
use burn_backend::Slice;
use burn_backend::TensorData;
use burn_backend::ops::FloatTensorOps;
use burn_backend::ops::GridSampleOptions;
use burn_backend::tensor::IndexingUpdateOp;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::float::float_methods!(forward_ops! {{
        crate::ops::into_data!(float_into_data, FloatTensor);
        crate::ops::device_of!(float_device, FloatTensor);
        crate::ops::to_device!(float_to_device, FloatTensor, FloatKind);
}});
