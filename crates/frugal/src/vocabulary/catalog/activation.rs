//! The methods of Burn's `ActivationOps`, in op-id order, in the signature language of
//! [`crate::ops`]. Read twice: by `crate::vocabulary::declare_family!` for the ids and names, and by
//! the forwarding macro of `crate::ops::activation` for the implementations.

/// Expands to `$callback! { $head... }` followed by the family's method list.
macro_rules! activation_methods {
    ($callback:ident! { $($head:tt)* }) => {
        $callback! {
            $($head)*
            family ActivationOps, module activation, base ACTIVATION_BASE;
            manual [];
            fn leaky_relu(tensor: F, negative_slope: [Scalar]) -> F;
            fn relu(tensor: F) -> F;
            fn relu_backward(output: F, grad: F) -> F;
            fn gelu(tensor: F) -> F;
            fn prelu(tensor: F, alpha: F) -> F;
            fn gelu_backward(x: F, grad: F) -> F;
            fn sigmoid(tensor: F) -> F;
            fn sigmoid_backward(output: F, grad: F) -> F;
            fn hard_sigmoid(tensor: F, alpha: [Scalar], beta: [Scalar]) -> F;
            fn log_sigmoid(tensor: F) -> F;
            fn softmax(tensor: F, dim: [usize]) -> F;
            fn log_softmax(tensor: F, dim: [usize]) -> F;
            fn softmin(tensor: F, dim: [usize]) -> F;
            fn log_sigmoid_backward(x: F, grad: F) -> F;
            views:
        }
    };
}
pub(crate) use activation_methods;
