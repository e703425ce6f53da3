//! The methods of Burn's `IntTensorOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::int` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! int_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family IntTensorOps, module int, base INT_BASE;
            manual [int_device, int_into_data, int_to_device];
            fn int_empty(shape: [Shape], device: D, dtype: [IntDType]) -> I;
            fn int_from_data(data: [TensorData], device: D) -> I;
            fn int_slice_assign(tensor: I, slices: [&[Slice]], value: I) -> I;
            fn int_into_float(tensor: I, out_dtype: [FloatDType]) -> F;
            fn int_mask_where(tensor: I, mask: Bo, value: I) -> I;
            fn int_mask_fill(tensor: I, mask: Bo, value: [Scalar]) -> I;
            fn int_gather(dim: [usize], tensor: I, indices: I) -> I;
            fn int_scatter_add(dim: [usize], tensor: I, indices: I, value: I) -> I;
            fn int_scatter_nd(data: I, indices: I, values: I, reduction: [IndexingUpdateOp]) -> I;
            fn int_gather_nd(data: I, indices: I) -> I;
            fn int_select(tensor: I, dim: [usize], indices: I) -> I;
            fn int_select_add(tensor: I, dim: [usize], indices: I, value: I) -> I;
            fn int_repeat_dim(tensor: I, dim: [usize], times: [usize]) -> I;
            fn int_cat(tensors: VI, dim: [usize]) -> I;
            fn int_equal(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_not_equal(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_equal_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_not_equal_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_greater(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_greater_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_greater_equal(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_greater_equal_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_lower(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_lower_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_lower_equal(lhs: I, rhs: I, out_dtype: [BoolDType]) -> Bo;
            fn int_lower_equal_elem(lhs: I, rhs: [Scalar], out_dtype: [BoolDType]) -> Bo;
            fn int_add(lhs: I, rhs: I) -> I;
            fn int_add_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_powi(lhs: I, rhs: I) -> I;
            fn int_powi_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_powi_scalar_impl(lhs: I, rhs: [Scalar]) -> I;
            fn int_clamp_min(tensor: I, min: [Scalar]) -> I;
            fn int_clamp_max(tensor: I, max: [Scalar]) -> I;
            fn int_clamp(tensor: I, min: [Scalar], max: [Scalar]) -> I;
            fn int_sub(lhs: I, rhs: I) -> I;
            fn int_sub_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_mul(lhs: I, rhs: I) -> I;
            fn int_mul_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_div(lhs: I, rhs: I) -> I;
            fn int_div_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_remainder(lhs: I, rhs: I) -> I;
            fn int_remainder_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_matmul(lhs: I, rhs: I) -> I;
            fn int_neg(tensor: I) -> I;
            fn int_zeros(shape: [Shape], device: D, dtype: [IntDType]) -> I;
            fn int_ones(shape: [Shape], device: D, dtype: [IntDType]) -> I;
            fn int_full(shape: [Shape], fill_value: [Scalar], device: D, dtype: [IntDType]) -> I;
            fn int_sum(tensor: I) -> I;
            fn int_sum_dim(tensor: I, dim: [usize]) -> I;
            fn int_prod(tensor: I) -> I;
            fn int_prod_dim(tensor: I, dim: [usize]) -> I;
            fn int_mean(tensor: I) -> I;
            fn int_mean_dim(tensor: I, dim: [usize]) -> I;
            fn int_cumsum(tensor: I, dim: [usize]) -> I;
            fn int_cumprod(tensor: I, dim: [usize]) -> I;
            fn int_cummin(tensor: I, dim: [usize]) -> I;
            fn int_cummax(tensor: I, dim: [usize]) -> I;
            fn int_argmax(tensor: I, dim: [usize]) -> I;
            fn int_argtopk(tensor: I, dim: [usize], k: [usize]) -> I;
            fn int_topk(tensor: I, dim: [usize], k: [usize]) -> I;
            fn int_argmin(tensor: I, dim: [usize]) -> I;
            fn int_max(tensor: I) -> I;
            fn int_max_dim(tensor: I, dim: [usize]) -> I;
            fn int_max_dim_with_indices(tensor: I, dim: [usize]) -> (I, I);
            fn int_max_abs(tensor: I) -> I;
            fn int_max_abs_dim(tensor: I, dim: [usize]) -> I;
            fn int_min(tensor: I) -> I;
            fn int_min_dim(tensor: I, dim: [usize]) -> I;
            fn int_min_dim_with_indices(tensor: I, dim: [usize]) -> (I, I);
            fn int_abs(tensor: I) -> I;
            fn int_flip(tensor: I, axes: [&[usize]]) -> I;
            fn int_random(shape: [Shape], distribution: [Distribution], device: D, dtype: [IntDType]) -> I;
            fn int_arange_step(range: [Range<i64>], step: [usize], device: D, dtype: [IntDType]) -> I;
            fn int_arange(range: [Range<i64>], device: D, dtype: [IntDType]) -> I;
            fn int_any(tensor: I, out_dtype: [BoolDType]) -> Bo;
            fn int_any_dim(tensor: I, dim: [usize], out_dtype: [BoolDType]) -> Bo;
            fn int_all(tensor: I, out_dtype: [BoolDType]) -> Bo;
            fn int_all_dim(tensor: I, dim: [usize], out_dtype: [BoolDType]) -> Bo;
            fn int_sign(tensor: I) -> I;
            fn int_sort(tensor: I, dim: [usize], descending: [bool]) -> I;
            fn int_sort_with_indices(tensor: I, dim: [usize], descending: [bool]) -> (I, I);
            fn int_argsort(tensor: I, dim: [usize], descending: [bool]) -> I;
            fn bitwise_and(lhs: I, rhs: I) -> I;
            fn bitwise_and_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn bitwise_or(lhs: I, rhs: I) -> I;
            fn bitwise_or_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn bitwise_xor(lhs: I, rhs: I) -> I;
            fn bitwise_xor_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn bitwise_not(tensor: I) -> I;
            fn bitwise_left_shift(lhs: I, rhs: I) -> I;
            fn bitwise_left_shift_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn bitwise_right_shift(lhs: I, rhs: I) -> I;
            fn bitwise_right_shift_scalar(lhs: I, rhs: [Scalar]) -> I;
            fn int_cast(tensor: I, dtype: [IntDType]) -> I;
            fn int_unfold(tensor: I, dim: [usize], size: [usize], step: [usize]) -> I;
            views:
            fn int_reshape(tensor: I, shape: [Shape]) -> I;
            fn int_slice(tensor: I, slices: [&[Slice]]) -> I;
            fn int_transpose(tensor: I) -> I;
            fn int_swap_dims(tensor: I, dim1: [usize], dim2: [usize]) -> I;
            fn int_permute(tensor: I, axes: [&[usize]]) -> I;
            fn int_expand(tensor: I, shape: [Shape]) -> I;
        }
    };
}
pub(crate) use int_methods;
