//! The GPT of `shared/anchors/torch_gpt.py`, in Burn: token and learned position embeddings,
//! pre-norm blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and an untied
//! head. Attention is written out (scores materialised, like the `fp32_math` configuration)
//! unless [`GptConfig::fused_attention`] asks for [`frugal::nn::attention_packed`], which keeps no
//! `seq × seq` tensor for the backward pass under `Autodiff<Frugal<_>>`. Layer norms are
//! [`frugal::nn::LayerNorm`] (burn-nn's layer and records; one autodiff node under
//! `Autodiff<Frugal<_>>`) unless [`GptConfig::fused_norm`] is off.

use burn::config::Config;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, Gelu, Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use frugal::nn::{LayerNorm, LayerNormConfig};

/// Model size.
#[derive(Config, Debug)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Context length (positions).
    pub seq: usize,
    /// Width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// Attention through [`frugal::nn::attention`] (flash attention's kernels on CubeCL
    /// backends, its block-wise portable path elsewhere; the written-out attention on
    /// backends without Frugal) instead of written out.
    #[config(default = false)]
    pub fused_attention: bool,
    /// Layer norms through [`frugal::nn::layer_norm`] (one autodiff node, Frugal's kernels on
    /// CubeCL backends; Burn's own layer norm on backends without Frugal) instead of Burn's
    /// written-out layer norm.
    #[config(default = true)]
    pub fused_norm: bool,
    /// The head and the loss through [`frugal::nn::linear_cross_entropy`] (one autodiff node
    /// that never holds the whole logits; the written-out loss on backends without Frugal)
    /// instead of the logits and burn-nn's `CrossEntropyLoss`.
    #[config(default = true)]
    pub fused_loss: bool,
}

/// A layer norm as the configuration asks: fused or Burn's written-out one.
fn norm<B: Backend, const D: usize>(
    ln: &LayerNorm<B>,
    x: Tensor<B, D>,
    fused: bool,
) -> Tensor<B, D> {
    if fused {
        ln.forward(x)
    } else {
        ln.forward_written_out(x)
    }
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    ln1: LayerNorm<B>,
    qkv: Linear<B>,
    proj: Linear<B>,
    ln2: LayerNorm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    gelu: Gelu,
    heads: usize,
    fused_attention: bool,
    fused_norm: bool,
}

impl<B: Backend> Block<B> {
    fn new(config: &GptConfig, device: &B::Device) -> Self {
        let d = config.d_model;
        Self {
            ln1: LayerNormConfig::new(d).init(device),
            qkv: LinearConfig::new(d, 3 * d).init(device),
            proj: LinearConfig::new(d, d).init(device),
            ln2: LayerNormConfig::new(d).init(device),
            fc1: LinearConfig::new(d, 4 * d).init(device),
            fc2: LinearConfig::new(4 * d, d).init(device),
            gelu: Gelu::new(),
            heads: config.heads,
            fused_attention: config.fused_attention,
            fused_norm: config.fused_norm,
        }
    }

    /// Applies the block to `[batch, seq, d_model]` activations.
    pub fn forward(&self, x: Tensor<B, 3>, causal: Tensor<B, 4, Bool>) -> Tensor<B, 3> {
        let [b, t, d] = x.dims();
        let hd = d / self.heads;
        let qkv = self
            .qkv
            .forward(norm(&self.ln1, x.clone(), self.fused_norm));
        let y = if self.fused_attention {
            frugal::nn::attention_packed(qkv, self.heads, frugal::nn::AttentionOptions::causal())
        } else {
            let split = |i: usize| {
                qkv.clone()
                    .slice([0..b, 0..t, i * d..(i + 1) * d])
                    .reshape([b, t, self.heads, hd])
                    .swap_dims(1, 2)
            };
            let (q, k, v) = (split(0), split(1), split(2));
            let scores = q.matmul(k.swap_dims(2, 3)).div_scalar((hd as f64).sqrt());
            let scores = scores.mask_fill(causal, f32::NEG_INFINITY);
            softmax(scores, 3)
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([b, t, d])
        };
        let x = x + self.proj.forward(y);
        let h = self.fc2.forward(self.gelu.forward(self.fc1.forward(norm(
            &self.ln2,
            x.clone(),
            self.fused_norm,
        ))));
        x + h
    }
}

/// The whole model.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tok: Embedding<B>,
    pos: Embedding<B>,
    blocks: Vec<Block<B>>,
    ln: LayerNorm<B>,
    head: Linear<B>,
    fused_norm: bool,
    fused_loss: bool,
}

impl GptConfig {
    /// The reference configuration of `torch_gpt.py`: 12 layers, d 768, 12 heads, vocab 8192,
    /// seq 512.
    pub fn reference() -> Self {
        Self::new(8192, 512, 768, 12, 12)
    }

    /// Builds the model with Burn's default initialisation.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        assert!(
            self.d_model.is_multiple_of(self.heads),
            "d_model ({}) must be a multiple of heads ({})",
            self.d_model,
            self.heads
        );
        Gpt {
            tok: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            pos: EmbeddingConfig::new(self.seq, self.d_model).init(device),
            blocks: (0..self.layers).map(|_| Block::new(self, device)).collect(),
            ln: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
            fused_norm: self.fused_norm,
            fused_loss: self.fused_loss,
        }
    }

    /// Number of parameters, as PyTorch counts them for the same model.
    pub fn parameters(&self) -> usize {
        let (v, s, d) = (self.vocab, self.seq, self.d_model);
        let block =
            2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
        v * d + s * d + self.layers * block + 2 * d + d * v + v
    }
}

impl<B: Backend> Gpt<B> {
    /// Logits `[batch, seq, vocab]` for tokens `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.forward_with(tokens, false)
    }

    /// As [`Self::forward`]; with `checkpoint_blocks`, each block runs in a
    /// [`frugal::checkpoint`] scope, so only block inputs and outputs stay on the device until
    /// the backward pass recomputes the rest (on a backend without Frugal it changes nothing).
    pub fn forward_with(&self, tokens: Tensor<B, 2, Int>, checkpoint_blocks: bool) -> Tensor<B, 3> {
        self.head.forward(self.features(tokens, checkpoint_blocks))
    }

    /// The final layer norm's output `[batch, seq, d_model]`: what the head reads.
    fn features(&self, tokens: Tensor<B, 2, Int>, checkpoint_blocks: bool) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..t as i64, &device)
            .reshape([1, t])
            .expand([b, t]);
        let mut h = self.tok.forward(tokens) + self.pos.forward(positions);
        // True where key j > query i. Burn's `tril_mask` is true *outside* the lower
        // triangle, i.e. exactly the future positions.
        let causal = Tensor::<B, 2, Bool>::tril_mask([t, t], 0, &device).reshape([1, 1, t, t]);
        for block in &self.blocks {
            h = if checkpoint_blocks {
                frugal::checkpoint(&device, || block.forward(h, causal.clone()))
            } else {
                block.forward(h, causal.clone())
            };
        }
        norm(&self.ln, h, self.fused_norm)
    }

    /// Mean cross-entropy of next-token prediction: `targets[b, i]` follows `tokens[b, i]`.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        self.loss_with(tokens, targets, false)
    }

    /// As [`Self::loss`], with blocks checkpointed if asked (see [`Self::forward_with`]).
    pub fn loss_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        checkpoint_blocks: bool,
    ) -> Tensor<B, 1> {
        if self.fused_loss {
            let h = self.features(tokens, checkpoint_blocks);
            let [b, t, d] = h.dims();
            return frugal::nn::linear_cross_entropy(
                h.reshape([b * t, d]),
                self.head.weight.val(),
                self.head.bias.as_ref().map(|bias| bias.val()),
                targets.reshape([b * t]),
                None,
            );
        }
        let logits = self.forward_with(tokens, checkpoint_blocks);
        let [b, t, v] = logits.dims();
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.reshape([b * t, v]), targets.reshape([b * t]))
    }
}
