//! A drop-in for burn-nn 0.21's `MultiHeadAttention` whose attention core is
//! [`super::attention`]: the same configuration, parameters (and so records) and forward
//! signature, without the `seq × seq` weights.

use burn_core as burn;

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn_nn::activation::Gelu;
use burn_nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn_tensor::activation::{quiet_softmax, softmax};
use burn_tensor::{Bool, Tensor, backend::Backend};

use super::{AttentionOptions, attention};

/// Configuration of a [`MultiHeadAttention`] layer, as burn-nn's
/// `MultiHeadAttentionConfig`.
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// The dropout rate on the attention scores (burn-nn applies it before the softmax).
    /// While training with a rate above 0 the layer computes the written-out attention, as
    /// burn-nn does; 0 keeps the fused path. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// The value masked scores take on the written-out path. Default: -1.0e4. The fused
    /// path masks with `-inf`, which differs only for a row whose every key is masked
    /// (0 there rather than the mean of the values).
    #[config(default = -1.0e4)]
    pub min_float: f64,
    /// Use "quiet softmax" (the written-out path: the fused kernels use the plain softmax).
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// The initializer of the four linear layers.
    #[config(default = "Initializer::KaimingUniform{gain:0.5773502691896258, fan_out_only:false}")]
    pub initializer: Initializer,
}

/// Multi-head attention whose core is [`attention`]: under `Autodiff<Frugal<_>>` the
/// backward pass stores no `batch × heads × seq × seq` tensor. Same fields as burn-nn's.
#[derive(Module, Debug)]
pub struct MultiHeadAttention<B: Backend> {
    /// Linear layer to the query space.
    pub query: Linear<B>,
    /// Linear layer to the key space.
    pub key: Linear<B>,
    /// Linear layer to the value space.
    pub value: Linear<B>,
    /// Linear layer back to the model space.
    pub output: Linear<B>,
    /// Dropout on the scores (written-out path only).
    pub dropout: Dropout,
    /// Unused, kept so records match burn-nn's layer.
    pub activation: Gelu,
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// Size of the key and query vectors.
    pub d_k: usize,
    /// The value masked scores take on the written-out path.
    pub min_float: f64,
    /// Use "quiet softmax" (written-out path).
    pub quiet_softmax: bool,
}

/// The input of [`MultiHeadAttention::forward`], as burn-nn's `MhaInput`, plus
/// [`MhaInput::causal`].
#[derive(Debug, Clone)]
pub struct MhaInput<B: Backend> {
    query: Tensor<B, 3>,
    key: Tensor<B, 3>,
    value: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
    causal: bool,
}

/// The output of [`MultiHeadAttention::forward`]: burn-nn's `MhaOutput` without the
/// attention weights, which are never formed.
#[derive(Debug, Clone)]
pub struct MhaOutput<B: Backend> {
    /// The context `[batch, seq_q, d_model]`.
    pub context: Tensor<B, 3>,
}

impl MultiHeadAttentionConfig {
    /// A new layer.
    pub fn init<B: Backend>(&self, device: &B::Device) -> MultiHeadAttention<B> {
        let linear = || {
            LinearConfig::new(self.d_model, self.d_model)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        MultiHeadAttention {
            query: linear(),
            key: linear(),
            value: linear(),
            output: linear(),
            dropout: DropoutConfig::new(self.dropout).init(),
            activation: Gelu::new(),
            d_model: self.d_model,
            n_heads: self.n_heads,
            d_k: self.d_model / self.n_heads,
            min_float: self.min_float,
            quiet_softmax: self.quiet_softmax,
        }
    }
}

/// burn-nn's layer with its parameters, computing with [`attention`]. The parameters move
/// as they are: a layer whose parameters were never read still initialises them lazily, so a
/// clone kept beside this one draws different values unless they were read before cloning.
impl<B: Backend> From<burn_nn::attention::MultiHeadAttention<B>> for MultiHeadAttention<B> {
    fn from(layer: burn_nn::attention::MultiHeadAttention<B>) -> Self {
        Self {
            query: layer.query,
            key: layer.key,
            value: layer.value,
            output: layer.output,
            dropout: layer.dropout,
            activation: layer.activation,
            d_model: layer.d_model,
            n_heads: layer.n_heads,
            d_k: layer.d_k,
            min_float: layer.min_float,
            quiet_softmax: layer.quiet_softmax,
        }
    }
}

impl<B: Backend> MhaInput<B> {
    /// Self-attention: query, key and value are `tensor` (`[batch, seq, d_model]`).
    pub fn self_attn(tensor: Tensor<B, 3>) -> Self {
        Self::new(tensor.clone(), tensor.clone(), tensor)
    }

    /// Query `[batch, seq_q, d_model]`, key and value `[batch, seq_k, d_model]`.
    pub fn new(query: Tensor<B, 3>, key: Tensor<B, 3>, value: Tensor<B, 3>) -> Self {
        Self {
            query,
            key,
            value,
            mask_pad: None,
            mask_attn: None,
            causal: false,
        }
    }

    /// A padding mask `[batch, seq_k]` (`true`: that key is masked for every query).
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// An attention mask `[batch, seq_q, seq_k]` (`true`: masked).
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    /// Causal masking (key `j > i` masked) without a mask tensor: the kernels skip the masked
    /// blocks. Equivalent to `mask_attn` with burn-nn's `generate_autoregressive_mask`.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }
}

impl<B: Backend> MultiHeadAttention<B> {
    /// The forward pass: query `[batch, seq_q, d_model]`, key and value
    /// `[batch, seq_k, d_model]`, context `[batch, seq_q, d_model]`.
    pub fn forward(&self, input: MhaInput<B>) -> MhaOutput<B> {
        let [batch, seq_q, _] = input.query.dims();
        let q = self.heads(input.query, &self.query);
        let k = self.heads(input.key, &self.key);
        let v = self.heads(input.value, &self.value);
        let seq_k = k.dims()[2];

        let mut mask: Option<Tensor<B, 4, Bool>> = None;
        if let Some(pad) = input.mask_pad {
            mask = Some(
                pad.reshape([batch, 1, 1, seq_k])
                    .expand([batch, 1, seq_q, seq_k]),
            );
        }
        if let Some(attn) = input.mask_attn {
            let attn = attn.reshape([batch, 1, seq_q, seq_k]);
            mask = Some(match mask {
                Some(m) => m.bool_or(attn),
                None => attn,
            });
        }

        let dropping = self.dropout.prob > 0.0 && B::ad_enabled(&q.device());
        let context = if dropping || self.quiet_softmax {
            self.written_out(q, k, v, mask, input.causal)
        } else {
            let mut options = AttentionOptions::new();
            options.causal = input.causal;
            options.mask = mask;
            attention(q, k, v, options)
        };
        let context = context
            .swap_dims(1, 2)
            .reshape([batch, seq_q, self.d_model]);
        MhaOutput {
            context: self.output.forward(context),
        }
    }

    /// burn-nn's computation: dropout on the scores, masks filled with `min_float`.
    fn written_out(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        mask: Option<Tensor<B, 4, Bool>>,
        causal: bool,
    ) -> Tensor<B, 4> {
        let [_, _, seq_q, _] = q.dims();
        let seq_k = k.dims()[2];
        let device = q.device();
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .div_scalar((self.d_k as f32).sqrt());
        let mut scores = self.dropout.forward(scores);
        if let Some(mask) = mask {
            scores = scores.mask_fill(mask, self.min_float);
        }
        if causal {
            let causal =
                Tensor::<B, 2, Bool>::tril_mask([seq_q, seq_k], 0, &device).unsqueeze::<4>();
            scores = scores.mask_fill(causal, self.min_float);
        }
        let weights = if self.quiet_softmax {
            quiet_softmax(scores, 3)
        } else {
            softmax(scores, 3)
        };
        weights.matmul(v)
    }

    fn heads(&self, x: Tensor<B, 3>, linear: &Linear<B>) -> Tensor<B, 4> {
        let [batch, seq, _] = x.dims();
        linear
            .forward(x)
            .reshape([batch, seq, self.n_heads, self.d_k])
            .swap_dims(1, 2)
    }
}
