//! Layer 9, neural-network building blocks for models generic over `B: Backend`: attention
//! that stores no `seq × seq` tensor for the backward pass ([`attention`], and
//! [`attention_packed`] over one projection's packed q, k and v) and a drop-in for
//! burn-nn's `MultiHeadAttention` built on it ([`MultiHeadAttention`]); layer norm as one
//! autodiff node ([`layer_norm()`], [`LayerNorm`]); a vocabulary head and its cross-entropy that
//! never hold the whole logits ([`linear_cross_entropy()`]). Owns the public functions and
//! modules; the implementations are registered by `Frugal<B>` in `crate::ops::attention`,
//! `crate::ops::layer_norm` and `crate::ops::linear_cross_entropy`, which it imports with
//! `crate::ops::registry`'s boxing helpers and nothing else of the crate.
//!
//! Under `Autodiff<Frugal<B>>` (either checkpoint strategy) [`attention`] records one autodiff
//! node that keeps q, k, v, the output and each query row's logsumexp, and computes with
//! Frugal's flash-attention kernels on CubeCL backends (CUDA, wgpu; fused or not), else block
//! by block with the backend's own ops. Under `Frugal<B>` without autodiff it runs the same
//! forward. On any other backend (`Autodiff<Cuda>`, `NdArray`, ...) it computes the written-out
//! attention ([`attention_written_out`]), exactly what a model writes by hand today.

mod layer_norm;
mod linear_cross_entropy;
mod mha;

use std::any::TypeId;

use burn_backend::Backend;
use burn_tensor::{Bool, Tensor};

use crate::ops::attention::{AttentionArgs, AttentionInputs, lookup};
use crate::ops::registry::{boxed, unboxed};

pub use layer_norm::{LayerNorm, LayerNormConfig, layer_norm, layer_norm_written_out};
pub use linear_cross_entropy::{linear_cross_entropy, linear_cross_entropy_written_out};
pub use mha::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig};

/// Masking, bias and scale of an [`attention`] call.
#[derive(Clone, Debug)]
pub struct AttentionOptions<B: Backend> {
    /// Mask every key after the query (key `j > i`), aligned at the top left.
    pub causal: bool,
    /// The factor on `q kᵀ`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Masked pairs are `true`; shape `[batch | 1, heads | 1, seq_q | 1, seq_k]`.
    pub mask: Option<Tensor<B, 4, Bool>>,
    /// Added to the scaled scores; shape as `mask`. It gets a gradient only through the
    /// written-out path, which [`attention`] takes when the bias requires one.
    pub bias: Option<Tensor<B, 4>>,
}

impl<B: Backend> Default for AttentionOptions<B> {
    fn default() -> Self {
        Self {
            causal: false,
            scale: None,
            mask: None,
            bias: None,
        }
    }
}

impl<B: Backend> AttentionOptions<B> {
    /// No mask, no bias, the default scale.
    pub fn new() -> Self {
        Self::default()
    }

    /// Causal masking (a decoder's self-attention).
    pub fn causal() -> Self {
        Self {
            causal: true,
            ..Self::default()
        }
    }

    /// With a boolean mask (`true`: masked).
    pub fn with_mask(mut self, mask: Tensor<B, 4, Bool>) -> Self {
        self.mask = Some(mask);
        self
    }

    /// With an additive bias on the scores.
    pub fn with_bias(mut self, bias: Tensor<B, 4>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// With a scale other than `1 / sqrt(head_dim)`.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }
}

/// Scaled dot-product attention, `softmax(scale · q kᵀ + bias, masked) · v`, for q
/// `[batch, heads, seq_q, head_dim]` and k, v `[batch, heads, seq_k, head_dim]`.
///
/// Under `Autodiff<Frugal<_>>` the backward pass keeps only q, k, v, the output and one
/// logsumexp per query row (see the module docs); elsewhere it is [`attention_written_out`].
/// A query row whose every key is masked gives 0 on the fused paths (the written-out softmax
/// gives NaN there). Panics, as Burn's products do, if the shapes do not agree.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Tensor<B, 4> {
    let [batch, heads, _, head_dim] = q.dims();
    let [kb, kh, seq_k, kd] = k.dims();
    assert!(
        [kb, kh, kd] == [batch, heads, head_dim] && v.dims() == k.dims(),
        "frugal::nn::attention: q is {:?}, k {:?} and v {:?}; accepted: q [batch, heads, \
         seq_q, head_dim], k and v [batch, heads, seq_k, head_dim]",
        q.dims(),
        k.dims(),
        v.dims()
    );
    let Some(entry) = lookup(TypeId::of::<B>()) else {
        return attention_written_out(q, k, v, options);
    };
    if options.bias.as_ref().is_some_and(|b| b.is_require_grad()) {
        return attention_written_out(q, k, v, options);
    }
    let causal = options.causal;
    let (bias, scale) = fused_bias_and_scale(options, q.dtype(), &q.device(), head_dim, seq_k);
    let args = AttentionArgs {
        inputs: AttentionInputs::Separate {
            q: boxed(q),
            k: boxed(k),
            v: boxed(v),
        },
        bias: bias.map(boxed),
        causal,
        scale,
    };
    unboxed(entry(args))
}

/// [`attention`] over q, k and v packed side by side, as one projection of width
/// `3 · heads · head_dim` makes them: `qkv` is `[batch, seq, 3 · heads · head_dim]` (q, then k,
/// then v along the last dimension), and the output `[batch, seq, heads · head_dim]`, the heads
/// merged.
///
/// The same as slicing q, k and v out, splitting their heads, calling [`attention`] and
/// merging the output's heads, but under `Autodiff<Frugal<_>>` one autodiff node over `qkv`
/// whose gradient is dq, dk and dv concatenated once (the three slices' backward would zero a
/// tensor of `qkv`'s size three times and add them up). Panics if the last dimension is not a
/// multiple of `3 · heads`.
pub fn attention_packed<B: Backend>(
    qkv: Tensor<B, 3>,
    heads: usize,
    options: AttentionOptions<B>,
) -> Tensor<B, 3> {
    let [batch, seq, width] = qkv.dims();
    assert!(
        heads > 0 && width % (3 * heads) == 0,
        "frugal::nn::attention_packed: qkv is {:?} with {heads} heads; accepted: [batch, seq, \
         3 · heads · head_dim], the last dimension a multiple of 3 · heads",
        qkv.dims()
    );
    let head_dim = width / (3 * heads);
    let lookup_entry = lookup(TypeId::of::<B>());
    let bias_needs_grad = options.bias.as_ref().is_some_and(|b| b.is_require_grad());
    let Some(entry) = lookup_entry.filter(|_| !bias_needs_grad) else {
        let d = heads * head_dim;
        let part = |i: usize| {
            qkv.clone()
                .slice([0..batch, 0..seq, i * d..(i + 1) * d])
                .reshape([batch, seq, heads, head_dim])
                .swap_dims(1, 2)
        };
        let out = attention(part(0), part(1), part(2), options);
        return out.swap_dims(1, 2).reshape([batch, seq, d]);
    };
    let causal = options.causal;
    let (bias, scale) = fused_bias_and_scale(options, qkv.dtype(), &qkv.device(), head_dim, seq);
    let args = AttentionArgs {
        inputs: AttentionInputs::Packed {
            qkv: boxed(qkv),
            heads,
        },
        bias: bias.map(boxed),
        causal,
        scale,
    };
    unboxed(entry(args))
}

/// The one additive bias the fused paths take (the bias and the mask, `-inf` where masked,
/// its last dimension expanded to `seq_k`) and the scale.
fn fused_bias_and_scale<B: Backend>(
    options: AttentionOptions<B>,
    dtype: burn_tensor::DType,
    device: &B::Device,
    head_dim: usize,
    seq_k: usize,
) -> (Option<Tensor<B, 4>>, f64) {
    let scale = options
        .scale
        .unwrap_or_else(|| 1.0 / (head_dim as f64).sqrt());
    let mut bias = options.bias.map(|b| b.cast(dtype));
    if let Some(mask) = options.mask {
        let zeros = Tensor::<B, 4>::zeros(mask.dims(), device).cast(dtype);
        let masked = zeros.mask_fill(mask, f32::NEG_INFINITY);
        bias = Some(match bias {
            Some(b) => b + masked,
            None => masked,
        });
    }
    let bias = bias.map(|b| {
        let [d0, d1, d2, d3] = b.dims();
        if d3 == seq_k {
            b
        } else {
            b.expand([d0, d1, d2, seq_k])
        }
    });
    (bias, scale)
}

/// The written-out attention: scores `q kᵀ · scale` (plus the bias), masked with `-inf`,
/// softmax over the keys, product with v. Autodiff keeps the scores and the probabilities,
/// `batch × heads × seq_q × seq_k` each, for the backward pass.
pub fn attention_written_out<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Tensor<B, 4> {
    let [_, _, seq_q, head_dim] = q.dims();
    let seq_k = k.dims()[2];
    let device = q.device();
    let mut scores = match options.scale {
        Some(scale) => q.matmul(k.swap_dims(2, 3)).mul_scalar(scale),
        None => q
            .matmul(k.swap_dims(2, 3))
            .div_scalar((head_dim as f64).sqrt()),
    };
    if let Some(bias) = options.bias {
        scores = scores + bias;
    }
    if let Some(mask) = options.mask {
        scores = scores.mask_fill(mask, f32::NEG_INFINITY);
    }
    if options.causal {
        let causal = Tensor::<B, 2, Bool>::tril_mask([seq_q, seq_k], 0, &device).unsqueeze::<4>();
        scores = scores.mask_fill(causal, f32::NEG_INFINITY);
    }
    burn_tensor::activation::softmax(scores, 3).matmul(v)
}
