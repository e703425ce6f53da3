//! Forwarding of Burn's `QTensorOps`.

use burn_backend::Backend;
use burn_backend::BoolDType;
use burn_backend::FloatDType;
use burn_backend::IntDType;
use burn_backend::Scalar;
use burn_backend::Shape;
use burn_backend::Slice;
use burn_backend::TensorData;
use burn_backend::ops::QTensorOps;
use burn_backend::quantization::QuantScheme;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::qtensor::qtensor_methods!(forward_ops! {{
        crate::ops::into_data!(q_into_data, QuantizedTensor);
        crate::ops::device_of!(q_device, QuantizedTensor);
        crate::ops::to_device!(q_to_device, QuantizedTensor, QuantKind);
}});
