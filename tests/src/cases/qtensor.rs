//! Differential cases for Burn's `QTensorOps` (see `cases/mod.rs`).

#[allow(unused_imports)]
use crate::*;
#[allow(unused_imports)]
use burn::tensor::backend::Backend;
use burn::tensor::ops::QuantizedTensor;
use burn::tensor::quantization::{QTensorPrimitive, QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{Scalar, Slice, TensorData, TensorPrimitive};

/// The backend's default quantization scheme.
fn scheme<B: Backend>() -> QuantScheme {
    <B::QuantizedTensorPrimitive as QTensorPrimitive>::default_scheme()
}

/// A quantized tensor with values in [0.1, 2), for ops defined on positive numbers.
fn qpositive<B: Backend>(dims: &[usize], seed: u64, device: &B::Device) -> QuantizedTensor<B> {
    B::quantize_dynamic(positive::<B>(dims, seed, device), &scheme::<B>())
}

/// Reads a `TensorPrimitive`, whichever variant it is (the variant shows in the dtype).
fn rtp<B: Backend>(t: TensorPrimitive<B>) -> Out {
    match t {
        TensorPrimitive::Float(t) => rf::<B>(t),
        TensorPrimitive::QFloat(t) => rq::<B>(t),
    }
}

/// Reads a quantized tensor's data, for feeding it back.
fn qdata<B: Backend>(t: QuantizedTensor<B>) -> TensorData {
    burn::tensor::read_sync(B::q_into_data(t)).expect("quantized read")
}

crate::cases! {
    q_into_data(device) {
        let data = qdata::<B>(quantized::<B>(&[3, 4], 11, device));
        vec![Out::data(data)]
    }
    q_to_device(device) {
        let moved = B::q_to_device(quantized::<B>(&[2, 5], 12, device), device);
        vec![Out::device(B::q_device(&moved)), rq::<B>(moved)]
    }
    q_from_data(device) {
        let data = qdata::<B>(quantized::<B>(&[4, 3], 13, device));
        let tensor = B::q_from_data(data, device);
        vec![Out::device(B::q_device(&tensor)), rq::<B>(tensor)]
    }
    quantize(device) {
        let scheme = scheme::<B>();
        let scales = B::float_from_data(TensorData::new(vec![0.0125f32], vec![1]), device);
        let qparams = QuantizationParametersPrimitive::<B> { scales };
        let tensor = B::quantize(float::<B>(&[3, 4], 14, device), &scheme, qparams);
        vec![rq::<B>(tensor)]
    }
    quantize_dynamic(device) {
        let tensor = B::quantize_dynamic(float::<B>(&[4, 4], 15, device), &scheme::<B>());
        vec![rq::<B>(tensor)]
    }
    dequantize(device) {
        let out = B::dequantize(quantized::<B>(&[3, 5], 16, device), float_dtype::<B>(device));
        vec![rf::<B>(out)]
    }
    q_device(device) {
        let tensor = quantized::<B>(&[2, 2], 17, device);
        vec![Out::device(B::q_device(&tensor))]
    }
    q_is_require_grad(device) {
        let tensor = quantized::<B>(&[2, 2], 18, device);
        vec![Out::value(B::q_is_require_grad(&tensor))]
    }
    q_flip(device) {
        let out = B::q_flip(quantized::<B>(&[2, 3, 4], 19, device), &[0, 2]);
        vec![rq::<B>(out)]
    }
    q_select(device) {
        let indices = int::<B>(&[5], 0, 4, 20, device);
        let out = B::q_select(quantized::<B>(&[3, 4], 21, device), 1, indices);
        vec![rq::<B>(out)]
    }
    q_gather(device) {
        let indices = int::<B>(&[3, 6], 0, 4, 22, device);
        let out = B::q_gather(1, quantized::<B>(&[3, 4], 23, device), indices);
        vec![rq::<B>(out)]
    }
    q_repeat_dim(device) {
        let out = B::q_repeat_dim(quantized::<B>(&[2, 3], 24, device), 0, 3);
        vec![rq::<B>(out)]
    }
    q_add(device) {
        let out = B::q_add(quantized::<B>(&[3, 4], 25, device), quantized::<B>(&[3, 4], 26, device));
        vec![rtp::<B>(out)]
    }
    q_add_scalar(device) {
        let out = B::q_add_scalar(quantized::<B>(&[3, 4], 27, device), Scalar::from(0.75f32));
        vec![rtp::<B>(out)]
    }
    q_clamp_min(device) {
        let out = B::q_clamp_min(quantized::<B>(&[3, 4], 28, device), Scalar::from(-0.5f32));
        vec![rtp::<B>(out)]
    }
    q_clamp_max(device) {
        let out = B::q_clamp_max(quantized::<B>(&[3, 4], 29, device), Scalar::from(0.5f32));
        vec![rtp::<B>(out)]
    }
    q_clamp(device) {
        let out = B::q_clamp(
            quantized::<B>(&[3, 4], 30, device),
            Scalar::from(-0.8f32),
            Scalar::from(1.1f32),
        );
        vec![rtp::<B>(out)]
    }
    q_sub(device) {
        let out = B::q_sub(quantized::<B>(&[3, 4], 31, device), quantized::<B>(&[3, 4], 32, device));
        vec![rtp::<B>(out)]
    }
    q_sub_scalar(device) {
        let out = B::q_sub_scalar(quantized::<B>(&[3, 4], 33, device), Scalar::from(1.25f32));
        vec![rtp::<B>(out)]
    }
    q_mul(device) {
        let out = B::q_mul(quantized::<B>(&[3, 4], 34, device), quantized::<B>(&[3, 4], 35, device));
        vec![rtp::<B>(out)]
    }
    q_mul_scalar(device) {
        let out = B::q_mul_scalar(quantized::<B>(&[3, 4], 36, device), Scalar::from(-1.5f32));
        vec![rtp::<B>(out)]
    }
    q_div(device) {
        let out = B::q_div(quantized::<B>(&[3, 4], 37, device), qpositive::<B>(&[3, 4], 38, device));
        vec![rtp::<B>(out)]
    }
    q_div_scalar(device) {
        let out = B::q_div_scalar(quantized::<B>(&[3, 4], 39, device), Scalar::from(0.3f32));
        vec![rtp::<B>(out)]
    }
    q_matmul(device) {
        let both = B::q_matmul(
            TensorPrimitive::QFloat(quantized::<B>(&[3, 4], 40, device)),
            TensorPrimitive::QFloat(quantized::<B>(&[4, 2], 41, device)),
        );
        let mixed = B::q_matmul(
            TensorPrimitive::Float(float::<B>(&[2, 3], 42, device)),
            TensorPrimitive::QFloat(quantized::<B>(&[3, 5], 43, device)),
        );
        vec![rtp::<B>(both), rtp::<B>(mixed)]
    }
    q_neg(device) {
        vec![rtp::<B>(B::q_neg(quantized::<B>(&[3, 4], 44, device)))]
    }
    q_recip(device) {
        vec![rtp::<B>(B::q_recip(qpositive::<B>(&[3, 4], 45, device)))]
    }
    q_sum(device) {
        vec![rtp::<B>(B::q_sum(quantized::<B>(&[3, 4], 46, device)))]
    }
    q_sum_dim(device) {
        vec![rtp::<B>(B::q_sum_dim(quantized::<B>(&[3, 4], 47, device), 1))]
    }
    q_prod(device) {
        vec![rtp::<B>(B::q_prod(quantized::<B>(&[2, 3], 48, device)))]
    }
    q_prod_dim(device) {
        vec![rtp::<B>(B::q_prod_dim(quantized::<B>(&[3, 4], 49, device), 0))]
    }
    q_mean(device) {
        vec![rtp::<B>(B::q_mean(quantized::<B>(&[3, 4], 50, device)))]
    }
    q_mean_dim(device) {
        vec![rtp::<B>(B::q_mean_dim(quantized::<B>(&[3, 4], 51, device), 1))]
    }
    q_cumsum(device) {
        vec![rtp::<B>(B::q_cumsum(quantized::<B>(&[3, 4], 52, device), 1))]
    }
    q_cumprod(device) {
        vec![rtp::<B>(B::q_cumprod(quantized::<B>(&[3, 4], 53, device), 0))]
    }
    q_cummin(device) {
        vec![rtp::<B>(B::q_cummin(quantized::<B>(&[3, 4], 54, device), 1))]
    }
    q_cummax(device) {
        vec![rtp::<B>(B::q_cummax(quantized::<B>(&[3, 4], 55, device), 0))]
    }
    q_exp(device) {
        vec![rtp::<B>(B::q_exp(quantized::<B>(&[3, 4], 56, device)))]
    }
    q_log(device) {
        vec![rtp::<B>(B::q_log(qpositive::<B>(&[3, 4], 57, device)))]
    }
    q_log1p(device) {
        vec![rtp::<B>(B::q_log1p(qpositive::<B>(&[3, 4], 58, device)))]
    }
    q_powf(device) {
        let out = B::q_powf(qpositive::<B>(&[3, 4], 59, device), quantized::<B>(&[3, 4], 60, device));
        vec![rtp::<B>(out)]
    }
    q_powi(device) {
        let exponents = int::<B>(&[3, 4], 0, 4, 61, device);
        let out = B::q_powi(quantized::<B>(&[3, 4], 62, device), exponents);
        vec![rtp::<B>(out)]
    }
    q_powi_scalar(device) {
        let out = B::q_powi_scalar(quantized::<B>(&[3, 4], 63, device), Scalar::from(3i64));
        vec![rtp::<B>(out)]
    }
    q_powf_scalar(device) {
        let out = B::q_powf_scalar(qpositive::<B>(&[3, 4], 64, device), Scalar::from(1.5f32));
        vec![rtp::<B>(out)]
    }
    q_sqrt(device) {
        vec![rtp::<B>(B::q_sqrt(qpositive::<B>(&[3, 4], 65, device)))]
    }
    q_abs(device) {
        vec![rq::<B>(B::q_abs(quantized::<B>(&[3, 4], 66, device)))]
    }
    q_cos(device) {
        vec![rtp::<B>(B::q_cos(quantized::<B>(&[3, 4], 67, device)))]
    }
    q_sin(device) {
        vec![rtp::<B>(B::q_sin(quantized::<B>(&[3, 4], 68, device)))]
    }
    q_tan(device) {
        vec![rtp::<B>(B::q_tan(quantized::<B>(&[3, 4], 69, device)))]
    }
    q_cosh(device) {
        vec![rtp::<B>(B::q_cosh(quantized::<B>(&[3, 4], 70, device)))]
    }
    q_sinh(device) {
        vec![rtp::<B>(B::q_sinh(quantized::<B>(&[3, 4], 71, device)))]
    }
    q_tanh(device) {
        vec![rtp::<B>(B::q_tanh(quantized::<B>(&[3, 4], 72, device)))]
    }
    q_erf(device) {
        vec![rtp::<B>(B::q_erf(quantized::<B>(&[3, 4], 73, device)))]
    }
    q_cat(device) {
        let tensors = vec![
            quantized::<B>(&[2, 3], 74, device),
            quantized::<B>(&[1, 3], 75, device),
            quantized::<B>(&[3, 3], 76, device),
        ];
        vec![rq::<B>(B::q_cat(tensors, 0))]
    }
    q_argmax(device) {
        let out = B::q_argmax(quantized::<B>(&[3, 5], 77, device), 1, int_dtype::<B>(device));
        vec![ri::<B>(out)]
    }
    q_argtopk(device) {
        let out = B::q_argtopk(quantized::<B>(&[3, 6], 78, device), 1, 3, int_dtype::<B>(device));
        vec![ri::<B>(out)]
    }
    q_topk(device) {
        let out = B::q_topk(quantized::<B>(&[4, 5], 79, device), 0, 2);
        vec![rq::<B>(out)]
    }
    q_argmin(device) {
        let out = B::q_argmin(quantized::<B>(&[4, 3], 80, device), 0, int_dtype::<B>(device));
        vec![ri::<B>(out)]
    }
    q_max(device) {
        vec![rq::<B>(B::q_max(quantized::<B>(&[3, 4], 81, device)))]
    }
    q_max_dim(device) {
        vec![rq::<B>(B::q_max_dim(quantized::<B>(&[3, 4], 82, device), 1))]
    }
    q_max_dim_with_indices(device) {
        let (values, indices) =
            B::q_max_dim_with_indices(quantized::<B>(&[3, 4], 83, device), 0, int_dtype::<B>(device));
        vec![rq::<B>(values), ri::<B>(indices)]
    }
    q_min(device) {
        vec![rq::<B>(B::q_min(quantized::<B>(&[3, 4], 84, device)))]
    }
    q_min_dim(device) {
        vec![rq::<B>(B::q_min_dim(quantized::<B>(&[3, 4], 85, device), 0))]
    }
    q_min_dim_with_indices(device) {
        let (values, indices) =
            B::q_min_dim_with_indices(quantized::<B>(&[3, 4], 86, device), 1, int_dtype::<B>(device));
        vec![rq::<B>(values), ri::<B>(indices)]
    }
    q_max_abs(device) {
        vec![rq::<B>(B::q_max_abs(quantized::<B>(&[3, 4], 87, device)))]
    }
    q_max_abs_dim(device) {
        vec![rq::<B>(B::q_max_abs_dim(quantized::<B>(&[3, 4], 88, device), 1))]
    }
    q_any(device) {
        let out = B::q_any(quantized::<B>(&[3, 4], 89, device), bool_dtype::<B>(device));
        vec![rb::<B>(out)]
    }
    q_any_dim(device) {
        let out = B::q_any_dim(quantized::<B>(&[3, 4], 90, device), 1, bool_dtype::<B>(device));
        vec![rb::<B>(out)]
    }
    q_all(device) {
        let out = B::q_all(quantized::<B>(&[3, 4], 91, device), bool_dtype::<B>(device));
        vec![rb::<B>(out)]
    }
    q_all_dim(device) {
        let out = B::q_all_dim(quantized::<B>(&[3, 4], 92, device), 0, bool_dtype::<B>(device));
        vec![rb::<B>(out)]
    }
    q_sort(device) {
        let ascending = B::q_sort(quantized::<B>(&[3, 5], 93, device), 1, false);
        let descending = B::q_sort(quantized::<B>(&[3, 5], 94, device), 0, true);
        vec![rq::<B>(ascending), rq::<B>(descending)]
    }
    q_sort_with_indices(device) {
        let (values, indices) = B::q_sort_with_indices(
            quantized::<B>(&[3, 5], 95, device),
            1,
            true,
            int_dtype::<B>(device),
        );
        vec![rq::<B>(values), ri::<B>(indices)]
    }
    q_argsort(device) {
        let out = B::q_argsort(quantized::<B>(&[4, 3], 96, device), 0, false, int_dtype::<B>(device));
        vec![ri::<B>(out)]
    }
    q_reshape(device) {
        let out = B::q_reshape(quantized::<B>(&[3, 4], 97, device), shape(&[2, 6]));
        vec![rq::<B>(out)]
    }
    q_detach(device) {
        vec![rq::<B>(B::q_detach(quantized::<B>(&[3, 4], 98, device)))]
    }
    q_set_require_grad(device) {
        let tensor = B::q_set_require_grad(quantized::<B>(&[3, 4], 99, device), true);
        vec![Out::value(B::q_is_require_grad(&tensor)), rq::<B>(tensor)]
    }
    q_expand(device) {
        let out = B::q_expand(quantized::<B>(&[1, 4], 100, device), shape(&[3, 4]));
        vec![rq::<B>(out)]
    }
    q_transpose(device) {
        vec![rq::<B>(B::q_transpose(quantized::<B>(&[2, 3, 4], 101, device)))]
    }
    q_swap_dims(device) {
        vec![rq::<B>(B::q_swap_dims(quantized::<B>(&[2, 3, 4], 102, device), 0, 2))]
    }
    q_permute(device) {
        vec![rq::<B>(B::q_permute(quantized::<B>(&[2, 3, 4], 103, device), &[1, 2, 0]))]
    }
    q_slice(device) {
        let slices = [Slice::new(1, Some(3), 1), Slice::new(0, None, 2)];
        let out = B::q_slice(quantized::<B>(&[4, 5], 104, device), &slices);
        vec![rq::<B>(out)]
    }
}
