//! Differential cases for Burn's `FloatTensorOps`, one per method.

#[allow(unused_imports)]
use crate::*;
#[allow(unused_imports)]
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, GridSampleOptions, GridSamplePaddingMode, InterpolateMode};
use burn::tensor::{FloatDType, Scalar, Slice, TensorData};

/// A float tensor with the given f32 values.
fn floats<B: Backend>(values: Vec<f32>, dims: &[usize], device: &B::Device) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(values, dims.to_vec()), device)
}

/// A float tensor with some exact zeros, halves and negative values, for sign/round/any/all.
fn special<B: Backend>(device: &B::Device) -> FloatTensor<B> {
    floats::<B>(
        vec![
            0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.0, 0.0, -3.25, 7.75, 0.0, 0.1, -0.7, 4.0,
        ],
        &[4, 4],
        device,
    )
}

/// Values > 1, for acosh.
fn above_one<B: Backend>(dims: &[usize], seed: u64, device: &B::Device) -> FloatTensor<B> {
    B::float_add_scalar(positive::<B>(dims, seed, device), Scalar::from(1.0f64))
}

crate::cases! {
    float_from_data(device) {
        vec![
            rf::<B>(B::float_from_data(float_data(&[3, 4], 1), device)),
            rf::<B>(B::float_from_data(float_data(&[2, 3, 2], 2), device)),
            rf::<B>(B::float_from_data(TensorData::new(vec![1.5f64, -2.0, 3.25], vec![3]), device)),
        ]
    }
    float_random(device) {
        let dtype = float_dtype::<B>(device);
        let a = B::float_random(shape(&[4, 5]), UNIFORM, device, dtype);
        let b = B::float_random(
            shape(&[3, 3]),
            burn::tensor::Distribution::Uniform(-1.0, 3.0),
            device,
            dtype,
        );
        let c = B::float_random(
            shape(&[6]),
            burn::tensor::Distribution::Normal(0.5, 2.0),
            device,
            dtype,
        );
        let d = B::float_random(shape(&[2, 4]), burn::tensor::Distribution::Bernoulli(0.3), device, dtype);
        vec![rf::<B>(a), rf::<B>(b), rf::<B>(c), rf::<B>(d)]
    }
    float_zeros(device) {
        vec![
            rf::<B>(B::float_zeros(shape(&[3, 4]), device, float_dtype::<B>(device))),
            rf::<B>(B::float_zeros(shape(&[2, 1, 3]), device, FloatDType::F64)),
        ]
    }
    float_ones(device) {
        vec![
            rf::<B>(B::float_ones(shape(&[3, 4]), device, float_dtype::<B>(device))),
            rf::<B>(B::float_ones(shape(&[5]), device, FloatDType::F64)),
        ]
    }
    float_full(device) {
        vec![
            rf::<B>(B::float_full(shape(&[3, 4]), Scalar::from(1.25f64), device, float_dtype::<B>(device))),
            rf::<B>(B::float_full(shape(&[2, 2]), Scalar::from(-3.5f32), device, FloatDType::F64)),
        ]
    }
    float_into_data(device) {
        let a = burn::tensor::read_sync(B::float_into_data(float::<B>(&[3, 4], 3, device)))
            .expect("float read");
        let b = burn::tensor::read_sync(B::float_into_data(B::float_transpose(float::<B>(&[3, 5], 4, device))))
            .expect("float read");
        vec![Out::data(a), Out::data(b)]
    }
    float_device(device) {
        let t = float::<B>(&[2, 3], 5, device);
        let dev = B::float_device(&t);
        vec![Out::device(dev), rf::<B>(t)]
    }
    float_to_device(device) {
        let t = float::<B>(&[3, 4], 6, device);
        let moved = B::float_to_device(t, device);
        vec![Out::device(B::float_device(&moved)), rf::<B>(moved)]
    }
    float_into_int(device) {
        let t = B::float_mul_scalar(float::<B>(&[3, 5], 7, device), Scalar::from(10.0f64));
        vec![
            ri::<B>(B::float_into_int(t.clone(), int_dtype::<B>(device))),
            ri::<B>(B::float_into_int(t, burn::tensor::IntDType::I32)),
        ]
    }
    float_empty(device) {
        // Contents are unspecified: compare the shape and dtype only.
        let t = B::float_empty(shape(&[3, 4]), device, float_dtype::<B>(device));
        let data = burn::tensor::read_sync(B::float_into_data(t)).expect("float read");
        vec![Out::value(data.shape.to_vec()), Out::value(data.dtype)]
    }
    float_repeat_dim(device) {
        vec![
            rf::<B>(B::float_repeat_dim(float::<B>(&[2, 3], 8, device), 0, 3)),
            rf::<B>(B::float_repeat_dim(float::<B>(&[2, 1, 3], 9, device), 1, 4)),
        ]
    }
    float_add(device) {
        vec![
            rf::<B>(B::float_add(float::<B>(&[3, 4], 10, device), float::<B>(&[3, 4], 11, device))),
            rf::<B>(B::float_add(float::<B>(&[3, 4], 12, device), float::<B>(&[1, 4], 13, device))),
        ]
    }
    float_add_scalar(device) {
        vec![rf::<B>(B::float_add_scalar(float::<B>(&[3, 4], 14, device), Scalar::from(0.75f64)))]
    }
    float_clamp_min(device) {
        vec![rf::<B>(B::float_clamp_min(float::<B>(&[4, 5], 15, device), Scalar::from(-0.5f64)))]
    }
    float_clamp_max(device) {
        vec![rf::<B>(B::float_clamp_max(float::<B>(&[4, 5], 16, device), Scalar::from(0.25f64)))]
    }
    float_clamp(device) {
        vec![rf::<B>(B::float_clamp(
            float::<B>(&[4, 5], 17, device),
            Scalar::from(-1.0f64),
            Scalar::from(0.5f64),
        ))]
    }
    float_sub(device) {
        vec![
            rf::<B>(B::float_sub(float::<B>(&[3, 4], 18, device), float::<B>(&[3, 4], 19, device))),
            rf::<B>(B::float_sub(float::<B>(&[3, 1], 20, device), float::<B>(&[3, 4], 21, device))),
        ]
    }
    float_sub_scalar(device) {
        vec![rf::<B>(B::float_sub_scalar(float::<B>(&[3, 4], 22, device), Scalar::from(1.5f64)))]
    }
    float_mul(device) {
        vec![
            rf::<B>(B::float_mul(float::<B>(&[3, 4], 23, device), float::<B>(&[3, 4], 24, device))),
            rf::<B>(B::float_mul(float::<B>(&[2, 3, 4], 25, device), float::<B>(&[4], 26, device))),
        ]
    }
    float_mul_scalar(device) {
        vec![rf::<B>(B::float_mul_scalar(float::<B>(&[3, 4], 27, device), Scalar::from(-2.5f64)))]
    }
    float_div(device) {
        vec![
            rf::<B>(B::float_div(float::<B>(&[3, 4], 28, device), positive::<B>(&[3, 4], 29, device))),
            rf::<B>(B::float_div(float::<B>(&[3, 4], 30, device), positive::<B>(&[1, 4], 31, device))),
        ]
    }
    float_div_scalar(device) {
        vec![rf::<B>(B::float_div_scalar(float::<B>(&[3, 4], 32, device), Scalar::from(3.0f64)))]
    }
    float_remainder(device) {
        vec![
            rf::<B>(B::float_remainder(float::<B>(&[3, 4], 33, device), positive::<B>(&[3, 4], 34, device))),
            rf::<B>(B::float_remainder(float::<B>(&[3, 4], 35, device), B::float_neg(positive::<B>(&[3, 4], 36, device)))),
        ]
    }
    float_remainder_scalar(device) {
        vec![
            rf::<B>(B::float_remainder_scalar(float::<B>(&[3, 4], 37, device), Scalar::from(0.7f64))),
            rf::<B>(B::float_remainder_scalar(float::<B>(&[3, 4], 38, device), Scalar::from(-1.3f64))),
        ]
    }
    float_matmul(device) {
        vec![
            rf::<B>(B::float_matmul(float::<B>(&[3, 4], 39, device), float::<B>(&[4, 5], 40, device))),
            rf::<B>(B::float_matmul(float::<B>(&[2, 3, 4], 41, device), float::<B>(&[2, 4, 2], 42, device))),
        ]
    }
    float_cross(device) {
        vec![
            rf::<B>(B::float_cross(float::<B>(&[4, 3], 43, device), float::<B>(&[4, 3], 44, device), 1)),
            rf::<B>(B::float_cross(float::<B>(&[3, 2], 45, device), float::<B>(&[3, 2], 46, device), 0)),
        ]
    }
    float_neg(device) {
        vec![rf::<B>(B::float_neg(float::<B>(&[3, 4], 47, device)))]
    }
    float_recip(device) {
        vec![
            rf::<B>(B::float_recip(positive::<B>(&[3, 4], 48, device))),
            rf::<B>(B::float_recip(B::float_neg(positive::<B>(&[5], 49, device)))),
        ]
    }
    float_flip(device) {
        vec![
            rf::<B>(B::float_flip(float::<B>(&[3, 4], 50, device), &[0])),
            rf::<B>(B::float_flip(float::<B>(&[2, 3, 4], 51, device), &[0, 2])),
        ]
    }
    float_gather(device) {
        vec![
            rf::<B>(B::float_gather(1, float::<B>(&[3, 4], 52, device), int::<B>(&[3, 5], 0, 4, 53, device))),
            rf::<B>(B::float_gather(0, float::<B>(&[3, 4], 54, device), int::<B>(&[2, 4], 0, 3, 55, device))),
        ]
    }
    float_scatter_add(device) {
        vec![
            rf::<B>(B::float_scatter_add(
                1,
                float::<B>(&[3, 4], 56, device),
                int::<B>(&[3, 2], 0, 4, 57, device),
                float::<B>(&[3, 2], 58, device),
            )),
            rf::<B>(B::float_scatter_add(
                0,
                float::<B>(&[3, 4], 59, device),
                int::<B>(&[5, 4], 0, 3, 60, device),
                float::<B>(&[5, 4], 61, device),
            )),
        ]
    }
    float_scatter_nd(device) {
        // K = 1: rows of a [4, 3, 2] tensor.
        let rows = int::<B>(&[5, 1], 0, 4, 62, device);
        // K = 2: single elements of a [4, 3] tensor.
        let points = ints::<B>(&[0, 1, 3, 2, 1, 0, 2, 2, 3, 0], &[5, 2], device);
        let mut out = Vec::new();
        for (i, op) in UPDATE_OPS.into_iter().enumerate() {
            let seed = 63 + 4 * i as u64;
            out.push(rf::<B>(B::float_scatter_nd(
                float::<B>(&[4, 3, 2], seed, device),
                rows.clone(),
                float::<B>(&[5, 3, 2], seed + 1, device),
                op,
            )));
            out.push(rf::<B>(B::float_scatter_nd(
                float::<B>(&[4, 3], seed + 2, device),
                points.clone(),
                float::<B>(&[5], seed + 3, device),
                op,
            )));
        }
        out
    }
    float_gather_nd(device) {
        let rows = int::<B>(&[2, 3, 1], 0, 4, 90, device);
        let points = ints::<B>(&[0, 1, 3, 2, 1, 0, 2, 2], &[4, 2], device);
        vec![
            rf::<B>(B::float_gather_nd(float::<B>(&[4, 3, 2], 91, device), rows)),
            rf::<B>(B::float_gather_nd(float::<B>(&[4, 3, 2], 92, device), points)),
        ]
    }
    float_select(device) {
        vec![
            rf::<B>(B::float_select(float::<B>(&[4, 3], 93, device), 0, int::<B>(&[6], 0, 4, 94, device))),
            rf::<B>(B::float_select(float::<B>(&[2, 5, 3], 95, device), 1, int::<B>(&[3], 0, 5, 96, device))),
        ]
    }
    float_select_add(device) {
        vec![
            rf::<B>(B::float_select_add(
                float::<B>(&[4, 3], 97, device),
                0,
                int::<B>(&[5], 0, 4, 98, device),
                float::<B>(&[5, 3], 99, device),
            )),
            rf::<B>(B::float_select_add(
                float::<B>(&[2, 5], 100, device),
                1,
                int::<B>(&[3], 0, 5, 101, device),
                float::<B>(&[2, 3], 102, device),
            )),
        ]
    }
    float_slice_assign(device) {
        vec![
            rf::<B>(B::float_slice_assign(
                float::<B>(&[4, 5], 103, device),
                &[Slice::new(1, Some(3), 1), Slice::new(0, Some(5), 2)],
                float::<B>(&[2, 3], 104, device),
            )),
            rf::<B>(B::float_slice_assign(
                float::<B>(&[3, 4, 2], 105, device),
                &[Slice::new(0, Some(3), 1), Slice::new(2, Some(4), 1), Slice::new(1, Some(2), 1)],
                float::<B>(&[3, 2, 1], 106, device),
            )),
        ]
    }
    float_mask_where(device) {
        vec![
            rf::<B>(B::float_mask_where(
                float::<B>(&[3, 4], 107, device),
                boolean::<B>(&[3, 4], 108, device),
                float::<B>(&[3, 4], 109, device),
            )),
            rf::<B>(B::float_mask_where(
                float::<B>(&[2, 3, 2], 110, device),
                boolean::<B>(&[2, 3, 2], 111, device),
                float::<B>(&[2, 3, 2], 112, device),
            )),
        ]
    }
    float_mask_fill(device) {
        vec![rf::<B>(B::float_mask_fill(
            float::<B>(&[3, 4], 113, device),
            boolean::<B>(&[3, 4], 114, device),
            Scalar::from(-7.5f64),
        ))]
    }
    float_equal(device) {
        let a = float::<B>(&[3, 4], 115, device);
        let b = B::float_mask_where(a.clone(), boolean::<B>(&[3, 4], 116, device), float::<B>(&[3, 4], 117, device));
        vec![rb::<B>(B::float_equal(a, b, bool_dtype::<B>(device)))]
    }
    float_not_equal(device) {
        let a = float::<B>(&[3, 4], 118, device);
        let b = B::float_mask_where(a.clone(), boolean::<B>(&[3, 4], 119, device), float::<B>(&[3, 4], 120, device));
        vec![rb::<B>(B::float_not_equal(a, b, bool_dtype::<B>(device)))]
    }
    float_equal_elem(device) {
        vec![
            rb::<B>(B::float_equal_elem(special::<B>(device), Scalar::from(0.0f64), bool_dtype::<B>(device))),
            rb::<B>(B::float_equal_elem(special::<B>(device), Scalar::from(1.5f64), bool_dtype::<B>(device))),
        ]
    }
    float_not_equal_elem(device) {
        vec![
            rb::<B>(B::float_not_equal_elem(special::<B>(device), Scalar::from(0.0f64), bool_dtype::<B>(device))),
            rb::<B>(B::float_not_equal_elem(special::<B>(device), Scalar::from(-0.5f64), bool_dtype::<B>(device))),
        ]
    }
    float_greater(device) {
        vec![rb::<B>(B::float_greater(
            float::<B>(&[3, 4], 121, device),
            float::<B>(&[3, 4], 122, device),
            bool_dtype::<B>(device),
        ))]
    }
    float_greater_elem(device) {
        vec![rb::<B>(B::float_greater_elem(float::<B>(&[3, 4], 123, device), Scalar::from(0.3f64), bool_dtype::<B>(device)))]
    }
    float_greater_equal(device) {
        let a = float::<B>(&[3, 4], 124, device);
        let b = B::float_mask_where(float::<B>(&[3, 4], 125, device), boolean::<B>(&[3, 4], 126, device), a.clone());
        vec![rb::<B>(B::float_greater_equal(a, b, bool_dtype::<B>(device)))]
    }
    float_greater_equal_elem(device) {
        vec![rb::<B>(B::float_greater_equal_elem(special::<B>(device), Scalar::from(0.5f64), bool_dtype::<B>(device)))]
    }
    float_lower(device) {
        vec![rb::<B>(B::float_lower(
            float::<B>(&[3, 4], 127, device),
            float::<B>(&[3, 4], 128, device),
            bool_dtype::<B>(device),
        ))]
    }
    float_lower_elem(device) {
        vec![rb::<B>(B::float_lower_elem(float::<B>(&[3, 4], 129, device), Scalar::from(-0.2f64), bool_dtype::<B>(device)))]
    }
    float_lower_equal(device) {
        let a = float::<B>(&[3, 4], 130, device);
        let b = B::float_mask_where(float::<B>(&[3, 4], 131, device), boolean::<B>(&[3, 4], 132, device), a.clone());
        vec![rb::<B>(B::float_lower_equal(a, b, bool_dtype::<B>(device)))]
    }
    float_lower_equal_elem(device) {
        vec![rb::<B>(B::float_lower_equal_elem(special::<B>(device), Scalar::from(-0.5f64), bool_dtype::<B>(device)))]
    }
    float_is_require_grad(device) {
        let t = float::<B>(&[2, 2], 133, device);
        let before = B::float_is_require_grad(&t);
        let t = B::float_set_require_grad(t, true);
        vec![Out::value(before), Out::value(B::float_is_require_grad(&t))]
    }
    float_sum(device) {
        vec![
            rf::<B>(B::float_sum(float::<B>(&[3, 4], 134, device))),
            rf::<B>(B::float_sum(float::<B>(&[2, 3, 5], 135, device))),
        ]
    }
    float_sum_dim(device) {
        vec![
            rf::<B>(B::float_sum_dim(float::<B>(&[3, 4], 136, device), 0)),
            rf::<B>(B::float_sum_dim(float::<B>(&[2, 3, 5], 137, device), 2)),
        ]
    }
    float_prod(device) {
        vec![rf::<B>(B::float_prod(float::<B>(&[3, 4], 138, device)))]
    }
    float_prod_dim(device) {
        vec![
            rf::<B>(B::float_prod_dim(float::<B>(&[3, 4], 139, device), 1)),
            rf::<B>(B::float_prod_dim(float::<B>(&[2, 3, 4], 140, device), 0)),
        ]
    }
    float_mean(device) {
        vec![rf::<B>(B::float_mean(float::<B>(&[3, 7], 141, device)))]
    }
    float_mean_dim(device) {
        vec![
            rf::<B>(B::float_mean_dim(float::<B>(&[3, 7], 142, device), 1)),
            rf::<B>(B::float_mean_dim(float::<B>(&[2, 3, 4], 143, device), 1)),
        ]
    }
    float_cumsum(device) {
        vec![
            rf::<B>(B::float_cumsum(float::<B>(&[3, 5], 144, device), 1)),
            rf::<B>(B::float_cumsum(float::<B>(&[4, 3], 145, device), 0)),
        ]
    }
    float_cumprod(device) {
        vec![
            rf::<B>(B::float_cumprod(float::<B>(&[3, 5], 146, device), 1)),
            rf::<B>(B::float_cumprod(float::<B>(&[4, 3], 147, device), 0)),
        ]
    }
    float_cummin(device) {
        vec![
            rf::<B>(B::float_cummin(float::<B>(&[3, 5], 148, device), 1)),
            rf::<B>(B::float_cummin(float::<B>(&[4, 3], 149, device), 0)),
        ]
    }
    float_cummax(device) {
        vec![
            rf::<B>(B::float_cummax(float::<B>(&[3, 5], 150, device), 1)),
            rf::<B>(B::float_cummax(float::<B>(&[4, 3], 151, device), 0)),
        ]
    }
    float_cast(device) {
        let t = float::<B>(&[3, 4], 152, device);
        let wide = B::float_cast(t.clone(), FloatDType::F64);
        let back = B::float_cast(wide.clone(), FloatDType::F32);
        vec![rf::<B>(wide), rf::<B>(back), rf::<B>(B::float_cast(t, FloatDType::F32))]
    }
    float_exp(device) {
        vec![rf::<B>(B::float_exp(float::<B>(&[3, 4], 153, device)))]
    }
    float_log(device) {
        vec![rf::<B>(B::float_log(positive::<B>(&[3, 4], 154, device)))]
    }
    float_log1p(device) {
        vec![
            rf::<B>(B::float_log1p(positive::<B>(&[3, 4], 155, device))),
            rf::<B>(B::float_log1p(unit::<B>(&[3, 4], 156, device))),
        ]
    }
    float_powf(device) {
        vec![rf::<B>(B::float_powf(positive::<B>(&[3, 4], 157, device), float::<B>(&[3, 4], 158, device)))]
    }
    float_powi(device) {
        vec![rf::<B>(B::float_powi(float::<B>(&[3, 4], 159, device), int::<B>(&[3, 4], 0, 5, 160, device)))]
    }
    float_powi_scalar(device) {
        vec![
            rf::<B>(B::float_powi_scalar(float::<B>(&[3, 4], 161, device), Scalar::from(3i64))),
            rf::<B>(B::float_powi_scalar(float::<B>(&[3, 4], 162, device), Scalar::from(2i64))),
            rf::<B>(B::float_powi_scalar(positive::<B>(&[3, 4], 163, device), Scalar::from(-2i64))),
        ]
    }
    float_powi_scalar_impl(device) {
        vec![
            rf::<B>(B::float_powi_scalar_impl(float::<B>(&[3, 4], 164, device), Scalar::from(3i64))),
            rf::<B>(B::float_powi_scalar_impl(positive::<B>(&[3, 4], 165, device), Scalar::from(-1i64))),
        ]
    }
    float_powf_scalar(device) {
        vec![
            rf::<B>(B::float_powf_scalar(positive::<B>(&[3, 4], 166, device), Scalar::from(1.5f64))),
            rf::<B>(B::float_powf_scalar(float::<B>(&[3, 4], 167, device), Scalar::from(2.0f64))),
            rf::<B>(B::float_powf_scalar(positive::<B>(&[3, 4], 168, device), Scalar::from(-0.5f64))),
        ]
    }
    float_powf_scalar_impl(device) {
        vec![
            rf::<B>(B::float_powf_scalar_impl(positive::<B>(&[3, 4], 169, device), Scalar::from(2.5f64))),
            rf::<B>(B::float_powf_scalar_impl(positive::<B>(&[3, 4], 170, device), Scalar::from(-1.25f64))),
        ]
    }
    float_sqrt(device) {
        vec![rf::<B>(B::float_sqrt(positive::<B>(&[3, 4], 171, device)))]
    }
    float_abs(device) {
        vec![rf::<B>(B::float_abs(float::<B>(&[3, 4], 172, device))), rf::<B>(B::float_abs(special::<B>(device)))]
    }
    float_cos(device) {
        vec![rf::<B>(B::float_cos(float::<B>(&[3, 4], 173, device)))]
    }
    float_sin(device) {
        vec![rf::<B>(B::float_sin(float::<B>(&[3, 4], 174, device)))]
    }
    float_tan(device) {
        vec![rf::<B>(B::float_tan(unit::<B>(&[3, 4], 175, device)))]
    }
    float_cosh(device) {
        vec![rf::<B>(B::float_cosh(float::<B>(&[3, 4], 176, device)))]
    }
    float_sinh(device) {
        vec![rf::<B>(B::float_sinh(float::<B>(&[3, 4], 177, device)))]
    }
    float_tanh(device) {
        vec![rf::<B>(B::float_tanh(float::<B>(&[3, 4], 178, device)))]
    }
    float_acos(device) {
        vec![rf::<B>(B::float_acos(unit::<B>(&[3, 4], 179, device)))]
    }
    float_acosh(device) {
        vec![rf::<B>(B::float_acosh(above_one::<B>(&[3, 4], 180, device)))]
    }
    float_asin(device) {
        vec![rf::<B>(B::float_asin(unit::<B>(&[3, 4], 181, device)))]
    }
    float_asinh(device) {
        vec![rf::<B>(B::float_asinh(float::<B>(&[3, 4], 182, device)))]
    }
    float_atan(device) {
        vec![rf::<B>(B::float_atan(float::<B>(&[3, 4], 183, device)))]
    }
    float_atanh(device) {
        vec![rf::<B>(B::float_atanh(unit::<B>(&[3, 4], 184, device)))]
    }
    float_atan2(device) {
        vec![rf::<B>(B::float_atan2(float::<B>(&[3, 4], 185, device), float::<B>(&[3, 4], 186, device)))]
    }
    float_round(device) {
        let scaled = B::float_mul_scalar(float::<B>(&[3, 4], 187, device), Scalar::from(3.0f64));
        vec![rf::<B>(B::float_round(scaled)), rf::<B>(B::float_round(special::<B>(device)))]
    }
    float_floor(device) {
        vec![rf::<B>(B::float_floor(float::<B>(&[3, 4], 188, device))), rf::<B>(B::float_floor(special::<B>(device)))]
    }
    float_ceil(device) {
        vec![rf::<B>(B::float_ceil(float::<B>(&[3, 4], 189, device))), rf::<B>(B::float_ceil(special::<B>(device)))]
    }
    float_trunc(device) {
        vec![rf::<B>(B::float_trunc(float::<B>(&[3, 4], 190, device))), rf::<B>(B::float_trunc(special::<B>(device)))]
    }
    float_erf(device) {
        vec![rf::<B>(B::float_erf(float::<B>(&[3, 4], 191, device)))]
    }
    float_cat(device) {
        vec![
            rf::<B>(B::float_cat(
                vec![float::<B>(&[2, 3], 192, device), float::<B>(&[4, 3], 193, device), float::<B>(&[1, 3], 194, device)],
                0,
            )),
            rf::<B>(B::float_cat(vec![float::<B>(&[2, 3], 195, device), float::<B>(&[2, 2], 196, device)], 1)),
        ]
    }
    float_argmax(device) {
        vec![
            ri::<B>(B::float_argmax(float::<B>(&[3, 5], 197, device), 1, int_dtype::<B>(device))),
            ri::<B>(B::float_argmax(float::<B>(&[4, 3], 198, device), 0, int_dtype::<B>(device))),
        ]
    }
    float_argtopk(device) {
        vec![ri::<B>(B::float_argtopk(float::<B>(&[3, 6], 199, device), 1, 3, int_dtype::<B>(device)))]
    }
    float_topk(device) {
        vec![
            rf::<B>(B::float_topk(float::<B>(&[3, 6], 200, device), 1, 3)),
            rf::<B>(B::float_topk(float::<B>(&[5, 2], 201, device), 0, 2)),
        ]
    }
    float_argmin(device) {
        vec![
            ri::<B>(B::float_argmin(float::<B>(&[3, 5], 202, device), 1, int_dtype::<B>(device))),
            ri::<B>(B::float_argmin(float::<B>(&[4, 3], 203, device), 0, int_dtype::<B>(device))),
        ]
    }
    float_max(device) {
        vec![rf::<B>(B::float_max(float::<B>(&[3, 5], 204, device)))]
    }
    float_max_dim(device) {
        vec![
            rf::<B>(B::float_max_dim(float::<B>(&[3, 5], 205, device), 1)),
            rf::<B>(B::float_max_dim(float::<B>(&[3, 5], 206, device), 0)),
        ]
    }
    float_max_dim_with_indices(device) {
        let (values, indices) = B::float_max_dim_with_indices(float::<B>(&[3, 5], 207, device), 1, int_dtype::<B>(device));
        vec![rf::<B>(values), ri::<B>(indices)]
    }
    float_min(device) {
        vec![rf::<B>(B::float_min(float::<B>(&[3, 5], 208, device)))]
    }
    float_min_dim(device) {
        vec![
            rf::<B>(B::float_min_dim(float::<B>(&[3, 5], 209, device), 1)),
            rf::<B>(B::float_min_dim(float::<B>(&[3, 5], 210, device), 0)),
        ]
    }
    float_min_dim_with_indices(device) {
        let (values, indices) = B::float_min_dim_with_indices(float::<B>(&[4, 3], 211, device), 0, int_dtype::<B>(device));
        vec![rf::<B>(values), ri::<B>(indices)]
    }
    float_max_abs(device) {
        vec![rf::<B>(B::float_max_abs(float::<B>(&[3, 5], 212, device)))]
    }
    float_max_abs_dim(device) {
        vec![
            rf::<B>(B::float_max_abs_dim(float::<B>(&[3, 5], 213, device), 1)),
            rf::<B>(B::float_max_abs_dim(float::<B>(&[3, 5], 214, device), 0)),
        ]
    }
    float_any(device) {
        let zeros = B::float_zeros(shape(&[2, 3]), device, float_dtype::<B>(device));
        vec![
            rb::<B>(B::float_any(special::<B>(device), bool_dtype::<B>(device))),
            rb::<B>(B::float_any(zeros, bool_dtype::<B>(device))),
        ]
    }
    float_any_dim(device) {
        vec![
            rb::<B>(B::float_any_dim(special::<B>(device), 1, bool_dtype::<B>(device))),
            rb::<B>(B::float_any_dim(special::<B>(device), 0, bool_dtype::<B>(device))),
        ]
    }
    float_all(device) {
        vec![
            rb::<B>(B::float_all(special::<B>(device), bool_dtype::<B>(device))),
            rb::<B>(B::float_all(positive::<B>(&[3, 4], 215, device), bool_dtype::<B>(device))),
        ]
    }
    float_all_dim(device) {
        vec![
            rb::<B>(B::float_all_dim(special::<B>(device), 1, bool_dtype::<B>(device))),
            rb::<B>(B::float_all_dim(special::<B>(device), 0, bool_dtype::<B>(device))),
        ]
    }
    float_sign(device) {
        vec![rf::<B>(B::float_sign(special::<B>(device))), rf::<B>(B::float_sign(float::<B>(&[3, 4], 216, device)))]
    }
    float_sort(device) {
        vec![
            rf::<B>(B::float_sort(float::<B>(&[3, 6], 217, device), 1, false)),
            rf::<B>(B::float_sort(float::<B>(&[5, 2], 218, device), 0, true)),
        ]
    }
    float_sort_with_indices(device) {
        let (a, ai) = B::float_sort_with_indices(float::<B>(&[3, 6], 219, device), 1, false, int_dtype::<B>(device));
        let (b, bi) = B::float_sort_with_indices(float::<B>(&[5, 2], 220, device), 0, true, int_dtype::<B>(device));
        vec![rf::<B>(a), ri::<B>(ai), rf::<B>(b), ri::<B>(bi)]
    }
    float_argsort(device) {
        vec![
            ri::<B>(B::float_argsort(float::<B>(&[3, 6], 221, device), 1, false, int_dtype::<B>(device))),
            ri::<B>(B::float_argsort(float::<B>(&[5, 2], 222, device), 0, true, int_dtype::<B>(device))),
        ]
    }
    float_grid_sample_2d(device) {
        let input = float::<B>(&[1, 2, 4, 4], 223, device);
        let mut out = Vec::new();
        for (i, (mode, padding_mode, align_corners)) in [
            (InterpolateMode::Bilinear, GridSamplePaddingMode::Zeros, false),
            (InterpolateMode::Bilinear, GridSamplePaddingMode::Border, true),
            (InterpolateMode::Bilinear, GridSamplePaddingMode::Zeros, true),
            (InterpolateMode::Bilinear, GridSamplePaddingMode::Reflection, false),
        ]
        .into_iter()
        .enumerate()
        {
            // Values in (-1.35, 1.35): mostly inside, some out of bounds.
            let grid = B::float_mul_scalar(unit::<B>(&[1, 3, 3, 2], 224 + i as u64, device), Scalar::from(1.5f64));
            let options = GridSampleOptions { mode, padding_mode, align_corners };
            out.push(rf::<B>(B::float_grid_sample_2d(input.clone(), grid, options)));
        }
        out
    }
    float_unfold(device) {
        vec![
            rf::<B>(B::float_unfold(float::<B>(&[2, 8], 230, device), 1, 3, 2)),
            rf::<B>(B::float_unfold(float::<B>(&[5, 2, 3], 231, device), 0, 2, 1)),
        ]
    }
    float_is_nan(device) {
        let t = floats::<B>(vec![0.0, f32::NAN, 1.0, f32::INFINITY, -f32::NAN, -2.0], &[2, 3], device);
        vec![rb::<B>(B::float_is_nan(t, bool_dtype::<B>(device)))]
    }
    float_is_inf(device) {
        let t = floats::<B>(vec![0.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, f32::MAX, -2.0], &[2, 3], device);
        vec![rb::<B>(B::float_is_inf(t, bool_dtype::<B>(device)))]
    }
    float_transpose(device) {
        vec![
            rf::<B>(B::float_transpose(float::<B>(&[3, 4], 232, device))),
            rf::<B>(B::float_transpose(float::<B>(&[2, 3, 4], 233, device))),
        ]
    }
    float_swap_dims(device) {
        vec![
            rf::<B>(B::float_swap_dims(float::<B>(&[2, 3, 4], 234, device), 0, 2)),
            rf::<B>(B::float_swap_dims(float::<B>(&[3, 4], 235, device), 1, 0)),
        ]
    }
    float_permute(device) {
        vec![
            rf::<B>(B::float_permute(float::<B>(&[2, 3, 4], 236, device), &[2, 0, 1])),
            rf::<B>(B::float_permute(float::<B>(&[2, 3, 4], 237, device), &[1, 2, 0])),
        ]
    }
    float_reshape(device) {
        vec![
            rf::<B>(B::float_reshape(float::<B>(&[3, 4], 238, device), shape(&[2, 6]))),
            rf::<B>(B::float_reshape(B::float_transpose(float::<B>(&[3, 4], 239, device)), shape(&[12]))),
        ]
    }
    float_slice(device) {
        vec![
            rf::<B>(B::float_slice(
                float::<B>(&[4, 6], 240, device),
                &[Slice::new(1, Some(4), 1), Slice::new(0, Some(6), 2)],
            )),
            rf::<B>(B::float_slice(
                float::<B>(&[3, 4, 5], 241, device),
                &[Slice::new(0, Some(2), 1), Slice::new(1, Some(3), 1), Slice::new(2, Some(5), 1)],
            )),
        ]
    }
    float_detach(device) {
        vec![rf::<B>(B::float_detach(float::<B>(&[3, 4], 242, device)))]
    }
    float_set_require_grad(device) {
        let t = B::float_set_require_grad(float::<B>(&[3, 4], 243, device), true);
        let grad = B::float_is_require_grad(&t);
        let t = B::float_set_require_grad(t, false);
        vec![Out::value(grad), Out::value(B::float_is_require_grad(&t)), rf::<B>(t)]
    }
    float_expand(device) {
        vec![
            rf::<B>(B::float_expand(float::<B>(&[3, 1], 244, device), shape(&[2, 3, 4]))),
            rf::<B>(B::float_expand(float::<B>(&[1, 4], 245, device), shape(&[3, 4]))),
        ]
    }
}
