//! Layer 3, kernel dispatch: Frugal's own CubeCL kernels (crate `frugal-kernels`) in place
//! of the inner backend's ops, for inner backends built on a CubeCL runtime this build knows
//! (features `cuda`, `wgpu`), with Burn's fusion on or off. Owns the mode and the counters;
//! imports `runtime`. The gradient unscale's launches are in `crate::scaler`, above the tensor
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
//! - **the 8-bit AdamW update** (`crate::optim::AdamW8bit`): one launch per parameter, in
//!   place (its dispatch is in `crate::optim`, above the tensor type it unwraps).
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
    /// Launches of the fused 8-bit AdamW update (`frugal::optim::AdamW8bit`), one per
    /// parameter and step.
    pub adamw8bit_launches: u64,
    /// Of those, registered as a custom operation of Burn's fusion (counted when registered).
    pub fused_adamw8bit: u64,
    /// Attention forward passes run by Frugal's flash-attention kernels.
    pub attention_forwards: u64,
    /// Attention backward passes run by Frugal's flash-attention kernels.
    pub attention_backwards: u64,
}

pub(crate) static CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static SCALED_CASTS: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNSCALE_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static UNSCALED_TENSORS: AtomicU64 = AtomicU64::new(0);
pub(crate) static ADAMW8BIT_LAUNCHES: AtomicU64 = AtomicU64::new(0);
pub(crate) static FUSED_ADAMW8BIT: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static ATTENTION_FORWARDS: AtomicU64 = AtomicU64::new(0);
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) static ATTENTION_BACKWARDS: AtomicU64 = AtomicU64::new(0);

/// Reads the [`KernelStats`] counters.
pub fn stats() -> KernelStats {
    KernelStats {
        casts: CASTS.load(Relaxed),
        fused_casts: FUSED_CASTS.load(Relaxed),
        scaled_casts: SCALED_CASTS.load(Relaxed),
        unscale_launches: UNSCALE_LAUNCHES.load(Relaxed),
        unscaled_tensors: UNSCALED_TENSORS.load(Relaxed),
        adamw8bit_launches: ADAMW8BIT_LAUNCHES.load(Relaxed),
        fused_adamw8bit: FUSED_ADAMW8BIT.load(Relaxed),
        attention_forwards: ATTENTION_FORWARDS.load(Relaxed),
        attention_backwards: ATTENTION_BACKWARDS.load(Relaxed),
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
        let mut slot = attention::Slot {
            inputs: all,
            has_bias: bias.is_some(),
            outputs: None,
        };
        if attention::run(&mut slot, &call, backward) {
            return slot.outputs;
        }
        None
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (inputs, bias, call, backward);
        None
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod attention;
