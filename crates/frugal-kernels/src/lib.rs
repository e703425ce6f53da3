//! CubeCL kernels for Frugal: mixed precision casts and unscaling, AdamW updates (f32 and 8-bit moments), and
//! flash attention.
//!
//! Every kernel is generic over the CubeCL runtime `R` and works on contiguous device buffers:
//! a cubecl [`Handle`](cubecl::server::Handle) plus an element count. The host-side functions
//! check their inputs (dtype support on the runtime, buffer sizes, lengths, scale values) and
//! return a [`KernelError`] instead of panicking.
//!
//! - [`cast()`] and the named casts ([`cast_f32_to_f16`], [`cast_f16_to_f32`],
//!   [`cast_f32_to_bf16`], [`cast_bf16_to_f32`]): round to nearest even, the same bits as
//!   `half::f16::from_f32` / `half::bf16::from_f32` and as Burn's own cast.
//! - [`cast_scaled`]: `out = cast(x * scale)`, the product taken in f32.
//! - [`unscale_and_check`]: multiplies many f32 gradient buffers in place by `inv_scale` in a few
//!   launches and raises a device-side [`FoundInf`] flag if any result is NaN or ±inf.
//!
//! - [`embedding_grad_add`]: an embedding lookup's backward, one unit per value of the output
//!   gradient, added into the table's gradient with atomic adds.
//! - [`layer_norm_forward`] and [`layer_norm_backward`]: layer normalisation over the last
//!   dimension in one launch forward and three backward, f32 statistics and sums.
//! - [`cross_entropy_rows`]: each row's softmax cross-entropy against its target and the
//!   logits' gradient (`softmax − one-hot`), in one launch, f32 statistics.
//! - [`adamw_update`]: one AdamW step on f32 moments (burn-optim's arithmetic), in place, in one
//!   launch.
//! - [`adamw8bit_update`]: one AdamW step on 8-bit block-wise quantised moments (dequantise
//!   both, update, write the parameter, requantise), in place, in one launch.
//!
//! - [`attention`]: flash attention, forward (with each query row's logsumexp) and backward
//!   (dQ, dK, dV), causal or not, with an optional additive bias: training attention without
//!   storing the `seq × seq` scores; and the element-wise passes of attention computed as
//!   matrix products by the caller's library ([`attention::scores_softmax`],
//!   [`attention::scores_backward`]).
//!
//! Loads and stores are vectorised with the widest vector size the runtime favours for the
//! element type that divides the length (falling back to 1).
//!
//! # Example
//!
//! The host-side helpers need no device: the sizes a caller allocates before a launch.
//!
//! ```
//! use frugal_kernels::attention::{AttentionConfig, AttentionShape};
//! use frugal_kernels::{FloatDtype, adamw8bit_layout};
//!
//! // A bf16 copy of a 4096-element f32 tensor takes half the bytes.
//! assert_eq!(4096 * FloatDtype::BF16.size_bytes(), 4096 * FloatDtype::F32.size_bytes() / 2);
//!
//! // 8-bit AdamW state of a 1000-element parameter in blocks of 256: 4 blocks, each moment in
//! // 256 words of four codes (the last block padded), plus one absmax per block and moment.
//! assert_eq!(adamw8bit_layout(1000, 256), (4, 256));
//!
//! // Flash attention keeps one logsumexp per query row, not the seq × seq scores.
//! let shape = AttentionShape { batch: 2, heads: 4, seq_q: 128, seq_k: 128, head_dim: 64 };
//! assert_eq!(shape.rows(), 2 * 4 * 128);
//! assert_eq!(AttentionConfig::default().scale_for(shape.head_dim), 0.125);
//! ```
//!
//! A launch takes a runtime's client and device buffers. This function compiles for any
//! runtime; calling it needs a device (e.g. `cubecl::wgpu::WgpuRuntime` with feature `wgpu`,
//! `cubecl::cuda::CudaRuntime` with feature `cuda`), so it is not called here.
//!
//! ```
//! use frugal_kernels::cubecl::{Runtime, client::ComputeClient};
//! use frugal_kernels::{KernelError, cast_f32_to_bf16, unscale_and_check};
//!
//! /// Unscales loss-scaled f32 gradients in place and returns their bf16 copy, or `None` when
//! /// one was NaN or infinite (the step is then skipped).
//! fn unscale_then_narrow<R: Runtime>(
//!     client: &ComputeClient<R>,
//!     grads: &[f32],
//!     loss_scale: f32,
//! ) -> Result<Option<frugal_kernels::cubecl::server::Handle>, KernelError> {
//!     let bytes: Vec<u8> = grads.iter().flat_map(|g| g.to_le_bytes()).collect();
//!     let handle = client.create_from_slice(&bytes);
//!     let found_inf = unscale_and_check(client, &[(&handle, grads.len())], 1.0 / loss_scale)?;
//!     if found_inf.read(client)? {
//!         return Ok(None);
//!     }
//!     cast_f32_to_bf16(client, &handle, grads.len()).map(Some)
//! }
//! ```
#![warn(missing_docs)]

/// The CubeCL crate these kernels are built with (the same version Burn 0.21 uses), so callers
/// can name runtimes, clients and handles without a separate dependency.
pub use cubecl;

mod adamw;
mod adamw8bit;
pub mod attention;
mod cast;
mod cross_entropy;
mod dtype;
mod embedding;
mod error;
mod layer_norm;
mod unscale;

pub use adamw::{AdamWBuffers, AdamWScalars, WeightDecay, adamw_update};
pub use adamw8bit::{
    AdamW8bitBuffers, MAP_LEN, MAX_BLOCK_SIZE, TABLES_LEN, adamw8bit_layout, adamw8bit_update,
};
pub use cast::{
    cast, cast_bf16_to_f32, cast_f16_to_f32, cast_f32_to_bf16, cast_f32_to_f16, cast_scaled, copy,
    vector_size_for,
};
pub use cross_entropy::{CrossEntropyRows, CrossEntropyShape, cross_entropy_rows};
pub use dtype::FloatDtype;
pub use embedding::{EmbeddingGradBuffers, IdDtype, embedding_grad_add};
pub use error::KernelError;
pub use layer_norm::{
    LayerNormForward, LayerNormGrads, LayerNormShape, layer_norm_backward, layer_norm_forward,
};
pub use unscale::{FoundInf, unscale_and_check, unscale_and_check_into, unscale_group_size};
