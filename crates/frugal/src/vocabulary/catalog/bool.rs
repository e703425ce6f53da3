//! The methods of Burn's `BoolTensorOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::bool` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! bool_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family BoolTensorOps, module bool, base BOOL_BASE;
            manual [bool_device, bool_into_data, bool_argwhere, bool_to_device];
            fn bool_empty(shape: [Shape], device: D, dtype: [BoolDType]) -> Bo;
            fn bool_zeros(shape: [Shape], device: D, dtype: [BoolDType]) -> Bo;
            fn bool_ones(shape: [Shape], device: D, dtype: [BoolDType]) -> Bo;
            fn bool_from_data(data: [TensorData], device: D) -> Bo;
            fn bool_into_int(tensor: Bo, out_dtype: [IntDType]) -> I;
            fn bool_into_float(tensor: Bo, out_dtype: [FloatDType]) -> F;
            fn bool_slice_assign(tensor: Bo, slices: [&[Slice]], value: Bo) -> Bo;
            fn bool_mask_where(tensor: Bo, mask: Bo, value: Bo) -> Bo;
            fn bool_mask_fill(tensor: Bo, mask: Bo, value: [Scalar]) -> Bo;
            fn bool_gather(dim: [usize], tensor: Bo, indices: I) -> Bo;
            fn bool_scatter_or(dim: [usize], tensor: Bo, indices: I, value: Bo) -> Bo;
            fn bool_select(tensor: Bo, dim: [usize], indices: I) -> Bo;
            fn bool_select_or(tensor: Bo, dim: [usize], indices: I, value: Bo) -> Bo;
            fn bool_repeat_dim(tensor: Bo, dim: [usize], times: [usize]) -> Bo;
            fn bool_cat(tensors: VBo, dim: [usize]) -> Bo;
            fn bool_equal(lhs: Bo, rhs: Bo) -> Bo;
            fn bool_not_equal(lhs: Bo, rhs: Bo) -> Bo;
            fn bool_equal_elem(lhs: Bo, rhs: [Scalar]) -> Bo;
            fn bool_not_equal_elem(lhs: Bo, rhs: [Scalar]) -> Bo;
            fn bool_not(tensor: Bo) -> Bo;
            fn bool_and(lhs: Bo, rhs: Bo) -> Bo;
            fn bool_or(lhs: Bo, rhs: Bo) -> Bo;
            fn bool_xor(lhs: Bo, rhs: Bo) -> Bo;
            fn bool_flip(tensor: Bo, axes: [&[usize]]) -> Bo;
            fn bool_any(tensor: Bo) -> Bo;
            fn bool_any_dim(tensor: Bo, dim: [usize]) -> Bo;
            fn bool_all(tensor: Bo) -> Bo;
            fn bool_all_dim(tensor: Bo, dim: [usize]) -> Bo;
            fn bool_unfold(tensor: Bo, dim: [usize], size: [usize], step: [usize]) -> Bo;
            views:
            fn bool_reshape(tensor: Bo, shape: [Shape]) -> Bo;
            fn bool_slice(tensor: Bo, slices: [&[Slice]]) -> Bo;
            fn bool_transpose(tensor: Bo) -> Bo;
            fn bool_swap_dims(tensor: Bo, dim1: [usize], dim2: [usize]) -> Bo;
            fn bool_permute(tensor: Bo, axes: [&[usize]]) -> Bo;
            fn bool_expand(tensor: Bo, shape: [Shape]) -> Bo;
        }
    };
}
pub(crate) use bool_methods;
