//! Differential cases for `ActivationOps` (see `cases/mod.rs`).

use burn::tensor::Scalar;

use crate::*;

crate::cases! {
    leaky_relu(device) {
        let t = float::<B>(&[3, 5], 101, device);
        vec![rf::<B>(B::leaky_relu(t, Scalar::Float(0.01)))]
    }
    relu(device) {
        vec![rf::<B>(B::relu(float::<B>(&[4, 4], 102, device)))]
    }
    relu_backward(device) {
        let output = B::relu(float::<B>(&[3, 4], 103, device));
        let grad = float::<B>(&[3, 4], 104, device);
        vec![rf::<B>(B::relu_backward(output, grad))]
    }
    gelu(device) {
        vec![rf::<B>(B::gelu(float::<B>(&[2, 3, 4], 105, device)))]
    }
    prelu(device) {
        let t = float::<B>(&[3, 4], 106, device);
        let alpha = positive::<B>(&[3, 4], 107, device);
        vec![rf::<B>(B::prelu(t, alpha))]
    }
    gelu_backward(device) {
        let x = float::<B>(&[3, 4], 108, device);
        let grad = float::<B>(&[3, 4], 109, device);
        vec![rf::<B>(B::gelu_backward(x, grad))]
    }
    sigmoid(device) {
        vec![rf::<B>(B::sigmoid(float::<B>(&[3, 5], 110, device)))]
    }
    sigmoid_backward(device) {
        let output = B::sigmoid(float::<B>(&[3, 4], 111, device));
        let grad = float::<B>(&[3, 4], 112, device);
        vec![rf::<B>(B::sigmoid_backward(output, grad))]
    }
    hard_sigmoid(device) {
        let t = float::<B>(&[3, 5], 113, device);
        vec![rf::<B>(B::hard_sigmoid(t, Scalar::Float(0.2), Scalar::Float(0.5)))]
    }
    log_sigmoid(device) {
        vec![rf::<B>(B::log_sigmoid(float::<B>(&[3, 5], 114, device)))]
    }
    softmax(device) {
        let t = float::<B>(&[2, 3, 4], 115, device);
        let a = B::softmax(t.clone(), 2);
        let b = B::softmax(t, 0);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    log_softmax(device) {
        let t = float::<B>(&[2, 3, 4], 116, device);
        let a = B::log_softmax(t.clone(), 2);
        let b = B::log_softmax(t, 1);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    softmin(device) {
        let t = float::<B>(&[2, 3, 4], 117, device);
        let a = B::softmin(t.clone(), 2);
        let b = B::softmin(t, 0);
        vec![rf::<B>(a), rf::<B>(b)]
    }
    log_sigmoid_backward(device) {
        let x = float::<B>(&[3, 4], 118, device);
        let grad = float::<B>(&[3, 4], 119, device);
        vec![rf::<B>(B::log_sigmoid_backward(x, grad))]
    }
}
