//! Differential cases for Burn's `IntTensorOps`: one case per method, named after it.

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, IntDType, Scalar, Slice, TensorData, TensorMetadata};

use crate::*;

crate::cases! {
    int_empty(device) {
        // Contents are uninitialised: compare only the shape and dtype.
        let t = B::int_empty(shape(&[2, 3]), device, int_dtype::<B>(device));
        let u = B::int_empty(shape(&[4]), device, IntDType::I32);
        vec![
            Out::value(t.shape()),
            Out::value(t.dtype()),
            Out::value(u.shape()),
            Out::value(u.dtype()),
        ]
    }
    int_into_data(device) {
        let t = int::<B>(&[3, 4], -50, 50, 1, device);
        let data = burn::tensor::read_sync(B::int_into_data(t)).expect("int read");
        vec![Out::data(data)]
    }
    int_from_data(device) {
        let a = B::int_from_data(TensorData::new(vec![1i64, -2, 3, -4, 5, -6], [2, 3]), device);
        let b = B::int_from_data(TensorData::new(vec![7i32, 8, -9, 10], [4]), device);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_device(device) {
        let t = int::<B>(&[2, 2], -5, 5, 2, device);
        vec![Out::device(B::int_device(&t)), ri::<B>(t)]
    }
    int_to_device(device) {
        let t = int::<B>(&[3, 2], -5, 5, 3, device);
        let moved = B::int_to_device(t, device);
        vec![Out::device(B::int_device(&moved)), ri::<B>(moved)]
    }
    int_reshape(device) {
        let t = int::<B>(&[2, 6], -20, 20, 4, device);
        let a = B::int_reshape(t.clone(), shape(&[3, 4]));
        let b = B::int_reshape(t, shape(&[12]));
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_slice(device) {
        let t = int::<B>(&[4, 5], -20, 20, 5, device);
        let a = B::int_slice(t.clone(), &[Slice::new(1, Some(3), 1), Slice::new(0, None, 2)]);
        let b = B::int_slice(t, &[Slice::new(0, None, -1), Slice::new(1, Some(4), 1)]);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_slice_assign(device) {
        let t = int::<B>(&[4, 5], -20, 20, 6, device);
        let v = int::<B>(&[2, 3], 100, 200, 7, device);
        let out = B::int_slice_assign(t, &[Slice::new(1, Some(3), 1), Slice::new(1, Some(4), 1)], v);
        vec![ri::<B>(out)]
    }
    int_into_float(device) {
        let t = int::<B>(&[3, 4], -100, 100, 8, device);
        let a = B::int_into_float(t.clone(), float_dtype::<B>(device));
        let b = B::int_into_float(t, FloatDType::F64);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    int_mask_where(device) {
        let t = int::<B>(&[3, 4], -10, 10, 9, device);
        let mask = boolean::<B>(&[3, 4], 10, device);
        let v = int::<B>(&[3, 4], 50, 90, 11, device);
        vec![ri::<B>(B::int_mask_where(t, mask, v))]
    }
    int_mask_fill(device) {
        let t = int::<B>(&[3, 4], -10, 10, 12, device);
        let mask = boolean::<B>(&[3, 4], 13, device);
        vec![ri::<B>(B::int_mask_fill(t, mask, Scalar::Int(42)))]
    }
    int_gather(device) {
        let t = int::<B>(&[3, 5], -30, 30, 14, device);
        let idx = int::<B>(&[3, 4], 0, 5, 15, device);
        let a = B::int_gather(1, t.clone(), idx);
        let idx0 = int::<B>(&[2, 5], 0, 3, 16, device);
        let b = B::int_gather(0, t, idx0);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_scatter_add(device) {
        let t = int::<B>(&[4, 3], -10, 10, 17, device);
        let idx = int::<B>(&[4, 3], 0, 4, 18, device);
        let v = int::<B>(&[4, 3], 1, 20, 19, device);
        let a = B::int_scatter_add(0, t.clone(), idx, v);
        let idx1 = int::<B>(&[4, 3], 0, 3, 20, device);
        let v1 = int::<B>(&[4, 3], -20, 20, 21, device);
        let b = B::int_scatter_add(1, t, idx1, v1);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_scatter_nd(device) {
        // data [4, 3, 2]; three distinct index tuples into the first two dims; values [3, 2].
        UPDATE_OPS.into_iter().map(|op| {
            let data = int::<B>(&[4, 3, 2], -10, 10, 22, device);
            let idx = ints::<B>(&[0, 1, 2, 2, 3, 0], &[3, 2], device);
            let values = int::<B>(&[3, 2], -10, 10, 23, device);
            ri::<B>(B::int_scatter_nd(data, idx, values, op))
        })
        .collect()
    }
    int_gather_nd(device) {
        let data = int::<B>(&[4, 3, 2], -30, 30, 24, device);
        let idx = ints::<B>(&[0, 1, 3, 2, 1, 0], &[3, 2], device);
        let a = B::int_gather_nd(data.clone(), idx);
        let idx1 = ints::<B>(&[3, 0, 2, 1], &[2, 2, 1], device);
        let b = B::int_gather_nd(data, idx1);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_select(device) {
        let t = int::<B>(&[4, 3], -30, 30, 25, device);
        let idx = int::<B>(&[5], 0, 4, 26, device);
        let a = B::int_select(t.clone(), 0, idx);
        let idx1 = int::<B>(&[4], 0, 3, 27, device);
        let b = B::int_select(t, 1, idx1);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_select_add(device) {
        let t = int::<B>(&[4, 3], -30, 30, 28, device);
        let idx = int::<B>(&[2], 0, 3, 29, device);
        let v = int::<B>(&[4, 2], -10, 10, 30, device);
        let a = B::int_select_add(t.clone(), 1, idx, v);
        let idx0 = int::<B>(&[3], 0, 4, 31, device);
        let v0 = int::<B>(&[3, 3], 1, 10, 32, device);
        let b = B::int_select_add(t, 0, idx0, v0);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_repeat_dim(device) {
        let t = int::<B>(&[2, 3], -10, 10, 33, device);
        let a = B::int_repeat_dim(t.clone(), 0, 3);
        let b = B::int_repeat_dim(t, 1, 2);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_cat(device) {
        let a = int::<B>(&[2, 3], -10, 10, 34, device);
        let b = int::<B>(&[1, 3], -10, 10, 35, device);
        let c = int::<B>(&[3, 3], -10, 10, 36, device);
        let d0 = B::int_cat(vec![a.clone(), b, c], 0);
        let e = int::<B>(&[2, 2], -10, 10, 37, device);
        let d1 = B::int_cat(vec![a, e], 1);
        vec![ri::<B>(d0), ri::<B>(d1)]
    }
    int_equal(device) {
        let a = int::<B>(&[4, 5], -3, 3, 38, device);
        let b = int::<B>(&[4, 5], -3, 3, 39, device);
        vec![rb::<B>(B::int_equal(a, b, bool_dtype::<B>(device)))]
    }
    int_not_equal(device) {
        let a = int::<B>(&[4, 5], -3, 3, 40, device);
        let b = int::<B>(&[4, 5], -3, 3, 41, device);
        vec![rb::<B>(B::int_not_equal(a, b, bool_dtype::<B>(device)))]
    }
    int_equal_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 42, device);
        vec![rb::<B>(B::int_equal_elem(a, Scalar::Int(1), bool_dtype::<B>(device)))]
    }
    int_not_equal_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 43, device);
        vec![rb::<B>(B::int_not_equal_elem(a, Scalar::Int(-2), bool_dtype::<B>(device)))]
    }
    int_greater(device) {
        let a = int::<B>(&[4, 5], -3, 3, 44, device);
        let b = int::<B>(&[4, 5], -3, 3, 45, device);
        vec![rb::<B>(B::int_greater(a, b, bool_dtype::<B>(device)))]
    }
    int_greater_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 46, device);
        vec![rb::<B>(B::int_greater_elem(a, Scalar::Int(0), bool_dtype::<B>(device)))]
    }
    int_greater_equal(device) {
        let a = int::<B>(&[4, 5], -3, 3, 47, device);
        let b = int::<B>(&[4, 5], -3, 3, 48, device);
        vec![rb::<B>(B::int_greater_equal(a, b, bool_dtype::<B>(device)))]
    }
    int_greater_equal_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 49, device);
        vec![rb::<B>(B::int_greater_equal_elem(a, Scalar::Int(1), bool_dtype::<B>(device)))]
    }
    int_lower(device) {
        let a = int::<B>(&[4, 5], -3, 3, 50, device);
        let b = int::<B>(&[4, 5], -3, 3, 51, device);
        vec![rb::<B>(B::int_lower(a, b, bool_dtype::<B>(device)))]
    }
    int_lower_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 52, device);
        vec![rb::<B>(B::int_lower_elem(a, Scalar::Int(0), bool_dtype::<B>(device)))]
    }
    int_lower_equal(device) {
        let a = int::<B>(&[4, 5], -3, 3, 53, device);
        let b = int::<B>(&[4, 5], -3, 3, 54, device);
        vec![rb::<B>(B::int_lower_equal(a, b, bool_dtype::<B>(device)))]
    }
    int_lower_equal_elem(device) {
        let a = int::<B>(&[4, 5], -3, 3, 55, device);
        vec![rb::<B>(B::int_lower_equal_elem(a, Scalar::Int(-1), bool_dtype::<B>(device)))]
    }
    int_add(device) {
        let a = int::<B>(&[3, 4], -100, 100, 56, device);
        let b = int::<B>(&[3, 4], -100, 100, 57, device);
        let c = int::<B>(&[1, 4], -100, 100, 58, device);
        let s = B::int_add(a.clone(), b);
        let broadcast = B::int_add(a, c);
        vec![ri::<B>(s), ri::<B>(broadcast)]
    }
    int_add_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 59, device);
        vec![ri::<B>(B::int_add_scalar(a, Scalar::Int(17)))]
    }
    int_powi(device) {
        let a = int::<B>(&[3, 4], -4, 5, 60, device);
        let b = int::<B>(&[3, 4], 0, 4, 61, device);
        vec![ri::<B>(B::int_powi(a, b))]
    }
    int_powi_scalar(device) {
        // Exercise the special-cased exponents (0, 1, 2) and the generic path (3).
        [0i64, 1, 2, 3]
            .into_iter()
            .map(|e| {
                let a = int::<B>(&[3, 4], -6, 7, 62, device);
                ri::<B>(B::int_powi_scalar(a, Scalar::Int(e)))
            })
            .collect()
    }
    int_powi_scalar_impl(device) {
        let a = int::<B>(&[3, 4], -6, 7, 63, device);
        let b = int::<B>(&[3, 4], -6, 7, 64, device);
        vec![
            ri::<B>(B::int_powi_scalar_impl(a, Scalar::Int(3))),
            ri::<B>(B::int_powi_scalar_impl(b, Scalar::Int(4))),
        ]
    }
    int_clamp_min(device) {
        let a = int::<B>(&[3, 4], -10, 10, 65, device);
        vec![ri::<B>(B::int_clamp_min(a, Scalar::Int(-2)))]
    }
    int_clamp_max(device) {
        let a = int::<B>(&[3, 4], -10, 10, 66, device);
        vec![ri::<B>(B::int_clamp_max(a, Scalar::Int(3)))]
    }
    int_clamp(device) {
        let a = int::<B>(&[3, 4], -10, 10, 67, device);
        vec![ri::<B>(B::int_clamp(a, Scalar::Int(-3), Scalar::Int(4)))]
    }
    int_sub(device) {
        let a = int::<B>(&[3, 4], -100, 100, 68, device);
        let b = int::<B>(&[3, 4], -100, 100, 69, device);
        vec![ri::<B>(B::int_sub(a, b))]
    }
    int_sub_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 70, device);
        vec![ri::<B>(B::int_sub_scalar(a, Scalar::Int(23)))]
    }
    int_mul(device) {
        let a = int::<B>(&[3, 4], -100, 100, 71, device);
        let b = int::<B>(&[3, 4], -100, 100, 72, device);
        vec![ri::<B>(B::int_mul(a, b))]
    }
    int_mul_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 73, device);
        vec![ri::<B>(B::int_mul_scalar(a, Scalar::Int(-7)))]
    }
    int_div(device) {
        let a = int::<B>(&[3, 4], -100, 100, 74, device);
        let b = int::<B>(&[3, 4], 1, 9, 75, device);
        let neg = B::int_neg(int::<B>(&[3, 4], 1, 9, 76, device));
        let c = int::<B>(&[3, 4], -100, 100, 77, device);
        vec![ri::<B>(B::int_div(a, b)), ri::<B>(B::int_div(c, neg))]
    }
    int_div_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 78, device);
        let b = int::<B>(&[3, 4], -100, 100, 79, device);
        vec![
            ri::<B>(B::int_div_scalar(a, Scalar::Int(7))),
            ri::<B>(B::int_div_scalar(b, Scalar::Int(-3))),
        ]
    }
    int_remainder(device) {
        let a = int::<B>(&[3, 4], -100, 100, 80, device);
        let b = int::<B>(&[3, 4], 1, 9, 81, device);
        vec![ri::<B>(B::int_remainder(a, b))]
    }
    int_remainder_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 82, device);
        vec![ri::<B>(B::int_remainder_scalar(a, Scalar::Int(6)))]
    }
    int_matmul(device) {
        let a = int::<B>(&[3, 4], -5, 5, 83, device);
        let b = int::<B>(&[4, 2], -5, 5, 84, device);
        let c = int::<B>(&[2, 3, 4], -5, 5, 85, device);
        let d = int::<B>(&[2, 4, 5], -5, 5, 86, device);
        vec![ri::<B>(B::int_matmul(a, b)), ri::<B>(B::int_matmul(c, d))]
    }
    int_neg(device) {
        let a = int::<B>(&[3, 4], -100, 100, 87, device);
        vec![ri::<B>(B::int_neg(a))]
    }
    int_zeros(device) {
        let a = B::int_zeros(shape(&[2, 3]), device, int_dtype::<B>(device));
        let b = B::int_zeros(shape(&[4]), device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_ones(device) {
        let a = B::int_ones(shape(&[2, 3]), device, int_dtype::<B>(device));
        let b = B::int_ones(shape(&[4]), device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_full(device) {
        let a = B::int_full(shape(&[2, 3]), Scalar::Int(7), device, int_dtype::<B>(device));
        let b = B::int_full(shape(&[4]), Scalar::Int(-3), device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_sum(device) {
        let a = int::<B>(&[3, 4], -100, 100, 88, device);
        vec![ri::<B>(B::int_sum(a))]
    }
    int_sum_dim(device) {
        let a = int::<B>(&[3, 4], -100, 100, 89, device);
        vec![ri::<B>(B::int_sum_dim(a.clone(), 0)), ri::<B>(B::int_sum_dim(a, 1))]
    }
    int_prod(device) {
        let a = int::<B>(&[2, 4], -4, 5, 90, device);
        vec![ri::<B>(B::int_prod(a))]
    }
    int_prod_dim(device) {
        let a = int::<B>(&[3, 4], -4, 5, 91, device);
        vec![ri::<B>(B::int_prod_dim(a.clone(), 0)), ri::<B>(B::int_prod_dim(a, 1))]
    }
    int_mean(device) {
        let a = int::<B>(&[3, 4], -100, 100, 92, device);
        vec![ri::<B>(B::int_mean(a))]
    }
    int_mean_dim(device) {
        let a = int::<B>(&[3, 4], -100, 100, 93, device);
        vec![ri::<B>(B::int_mean_dim(a.clone(), 0)), ri::<B>(B::int_mean_dim(a, 1))]
    }
    int_cumsum(device) {
        let a = int::<B>(&[3, 4], -20, 20, 94, device);
        vec![ri::<B>(B::int_cumsum(a.clone(), 0)), ri::<B>(B::int_cumsum(a, 1))]
    }
    int_cumprod(device) {
        let a = int::<B>(&[3, 4], -4, 5, 95, device);
        vec![ri::<B>(B::int_cumprod(a.clone(), 0)), ri::<B>(B::int_cumprod(a, 1))]
    }
    int_cummin(device) {
        let a = int::<B>(&[3, 4], -20, 20, 96, device);
        vec![ri::<B>(B::int_cummin(a.clone(), 0)), ri::<B>(B::int_cummin(a, 1))]
    }
    int_cummax(device) {
        let a = int::<B>(&[3, 4], -20, 20, 97, device);
        vec![ri::<B>(B::int_cummax(a.clone(), 0)), ri::<B>(B::int_cummax(a, 1))]
    }
    int_argmax(device) {
        let a = int::<B>(&[3, 5], -20, 20, 98, device);
        vec![ri::<B>(B::int_argmax(a.clone(), 0)), ri::<B>(B::int_argmax(a, 1))]
    }
    int_argtopk(device) {
        let a = int::<B>(&[3, 5], -20, 20, 99, device);
        vec![ri::<B>(B::int_argtopk(a, 1, 2))]
    }
    int_topk(device) {
        let a = int::<B>(&[3, 5], -20, 20, 100, device);
        vec![ri::<B>(B::int_topk(a.clone(), 1, 2)), ri::<B>(B::int_topk(a, 0, 2))]
    }
    int_argmin(device) {
        let a = int::<B>(&[3, 5], -20, 20, 101, device);
        vec![ri::<B>(B::int_argmin(a.clone(), 0)), ri::<B>(B::int_argmin(a, 1))]
    }
    int_max(device) {
        let a = int::<B>(&[3, 5], -20, 20, 102, device);
        vec![ri::<B>(B::int_max(a))]
    }
    int_max_dim(device) {
        let a = int::<B>(&[3, 5], -20, 20, 103, device);
        vec![ri::<B>(B::int_max_dim(a.clone(), 0)), ri::<B>(B::int_max_dim(a, 1))]
    }
    int_max_dim_with_indices(device) {
        let a = int::<B>(&[3, 5], -20, 20, 104, device);
        let (values, indices) = B::int_max_dim_with_indices(a, 1);
        vec![ri::<B>(values), ri::<B>(indices)]
    }
    int_max_abs(device) {
        let a = int::<B>(&[3, 5], -20, 20, 105, device);
        vec![ri::<B>(B::int_max_abs(a))]
    }
    int_max_abs_dim(device) {
        let a = int::<B>(&[3, 5], -20, 20, 106, device);
        vec![ri::<B>(B::int_max_abs_dim(a.clone(), 0)), ri::<B>(B::int_max_abs_dim(a, 1))]
    }
    int_min(device) {
        let a = int::<B>(&[3, 5], -20, 20, 107, device);
        vec![ri::<B>(B::int_min(a))]
    }
    int_min_dim(device) {
        let a = int::<B>(&[3, 5], -20, 20, 108, device);
        vec![ri::<B>(B::int_min_dim(a.clone(), 0)), ri::<B>(B::int_min_dim(a, 1))]
    }
    int_min_dim_with_indices(device) {
        let a = int::<B>(&[3, 5], -20, 20, 109, device);
        let (values, indices) = B::int_min_dim_with_indices(a, 0);
        vec![ri::<B>(values), ri::<B>(indices)]
    }
    int_abs(device) {
        let a = int::<B>(&[3, 5], -20, 20, 110, device);
        vec![ri::<B>(B::int_abs(a))]
    }
    int_transpose(device) {
        let a = int::<B>(&[3, 5], -20, 20, 111, device);
        let b = int::<B>(&[2, 3, 4], -20, 20, 112, device);
        vec![ri::<B>(B::int_transpose(a)), ri::<B>(B::int_transpose(b))]
    }
    int_swap_dims(device) {
        let a = int::<B>(&[2, 3, 4], -20, 20, 113, device);
        vec![ri::<B>(B::int_swap_dims(a.clone(), 0, 2)), ri::<B>(B::int_swap_dims(a, 1, 0))]
    }
    int_permute(device) {
        let a = int::<B>(&[2, 3, 4], -20, 20, 114, device);
        vec![ri::<B>(B::int_permute(a.clone(), &[2, 0, 1])), ri::<B>(B::int_permute(a, &[1, 2, 0]))]
    }
    int_flip(device) {
        let a = int::<B>(&[2, 3, 4], -20, 20, 115, device);
        vec![ri::<B>(B::int_flip(a.clone(), &[0, 2])), ri::<B>(B::int_flip(a, &[1]))]
    }
    int_random(device) {
        let a = B::int_random(shape(&[4, 5]), UNIFORM, device, int_dtype::<B>(device));
        let b = B::int_random(
            shape(&[4, 5]),
            Distribution::Uniform(-10.0, 10.0),
            device,
            int_dtype::<B>(device),
        );
        let c = B::int_random(shape(&[6]), Distribution::Bernoulli(0.5), device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b), ri::<B>(c)]
    }
    int_arange_step(device) {
        let a = B::int_arange_step(0..20, 3, device, int_dtype::<B>(device));
        let b = B::int_arange_step(-5..7, 2, device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_arange(device) {
        let a = B::int_arange(-3..9, device, int_dtype::<B>(device));
        let b = B::int_arange(0..5, device, IntDType::I32);
        vec![ri::<B>(a), ri::<B>(b)]
    }
    int_any(device) {
        let a = int::<B>(&[3, 4], -2, 2, 116, device);
        let z = B::int_zeros(shape(&[3, 4]), device, int_dtype::<B>(device));
        vec![
            rb::<B>(B::int_any(a, bool_dtype::<B>(device))),
            rb::<B>(B::int_any(z, bool_dtype::<B>(device))),
        ]
    }
    int_any_dim(device) {
        let a = int::<B>(&[4, 5], 0, 2, 117, device);
        a_dim_pair::<B>(a, device, B::int_any_dim)
    }
    int_all(device) {
        let a = int::<B>(&[3, 4], -2, 2, 118, device);
        let o = B::int_ones(shape(&[3, 4]), device, int_dtype::<B>(device));
        vec![
            rb::<B>(B::int_all(a, bool_dtype::<B>(device))),
            rb::<B>(B::int_all(o, bool_dtype::<B>(device))),
        ]
    }
    int_all_dim(device) {
        let a = int::<B>(&[4, 5], 0, 4, 119, device);
        a_dim_pair::<B>(a, device, B::int_all_dim)
    }
    int_sign(device) {
        let a = int::<B>(&[3, 5], -3, 4, 120, device);
        vec![ri::<B>(B::int_sign(a))]
    }
    int_expand(device) {
        let a = int::<B>(&[1, 3], -20, 20, 121, device);
        let b = int::<B>(&[3, 1], -20, 20, 122, device);
        vec![
            ri::<B>(B::int_expand(a, shape(&[4, 3]))),
            ri::<B>(B::int_expand(b, shape(&[2, 3, 4]))),
        ]
    }
    int_sort(device) {
        let a = int::<B>(&[3, 6], -10, 10, 123, device);
        vec![
            ri::<B>(B::int_sort(a.clone(), 1, false)),
            ri::<B>(B::int_sort(a.clone(), 1, true)),
            ri::<B>(B::int_sort(a, 0, false)),
        ]
    }
    int_sort_with_indices(device) {
        let a = int::<B>(&[3, 6], -10, 10, 124, device);
        let (v0, i0) = B::int_sort_with_indices(a.clone(), 1, false);
        let (v1, i1) = B::int_sort_with_indices(a, 0, true);
        vec![ri::<B>(v0), ri::<B>(i0), ri::<B>(v1), ri::<B>(i1)]
    }
    int_argsort(device) {
        let a = int::<B>(&[3, 6], -10, 10, 125, device);
        vec![ri::<B>(B::int_argsort(a.clone(), 1, false)), ri::<B>(B::int_argsort(a, 0, true))]
    }
    bitwise_and(device) {
        let a = int::<B>(&[3, 4], -100, 100, 126, device);
        let b = int::<B>(&[3, 4], -100, 100, 127, device);
        vec![ri::<B>(B::bitwise_and(a, b))]
    }
    bitwise_and_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 128, device);
        vec![ri::<B>(B::bitwise_and_scalar(a, Scalar::Int(0b1011_0110)))]
    }
    bitwise_or(device) {
        let a = int::<B>(&[3, 4], -100, 100, 129, device);
        let b = int::<B>(&[3, 4], -100, 100, 130, device);
        vec![ri::<B>(B::bitwise_or(a, b))]
    }
    bitwise_or_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 131, device);
        vec![ri::<B>(B::bitwise_or_scalar(a, Scalar::Int(0b0101_0001)))]
    }
    bitwise_xor(device) {
        let a = int::<B>(&[3, 4], -100, 100, 132, device);
        let b = int::<B>(&[3, 4], -100, 100, 133, device);
        vec![ri::<B>(B::bitwise_xor(a, b))]
    }
    bitwise_xor_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 134, device);
        vec![ri::<B>(B::bitwise_xor_scalar(a, Scalar::Int(0b1110_0011)))]
    }
    bitwise_not(device) {
        let a = int::<B>(&[3, 4], -100, 100, 135, device);
        vec![ri::<B>(B::bitwise_not(a))]
    }
    bitwise_left_shift(device) {
        let a = int::<B>(&[3, 4], -100, 100, 136, device);
        let b = int::<B>(&[3, 4], 0, 8, 137, device);
        vec![ri::<B>(B::bitwise_left_shift(a, b))]
    }
    bitwise_left_shift_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 138, device);
        vec![ri::<B>(B::bitwise_left_shift_scalar(a, Scalar::Int(3)))]
    }
    bitwise_right_shift(device) {
        let a = int::<B>(&[3, 4], -100, 100, 139, device);
        let b = int::<B>(&[3, 4], 0, 8, 140, device);
        vec![ri::<B>(B::bitwise_right_shift(a, b))]
    }
    bitwise_right_shift_scalar(device) {
        let a = int::<B>(&[3, 4], -100, 100, 141, device);
        vec![ri::<B>(B::bitwise_right_shift_scalar(a, Scalar::Int(2)))]
    }
    int_cast(device) {
        let a = int::<B>(&[3, 4], -100, 100, 142, device);
        let b = int::<B>(&[3, 4], 0, 200, 143, device);
        vec![
            ri::<B>(B::int_cast(a.clone(), IntDType::I32)),
            ri::<B>(B::int_cast(a.clone(), IntDType::I16)),
            ri::<B>(B::int_cast(a, IntDType::I8)),
            ri::<B>(B::int_cast(b, IntDType::U8)),
        ]
    }
    int_unfold(device) {
        let a = int::<B>(&[2, 7], -20, 20, 144, device);
        vec![ri::<B>(B::int_unfold(a.clone(), 1, 3, 2)), ri::<B>(B::int_unfold(a, 0, 2, 1))]
    }
}

/// Runs a `(tensor, dim, out_dtype) -> bool tensor` reduction along both dims of a 2-d tensor.
fn a_dim_pair<B: Backend>(
    a: burn::tensor::ops::IntTensor<B>,
    device: &B::Device,
    op: fn(
        burn::tensor::ops::IntTensor<B>,
        usize,
        burn::tensor::BoolDType,
    ) -> burn::tensor::ops::BoolTensor<B>,
) -> Vec<Out> {
    vec![
        rb::<B>(op(a.clone(), 0, bool_dtype::<B>(device))),
        rb::<B>(op(a, 1, bool_dtype::<B>(device))),
    ]
}
