//! The methods of Burn's `ModuleOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::module` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! module_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family ModuleOps, module module, base MODULE_BASE;
            manual [];
            fn embedding(weights: F, indices: I) -> F;
            fn embedding_backward(weights: F, output_grad: F, indices: I) -> F via embedding_backward;
            fn linear(x: F, weight: F, bias: OF) -> F via linear;
            fn linear_x_backward(weight: F, output_grad: F) -> F via linear_x_backward;
            fn linear_weight_backward(x: F, output_grad: F) -> F via linear_weight_backward;
            fn linear_bias_backward(output_grad: F) -> F;
            fn conv1d(x: F, weight: F, bias: OF, options: [ConvOptions<1>]) -> F;
            fn conv1d_x_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<1>]) -> F;
            fn conv1d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<1>]) -> F;
            fn conv1d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn conv2d(x: F, weight: F, bias: OF, options: [ConvOptions<2>]) -> F via conv2d;
            fn conv2d_x_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<2>]) -> F via conv2d_x_backward;
            fn conv2d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<2>]) -> F via conv2d_weight_backward;
            fn conv2d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn deform_conv2d(x: F, offset: F, weight: F, mask: OF, bias: OF, options: [DeformConvOptions<2>]) -> F;
            fn deform_conv2d_backward(x: F, offset: F, weight: F, mask: OF, bias: OF, output_grad: F, options: [DeformConvOptions<2>]) -> DeformConv2dBackward;
            fn conv3d(x: F, weight: F, bias: OF, options: [ConvOptions<3>]) -> F;
            fn conv3d_x_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<3>]) -> F;
            fn conv3d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvOptions<3>]) -> F;
            fn conv3d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn conv_transpose1d(x: F, weight: F, bias: OF, options: [ConvTransposeOptions<1>]) -> F;
            fn conv_transpose1d_x_backward(weight: F, output_grad: F, options: [ConvTransposeOptions<1>]) -> F;
            fn conv_transpose1d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvTransposeOptions<1>]) -> F;
            fn conv_transpose1d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn conv_transpose2d(x: F, weight: F, bias: OF, options: [ConvTransposeOptions<2>]) -> F;
            fn conv_transpose2d_x_backward(weight: F, output_grad: F, options: [ConvTransposeOptions<2>]) -> F;
            fn conv_transpose2d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvTransposeOptions<2>]) -> F;
            fn conv_transpose2d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn conv_transpose3d(x: F, weight: F, bias: OF, options: [ConvTransposeOptions<3>]) -> F;
            fn conv_transpose3d_x_backward(weight: F, output_grad: F, options: [ConvTransposeOptions<3>]) -> F;
            fn conv_transpose3d_weight_backward(x: F, weight: F, output_grad: F, options: [ConvTransposeOptions<3>]) -> F;
            fn conv_transpose3d_bias_backward(x: F, bias: F, output_grad: F) -> F;
            fn unfold4d(x: F, kernel_size: [[usize; 2]], options: [UnfoldOptions]) -> F;
            fn avg_pool1d(x: F, kernel_size: [usize], stride: [usize], padding: [usize], count_include_pad: [bool], ceil_mode: [bool]) -> F;
            fn avg_pool1d_backward(x: F, grad: F, kernel_size: [usize], stride: [usize], padding: [usize], count_include_pad: [bool], ceil_mode: [bool]) -> F;
            fn avg_pool2d(x: F, kernel_size: [[usize; 2]], stride: [[usize; 2]], padding: [[usize; 2]], count_include_pad: [bool], ceil_mode: [bool]) -> F;
            fn avg_pool2d_backward(x: F, grad: F, kernel_size: [[usize; 2]], stride: [[usize; 2]], padding: [[usize; 2]], count_include_pad: [bool], ceil_mode: [bool]) -> F;
            fn adaptive_avg_pool2d(x: F, output_size: [[usize; 2]]) -> F;
            fn adaptive_avg_pool2d_backward(x: F, grad: F) -> F;
            fn adaptive_avg_pool1d(x: F, output_size: [usize]) -> F;
            fn adaptive_avg_pool1d_backward(x: F, grad: F) -> F;
            fn max_pool1d(x: F, kernel_size: [usize], stride: [usize], padding: [usize], dilation: [usize], ceil_mode: [bool]) -> F;
            fn max_pool1d_with_indices(x: F, kernel_size: [usize], stride: [usize], padding: [usize], dilation: [usize], ceil_mode: [bool]) -> MaxPool1dWithIndices;
            fn max_pool1d_with_indices_backward(x: F, kernel_size: [usize], stride: [usize], padding: [usize], dilation: [usize], ceil_mode: [bool], output_grad: F, indices: I) -> MaxPool1dBackward;
            fn max_pool2d(x: F, kernel_size: [[usize; 2]], stride: [[usize; 2]], padding: [[usize; 2]], dilation: [[usize; 2]], ceil_mode: [bool]) -> F;
            fn max_pool2d_with_indices(x: F, kernel_size: [[usize; 2]], stride: [[usize; 2]], padding: [[usize; 2]], dilation: [[usize; 2]], ceil_mode: [bool]) -> MaxPool2dWithIndices;
            fn max_pool2d_with_indices_backward(x: F, kernel_size: [[usize; 2]], stride: [[usize; 2]], padding: [[usize; 2]], dilation: [[usize; 2]], ceil_mode: [bool], output_grad: F, indices: I) -> MaxPool2dBackward;
            fn interpolate(x: F, output_size: [[usize; 2]], options: [InterpolateOptions]) -> F;
            fn interpolate_backward(x: F, grad: F, output_size: [[usize; 2]], options: [InterpolateOptions]) -> F;
            fn attention(query: F, key: F, value: F, mask: OBo, attn_bias: OF, options: [AttentionModuleOptions]) -> F;
            fn layer_norm(tensor: F, gamma: F, beta: OF, epsilon: [f64]) -> F;
            fn ctc_loss(log_probs: F, targets: I, input_lengths: I, target_lengths: I, blank: [usize]) -> F;
            fn has_ctc_loss_backward() -> [bool];
            fn ctc_loss_backward(log_probs: F, targets: I, input_lengths: I, target_lengths: I, grad_loss: F, blank: [usize]) -> F;
            fn rfft(signal: F, dim: [usize], n: [Option<usize>]) -> (F, F);
            fn irfft(spectrum_re: F, spectrum_im: F, dim: [usize], n: [Option<usize>]) -> F;
            views:
        }
    };
}
pub(crate) use module_methods;
