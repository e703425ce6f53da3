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

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use burn_backend::{Backend, DType, DeviceOps, TensorMetadata};
use burn_std::FloatDType;

use crate::Frugal;
use crate::ledger::Ledger;
use crate::ops::{OP_COUNT, OpId, forwarded_methods};

/// How autocast treats an op's floating-point inputs (see the module docs' table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpPrecision {
    /// Inputs as given; the op is never touched.
    Keep,
    /// Mixed float inputs are cast to the widest of their types.
    Promote,
    /// f16/bf16 inputs are cast to f32.
    F32,
    /// f32 inputs are cast to the policy's low type; the result is cast back to the widest
    /// input type.
    Low,
}

/// The low-precision type autocast computes [`OpPrecision::Low`] ops in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LowPrecision {
    /// bfloat16: f32's range, 8 bits of mantissa. No loss scaling needed.
    BF16,
    /// IEEE half: 11 bits of mantissa, range to 65504. Train with a [`crate::GradScaler`].
    F16,
}

impl LowPrecision {
    /// Burn's dtype for it.
    pub fn dtype(self) -> DType {
        match self {
            LowPrecision::BF16 => DType::BF16,
            LowPrecision::F16 => DType::F16,
        }
    }
}

/// Ops computed in the low type by default (PyTorch's "lower precision" list as Burn names
/// the ops).
pub const DEFAULT_LOW: &[&str] = &[
    "float_matmul",
    "linear",
    "linear_x_backward",
    "linear_weight_backward",
    "conv1d",
    "conv1d_x_backward",
    "conv1d_weight_backward",
    "conv2d",
    "conv2d_x_backward",
    "conv2d_weight_backward",
    "conv3d",
    "conv3d_x_backward",
    "conv3d_weight_backward",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "attention",
];

/// Ops computed in f32 by default (PyTorch's "float32" list: exponentials, logarithms,
/// powers, reciprocals, reductions, and the activations built on them).
pub const DEFAULT_F32: &[&str] = &[
    "float_exp",
    "float_log",
    "float_log1p",
    "float_recip",
    "float_powf",
    "float_powi",
    "float_powi_scalar",
    "float_powi_scalar_impl",
    "float_powf_scalar",
    "float_powf_scalar_impl",
    "float_sum",
    "float_sum_dim",
    "float_mean",
    "float_mean_dim",
    "float_prod",
    "float_prod_dim",
    "float_cumsum",
    "float_cumprod",
    "float_acos",
    "float_asin",
    "float_cosh",
    "float_sinh",
    "float_tan",
    "float_erf",
    "log_sigmoid",
    "log_sigmoid_backward",
    "linear_bias_backward",
    "conv1d_bias_backward",
    "conv2d_bias_backward",
    "conv3d_bias_backward",
];

/// Ops whose inputs autocast never touches: casts themselves and data movement between types
/// or devices.
pub const DEFAULT_KEEP: &[&str] = &[
    "float_cast",
    "float_into_int",
    "float_to_device",
    "float_into_data",
    "float_is_nan",
    "float_is_inf",
];

/// An autocast policy: the low type and the precision of every forwarded op. Build it with
/// [`AutocastPolicy::new`], change entries with [`AutocastPolicy::with`], switch it on with
/// [`set_autocast`].
#[derive(Clone, Debug, PartialEq)]
pub struct AutocastPolicy {
    low: LowPrecision,
    by_op: Vec<OpPrecision>,
    keep_low_outputs: bool,
}

/// A refused autocast setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrecisionError {
    /// The op name is not a method Frugal forwards.
    UnknownOp(String),
    /// The device's backend cannot compute in the requested type.
    UnsupportedDtype {
        /// The requested type.
        dtype: DType,
        /// The backend's name.
        backend: String,
        /// The low types the backend supports on that device (may be empty).
        supported: Vec<DType>,
    },
}

impl std::fmt::Display for PrecisionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrecisionError::UnknownOp(name) => write!(
                f,
                "autocast policy: `{name}` is not a Backend method Frugal forwards \
                 (see frugal::ops::forwarded_methods(), e.g. float_matmul, conv2d, float_exp)"
            ),
            PrecisionError::UnsupportedDtype {
                dtype,
                backend,
                supported,
            } => {
                write!(
                    f,
                    "autocast to {dtype:?}: backend {backend} does not support it"
                )?;
                if supported.is_empty() {
                    write!(
                        f,
                        "; it supports neither bf16 nor f16 (use f32, or a backend such as Cuda or Flex)"
                    )
                } else {
                    write!(f, "; accepted here: {supported:?}")
                }
            }
        }
    }
}

impl std::error::Error for PrecisionError {}

fn index_of(name: &str) -> Option<usize> {
    forwarded_methods().iter().position(|(_, m)| *m == name)
}

impl AutocastPolicy {
    /// The default table (see the module docs) with `low` as the low type.
    pub fn new(low: LowPrecision) -> Self {
        let mut by_op = vec![OpPrecision::Promote; OP_COUNT];
        for (list, precision) in [
            (DEFAULT_LOW, OpPrecision::Low),
            (DEFAULT_F32, OpPrecision::F32),
            (DEFAULT_KEEP, OpPrecision::Keep),
        ] {
            for name in list {
                let i = index_of(name).unwrap_or_else(|| panic!("default table names `{name}`"));
                by_op[i] = precision;
            }
        }
        Self {
            low,
            by_op,
            keep_low_outputs: false,
        }
    }

    /// With `true`, `Low` ops return their result in the low type, as PyTorch's autocast does
    /// (activations in bf16/f16: less memory and traffic), except the ops that produce a
    /// parameter's gradient (`*_weight_backward`, `*_bias_backward`), which still return f32.
    /// Gradients of parameters computed by other ops from 16-bit tensors may then be 16-bit:
    /// [`crate::GradScaler::unscale`] returns every gradient in f32. Off by default.
    pub fn with_low_outputs(mut self, keep_low_outputs: bool) -> Self {
        self.keep_low_outputs = keep_low_outputs;
        self
    }

    /// Whether `Low` ops return the low type (see [`Self::with_low_outputs`]).
    pub fn low_outputs(&self) -> bool {
        self.keep_low_outputs
    }

    /// The policy with `op` (a Backend method name such as `float_matmul`) set to `precision`.
    pub fn with(mut self, op: &str, precision: OpPrecision) -> Result<Self, PrecisionError> {
        let i = index_of(op).ok_or_else(|| PrecisionError::UnknownOp(op.to_string()))?;
        self.by_op[i] = precision;
        Ok(self)
    }

    /// The low type.
    pub fn low(&self) -> LowPrecision {
        self.low
    }

    /// The precision of `op`, or `None` if Frugal does not forward a method of that name.
    pub fn get(&self, op: &str) -> Option<OpPrecision> {
        index_of(op).map(|i| self.by_op[i])
    }

    /// Every op that is not [`OpPrecision::Promote`], as `(trait, method, precision)`: the
    /// table as it stands, for printing.
    pub fn table(&self) -> Vec<(&'static str, &'static str, OpPrecision)> {
        forwarded_methods()
            .into_iter()
            .zip(&self.by_op)
            .filter(|(_, p)| **p != OpPrecision::Promote)
            .map(|((family, name), p)| (family, name, *p))
            .collect()
    }
}

// Per-op byte codes in a ledger's table; 0 (KEEP) everywhere while autocast is off.
const KEEP: u8 = 0;
const PROMOTE: u8 = 1;
const F32: u8 = 2;
const LOW_BF16: u8 = 3;
const LOW_F16: u8 = 4;
// As LOW_*, the result left in the low type.
const LOW_BF16_OUT: u8 = 5;
const LOW_F16_OUT: u8 = 6;

/// Ops whose result is a parameter's gradient: cast back to f32 whatever the policy.
fn gives_parameter_gradient(name: &str) -> bool {
    name.ends_with("_weight_backward") || name.ends_with("_bias_backward")
}

/// A device's compiled autocast table: one byte per forwarded op.
pub(crate) struct PrecisionTable {
    by_op: Box<[AtomicU8]>,
    low: AtomicU8,
    low_outputs: std::sync::atomic::AtomicBool,
}

impl Default for PrecisionTable {
    fn default() -> Self {
        Self {
            by_op: (0..OP_COUNT).map(|_| AtomicU8::new(KEEP)).collect(),
            low: AtomicU8::new(KEEP),
            low_outputs: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl PrecisionTable {
    /// The op's code: what [`plan`] takes.
    #[inline]
    pub(crate) fn code(&self, op: OpId) -> u8 {
        self.by_op[op.index()].load(Relaxed)
    }

    fn set(&self, policy: Option<&AutocastPolicy>) {
        let Some(policy) = policy else {
            self.low.store(KEEP, Relaxed);
            self.by_op.iter().for_each(|c| c.store(KEEP, Relaxed));
            return;
        };
        let (low, low_out) = match policy.low {
            LowPrecision::BF16 => (LOW_BF16, LOW_BF16_OUT),
            LowPrecision::F16 => (LOW_F16, LOW_F16_OUT),
        };
        self.low.store(low, Relaxed);
        self.low_outputs.store(policy.keep_low_outputs, Relaxed);
        let names = forwarded_methods();
        for ((code, precision), (_, name)) in self.by_op.iter().zip(&policy.by_op).zip(names) {
            code.store(
                match precision {
                    OpPrecision::Keep => KEEP,
                    OpPrecision::Promote => PROMOTE,
                    OpPrecision::F32 => F32,
                    OpPrecision::Low
                        if policy.keep_low_outputs && !gives_parameter_gradient(name) =>
                    {
                        low_out
                    }
                    OpPrecision::Low => low,
                },
                Relaxed,
            );
        }
    }

    fn get(&self) -> Option<AutocastPolicy> {
        let low = match self.low.load(Relaxed) {
            LOW_BF16 => LowPrecision::BF16,
            LOW_F16 => LowPrecision::F16,
            _ => return None,
        };
        let by_op = self
            .by_op
            .iter()
            .map(|c| match c.load(Relaxed) {
                KEEP => OpPrecision::Keep,
                PROMOTE => OpPrecision::Promote,
                F32 => OpPrecision::F32,
                _ => OpPrecision::Low,
            })
            .collect();
        Some(AutocastPolicy {
            low,
            by_op,
            keep_low_outputs: self.low_outputs.load(Relaxed),
        })
    }
}

/// The float types among an op's inputs, as a bit set.
#[derive(Clone, Copy, Default)]
pub(crate) struct DtypeSet(u8);

const BIT_F64: u8 = 1;
const BIT_F32: u8 = 2;
const BIT_F16: u8 = 4;
const BIT_BF16: u8 = 8;
// Flex32 and quantized floats: autocast leaves such ops alone.
const BIT_OTHER: u8 = 16;

impl DtypeSet {
    #[inline]
    pub(crate) fn add(&mut self, dtype: DType) {
        self.0 |= match dtype {
            DType::F64 => BIT_F64,
            DType::F32 => BIT_F32,
            DType::F16 => BIT_F16,
            DType::BF16 => BIT_BF16,
            _ => BIT_OTHER,
        };
    }

    fn widest(self) -> DType {
        if self.0 & BIT_F64 != 0 {
            DType::F64
        } else if self.0 & BIT_F32 != 0 || self.0 & (BIT_F16 | BIT_BF16) == BIT_F16 | BIT_BF16 {
            DType::F32
        } else if self.0 & BIT_F16 != 0 {
            DType::F16
        } else {
            DType::BF16
        }
    }
}

/// What autocast does to one call: the type every float input is cast to, and the type the
/// output is cast to afterwards (for `Low` ops).
pub(crate) struct Plan {
    pub(crate) input: DType,
    pub(crate) output: Option<DType>,
}

/// The casts an op with precision `code` needs for inputs of types `dtypes`, or `None` when
/// its inputs already fit (which ends the recursion: the op is called again on cast inputs).
#[inline]
pub(crate) fn plan(code: u8, dtypes: DtypeSet) -> Option<Plan> {
    let bits = dtypes.0;
    if bits == 0 || bits & BIT_OTHER != 0 {
        return None;
    }
    let mixed = bits.count_ones() > 1;
    match code {
        PROMOTE if mixed => Some(Plan {
            input: dtypes.widest(),
            output: None,
        }),
        F32 if bits & (BIT_F16 | BIT_BF16) != 0 => Some(Plan {
            input: dtypes.widest().max_f32(),
            output: None,
        }),
        LOW_BF16 | LOW_F16 | LOW_BF16_OUT | LOW_F16_OUT if bits & BIT_F64 == 0 => {
            let low = if code == LOW_BF16 || code == LOW_BF16_OUT {
                (DType::BF16, BIT_BF16)
            } else {
                (DType::F16, BIT_F16)
            };
            let cast_back = code == LOW_BF16 || code == LOW_F16;
            (bits != low.1).then(|| Plan {
                input: low.0,
                output: cast_back.then(|| dtypes.widest()),
            })
        }
        _ => None,
    }
}

trait MaxF32 {
    fn max_f32(self) -> DType;
}

impl MaxF32 for DType {
    fn max_f32(self) -> DType {
        if self == DType::F64 { self } else { DType::F32 }
    }
}

/// `tensor` cast to `dtype` through Frugal's own `float_cast` (charged and recorded like any
/// op), or unchanged if it already has that type.
#[inline]
pub(crate) fn cast_to<B: Backend>(
    tensor: burn_backend::tensor::FloatTensor<Frugal<B>>,
    dtype: DType,
) -> burn_backend::tensor::FloatTensor<Frugal<B>> {
    if tensor.dtype() == dtype {
        return tensor;
    }
    <Frugal<B> as burn_backend::ops::FloatTensorOps<Frugal<B>>>::float_cast(
        tensor,
        FloatDType::from(dtype),
    )
}

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
        check_supported::<B>(device, policy.low.dtype())?;
    }
    Ledger::of_device(device).precision.set(policy.as_ref());
    Ok(())
}

/// Switches autocast and compressed storage ([`crate::memory::set_storage_precision`]) off on
/// `device`; needs no backend type, so cleanup code generic over the device can call it.
pub fn clear<D: DeviceOps + 'static>(device: &D) {
    let ledger = Ledger::of_device(device);
    ledger.precision.set(None);
    ledger.budget.set_storage_dtype(None);
}

/// The autocast policy on `device`, or `None` when autocast is off there.
pub fn autocast<D: DeviceOps + 'static>(device: &D) -> Option<AutocastPolicy> {
    Ledger::of_device(device).precision.get()
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
