//! Differential cases for `BoolTensorOps` (see `cases/mod.rs`).

use burn::tensor::backend::Backend;
use burn::tensor::ops::BoolTensor;
use burn::tensor::{Scalar, Slice, TensorData, TensorMetadata};

use crate::*;

/// A bool tensor with the given values.
fn bools<B: Backend>(values: &[bool], dims: &[usize], device: &B::Device) -> BoolTensor<B> {
    B::bool_from_data(TensorData::new(values.to_vec(), dims.to_vec()), device)
}

crate::cases! {
    bool_empty(device) {
        // Contents are unspecified; compare shape and dtype only.
        let t = B::bool_empty(shape(&[3, 4]), device, bool_dtype::<B>(device));
        vec![Out::value(t.shape()), Out::value(t.dtype())]
    }
    bool_zeros(device) {
        vec![rb::<B>(B::bool_zeros(shape(&[2, 3, 4]), device, bool_dtype::<B>(device)))]
    }
    bool_ones(device) {
        vec![rb::<B>(B::bool_ones(shape(&[5, 2]), device, bool_dtype::<B>(device)))]
    }
    bool_into_data(device) {
        let t = boolean::<B>(&[3, 5], 11, device);
        let data = burn::tensor::read_sync(B::bool_into_data(t)).expect("bool read");
        vec![Out::data(data)]
    }
    bool_from_data(device) {
        let data = TensorData::new(vec![true, false, false, true, true, false], vec![2, 3]);
        vec![rb::<B>(B::bool_from_data(data, device))]
    }
    bool_into_int(device) {
        let t = boolean::<B>(&[4, 3], 12, device);
        vec![ri::<B>(B::bool_into_int(t, int_dtype::<B>(device)))]
    }
    bool_into_float(device) {
        let t = boolean::<B>(&[4, 3], 13, device);
        vec![rf::<B>(B::bool_into_float(t, float_dtype::<B>(device)))]
    }
    bool_device(device) {
        let t = boolean::<B>(&[2, 2], 14, device);
        vec![Out::device(B::bool_device(&t))]
    }
    bool_to_device(device) {
        let t = boolean::<B>(&[3, 3], 15, device);
        vec![rb::<B>(B::bool_to_device(t, device))]
    }
    bool_argwhere(device) {
        let t = boolean::<B>(&[3, 4, 2], 16, device);
        let indices = burn::tensor::read_sync(B::bool_argwhere(t, int_dtype::<B>(device)));
        vec![ri::<B>(indices)]
    }
    bool_slice_assign(device) {
        let t = boolean::<B>(&[4, 6], 17, device);
        let value = boolean::<B>(&[2, 3], 18, device);
        let slices = [Slice::new(1, Some(3), 1), Slice::new(0, Some(6), 2)];
        vec![rb::<B>(B::bool_slice_assign(t, &slices, value))]
    }
    bool_mask_where(device) {
        let t = boolean::<B>(&[3, 5], 19, device);
        let mask = boolean::<B>(&[3, 5], 20, device);
        let value = boolean::<B>(&[3, 5], 21, device);
        vec![rb::<B>(B::bool_mask_where(t, mask, value))]
    }
    bool_mask_fill(device) {
        let t = boolean::<B>(&[3, 5], 22, device);
        let mask = boolean::<B>(&[3, 5], 23, device);
        let a = B::bool_mask_fill(t.clone(), mask.clone(), Scalar::Bool(true));
        let b = B::bool_mask_fill(t, mask, Scalar::Bool(false));
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_gather(device) {
        let t = boolean::<B>(&[3, 4], 24, device);
        let indices = int::<B>(&[3, 5], 0, 4, 25, device);
        let a = B::bool_gather(1, t.clone(), indices);
        let indices = int::<B>(&[2, 4], 0, 3, 26, device);
        let b = B::bool_gather(0, t, indices);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_scatter_or(device) {
        let t = boolean::<B>(&[3, 4], 27, device);
        let indices = int::<B>(&[3, 4], 0, 4, 28, device);
        let value = boolean::<B>(&[3, 4], 29, device);
        vec![rb::<B>(B::bool_scatter_or(1, t, indices, value))]
    }
    bool_select(device) {
        let t = boolean::<B>(&[4, 3], 30, device);
        let indices = ints::<B>(&[3, 0, 0, 2, 1], &[5], device);
        vec![rb::<B>(B::bool_select(t, 0, indices))]
    }
    bool_select_or(device) {
        let t = boolean::<B>(&[3, 5], 31, device);
        let indices = ints::<B>(&[4, 1, 4], &[3], device);
        let value = boolean::<B>(&[3, 3], 32, device);
        vec![rb::<B>(B::bool_select_or(t, 1, indices, value))]
    }
    bool_repeat_dim(device) {
        let t = boolean::<B>(&[2, 3], 33, device);
        let a = B::bool_repeat_dim(t.clone(), 0, 3);
        let b = B::bool_repeat_dim(t, 1, 2);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_cat(device) {
        let a = boolean::<B>(&[2, 3], 34, device);
        let b = boolean::<B>(&[1, 3], 35, device);
        let c = boolean::<B>(&[4, 3], 36, device);
        vec![rb::<B>(B::bool_cat(vec![a, b, c], 0))]
    }
    bool_equal(device) {
        let a = boolean::<B>(&[3, 4], 37, device);
        let b = boolean::<B>(&[3, 4], 38, device);
        vec![rb::<B>(B::bool_equal(a, b))]
    }
    bool_not_equal(device) {
        let a = boolean::<B>(&[3, 4], 39, device);
        let b = boolean::<B>(&[3, 4], 40, device);
        vec![rb::<B>(B::bool_not_equal(a, b))]
    }
    bool_equal_elem(device) {
        let t = boolean::<B>(&[3, 4], 41, device);
        let a = B::bool_equal_elem(t.clone(), Scalar::Bool(true));
        let b = B::bool_equal_elem(t, Scalar::Bool(false));
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_not_equal_elem(device) {
        let t = boolean::<B>(&[3, 4], 42, device);
        let a = B::bool_not_equal_elem(t.clone(), Scalar::Bool(true));
        let b = B::bool_not_equal_elem(t, Scalar::Bool(false));
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_not(device) {
        vec![rb::<B>(B::bool_not(boolean::<B>(&[2, 5], 43, device)))]
    }
    bool_and(device) {
        let a = boolean::<B>(&[3, 4], 44, device);
        let b = boolean::<B>(&[3, 4], 45, device);
        vec![rb::<B>(B::bool_and(a, b))]
    }
    bool_or(device) {
        let a = boolean::<B>(&[3, 4], 46, device);
        let b = boolean::<B>(&[3, 4], 47, device);
        vec![rb::<B>(B::bool_or(a, b))]
    }
    bool_xor(device) {
        let a = boolean::<B>(&[3, 4], 48, device);
        let b = boolean::<B>(&[3, 4], 49, device);
        vec![rb::<B>(B::bool_xor(a, b))]
    }
    bool_flip(device) {
        let t = boolean::<B>(&[2, 3, 4], 50, device);
        let a = B::bool_flip(t.clone(), &[0, 2]);
        let b = B::bool_flip(t, &[1]);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_any(device) {
        let a = B::bool_any(boolean::<B>(&[3, 4], 51, device));
        let b = B::bool_any(B::bool_zeros(shape(&[2, 2]), device, bool_dtype::<B>(device)));
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_any_dim(device) {
        let t = bools::<B>(
            &[false, false, true, false, false, false, true, true, false, false, false, false],
            &[3, 4],
            device,
        );
        let a = B::bool_any_dim(t.clone(), 0);
        let b = B::bool_any_dim(t, 1);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_all(device) {
        let a = B::bool_all(boolean::<B>(&[3, 4], 52, device));
        let b = B::bool_all(B::bool_ones(shape(&[2, 2]), device, bool_dtype::<B>(device)));
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_all_dim(device) {
        let t = bools::<B>(
            &[true, true, false, true, true, true, true, true, false, true, true, true],
            &[3, 4],
            device,
        );
        let a = B::bool_all_dim(t.clone(), 0);
        let b = B::bool_all_dim(t, 1);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_unfold(device) {
        let t = boolean::<B>(&[2, 7, 2], 53, device);
        vec![rb::<B>(B::bool_unfold(t, 1, 3, 2))]
    }
    bool_reshape(device) {
        let t = boolean::<B>(&[2, 6], 54, device);
        vec![rb::<B>(B::bool_reshape(t, shape(&[3, 2, 2])))]
    }
    bool_slice(device) {
        let t = boolean::<B>(&[4, 6], 55, device);
        let slices = [Slice::new(1, Some(4), 1), Slice::new(0, None, 2)];
        let a = B::bool_slice(t.clone(), &slices);
        let b = B::bool_slice(t, &[Slice::new(0, None, -1)]);
        vec![rb::<B>(a), rb::<B>(b)]
    }
    bool_transpose(device) {
        let t = boolean::<B>(&[2, 3, 4], 56, device);
        vec![rb::<B>(B::bool_transpose(t))]
    }
    bool_swap_dims(device) {
        let t = boolean::<B>(&[2, 3, 4], 57, device);
        vec![rb::<B>(B::bool_swap_dims(t, 0, 2))]
    }
    bool_permute(device) {
        let t = boolean::<B>(&[2, 3, 4], 58, device);
        vec![rb::<B>(B::bool_permute(t, &[1, 2, 0]))]
    }
    bool_expand(device) {
        let t = boolean::<B>(&[3, 1], 59, device);
        vec![rb::<B>(B::bool_expand(t, shape(&[2, 3, 4])))]
    }
}
