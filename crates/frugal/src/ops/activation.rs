//! Forwarding of Burn's `ActivationOps`.

use burn_backend::Backend;
use burn_backend::Scalar;
use burn_backend::ops::ActivationOps;

use crate::Frugal;

crate::ops::forward_ops! {
    impl ActivationOps, base crate::ops::ACTIVATION_BASE;
    manual [] {}
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
