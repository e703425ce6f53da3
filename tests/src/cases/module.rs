//! Differential cases for `ModuleOps` (see `cases/mod.rs`).

use burn::tensor::backend::Backend;
use burn::tensor::ops::{
    AttentionModuleOptions, ConvOptions, ConvTransposeOptions, DeformConvOptions, FloatTensor,
    IntTensor, InterpolateMode, InterpolateOptions, UnfoldOptions,
};

use crate::*;

/// Inputs of a CTC loss: log-probabilities `[T=6, N=2, C=5]`, targets `[N, S=3]`, input and
/// target lengths `[N]`; blank is 0.
fn ctc_inputs<B: Backend>(
    device: &B::Device,
) -> (FloatTensor<B>, IntTensor<B>, IntTensor<B>, IntTensor<B>) {
    let log_probs = B::log_softmax(float::<B>(&[6, 2, 5], 401, device), 2);
    let targets = ints::<B>(&[1, 3, 3, 2, 4, 0], &[2, 3], device);
    let input_lengths = ints::<B>(&[6, 5], &[2], device);
    let target_lengths = ints::<B>(&[3, 2], &[2], device);
    (log_probs, targets, input_lengths, target_lengths)
}

crate::cases! {
    embedding(device) {
        let weights = float::<B>(&[7, 4], 201, device);
        let indices = int::<B>(&[2, 5], 0, 7, 202, device);
        vec![rf::<B>(B::embedding(weights, indices))]
    }
    embedding_backward(device) {
        let weights = float::<B>(&[7, 4], 203, device);
        let output_grad = float::<B>(&[2, 5, 4], 204, device);
        // Repeated indices so that gradients accumulate.
        let indices = ints::<B>(&[0, 3, 3, 6, 1, 3, 2, 0, 5, 6], &[2, 5], device);
        vec![rf::<B>(B::embedding_backward(weights, output_grad, indices))]
    }
    linear(device) {
        let x = float::<B>(&[2, 3, 5], 205, device);
        let weight = float::<B>(&[5, 4], 206, device);
        let bias = float::<B>(&[4], 207, device);
        let a = B::linear(x.clone(), weight.clone(), Some(bias));
        let b = B::linear(x, weight, None);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    linear_x_backward(device) {
        let weight = float::<B>(&[5, 4], 208, device);
        let output_grad = float::<B>(&[2, 3, 4], 209, device);
        vec![rf::<B>(B::linear_x_backward(weight, output_grad))]
    }
    linear_weight_backward(device) {
        let x = float::<B>(&[2, 3, 5], 210, device);
        let output_grad = float::<B>(&[2, 3, 4], 211, device);
        vec![rf::<B>(B::linear_weight_backward(x, output_grad))]
    }
    linear_bias_backward(device) {
        let output_grad = float::<B>(&[2, 3, 4], 212, device);
        vec![rf::<B>(B::linear_bias_backward(output_grad))]
    }

    // conv1d: x [2, 4, 9], weight [6, 2, 3], groups 2, stride 2, padding 1 -> [2, 6, 5].
    conv1d(device) {
        let options = ConvOptions::new([2], [1], [1], 2);
        let x = float::<B>(&[2, 4, 9], 213, device);
        let weight = float::<B>(&[6, 2, 3], 214, device);
        let bias = float::<B>(&[6], 215, device);
        let a = B::conv1d(x.clone(), weight.clone(), Some(bias), options.clone());
        let b = B::conv1d(x, weight, None, ConvOptions::new([1], [0], [2], 2));
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv1d_x_backward(device) {
        let options = ConvOptions::new([2], [1], [1], 2);
        let x = float::<B>(&[2, 4, 9], 216, device);
        let weight = float::<B>(&[6, 2, 3], 217, device);
        let output_grad = float::<B>(&[2, 6, 5], 218, device);
        vec![rf::<B>(B::conv1d_x_backward(x, weight, output_grad, options))]
    }
    conv1d_weight_backward(device) {
        let options = ConvOptions::new([2], [1], [1], 2);
        let x = float::<B>(&[2, 4, 9], 219, device);
        let weight = float::<B>(&[6, 2, 3], 220, device);
        let output_grad = float::<B>(&[2, 6, 5], 221, device);
        vec![rf::<B>(B::conv1d_weight_backward(x, weight, output_grad, options))]
    }
    conv1d_bias_backward(device) {
        let x = float::<B>(&[2, 4, 9], 222, device);
        let bias = float::<B>(&[6], 223, device);
        let output_grad = float::<B>(&[2, 6, 5], 224, device);
        vec![rf::<B>(B::conv1d_bias_backward(x, bias, output_grad))]
    }

    // conv2d: x [2, 4, 7, 6], weight [6, 2, 3, 2], groups 2, stride [2, 1], padding [1, 0],
    // dilation [1, 2] -> [2, 6, 4, 4].
    conv2d(device) {
        let options = ConvOptions::new([2, 1], [1, 0], [1, 2], 2);
        let x = float::<B>(&[2, 4, 7, 6], 225, device);
        let weight = float::<B>(&[6, 2, 3, 2], 226, device);
        let bias = float::<B>(&[6], 227, device);
        let a = B::conv2d(x.clone(), weight.clone(), Some(bias), options);
        let b = B::conv2d(x, weight, None, ConvOptions::new([1, 1], [1, 1], [1, 1], 2));
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv2d_x_backward(device) {
        let options = ConvOptions::new([2, 1], [1, 0], [1, 2], 2);
        let x = float::<B>(&[2, 4, 7, 6], 228, device);
        let weight = float::<B>(&[6, 2, 3, 2], 229, device);
        let output_grad = float::<B>(&[2, 6, 4, 4], 230, device);
        vec![rf::<B>(B::conv2d_x_backward(x, weight, output_grad, options))]
    }
    conv2d_weight_backward(device) {
        let options = ConvOptions::new([2, 1], [1, 0], [1, 2], 2);
        let x = float::<B>(&[2, 4, 7, 6], 231, device);
        let weight = float::<B>(&[6, 2, 3, 2], 232, device);
        let output_grad = float::<B>(&[2, 6, 4, 4], 233, device);
        vec![rf::<B>(B::conv2d_weight_backward(x, weight, output_grad, options))]
    }
    conv2d_bias_backward(device) {
        let x = float::<B>(&[2, 4, 7, 6], 234, device);
        let bias = float::<B>(&[6], 235, device);
        let output_grad = float::<B>(&[2, 6, 4, 4], 236, device);
        vec![rf::<B>(B::conv2d_bias_backward(x, bias, output_grad))]
    }

    // deform_conv2d: x [1, 4, 5, 5], weight [6, 2, 3, 3] (2 weight groups), 2 offset groups,
    // stride 1, padding 1 -> [1, 6, 5, 5]; offset [1, 2*2*9, 5, 5], mask [1, 2*9, 5, 5].
    deform_conv2d(device) {
        let options = DeformConvOptions::new([1, 1], [1, 1], [1, 1], 2, 2);
        let x = float::<B>(&[1, 4, 5, 5], 237, device);
        let offset = float::<B>(&[1, 36, 5, 5], 238, device);
        let weight = float::<B>(&[6, 2, 3, 3], 239, device);
        let mask = unit::<B>(&[1, 18, 5, 5], 240, device);
        let bias = float::<B>(&[6], 241, device);
        let a = B::deform_conv2d(
            x.clone(),
            offset.clone(),
            weight.clone(),
            Some(mask),
            Some(bias),
            options.clone(),
        );
        let b = B::deform_conv2d(x, offset, weight, None, None, options);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    deform_conv2d_backward(device) {
        let options = DeformConvOptions::new([1, 1], [1, 1], [1, 1], 2, 2);
        let x = float::<B>(&[1, 4, 5, 5], 242, device);
        let offset = float::<B>(&[1, 36, 5, 5], 243, device);
        let weight = float::<B>(&[6, 2, 3, 3], 244, device);
        let mask = unit::<B>(&[1, 18, 5, 5], 245, device);
        let bias = float::<B>(&[6], 246, device);
        let output_grad = float::<B>(&[1, 6, 5, 5], 247, device);
        let grads = B::deform_conv2d_backward(
            x,
            offset,
            weight,
            Some(mask),
            Some(bias),
            output_grad,
            options,
        );
        vec![
            rf::<B>(grads.x_grad),
            rf::<B>(grads.offset_grad),
            rf::<B>(grads.weight_grad),
            rf::<B>(grads.mask_grad.expect("mask grad")),
            rf::<B>(grads.bias_grad.expect("bias grad")),
        ]
    }

    // conv3d: x [1, 2, 4, 5, 4], weight [4, 2, 2, 3, 2], padding [0, 1, 0] -> [1, 4, 3, 5, 3].
    conv3d(device) {
        let options = ConvOptions::new([1, 1, 1], [0, 1, 0], [1, 1, 1], 1);
        let x = float::<B>(&[1, 2, 4, 5, 4], 248, device);
        let weight = float::<B>(&[4, 2, 2, 3, 2], 249, device);
        let bias = float::<B>(&[4], 250, device);
        let a = B::conv3d(x.clone(), weight.clone(), Some(bias), options);
        let b = B::conv3d(
            x,
            weight,
            None,
            ConvOptions::new([2, 1, 2], [1, 0, 1], [1, 2, 1], 1),
        );
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv3d_x_backward(device) {
        let options = ConvOptions::new([1, 1, 1], [0, 1, 0], [1, 1, 1], 1);
        let x = float::<B>(&[1, 2, 4, 5, 4], 251, device);
        let weight = float::<B>(&[4, 2, 2, 3, 2], 252, device);
        let output_grad = float::<B>(&[1, 4, 3, 5, 3], 253, device);
        vec![rf::<B>(B::conv3d_x_backward(x, weight, output_grad, options))]
    }
    conv3d_weight_backward(device) {
        let options = ConvOptions::new([1, 1, 1], [0, 1, 0], [1, 1, 1], 1);
        let x = float::<B>(&[1, 2, 4, 5, 4], 254, device);
        let weight = float::<B>(&[4, 2, 2, 3, 2], 255, device);
        let output_grad = float::<B>(&[1, 4, 3, 5, 3], 256, device);
        vec![rf::<B>(B::conv3d_weight_backward(x, weight, output_grad, options))]
    }
    conv3d_bias_backward(device) {
        let x = float::<B>(&[1, 2, 4, 5, 4], 257, device);
        let bias = float::<B>(&[4], 258, device);
        let output_grad = float::<B>(&[1, 4, 3, 5, 3], 259, device);
        vec![rf::<B>(B::conv3d_bias_backward(x, bias, output_grad))]
    }

    // conv_transpose1d: x [2, 4, 5], weight [4, 2, 3], groups 2, stride 2, padding 1,
    // padding_out 1 -> [2, 4, 10].
    conv_transpose1d(device) {
        let options = ConvTransposeOptions::new([2], [1], [1], [1], 2);
        let x = float::<B>(&[2, 4, 5], 260, device);
        let weight = float::<B>(&[4, 2, 3], 261, device);
        let bias = float::<B>(&[4], 262, device);
        let a = B::conv_transpose1d(x.clone(), weight.clone(), Some(bias), options);
        let b = B::conv_transpose1d(
            x,
            weight,
            None,
            ConvTransposeOptions::new([1], [0], [0], [2], 2),
        );
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv_transpose1d_x_backward(device) {
        let options = ConvTransposeOptions::new([2], [1], [1], [1], 2);
        let weight = float::<B>(&[4, 2, 3], 263, device);
        let output_grad = float::<B>(&[2, 4, 10], 264, device);
        vec![rf::<B>(B::conv_transpose1d_x_backward(weight, output_grad, options))]
    }
    conv_transpose1d_weight_backward(device) {
        let options = ConvTransposeOptions::new([2], [1], [1], [1], 2);
        let x = float::<B>(&[2, 4, 5], 265, device);
        let weight = float::<B>(&[4, 2, 3], 266, device);
        let output_grad = float::<B>(&[2, 4, 10], 267, device);
        vec![rf::<B>(B::conv_transpose1d_weight_backward(x, weight, output_grad, options))]
    }
    conv_transpose1d_bias_backward(device) {
        let x = float::<B>(&[2, 4, 5], 268, device);
        let bias = float::<B>(&[4], 269, device);
        let output_grad = float::<B>(&[2, 4, 10], 270, device);
        vec![rf::<B>(B::conv_transpose1d_bias_backward(x, bias, output_grad))]
    }

    // conv_transpose2d: x [1, 2, 3, 4], weight [2, 3, 3, 2], stride [2, 1], padding [1, 0],
    // padding_out [1, 0], dilation [1, 2] -> [1, 3, 6, 6].
    conv_transpose2d(device) {
        let options = ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], 1);
        let x = float::<B>(&[1, 2, 3, 4], 271, device);
        let weight = float::<B>(&[2, 3, 3, 2], 272, device);
        let bias = float::<B>(&[3], 273, device);
        let a = B::conv_transpose2d(x.clone(), weight.clone(), Some(bias), options);
        let b = B::conv_transpose2d(
            x,
            weight,
            None,
            ConvTransposeOptions::new([1, 1], [0, 0], [0, 0], [1, 1], 1),
        );
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv_transpose2d_x_backward(device) {
        let options = ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], 1);
        let weight = float::<B>(&[2, 3, 3, 2], 274, device);
        let output_grad = float::<B>(&[1, 3, 6, 6], 275, device);
        vec![rf::<B>(B::conv_transpose2d_x_backward(weight, output_grad, options))]
    }
    conv_transpose2d_weight_backward(device) {
        let options = ConvTransposeOptions::new([2, 1], [1, 0], [1, 0], [1, 2], 1);
        let x = float::<B>(&[1, 2, 3, 4], 276, device);
        let weight = float::<B>(&[2, 3, 3, 2], 277, device);
        let output_grad = float::<B>(&[1, 3, 6, 6], 278, device);
        vec![rf::<B>(B::conv_transpose2d_weight_backward(x, weight, output_grad, options))]
    }
    conv_transpose2d_bias_backward(device) {
        let x = float::<B>(&[1, 2, 3, 4], 279, device);
        let bias = float::<B>(&[3], 280, device);
        let output_grad = float::<B>(&[1, 3, 6, 6], 281, device);
        vec![rf::<B>(B::conv_transpose2d_bias_backward(x, bias, output_grad))]
    }

    // conv_transpose3d: x [1, 2, 2, 3, 2], weight [2, 2, 2, 2, 2], stride [1, 2, 1],
    // padding_out [0, 1, 0] -> [1, 2, 3, 7, 3].
    conv_transpose3d(device) {
        let options = ConvTransposeOptions::new([1, 2, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], 1);
        let x = float::<B>(&[1, 2, 2, 3, 2], 282, device);
        let weight = float::<B>(&[2, 2, 2, 2, 2], 283, device);
        let bias = float::<B>(&[2], 284, device);
        let a = B::conv_transpose3d(x.clone(), weight.clone(), Some(bias), options);
        let b = B::conv_transpose3d(
            x,
            weight,
            None,
            ConvTransposeOptions::new([1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 2], 1),
        );
        vec![rf::<B>(a), rf::<B>(b)]
    }
    conv_transpose3d_x_backward(device) {
        let options = ConvTransposeOptions::new([1, 2, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], 1);
        let weight = float::<B>(&[2, 2, 2, 2, 2], 285, device);
        let output_grad = float::<B>(&[1, 2, 3, 7, 3], 286, device);
        vec![rf::<B>(B::conv_transpose3d_x_backward(weight, output_grad, options))]
    }
    conv_transpose3d_weight_backward(device) {
        let options = ConvTransposeOptions::new([1, 2, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], 1);
        let x = float::<B>(&[1, 2, 2, 3, 2], 287, device);
        let weight = float::<B>(&[2, 2, 2, 2, 2], 288, device);
        let output_grad = float::<B>(&[1, 2, 3, 7, 3], 289, device);
        vec![rf::<B>(B::conv_transpose3d_weight_backward(x, weight, output_grad, options))]
    }
    conv_transpose3d_bias_backward(device) {
        let x = float::<B>(&[1, 2, 2, 3, 2], 290, device);
        let bias = float::<B>(&[2], 291, device);
        let output_grad = float::<B>(&[1, 2, 3, 7, 3], 292, device);
        vec![rf::<B>(B::conv_transpose3d_bias_backward(x, bias, output_grad))]
    }

    unfold4d(device) {
        let x = float::<B>(&[1, 2, 5, 5], 293, device);
        // Padding: the conv2d-based path; no padding, no dilation: the float_unfold path.
        let a = B::unfold4d(x.clone(), [2, 3], UnfoldOptions::new([1, 2], [1, 0], [1, 1]));
        let b = B::unfold4d(x, [2, 2], UnfoldOptions::new([2, 1], [0, 0], [1, 1]));
        vec![rf::<B>(a), rf::<B>(b)]
    }

    // avg_pool1d: x [2, 3, 8], kernel 3, stride 2, padding 1 -> [2, 3, 4] (ceil: [2, 3, 5]).
    avg_pool1d(device) {
        let x = float::<B>(&[2, 3, 8], 294, device);
        let a = B::avg_pool1d(x.clone(), 3, 2, 1, true, false);
        let b = B::avg_pool1d(x, 3, 2, 1, false, true);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    avg_pool1d_backward(device) {
        let x = float::<B>(&[2, 3, 8], 295, device);
        let grad = float::<B>(&[2, 3, 4], 296, device);
        let a = B::avg_pool1d_backward(x.clone(), grad, 3, 2, 1, true, false);
        let grad = float::<B>(&[2, 3, 4], 297, device);
        let b = B::avg_pool1d_backward(x, grad, 3, 2, 1, false, false);
        vec![rf::<B>(a), rf::<B>(b)]
    }

    // avg_pool2d: x [1, 2, 6, 5], kernel [3, 2], stride [2, 1], padding [1, 0] -> [1, 2, 3, 4].
    avg_pool2d(device) {
        let x = float::<B>(&[1, 2, 6, 5], 298, device);
        let a = B::avg_pool2d(x.clone(), [3, 2], [2, 1], [1, 0], true, false);
        let b = B::avg_pool2d(x, [3, 2], [2, 1], [1, 0], false, false);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    avg_pool2d_backward(device) {
        let x = float::<B>(&[1, 2, 6, 5], 299, device);
        let grad = float::<B>(&[1, 2, 3, 4], 300, device);
        let a = B::avg_pool2d_backward(x.clone(), grad.clone(), [3, 2], [2, 1], [1, 0], true, false);
        let b = B::avg_pool2d_backward(x, grad, [3, 2], [2, 1], [1, 0], false, false);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    adaptive_avg_pool2d(device) {
        let x = float::<B>(&[1, 2, 7, 5], 301, device);
        vec![rf::<B>(B::adaptive_avg_pool2d(x, [3, 2]))]
    }
    adaptive_avg_pool2d_backward(device) {
        let x = float::<B>(&[1, 2, 7, 5], 302, device);
        let grad = float::<B>(&[1, 2, 3, 2], 303, device);
        vec![rf::<B>(B::adaptive_avg_pool2d_backward(x, grad))]
    }
    adaptive_avg_pool1d(device) {
        let x = float::<B>(&[2, 3, 7], 304, device);
        vec![rf::<B>(B::adaptive_avg_pool1d(x, 3))]
    }
    adaptive_avg_pool1d_backward(device) {
        let x = float::<B>(&[2, 3, 7], 305, device);
        let grad = float::<B>(&[2, 3, 3], 306, device);
        vec![rf::<B>(B::adaptive_avg_pool1d_backward(x, grad))]
    }

    // max_pool1d: x [2, 3, 9], kernel 3, stride 2, padding 1, dilation 2 -> [2, 3, 4].
    max_pool1d(device) {
        let x = float::<B>(&[2, 3, 9], 307, device);
        let a = B::max_pool1d(x.clone(), 3, 2, 1, 2, false);
        let b = B::max_pool1d(x, 2, 1, 0, 1, false);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    max_pool1d_with_indices(device) {
        let x = float::<B>(&[2, 3, 9], 308, device);
        let out = B::max_pool1d_with_indices(x, 3, 2, 1, 2, false);
        vec![rf::<B>(out.output), ri::<B>(out.indices)]
    }
    max_pool1d_with_indices_backward(device) {
        let x = float::<B>(&[2, 3, 9], 309, device);
        let indices = B::max_pool1d_with_indices(x.clone(), 3, 2, 1, 2, false).indices;
        let output_grad = float::<B>(&[2, 3, 4], 310, device);
        let grads = B::max_pool1d_with_indices_backward(x, 3, 2, 1, 2, false, output_grad, indices);
        vec![rf::<B>(grads.x_grad)]
    }

    // max_pool2d: x [1, 2, 6, 7], kernel [2, 3], stride [2, 2], padding [1, 1] -> [1, 2, 4, 4].
    max_pool2d(device) {
        let x = float::<B>(&[1, 2, 6, 7], 311, device);
        let a = B::max_pool2d(x.clone(), [2, 3], [2, 2], [1, 1], [1, 1], false);
        let b = B::max_pool2d(x, [2, 2], [1, 2], [0, 0], [2, 1], false);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    max_pool2d_with_indices(device) {
        let x = float::<B>(&[1, 2, 6, 7], 312, device);
        let out = B::max_pool2d_with_indices(x, [2, 3], [2, 2], [1, 1], [1, 1], false);
        vec![rf::<B>(out.output), ri::<B>(out.indices)]
    }
    max_pool2d_with_indices_backward(device) {
        let x = float::<B>(&[1, 2, 6, 7], 313, device);
        let indices =
            B::max_pool2d_with_indices(x.clone(), [2, 3], [2, 2], [1, 1], [1, 1], false).indices;
        let output_grad = float::<B>(&[1, 2, 4, 4], 314, device);
        let grads = B::max_pool2d_with_indices_backward(
            x,
            [2, 3],
            [2, 2],
            [1, 1],
            [1, 1],
            false,
            output_grad,
            indices,
        );
        vec![rf::<B>(grads.x_grad)]
    }

    interpolate(device) {
        let x = float::<B>(&[1, 2, 4, 5], 315, device);
        let options = [
            InterpolateOptions::new(InterpolateMode::Nearest),
            InterpolateOptions::new(InterpolateMode::Bilinear),
            InterpolateOptions::new(InterpolateMode::Bilinear).with_align_corners(false),
            InterpolateOptions::new(InterpolateMode::Bicubic),
            InterpolateOptions::new(InterpolateMode::Bicubic).with_align_corners(false),
            InterpolateOptions::new(InterpolateMode::Lanczos3),
        ];
        options
            .into_iter()
            .map(|options| rf::<B>(B::interpolate(x.clone(), [7, 3], options)))
            .collect()
    }
    interpolate_backward(device) {
        // NdArray implements the backward pass for nearest interpolation only.
        let x = float::<B>(&[1, 2, 4, 5], 316, device);
        let grad = float::<B>(&[1, 2, 7, 3], 317, device);
        let options = InterpolateOptions::new(InterpolateMode::Nearest);
        vec![rf::<B>(B::interpolate_backward(x, grad, [7, 3], options))]
    }

    // attention: q [2, 2, 3, 4], k [2, 2, 5, 4], v [2, 2, 5, 3].
    attention(device) {
        let q = float::<B>(&[2, 2, 3, 4], 318, device);
        let k = float::<B>(&[2, 2, 5, 4], 319, device);
        let v = float::<B>(&[2, 2, 5, 3], 320, device);
        let mask = boolean::<B>(&[2, 2, 3, 5], 321, device);
        let bias = float::<B>(&[2, 2, 3, 5], 322, device);
        let a = B::attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            None,
            AttentionModuleOptions::default(),
        );
        let b = B::attention(
            q.clone(),
            k.clone(),
            v.clone(),
            Some(mask),
            Some(bias),
            AttentionModuleOptions { scale: Some(0.3), softcap: Some(5.0), is_causal: false },
        );
        let c = B::attention(
            q,
            k,
            v,
            None,
            None,
            AttentionModuleOptions { scale: None, softcap: None, is_causal: true },
        );
        vec![rf::<B>(a), rf::<B>(b), rf::<B>(c)]
    }
    layer_norm(device) {
        let x = float::<B>(&[2, 3, 6], 323, device);
        let gamma = float::<B>(&[6], 324, device);
        let beta = float::<B>(&[6], 325, device);
        let a = B::layer_norm(x.clone(), gamma.clone(), Some(beta), 1e-5);
        let b = B::layer_norm(x, gamma, None, 1e-3);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    ctc_loss(device) {
        let (log_probs, targets, input_lengths, target_lengths) = ctc_inputs::<B>(device);
        vec![rf::<B>(B::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0))]
    }
    has_ctc_loss_backward(device) {
        vec![Out::value(B::has_ctc_loss_backward())]
    }
    ctc_loss_backward(device) {
        // Only meaningful where `has_ctc_loss_backward` is true; NdArray leaves it unreachable.
        let (log_probs, targets, input_lengths, target_lengths) = ctc_inputs::<B>(device);
        let grad_loss = positive::<B>(&[2], 402, device);
        vec![rf::<B>(B::ctc_loss_backward(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            grad_loss,
            0,
        ))]
    }
    rfft(device) {
        let signal = float::<B>(&[2, 8], 403, device);
        let (re, im) = B::rfft(signal, 1, None);
        vec![rf::<B>(re), rf::<B>(im)]
    }
    irfft(device) {
        // Spectrum of an 8-sample signal: 8 / 2 + 1 = 5 bins.
        let re = float::<B>(&[2, 5], 404, device);
        let im = float::<B>(&[2, 5], 405, device);
        vec![rf::<B>(B::irfft(re, im, 1, Some(8)))]
    }
}
