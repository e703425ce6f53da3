//! Layer 3, kernel dispatch: Frugal's own CubeCL kernels (crate `frugal-kernels`) in place
//! of the inner backend's ops, for inner backends built on a CubeCL runtime this build knows
//! (features `cuda`, `wgpu`), with Burn's fusion on or off. Owns the mode and the counters;
//! imports `runtime`. The gradient unscale's launches are in `crate::training::scaler`, above the tensor
//! type they unwrap.
//!
//! Which inner backend runs is found from the tensor primitive's type at run time (a type id
//! comparison, no allocation), so `Frugal<B>` stays generic: for any other backend (NdArray,
//! Flex, ...) and for layouts the kernels do not take (strided views), Frugal calls the inner
//! backend's own op, which gives the same bits (the kernels are tested bit for bit against
//! Burn's cast).
//!
//! Where they are used:
//! - **casts** between f32, f16 and bf16 (`float_cast`: autocast's casts and the user's own),
//!   vectorised;
//! - **compressed storage** (the budget's `Compress` action and the cast back on a read);
//! - **attention** (`frugal::nn::attention` under `Autodiff<Frugal<B>>`): flash attention's
//!   forward (output and logsumexp) and backward (dQ, dK, dV), so no `seq × seq` tensor is
//!   stored; one custom operation each under fusion;
//! - **[`crate::GradScaler::unscale`]**: one fused unscale-and-check launch per group of f32
//!   gradients with the found-inf flag kept on the device, and the fused widen-and-scale cast
//!   for 16-bit gradients;
//! - **matrix products on cuBLASLt** (`float_matmul`, `linear`, `linear_x_backward`,
//!   `linear_weight_backward`) when the inner backend runs on frugal-cuda's runtime, fused or
//!   not: f16 and bf16 by default, f32 (strict or TF32) when asked; see [`Products`];
//! - **embedding backward** (`embedding_backward`): atomic adds of every token's gradient row,
//!   one unit per value, in place of Burn's `select_assign` (one unit per column walking the
//!   tokens); f32 output gradients;
//! - **layer norm** (`frugal::nn::layer_norm` under `Autodiff<Frugal<B>>`): one launch
//!   forward (the row statistics kept in f32), three backward, where the written-out norm and
//!   its autodiff take a dozen; one custom operation each under fusion;
//! - **the cross-entropy of a head's logits** (`frugal::nn::linear_cross_entropy` under
//!   `Frugal<B>`): each chunk's row losses and `softmax − one-hot` in one launch where the
//!   written-out arithmetic takes a dozen; one custom operation under fusion;
//! - **uploads** of tensors brought back from host memory, on frugal-cuda's runtime: the host
//!   bytes go to the device as they are, with no host copy and no wait (see `upload`);
//! - **the AdamW update** (`crate::optim::AdamW8bit`, f32 or 8-bit moments): one launch per
//!   parameter, in place (its dispatch is in `crate::optim`, above the tensor type it unwraps).
//! - **2D convolutions** (`conv2d` and its data and weight gradients), when asked
//!   ([`ConvAlgorithm::OneKernel`]): burn-cubecl's own kernels with one strategy (implicit
//!   GEMM, else direct) instead of its autotune, which compiles and times 21 candidate kernels
//!   for every new shape; one custom operation each under fusion.
//!
//! Under fusion, a Frugal kernel is a custom operation, which ends the fused block before it:
//! a cast that Burn's fusion would fold into the neighbouring element-wise kernel is cheaper
//! left to Burn. So by default ([`KernelMode::Auto`]) casts on a fused backend stay Burn's and
//! everything else uses Frugal's kernels; [`KernelMode::Always`] and [`KernelMode::Never`]
//! override that (e.g. to compare them).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use burn_backend::{Backend, FloatDType};

/// When Frugal runs its own kernels rather than the inner backend's ops (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelMode {
    /// Frugal's kernels everywhere except casts on a fused backend (which fusion folds into
    /// neighbouring kernels).
    #[default]
    Auto,
    /// Frugal's kernels wherever the primitive is a CubeCL one, fused or not.
    Always,
    /// Never: always the inner backend's own ops.
    Never,
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Sets when Frugal uses its own kernels, for every device (default [`KernelMode::Auto`]).
pub fn set_mode(mode: KernelMode) {
    MODE.store(
        match mode {
            KernelMode::Auto => 0,
            KernelMode::Always => 1,
            KernelMode::Never => 2,
        },
        Relaxed,
    );
}

/// The current [`KernelMode`].
pub fn mode() -> KernelMode {
    match MODE.load(Relaxed) {
        1 => KernelMode::Always,
        2 => KernelMode::Never,
        _ => KernelMode::Auto,
    }
}

/// How many times each of Frugal's kernels ran, since the process started (all devices).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Casts run by Frugal's cast kernel.
    pub casts: u64,
    /// Of those, run as a custom operation of Burn's fusion.
    pub fused_casts: u64,
    /// Widening casts fused with a scale (16-bit gradients unscaled).
    pub scaled_casts: u64,
    /// Launches of the fused unscale-and-check kernel.
    pub unscale_launches: u64,
    /// Gradients unscaled by those launches.
    pub unscaled_tensors: u64,
    /// Launches of the fused f32 AdamW update (`frugal::optim::AdamW8bit` for parameters
    /// it keeps in f32, e.g. every one with [`crate::optim::AdamW8bitConfig::full_precision`]),
    /// one per parameter and step.
    pub adamw_launches: u64,
    /// Of those, registered as a custom operation of Burn's fusion (counted when registered).
    pub fused_adamw: u64,
    /// Launches of the fused 8-bit AdamW update (`frugal::optim::AdamW8bit`), one per
    /// parameter and step.
    pub adamw8bit_launches: u64,
    /// Of those, registered as a custom operation of Burn's fusion (counted when registered).
    pub fused_adamw8bit: u64,
    /// Attention forward passes run by Frugal's flash-attention kernels.
    pub attention_forwards: u64,
    /// Attention backward passes run by Frugal's flash-attention kernels.
    pub attention_backwards: u64,
    /// Attention forward passes run as matrix products (see [`AttentionPath`]).
    pub attention_product_forwards: u64,
    /// Attention backward passes run as matrix products (see [`AttentionPath`]).
    pub attention_product_backwards: u64,
    /// Embedding backwards run by Frugal's kernel (atomic adds, one unit per value of the
    /// output gradient), in place of Burn's `select_assign`.
    pub embedding_backwards: u64,
    /// Of those, registered as a custom operation of Burn's fusion (counted when registered).
    pub fused_embedding_backwards: u64,
    /// Layer norm forwards run by Frugal's kernel (`frugal::nn::layer_norm` under
    /// `Autodiff<Frugal<_>>`; counted when launched).
    pub layer_norm_forwards: u64,
    /// Layer norm backwards run by Frugal's kernels (counted when launched).
    pub layer_norm_backwards: u64,
    /// Row losses (and logits' gradients) of `frugal::nn::linear_cross_entropy`'s chunks run
    /// by Frugal's kernel (counted when launched).
    pub cross_entropy_rows: u64,
    /// Matrix products run on cuBLASLt (counted when queued).
    pub blas_products: u64,
    /// Of the products, those registered as a custom operation of Burn's fusion (counted when
    /// registered).
    pub fused_blas_products: u64,
    /// 2D convolution passes (forward, data and weight gradients) run with one kernel each
    /// under [`ConvAlgorithm::OneKernel`] (counted when launched).
    pub conv_passes: u64,
    /// Of those, passes the implicit GEMM refused, run by the direct kernel.
    pub conv_fallbacks: u64,
}

pub(crate) static CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static SCALED_CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNSCALE_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNSCALED_TENSORS: AtomicU64 = AtomicU64::new(0);
pub(crate) static ADAMW_LAUNCHES: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static EMBEDDING_BACKWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static FUSED_EMBEDDING_BACKWARDS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_ADAMW: AtomicU64 = AtomicU64::new(0);
pub(crate) static ADAMW8BIT_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_ADAMW8BIT: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static ATTENTION_FORWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static ATTENTION_BACKWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) static ATTENTION_PRODUCT_FORWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) static ATTENTION_PRODUCT_BACKWARDS: AtomicU64 = AtomicU64::new(0);

#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static LAYER_NORM_FORWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static LAYER_NORM_BACKWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static CROSS_ENTROPY_ROWS: AtomicU64 = AtomicU64::new(0);

#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) static BLAS_PRODUCTS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) static FUSED_BLAS_PRODUCTS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static CONV_PASSES: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static CONV_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Reads the [`KernelStats`] counters.
pub fn stats() -> KernelStats {
    KernelStats {
        casts: CASTS.load(Relaxed),
        fused_casts: FUSED_CASTS.load(Relaxed),
        scaled_casts: SCALED_CASTS.load(Relaxed),
        unscale_launches: UNSCALE_LAUNCHES.load(Relaxed),
        unscaled_tensors: UNSCALED_TENSORS.load(Relaxed),
        adamw_launches: ADAMW_LAUNCHES.load(Relaxed),
        fused_adamw: FUSED_ADAMW.load(Relaxed),
        adamw8bit_launches: ADAMW8BIT_LAUNCHES.load(Relaxed),
        fused_adamw8bit: FUSED_ADAMW8BIT.load(Relaxed),
        attention_forwards: ATTENTION_FORWARDS.load(Relaxed),
        attention_backwards: ATTENTION_BACKWARDS.load(Relaxed),
        attention_product_forwards: ATTENTION_PRODUCT_FORWARDS.load(Relaxed),
        attention_product_backwards: ATTENTION_PRODUCT_BACKWARDS.load(Relaxed),
        embedding_backwards: EMBEDDING_BACKWARDS.load(Relaxed),
        fused_embedding_backwards: FUSED_EMBEDDING_BACKWARDS.load(Relaxed),
        layer_norm_forwards: LAYER_NORM_FORWARDS.load(Relaxed),
        layer_norm_backwards: LAYER_NORM_BACKWARDS.load(Relaxed),
        cross_entropy_rows: CROSS_ENTROPY_ROWS.load(Relaxed),
        blas_products: BLAS_PRODUCTS.load(Relaxed),
        fused_blas_products: FUSED_BLAS_PRODUCTS.load(Relaxed),
        conv_passes: CONV_PASSES.load(Relaxed),
        conv_fallbacks: CONV_FALLBACKS.load(Relaxed),
    }
}

/// Why a cast is made, which decides whether Frugal's kernel is worth it under fusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CastPurpose {
    /// An op's cast (autocast or the user's): fusable with its neighbours.
    Op,
    /// Compressing a tensor at rest or restoring it: a lone pass over the buffer.
    Storage,
}

/// `B::float_cast`, run by Frugal's kernel when the mode and the primitive allow it.
pub(crate) fn float_cast<B: Backend>(
    tensor: B::FloatTensorPrimitive,
    dtype: FloatDType,
) -> B::FloatTensorPrimitive {
    cast_for::<B>(tensor, dtype, CastPurpose::Op)
}

/// `B::float_cast` for `purpose`.
pub(crate) fn cast_for<B: Backend>(
    tensor: B::FloatTensorPrimitive,
    dtype: FloatDType,
    purpose: CastPurpose,
) -> B::FloatTensorPrimitive {
    let mode = mode();
    if mode == KernelMode::Never {
        return B::float_cast(tensor, dtype);
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let mut slot = Some(tensor);
        if cube::try_cast(&mut slot, burn_backend::DType::from(dtype), mode, purpose) {
            return slot.expect("the cast put its output back");
        }
        B::float_cast(slot.expect("untouched when not cast"), dtype)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = purpose;
        B::float_cast(tensor, dtype)
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) mod cube;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod embedding;

/// `B::embedding_backward`, by Frugal's kernel where the mode and the primitives allow (an
/// f32 output gradient, 32- or 64-bit ids, on a CubeCL runtime): every token's row added
/// with atomic adds, where Burn's `select_assign` runs one unit per column over the tokens.
pub(crate) fn embedding_backward<B: Backend>(
    weights: B::FloatTensorPrimitive,
    output_grad: B::FloatTensorPrimitive,
    indices: B::IntTensorPrimitive,
) -> B::FloatTensorPrimitive {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    if mode() != KernelMode::Never {
        use burn_backend::TensorMetadata;
        let dims = weights.shape();
        if dims.num_dims() == 2 {
            let mut slot = embedding::EmbeddingSlot {
                table: [dims[0], dims[1]],
                output_grad: Some(output_grad),
                indices: Some(indices),
                output: None,
            };
            if embedding::run(&mut slot) {
                return slot
                    .output
                    .expect("the backward put its output in the slot");
            }
            let (output_grad, indices) = (slot.output_grad, slot.indices);
            return B::embedding_backward(
                weights,
                output_grad.expect("untouched"),
                indices.expect("untouched"),
            );
        }
    }
    B::embedding_backward(weights, output_grad, indices)
}

/// Masking and scale of one attention call, as the kernels take them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttentionCall {
    /// Keys after the query are masked.
    pub(crate) causal: bool,
    /// The factor on `q kᵀ`.
    pub(crate) scale: f32,
}

/// Flash attention's forward on inner primitives: `(out, lse)` with `lse` f32 `[b, h, sq]`,
/// when they are CubeCL tensors of a known runtime the kernels take (else `None`).
#[allow(clippy::type_complexity)]
pub(crate) fn attention_forward<B: Backend>(
    q: &B::FloatTensorPrimitive,
    k: &B::FloatTensorPrimitive,
    v: &B::FloatTensorPrimitive,
    bias: Option<&B::FloatTensorPrimitive>,
    call: AttentionCall,
) -> Option<(B::FloatTensorPrimitive, B::FloatTensorPrimitive)> {
    let mut outputs = attention_run::<B>(vec![q, k, v], bias, call, false)?.into_iter();
    Some((outputs.next()?, outputs.next()?))
}

/// Flash attention's backward on inner primitives: `(grad_q, grad_k, grad_v)`, as
/// [`attention_forward`].
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(crate) fn attention_backward<B: Backend>(
    q: &B::FloatTensorPrimitive,
    k: &B::FloatTensorPrimitive,
    v: &B::FloatTensorPrimitive,
    bias: Option<&B::FloatTensorPrimitive>,
    out: &B::FloatTensorPrimitive,
    lse: &B::FloatTensorPrimitive,
    grad_out: &B::FloatTensorPrimitive,
    call: AttentionCall,
) -> Option<(
    B::FloatTensorPrimitive,
    B::FloatTensorPrimitive,
    B::FloatTensorPrimitive,
)> {
    let mut inputs = vec![q, k, v];
    let tail = [out, lse, grad_out];
    let mut outputs =
        attention_run::<B>(inputs.drain(..).chain(tail).collect(), bias, call, true)?.into_iter();
    Some((outputs.next()?, outputs.next()?, outputs.next()?))
}

/// Whether Frugal's kernels on float tensors (attention, layer norm) may launch on `B`'s
/// tensors: kernels are not turned off and `B`'s float primitive belongs to a CubeCL runtime
/// this build knows. (They may still decline a call, e.g. a head dimension they do not
/// support.)
#[cfg_attr(
    not(any(feature = "cuda", feature = "wgpu")),
    allow(clippy::extra_unused_type_parameters)
)]
pub(crate) fn may_launch<B: Backend>() -> bool {
    if mode() == KernelMode::Never {
        return false;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        custom::knows::<B::FloatTensorPrimitive>()
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        false
    }
}

/// Runs the kernels on `inputs` (q, k, v, then the backward's out, lse and grad_out), with
/// the bias inserted after v.
fn attention_run<B: Backend>(
    inputs: Vec<&B::FloatTensorPrimitive>,
    bias: Option<&B::FloatTensorPrimitive>,
    call: AttentionCall,
    backward: bool,
) -> Option<Vec<B::FloatTensorPrimitive>> {
    if mode() == KernelMode::Never {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let mut all: Vec<B::FloatTensorPrimitive> =
            inputs[..3].iter().map(|t| (*t).clone()).collect();
        all.extend(bias.cloned());
        all.extend(inputs[3..].iter().map(|t| (*t).clone()));
        let launch = attention::AttentionLaunch {
            call,
            has_bias: bias.is_some(),
            backward,
        };
        let mut slot = custom::Slot {
            inputs: all,
            outputs: None,
        };
        custom::run(&mut slot, &launch).then_some(slot.outputs?)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (inputs, bias, call, backward);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod attention;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) mod custom;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod layer_norm;

/// A layer norm's forward on inner primitives: `(y, mean, rstd)`, the statistics f32
/// `[rows]`, when the kernels take the tensors (else `None`).
#[allow(clippy::type_complexity)]
pub(crate) fn layer_norm_forward<B: Backend>(
    x: &B::FloatTensorPrimitive,
    gamma: &B::FloatTensorPrimitive,
    beta: Option<&B::FloatTensorPrimitive>,
    epsilon: f64,
) -> Option<(
    B::FloatTensorPrimitive,
    B::FloatTensorPrimitive,
    B::FloatTensorPrimitive,
)> {
    let mut inputs = vec![x.clone(), gamma.clone()];
    inputs.extend(beta.cloned());
    let call = LayerNormCall {
        backward: false,
        with_beta: beta.is_some(),
        epsilon: epsilon as f32,
    };
    let mut outputs = layer_norm_run::<B>(inputs, call)?.into_iter();
    Some((outputs.next()?, outputs.next()?, outputs.next()?))
}

/// A layer norm's backward on inner primitives: the gradients of x, gamma and (with a
/// beta) beta, from the output's gradient and the forward's f32 statistics.
#[allow(clippy::type_complexity)]
pub(crate) fn layer_norm_backward<B: Backend>(
    grad: &B::FloatTensorPrimitive,
    x: &B::FloatTensorPrimitive,
    gamma: &B::FloatTensorPrimitive,
    mean: &B::FloatTensorPrimitive,
    rstd: &B::FloatTensorPrimitive,
    with_beta: bool,
) -> Option<(
    B::FloatTensorPrimitive,
    B::FloatTensorPrimitive,
    Option<B::FloatTensorPrimitive>,
)> {
    let inputs = [grad, x, gamma, mean, rstd].map(|t| t.clone()).to_vec();
    let call = LayerNormCall {
        backward: true,
        with_beta,
        epsilon: 0.0,
    };
    let mut outputs = layer_norm_run::<B>(inputs, call)?.into_iter();
    Some((outputs.next()?, outputs.next()?, outputs.next()))
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use layer_norm::LayerNormCall;

/// The same shape of call where no CubeCL runtime is compiled in (never launched).
#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
#[derive(Clone, Copy, Debug)]
struct LayerNormCall {
    #[allow(dead_code)]
    backward: bool,
    #[allow(dead_code)]
    with_beta: bool,
    #[allow(dead_code)]
    epsilon: f32,
}

fn layer_norm_run<B: Backend>(
    inputs: Vec<B::FloatTensorPrimitive>,
    call: LayerNormCall,
) -> Option<Vec<B::FloatTensorPrimitive>> {
    if mode() == KernelMode::Never {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let mut slot = custom::Slot {
            inputs,
            outputs: None,
        };
        custom::run(&mut slot, &call).then_some(slot.outputs?)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (inputs, call);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cross_entropy;

/// Each row's cross-entropy against its target (f32 `[rows]`) and, with `with_grad`, the
/// logits' gradient `softmax − one-hot` (the logits' dtype), from `logits [rows, classes]`
/// and `targets [rows]` on inner primitives, when the kernel takes them (else `None`).
pub(crate) fn cross_entropy_rows<B: Backend>(
    logits: &B::FloatTensorPrimitive,
    targets: &B::IntTensorPrimitive,
    with_grad: bool,
) -> Option<(B::FloatTensorPrimitive, Option<B::FloatTensorPrimitive>)> {
    if mode() == KernelMode::Never {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use std::any::Any;
        // On CubeCL backends the int primitive is the float one's type (the tensor carries
        // its dtype); on any other the kernel does not apply.
        let targets = *(Box::new(targets.clone()) as Box<dyn Any>)
            .downcast::<B::FloatTensorPrimitive>()
            .ok()?;
        let mut slot = custom::Slot {
            inputs: vec![logits.clone(), targets],
            outputs: None,
        };
        let call = cross_entropy::CrossEntropyCall { with_grad };
        custom::run(&mut slot, &call).then_some(())?;
        let mut outputs = slot.outputs?.into_iter();
        Some((outputs.next()?, outputs.next()))
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (logits, targets, with_grad);
        None
    }
}

/// Where matrix products run when the inner backend is on frugal-cuda's runtime (other
/// backends always run their own).
///
/// Burn's CubeCL products stage f32 operands in TF32 on GPUs that have TF32 tensor cores
/// (compute capability 8.0 on), so there [`Products::Auto`] runs f32 products on cuBLASLt's
/// TF32 too: the same arithmetic, faster, and none of CubeCL's matmul kernels to compile and
/// tune in a first process. On older GPUs f32 stays on CubeCL's kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// f16 and bf16 on cuBLASLt; f32 on cuBLASLt's TF32 where every GPU has TF32 tensor cores,
    /// else on CubeCL's kernels (Burn's numerics either way).
    #[default]
    Auto,
    /// Every product on cuBLASLt, f32 with strict IEEE arithmetic (slower than TF32).
    Blas,
    /// Every product on cuBLASLt, f32 on TF32 tensor cores (10-bit mantissa, as PyTorch's
    /// `allow_tf32`).
    BlasTf32,
    /// CubeCL's kernels (Burn's own products) for every dtype.
    Cube,
}

impl Products {
    /// Whether a product of `dtype` runs on cuBLASLt, and if f32, on TF32; `tf32_cores`:
    /// whether the GPUs have TF32 tensor cores (`frugal_cuda::tf32_cores`).
    #[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
    pub(crate) fn blas_for(self, dtype: burn_backend::DType, tf32_cores: bool) -> Option<bool> {
        use burn_backend::DType;
        match (self, dtype) {
            (Products::Cube, _) => None,
            (_, DType::F16 | DType::BF16) => Some(false),
            (Products::Auto, DType::F32) if tf32_cores => Some(true),
            (Products::Auto, _) => None,
            (Products::Blas, DType::F32) => Some(false),
            (Products::BlasTf32, DType::F32) => Some(true),
            _ => None,
        }
    }
}

static PRODUCTS: AtomicU8 = AtomicU8::new(0);

/// Sets where matrix products run, for every device (default [`Products::Auto`]).
pub fn set_products(products: Products) {
    PRODUCTS.store(
        match products {
            Products::Auto => 0,
            Products::Blas => 1,
            Products::BlasTf32 => 2,
            Products::Cube => 3,
        },
        Relaxed,
    );
}

/// The current [`Products`] setting.
pub fn products() -> Products {
    match PRODUCTS.load(Relaxed) {
        1 => Products::Blas,
        2 => Products::BlasTf32,
        3 => Products::Cube,
        _ => Products::Auto,
    }
}

/// How Frugal's attention runs on a CubeCL backend (the portable path, for other backends, is
/// unaffected).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPath {
    /// [`AttentionPath::Products`] for f16 and bf16 attention where their products run on
    /// cuBLASLt (frugal-cuda), [`AttentionPath::Flash`] otherwise: f32 products on cuBLASLt
    /// (strict or TF32) do not beat the flash kernels' f32 arithmetic by enough to pay for the
    /// score matrices' traffic.
    #[default]
    Auto,
    /// Frugal's flash-attention kernels: no `seq × seq` tensor at any time.
    Flash,
    /// Matrix products on tensor cores through cuBLASLt (`q kᵀ` and `P v` forward; the scores,
    /// `dO vᵀ`, `Pᵀ dO`, `dS k` and `dSᵀ q` backward), with the softmax and the scores'
    /// gradient in f32 between them: `seq × seq` matrices held only while one call runs (two
    /// forward, four backward; never between the passes, which keep what the flash kernels
    /// keep). Only on frugal-cuda, where the attention's dtype's products run on cuBLASLt (see
    /// [`Products`]: f16 and bf16 by default, f32 under [`Products::Blas`] or
    /// [`Products::BlasTf32`]); elsewhere the flash kernels.
    Products,
}

impl AttentionPath {
    /// Whether this setting asks for products for attention of `dtype` (where they can run).
    pub(crate) fn wants_products(self, dtype: burn_backend::DType) -> bool {
        use burn_backend::DType;
        match self {
            AttentionPath::Auto => matches!(dtype, DType::F16 | DType::BF16),
            AttentionPath::Flash => false,
            AttentionPath::Products => true,
        }
    }
}

static ATTENTION_PATH: AtomicU8 = AtomicU8::new(0);

/// Sets how attention runs, for every device (default [`AttentionPath::Auto`]).
pub fn set_attention_path(path: AttentionPath) {
    ATTENTION_PATH.store(
        match path {
            AttentionPath::Auto => 0,
            AttentionPath::Flash => 1,
            AttentionPath::Products => 2,
        },
        Relaxed,
    );
}

/// The current [`AttentionPath`] setting.
pub fn attention_path() -> AttentionPath {
    match ATTENTION_PATH.load(Relaxed) {
        1 => AttentionPath::Flash,
        2 => AttentionPath::Products,
        _ => AttentionPath::Auto,
    }
}

/// Whether products of `dtype` on `B`'s primitives run on cuBLASLt under the current
/// settings (frugal-cuda's runtime, fused or not, with the library present).
#[cfg_attr(
    not(feature = "frugal-cuda"),
    allow(clippy::extra_unused_type_parameters, unused_variables)
)]
pub(crate) fn products_on_library<B: Backend>(dtype: burn_backend::DType) -> bool {
    #[cfg(feature = "frugal-cuda")]
    {
        if mode() != KernelMode::Never
            && products().blas_for(dtype, products::tf32_cores()).is_some()
        {
            return products::takes::<B::FloatTensorPrimitive>();
        }
    }
    false
}

/// Whether attention of `dtype` on `B`'s primitives runs as matrix products (see
/// [`AttentionPath`]).
pub(crate) fn attention_by_products<B: Backend>(dtype: burn_backend::DType) -> bool {
    attention_path().wants_products(dtype) && products_on_library::<B>(dtype)
}

/// Which product a [`ProductSlot`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) enum ProductCall {
    /// `float_matmul(lhs, rhs)`.
    Matmul,
    /// `linear(x, weight, None)`: `x · weight` over all of x's rows.
    Linear,
    /// `linear_x_backward(weight, grad)`: `grad · weightᵀ`.
    LinearX,
    /// `linear_weight_backward(x, grad)`: `xᵀ · grad` summed over x's rows.
    LinearWeight,
}

/// A product's two operands and, once run, its output, for the runtimes to downcast.
#[cfg_attr(not(feature = "frugal-cuda"), allow(dead_code))]
pub(crate) struct ProductSlot<P> {
    pub(crate) call: ProductCall,
    pub(crate) inputs: [Option<P>; 2],
    pub(crate) output: Option<P>,
}

/// Runs a product on cuBLASLt when the setting and the primitives allow; else gives the
/// operands back.
#[allow(unused_variables)]
fn product<B: Backend>(
    call: ProductCall,
    a: B::FloatTensorPrimitive,
    b: B::FloatTensorPrimitive,
) -> Result<B::FloatTensorPrimitive, [B::FloatTensorPrimitive; 2]> {
    #[cfg(feature = "frugal-cuda")]
    {
        let products = products();
        if products != Products::Cube && mode() != KernelMode::Never {
            let mut slot = ProductSlot {
                call,
                inputs: [Some(a), Some(b)],
                output: None,
            };
            if products::run(&mut slot, products) {
                return Ok(slot.output.expect("the product put its output in the slot"));
            }
            let [a, b] = slot.inputs;
            return Err([a.expect("untouched"), b.expect("untouched")]);
        }
    }
    Err([a, b])
}

/// `B::float_matmul`, on cuBLASLt where [`Products`] and the primitive allow.
pub(crate) fn float_matmul<B: Backend>(
    lhs: B::FloatTensorPrimitive,
    rhs: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    match product::<B>(ProductCall::Matmul, lhs, rhs) {
        Ok(out) => out,
        Err([lhs, rhs]) => B::float_matmul(lhs, rhs),
    }
}

/// `B::linear`: the product over all of x's rows on cuBLASLt where it applies, then the bias
/// added as Burn's default `linear` adds it.
pub(crate) fn linear<B: Backend>(
    x: B::FloatTensorPrimitive,
    weight: B::FloatTensorPrimitive,
    bias: Option<B::FloatTensorPrimitive>,
) -> B::FloatTensorPrimitive {
    use burn_backend::TensorMetadata;
    match product::<B>(ProductCall::Linear, x, weight) {
        Ok(out) => match bias {
            Some(bias) => {
                let rank = out.shape().num_dims();
                let mut dims = vec![1; rank];
                dims[rank - 1] = bias.shape().num_elements();
                B::float_add(out, B::float_reshape(bias, burn_backend::Shape::from(dims)))
            }
            None => out,
        },
        Err([x, weight]) => B::linear(x, weight, bias),
    }
}

/// `B::linear_x_backward` (`grad · weightᵀ`), on cuBLASLt where it applies.
pub(crate) fn linear_x_backward<B: Backend>(
    weight: B::FloatTensorPrimitive,
    output_grad: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    match product::<B>(ProductCall::LinearX, weight, output_grad) {
        Ok(out) => out,
        Err([weight, output_grad]) => B::linear_x_backward(weight, output_grad),
    }
}

/// `B::linear_weight_backward` (`xᵀ · grad` over all rows), on cuBLASLt as one product where
/// it applies (Burn's default forms one product per batch and sums them).
pub(crate) fn linear_weight_backward<B: Backend>(
    x: B::FloatTensorPrimitive,
    output_grad: B::FloatTensorPrimitive,
) -> B::FloatTensorPrimitive {
    match product::<B>(ProductCall::LinearWeight, x, output_grad) {
        Ok(out) => out,
        Err([x, output_grad]) => B::linear_weight_backward(x, output_grad),
    }
}

/// How 2D convolutions on a CubeCL runtime choose their kernels.
///
/// Burn's autotune compiles and times every candidate of every pass (21 kernels for each new
/// shape, one after another) before the step that first meets the shape can end; one kernel a
/// pass skips that, but its kernel may be slower in every step after, so
/// [`ConvAlgorithm::OneKernel`] pays off for short runs or a first look at a model (the
/// trade measured on a ResNet is in `docs/results.md`, under cold start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConvAlgorithm {
    /// The inner backend's own convolution: on burn-cubecl, autotune keeps the fastest
    /// candidate of each pass and shape.
    #[default]
    Autotune,
    /// One kernel a pass: burn-cubecl's implicit GEMM on tensor cores where it takes the
    /// problem (a strided data gradient as a unit-stride one on the gradient spread out with
    /// zeros), else its direct kernel. A new shape compiles one kernel a pass.
    OneKernel,
}

static CONV_ALGORITHM: AtomicU8 = AtomicU8::new(0);

/// Sets how 2D convolutions choose their kernels, for every device (default
/// [`ConvAlgorithm::Autotune`]). [`KernelMode::Never`] leaves them to the inner backend
/// whatever this says.
pub fn set_conv_algorithm(algorithm: ConvAlgorithm) {
    CONV_ALGORITHM.store(algorithm as u8, Relaxed);
}

/// The current [`ConvAlgorithm`].
pub fn conv_algorithm() -> ConvAlgorithm {
    match CONV_ALGORITHM.load(Relaxed) {
        1 => ConvAlgorithm::OneKernel,
        _ => ConvAlgorithm::Autotune,
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod conv;

/// Runs one convolution pass with [`ConvAlgorithm::OneKernel`] if the algorithm, the mode
/// and the primitives allow; `Err` gives the inputs back.
fn conv_pass<B: Backend>(
    pass: ConvPassKind,
    inputs: Vec<B::FloatTensorPrimitive>,
    options: &burn_backend::ops::ConvOptions<2>,
) -> Result<B::FloatTensorPrimitive, Vec<B::FloatTensorPrimitive>> {
    if conv_algorithm() != ConvAlgorithm::OneKernel || mode() == KernelMode::Never {
        return Err(inputs);
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let call = conv::ConvCall {
            pass: match pass {
                ConvPassKind::Forward => conv::ConvPass::Forward,
                ConvPassKind::Data(x_shape) => conv::ConvPass::Data { x_shape },
                ConvPassKind::Weight(weight_shape) => conv::ConvPass::Weight { weight_shape },
            },
            options: options.clone(),
        };
        let mut slot = custom::Slot {
            inputs,
            outputs: None,
        };
        if custom::run(&mut slot, &call)
            && let Some(out) = slot.outputs.and_then(|outputs| outputs.into_iter().next())
        {
            return Ok(out);
        }
        Err(slot.inputs)
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (pass, options);
        Err(inputs)
    }
}

/// Which convolution pass [`conv_pass`] runs, with the shape it makes for the gradients.
// Without a CubeCL runtime no kernel reads the shapes.
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
enum ConvPassKind {
    Forward,
    Data(burn_backend::Shape),
    Weight(burn_backend::Shape),
}

/// `B::conv2d`, with one kernel under [`ConvAlgorithm::OneKernel`] on CubeCL runtimes.
pub(crate) fn conv2d<B: Backend>(
    x: B::FloatTensorPrimitive,
    weight: B::FloatTensorPrimitive,
    bias: Option<B::FloatTensorPrimitive>,
    options: burn_backend::ops::ConvOptions<2>,
) -> B::FloatTensorPrimitive {
    let with_bias = bias.is_some();
    let mut inputs = vec![x, weight];
    inputs.extend(bias);
    match conv_pass::<B>(ConvPassKind::Forward, inputs, &options) {
        Ok(out) => out,
        Err(inputs) => {
            let mut inputs = inputs.into_iter();
            let (x, weight) = (inputs.next().expect("x"), inputs.next().expect("weight"));
            let bias = with_bias.then(|| inputs.next().expect("bias"));
            B::conv2d(x, weight, bias, options)
        }
    }
}

/// `B::conv2d_x_backward`, with one kernel under [`ConvAlgorithm::OneKernel`] on CubeCL
/// runtimes.
pub(crate) fn conv2d_x_backward<B: Backend>(
    x: B::FloatTensorPrimitive,
    weight: B::FloatTensorPrimitive,
    output_grad: B::FloatTensorPrimitive,
    options: burn_backend::ops::ConvOptions<2>,
) -> B::FloatTensorPrimitive {
    use burn_backend::TensorMetadata;
    let pass = ConvPassKind::Data(x.shape());
    match conv_pass::<B>(pass, vec![output_grad, weight], &options) {
        Ok(out) => out,
        Err(inputs) => {
            let [output_grad, weight] = <[_; 2]>::try_from(inputs).expect("two inputs");
            B::conv2d_x_backward(x, weight, output_grad, options)
        }
    }
}

/// `B::conv2d_weight_backward`, with one kernel under [`ConvAlgorithm::OneKernel`] on CubeCL
/// runtimes.
pub(crate) fn conv2d_weight_backward<B: Backend>(
    x: B::FloatTensorPrimitive,
    weight: B::FloatTensorPrimitive,
    output_grad: B::FloatTensorPrimitive,
    options: burn_backend::ops::ConvOptions<2>,
) -> B::FloatTensorPrimitive {
    use burn_backend::TensorMetadata;
    let pass = ConvPassKind::Weight(weight.shape());
    match conv_pass::<B>(pass, vec![x, output_grad], &options) {
        Ok(out) => out,
        Err(inputs) => {
            let [x, output_grad] = <[_; 2]>::try_from(inputs).expect("two inputs");
            B::conv2d_weight_backward(x, weight, output_grad, options)
        }
    }
}

#[cfg(feature = "frugal-cuda")]
mod products;

#[cfg(feature = "frugal-cuda")]
pub(crate) mod attention_products;

#[cfg(feature = "frugal-cuda")]
mod upload;

/// `data` on `device` as primitive `P`, uploaded without a host copy where the runtime allows
/// (frugal-cuda, fused or not); else `data` back for the backend's own `from_data`.
pub(crate) fn try_upload<P: 'static, D: 'static>(
    data: burn_backend::TensorData,
    device: &D,
) -> Result<P, burn_backend::TensorData> {
    #[cfg(feature = "frugal-cuda")]
    {
        upload::try_upload(data, device)
    }
    #[cfg(not(feature = "frugal-cuda"))]
    {
        let _ = device;
        Err(data)
    }
}

#[cfg(test)]
mod tests {
    use super::Products;
    use burn_backend::DType;

    #[test]
    fn auto_attention_takes_products_for_16_bit_only() {
        use super::AttentionPath;
        assert!(AttentionPath::Auto.wants_products(DType::BF16));
        assert!(AttentionPath::Auto.wants_products(DType::F16));
        assert!(!AttentionPath::Auto.wants_products(DType::F32));
        assert!(AttentionPath::Products.wants_products(DType::F32));
        assert!(!AttentionPath::Flash.wants_products(DType::BF16));
    }

    #[test]
    fn auto_moves_16_bit_products_and_f32_on_tf32_cores_to_the_library() {
        for cores in [false, true] {
            assert_eq!(Products::Auto.blas_for(DType::BF16, cores), Some(false));
            assert_eq!(Products::Auto.blas_for(DType::F16, cores), Some(false));
            assert_eq!(Products::Blas.blas_for(DType::F32, cores), Some(false));
            assert_eq!(Products::BlasTf32.blas_for(DType::F32, cores), Some(true));
            assert_eq!(Products::Cube.blas_for(DType::BF16, cores), None);
            assert_eq!(Products::Cube.blas_for(DType::F32, cores), None);
            assert_eq!(Products::Blas.blas_for(DType::F64, cores), None);
            assert_eq!(Products::Auto.blas_for(DType::F64, cores), None);
        }
        // f32 follows Burn's arithmetic: TF32 on GPUs with TF32 tensor cores, CubeCL's
        // kernels elsewhere.
        assert_eq!(Products::Auto.blas_for(DType::F32, true), Some(true));
        assert_eq!(Products::Auto.blas_for(DType::F32, false), None);
    }
}
