//! The methods of Burn's `QTensorOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::qtensor` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! qtensor_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family QTensorOps, module qtensor, base Q_BASE;
            manual [q_device, q_into_data, q_to_device];
            fn q_from_data(data: [TensorData], device: D) -> Q;
            fn quantize(tensor: F, scheme: [&QuantScheme], qparams: QP) -> Q;
            fn quantize_dynamic(tensor: F, scheme: [&QuantScheme]) -> Q;
            fn dequantize(tensor: Q, dtype: [FloatDType]) -> F;
            fn q_is_require_grad(tensor: RQ) -> [bool];
            fn q_flip(tensor: Q, axes: [&[usize]]) -> Q;
            fn q_select(tensor: Q, dim: [usize], indices: I) -> Q;
            fn q_gather(dim: [usize], tensor: Q, indices: I) -> Q;
            fn q_repeat_dim(tensor: Q, dim: [usize], times: [usize]) -> Q;
            fn q_add(lhs: Q, rhs: Q) -> TP;
            fn q_add_scalar(lhs: Q, rhs: [Scalar]) -> TP;
            fn q_clamp_min(tensor: Q, min: [Scalar]) -> TP;
            fn q_clamp_max(tensor: Q, max: [Scalar]) -> TP;
            fn q_clamp(tensor: Q, min: [Scalar], max: [Scalar]) -> TP;
            fn q_sub(lhs: Q, rhs: Q) -> TP;
            fn q_sub_scalar(lhs: Q, rhs: [Scalar]) -> TP;
            fn q_mul(lhs: Q, rhs: Q) -> TP;
            fn q_mul_scalar(lhs: Q, rhs: [Scalar]) -> TP;
            fn q_div(lhs: Q, rhs: Q) -> TP;
            fn q_div_scalar(lhs: Q, rhs: [Scalar]) -> TP;
            fn q_matmul(lhs: TP, rhs: TP) -> TP;
            fn q_neg(tensor: Q) -> TP;
            fn q_recip(tensor: Q) -> TP;
            fn q_sum(tensor: Q) -> TP;
            fn q_sum_dim(tensor: Q, dim: [usize]) -> TP;
            fn q_prod(tensor: Q) -> TP;
            fn q_prod_dim(tensor: Q, dim: [usize]) -> TP;
            fn q_mean(tensor: Q) -> TP;
            fn q_mean_dim(tensor: Q, dim: [usize]) -> TP;
            fn q_cumsum(tensor: Q, dim: [usize]) -> TP;
            fn q_cumprod(tensor: Q, dim: [usize]) -> TP;
            fn q_cummin(tensor: Q, dim: [usize]) -> TP;
            fn q_cummax(tensor: Q, dim: [usize]) -> TP;
            fn q_exp(tensor: Q) -> TP;
            fn q_log(tensor: Q) -> TP;
            fn q_log1p(tensor: Q) -> TP;
            fn q_powf(lhs: Q, rhs: Q) -> TP;
            fn q_powi(lhs: Q, rhs: I) -> TP;
            fn q_powi_scalar(lhs: Q, rhs: [Scalar]) -> TP;
            fn q_powf_scalar(tensor: Q, value: [Scalar]) -> TP;
            fn q_sqrt(tensor: Q) -> TP;
            fn q_abs(tensor: Q) -> Q;
            fn q_cos(tensor: Q) -> TP;
            fn q_sin(tensor: Q) -> TP;
            fn q_tan(tensor: Q) -> TP;
            fn q_cosh(tensor: Q) -> TP;
            fn q_sinh(tensor: Q) -> TP;
            fn q_tanh(tensor: Q) -> TP;
            fn q_erf(tensor: Q) -> TP;
            fn q_cat(tensors: VQ, dim: [usize]) -> Q;
            fn q_argmax(tensor: Q, dim: [usize], out_dtype: [IntDType]) -> I;
            fn q_argtopk(tensor: Q, dim: [usize], k: [usize], out_dtype: [IntDType]) -> I;
            fn q_topk(tensor: Q, dim: [usize], k: [usize]) -> Q;
            fn q_argmin(tensor: Q, dim: [usize], out_dtype: [IntDType]) -> I;
            fn q_max(tensor: Q) -> Q;
            fn q_max_dim(tensor: Q, dim: [usize]) -> Q;
            fn q_max_dim_with_indices(tensor: Q, dim: [usize], out_dtype: [IntDType]) -> (Q, I);
            fn q_min(tensor: Q) -> Q;
            fn q_min_dim(tensor: Q, dim: [usize]) -> Q;
            fn q_min_dim_with_indices(tensor: Q, dim: [usize], out_dtype: [IntDType]) -> (Q, I);
            fn q_max_abs(tensor: Q) -> Q;
            fn q_max_abs_dim(tensor: Q, dim: [usize]) -> Q;
            fn q_any(tensor: Q, out_dtype: [BoolDType]) -> Bo;
            fn q_any_dim(tensor: Q, dim: [usize], out_dtype: [BoolDType]) -> Bo;
            fn q_all(tensor: Q, out_dtype: [BoolDType]) -> Bo;
            fn q_all_dim(tensor: Q, dim: [usize], out_dtype: [BoolDType]) -> Bo;
            fn q_sort(tensor: Q, dim: [usize], descending: [bool]) -> Q;
            fn q_sort_with_indices(tensor: Q, dim: [usize], descending: [bool], out_dtype: [IntDType]) -> (Q, I);
            fn q_argsort(tensor: Q, dim: [usize], descending: [bool], out_dtype: [IntDType]) -> I;
            views:
            fn q_reshape(tensor: Q, shape: [Shape]) -> Q;
            fn q_detach(tensor: Q) -> Q;
            fn q_set_require_grad(tensor: Q, require_grad: [bool]) -> Q;
            fn q_expand(tensor: Q, shape: [Shape]) -> Q;
            fn q_transpose(tensor: Q) -> Q;
            fn q_swap_dims(tensor: Q, dim1: [usize], dim2: [usize]) -> Q;
            fn q_permute(tensor: Q, axes: [&[usize]]) -> Q;
            fn q_slice(tensor: Q, slices: [&[Slice]]) -> Q;
        }
    };
}
pub(crate) use qtensor_methods;
