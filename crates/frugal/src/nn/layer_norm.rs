//! Layer norm as one autodiff node: [`layer_norm`] and a drop-in for burn-nn 0.21's
//! `LayerNorm` built on it ([`LayerNorm`], same configuration, parameters and records).

use std::any::TypeId;

use burn_core as burn;

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn_backend::{Backend, TensorPrimitive};
use burn_tensor::Tensor;

use crate::ops::layer_norm::{LayerNormArgs, lookup};
use crate::ops::registry::{boxed, unboxed};

/// Layer normalisation over the last dimension: `(x − mean) / sqrt(var + epsilon) · gamma +
/// beta`, with the biased variance, as burn-nn's `LayerNorm` computes it.
///
/// Under `Autodiff<Frugal<_>>` the call is one autodiff node that keeps the input, `gamma` and
/// each row's mean and reciprocal standard deviation, and runs Frugal's kernels on CubeCL
/// backends (one launch forward, three backward, fused or not); under `Frugal<_>` without
/// autodiff it runs the same forward. On any other backend it is Burn's own
/// `ModuleOps::layer_norm`, exactly burn-nn's layer.
///
/// Panics, naming the shapes, if `gamma` or `beta` does not have the input's last dimension.
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
) -> Tensor<B, D> {
    let width = x.dims()[D - 1];
    let fits = |t: &Tensor<B, 1>| t.dims() == [width];
    assert!(
        fits(&gamma) && beta.as_ref().is_none_or(fits),
        "frugal::nn::layer_norm: the input is {:?}, gamma {:?}, beta {:?}; gamma and beta must \
         have the input's last dimension ({width})",
        x.dims(),
        gamma.dims(),
        beta.as_ref().map(|b| b.dims()),
    );
    let Some(entry) = lookup(TypeId::of::<B>()) else {
        return layer_norm_written_out(x, gamma, beta, epsilon);
    };
    let args = LayerNormArgs {
        x: boxed(x),
        gamma: boxed(gamma),
        beta: beta.map(boxed),
        epsilon,
    };
    unboxed(entry(args))
}

/// Burn's own `ModuleOps::layer_norm`, what burn-nn's `LayerNorm` calls: under autodiff, a
/// dozen tensor ops, each its own autodiff node.
pub fn layer_norm_written_out<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::layer_norm(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.map(|b| b.into_primitive().tensor()),
        epsilon,
    )))
}

/// Configuration of a [`LayerNorm`] layer, as burn-nn's `LayerNormConfig`.
#[derive(Debug, Config)]
pub struct LayerNormConfig {
    /// The size of the input features.
    pub d_model: usize,
    /// A value required for numerical stability. Default: 1e-5
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// If a bias (beta) should be applied during the normalization. Default: true
    #[config(default = true)]
    pub bias: bool,
}

impl LayerNormConfig {
    /// A new layer: `gamma` ones, `beta` zeros.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNorm {
            gamma: Initializer::Ones.init([self.d_model], device),
            beta: self
                .bias
                .then(|| Initializer::Zeros.init([self.d_model], device)),
            epsilon: self.epsilon,
        }
    }
}

/// Layer normalisation by [`layer_norm`]: burn-nn's `LayerNorm` (same fields, so records
/// load in either), one autodiff node under `Autodiff<Frugal<_>>`.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// The learnable weight (scale).
    pub gamma: Param<Tensor<B, 1>>,
    /// The learnable bias (optional).
    pub beta: Option<Param<Tensor<B, 1>>>,
    /// A value required for numerical stability.
    pub epsilon: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// Normalises `input` over its last dimension.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        layer_norm(
            input,
            self.gamma.val(),
            self.beta.as_ref().map(|b| b.val()),
            self.epsilon,
        )
    }

    /// As [`Self::forward`], by [`layer_norm_written_out`] (burn-nn's arithmetic and autodiff).
    pub fn forward_written_out<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        layer_norm_written_out(
            input,
            self.gamma.val(),
            self.beta.as_ref().map(|b| b.val()),
            self.epsilon,
        )
    }
}
