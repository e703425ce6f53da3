//! Autocast: the precision each op computes in, per device, from a table the user can change.
//!
//! Off by default. When a device has an [`AutocastPolicy`], every float op Frugal forwards
//! looks up its [`OpPrecision`] (one relaxed byte load; nothing else when autocast is off) and,
//! if its float inputs do not already match, casts them with Frugal's own `float_cast` (so the
//! casts are charged, recorded and replayable like any op) before the inner backend runs it:
//!
//! | precision | inputs | output |
//! |---|---|---|
//! | [`Low`](OpPrecision::Low) | f32 inputs cast to the policy's low type (bf16 or f16) | cast back to the widest input type |
//! | [`F32`](OpPrecision::F32) | f16/bf16 inputs cast to f32 | f32 |
//! | [`Promote`](OpPrecision::Promote) | mixed inputs cast to the widest | the widest |
//! | [`Keep`](OpPrecision::Keep) | as given | as the inner backend returns it |
//!
//! The default table ([`AutocastPolicy::new`]) follows PyTorch's CUDA autocast lists: matrix
//! products (`float_matmul`, and Burn's `linear` op that `nn::Linear` calls, bias included),
//! convolutions (forward and both backward products) and attention run in the low
//! type — the inner backend accumulates in f32 (CubeCL's matmul and Flex's bf16 matmul both
//! do); exponentials, logarithms, powers, reciprocals and reductions (sums, means, products,
//! cumulative sums) in f32; every other op promotes mixed inputs; casts and data movement keep
//! their types.
//!
//! One deliberate difference from PyTorch, by default: a `Low` op's result is cast back to the
//! widest input type (f32 for an f32 model); [`AutocastPolicy::with_low_outputs`] gives
//! PyTorch's behaviour instead. Frugal sits below Burn's autodiff, which cannot see Frugal's
//! casts; returning f32 keeps every tensor autodiff and the optimizer see — parameters,
//! activations, gradients, optimizer state — in f32, so no gradient silently becomes bf16.
//! The memory PyTorch saves by keeping activations in bf16 comes instead from compressed
//! storage ([`crate::memory::set_storage_precision`]), which keeps tensors at rest in bf16/f16.

use burn_backend::{Backend, DType, DeviceOps};

pub use crate::autocast::{AutocastPolicy, LowPrecision, OpPrecision, PrecisionError};
use crate::device::DeviceState;

/// Switches autocast on `device` on with `policy`, or off with `None`. `B` is any backend whose
/// device type `device` is (the inner backend, `Frugal<_>`, or `Autodiff<Frugal<_>>`); it is
/// asked whether it supports the policy's low type on that device, and a type it cannot
/// compute in is refused with the types it can.
pub fn set_autocast<B: Backend>(
    device: &B::Device,
    policy: Option<AutocastPolicy>,
) -> Result<(), PrecisionError>
where
    B::Device: DeviceOps + 'static,
{
    if let Some(policy) = &policy {
        check_supported::<B>(device, policy.low().dtype())?;
    }
    DeviceState::of_device(device).autocast.set(policy.as_ref());
    Ok(())
}

/// Switches autocast and compressed storage ([`crate::memory::set_storage_precision`]) off on
/// `device`; needs no backend type, so cleanup code generic over the device can call it.
pub fn clear<D: DeviceOps + 'static>(device: &D) {
    let state = DeviceState::of_device(device);
    state.autocast.set(None);
    state.budget.set_storage(None);
}

/// The autocast policy on `device`, or `None` when autocast is off there.
pub fn autocast<D: DeviceOps + 'static>(device: &D) -> Option<AutocastPolicy> {
    DeviceState::of_device(device).autocast.get()
}

/// How many of autocast's casts on `device` were found kept rather than made again (see
/// [`AutocastPolicy::with_kept_casts`]), since the process started.
pub fn kept_casts_reused<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).autocast.kept_casts_reused()
}

/// `Ok` if `B` computes in `dtype` on `device`, else the error naming what it supports.
pub(crate) fn check_supported<B: Backend>(
    device: &B::Device,
    dtype: DType,
) -> Result<(), PrecisionError> {
    if B::supports_dtype(device, dtype) {
        return Ok(());
    }
    Err(PrecisionError::UnsupportedDtype {
        dtype,
        backend: B::name(device),
        supported: [DType::BF16, DType::F16]
            .into_iter()
            .filter(|d| B::supports_dtype(device, *d))
            .collect(),
    })
}

/// Casts each gradient of `module`'s parameters in `grads` to its parameter's type, so the
/// optimizer's state is built in the parameters' type (f32 for an f32 model). Needed with
/// [`AutocastPolicy::with_low_outputs`], where a gradient computed from 16-bit activations is
/// 16-bit; cheap otherwise (no cast when the types already match).
/// [`crate::GradScaler::unscale`] does the same.
pub fn match_param_dtypes<B, M>(module: &M, grads: &mut burn_optim::GradientsParams)
where
    B: burn_core::tensor::backend::AutodiffBackend,
    M: burn_core::module::AutodiffModule<B>,
{
    module.visit(&mut MatchDtypes::<B> {
        grads,
        _backend: std::marker::PhantomData,
    });
}

struct MatchDtypes<'a, B> {
    grads: &'a mut burn_optim::GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: burn_core::tensor::backend::AutodiffBackend> burn_core::module::ModuleVisitor<B>
    for MatchDtypes<'_, B>
{
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn_core::module::Param<burn_core::tensor::Tensor<B, D>>,
    ) {
        if let Some(grad) = take_grad_as_param::<B, D>(self.grads, param) {
            self.grads.register(param.id, grad);
        }
    }
}

/// Removes `param`'s gradient from `grads`, cast to the parameter's type if it differs.
pub(crate) fn take_grad_as_param<B, const D: usize>(
    grads: &mut burn_optim::GradientsParams,
    param: &burn_core::module::Param<burn_core::tensor::Tensor<B, D>>,
) -> Option<burn_core::tensor::Tensor<B::InnerBackend, D>>
where
    B: burn_core::tensor::backend::AutodiffBackend,
{
    let grad = grads.remove::<B::InnerBackend, D>(param.id)?;
    let dtype = param.val().dtype();
    Some(if grad.dtype() == dtype {
        grad
    } else {
        grad.cast(dtype)
    })
}
