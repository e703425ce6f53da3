//! Layer 2, autocast's machinery: the policy type and each device's compiled table (one byte
//! per op), and the plan of casts for one call. Owns no device state; imports `op`, `units`.
//! What autocast does and how to switch it on: [`crate::precision`].

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};

use burn_backend::DType;

pub use crate::units::LowPrecision;
pub use crate::vocabulary::OpPrecision;
use crate::vocabulary::{OP_COUNT, OpId, forwarded_methods};

/// An autocast policy: the low type and the precision of every forwarded op. Build it with
/// [`AutocastPolicy::new`], change entries with [`AutocastPolicy::with`], switch it on with
/// [`set_autocast`](crate::set_autocast).
#[derive(Clone, Debug, PartialEq)]
pub struct AutocastPolicy {
    low: LowPrecision,
    by_op: Vec<OpPrecision>,
    keep_low_outputs: bool,
    keep_casts: bool,
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

impl AutocastPolicy {
    /// The default table (see the module docs) with `low` as the low type.
    pub fn new(low: LowPrecision) -> Self {
        let by_op = (0..OP_COUNT)
            .map(|i| OpId::from_index(i).facts().autocast)
            .collect();
        Self {
            low,
            by_op,
            keep_low_outputs: false,
            keep_casts: true,
        }
    }

    /// With `true` (the default), a cast autocast makes of a whole buffer to the low type is
    /// kept while that buffer lives, and used again instead of casting again: backward reads
    /// the weights and the saved activations that forward cast, as PyTorch's autocast keeps
    /// its weight casts. It costs memory: each such buffer's low copy (half an f32 buffer)
    /// lives as long as the buffer (until a parameter is updated, an activation is freed).
    /// Tensors managed by a budget or a checkpoint scope never keep casts.
    pub fn with_kept_casts(mut self, keep_casts: bool) -> Self {
        self.keep_casts = keep_casts;
        self
    }

    /// Whether casts to the low type are kept (see [`Self::with_kept_casts`]).
    pub fn kept_casts(&self) -> bool {
        self.keep_casts
    }

    /// With `true`, `Low` ops return their result in the low type, as PyTorch's autocast does
    /// (activations in bf16/f16: less memory and traffic), except the ops that produce a
    /// parameter's gradient (`*_weight_backward`, `*_bias_backward`), which return the widest
    /// type of their inputs (f32 where one is f32). Bias gradients (`*_bias_backward`, on the
    /// f32 list otherwise) are then computed in the low type like the products they belong to:
    /// a 16-bit output gradient is summed as it is (CubeCL's and Flex's reductions accumulate
    /// in f32), not widened first. Gradients of parameters computed from 16-bit tensors only
    /// may then be 16-bit: [`crate::GradScaler::unscale`] and
    /// [`crate::precision::match_param_dtypes`] return them in their parameter's type. Off by
    /// default.
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
        let id = OpId::by_name(op).ok_or_else(|| PrecisionError::UnknownOp(op.to_string()))?;
        self.by_op[id.index()] = precision;
        Ok(self)
    }

    /// The low type.
    pub fn low(&self) -> LowPrecision {
        self.low
    }

    /// The precision of `op`, or `None` if Frugal does not forward a method of that name.
    pub fn get(&self, op: &str) -> Option<OpPrecision> {
        OpId::by_name(op).map(|id| self.by_op[id.index()])
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
// An op of the f32 list that gives a parameter's gradient (a bias's), under low outputs:
// planned as LOW_*, read back as F32 (the policy the user set).
const F32_PARAM_BF16: u8 = 7;
const F32_PARAM_F16: u8 = 8;

/// A device's compiled autocast table: one byte per forwarded op.
pub(crate) struct PrecisionTable {
    by_op: Box<[AtomicU8]>,
    low: AtomicU8,
    low_outputs: AtomicBool,
    keep_casts: AtomicBool,
    kept_cast_reuses: AtomicU64,
}

impl Default for PrecisionTable {
    fn default() -> Self {
        Self {
            by_op: (0..OP_COUNT).map(|_| AtomicU8::new(KEEP)).collect(),
            low: AtomicU8::new(KEEP),
            low_outputs: AtomicBool::new(false),
            keep_casts: AtomicBool::new(false),
            kept_cast_reuses: AtomicU64::new(0),
        }
    }
}

impl PrecisionTable {
    /// The op's code: what [`plan`] takes.
    #[inline]
    pub(crate) fn code(&self, op: OpId) -> u8 {
        self.by_op[op.index()].load(Relaxed)
    }

    pub(crate) fn set(&self, policy: Option<&AutocastPolicy>) {
        let Some(policy) = policy else {
            self.keep_casts.store(false, Relaxed);
            self.low.store(KEEP, Relaxed);
            self.by_op.iter().for_each(|c| c.store(KEEP, Relaxed));
            return;
        };
        let (low, low_out, f32_param) = match policy.low {
            LowPrecision::BF16 => (LOW_BF16, LOW_BF16_OUT, F32_PARAM_BF16),
            LowPrecision::F16 => (LOW_F16, LOW_F16_OUT, F32_PARAM_F16),
        };
        self.low.store(low, Relaxed);
        self.low_outputs.store(policy.keep_low_outputs, Relaxed);
        self.keep_casts.store(policy.keep_casts, Relaxed);
        for (index, (code, precision)) in self.by_op.iter().zip(&policy.by_op).enumerate() {
            let param_grad = OpId::from_index(index).facts().gives_param_grad;
            code.store(
                match precision {
                    OpPrecision::Keep => KEEP,
                    OpPrecision::Promote => PROMOTE,
                    // A bias's gradient is computed in the low type like the product it
                    // belongs to, as PyTorch's autocast sums it inside the product's backward
                    // (the reductions accumulate in f32): a 16-bit output gradient is not
                    // first widened, a copy of the whole gradient for one row of sums.
                    OpPrecision::F32 if policy.keep_low_outputs && param_grad => f32_param,
                    OpPrecision::F32 => F32,
                    OpPrecision::Low if policy.keep_low_outputs && !param_grad => low_out,
                    OpPrecision::Low => low,
                },
                Relaxed,
            );
        }
    }

    pub(crate) fn get(&self) -> Option<AutocastPolicy> {
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
                F32 | F32_PARAM_BF16 | F32_PARAM_F16 => OpPrecision::F32,
                _ => OpPrecision::Low,
            })
            .collect();
        Some(AutocastPolicy {
            low,
            by_op,
            keep_low_outputs: self.low_outputs.load(Relaxed),
            keep_casts: self.keep_casts.load(Relaxed),
        })
    }

    /// Whether autocast keeps its casts to the low type (see
    /// [`AutocastPolicy::with_kept_casts`]).
    #[inline]
    pub(crate) fn keeps_casts(&self) -> bool {
        self.keep_casts.load(Relaxed)
    }

    /// Counts a kept cast used instead of casting again.
    #[inline]
    pub(crate) fn note_kept_cast_reused(&self) {
        self.kept_cast_reuses.fetch_add(1, Relaxed);
    }

    /// How many casts were saved by kept ones since the process started.
    pub(crate) fn kept_casts_reused(&self) -> u64 {
        self.kept_cast_reuses.load(Relaxed)
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
        LOW_BF16 | LOW_F16 | LOW_BF16_OUT | LOW_F16_OUT | F32_PARAM_BF16 | F32_PARAM_F16
            if bits & BIT_F64 == 0 =>
        {
            let low = if matches!(code, LOW_BF16 | LOW_BF16_OUT | F32_PARAM_BF16) {
                (DType::BF16, BIT_BF16)
            } else {
                (DType::F16, BIT_F16)
            };
            let cast_back = !matches!(code, LOW_BF16_OUT | LOW_F16_OUT);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::families::module;

    fn dtypes(dtype: DType) -> DtypeSet {
        let mut set = DtypeSet::default();
        set.add(dtype);
        set
    }

    #[test]
    fn under_low_outputs_a_bias_gradient_is_planned_low_and_the_policy_reads_back_as_set() {
        let bias = module::op(module::Op::linear_bias_backward);
        let table = PrecisionTable::default();
        let policy = AutocastPolicy::new(LowPrecision::BF16).with_low_outputs(true);
        table.set(Some(&policy));
        assert_eq!(table.get(), Some(policy));
        // A bf16 gradient is summed as it is; an f32 one in bf16, its sum back in f32.
        assert!(plan(table.code(bias), dtypes(DType::BF16)).is_none());
        let from_f32 = plan(table.code(bias), dtypes(DType::F32)).unwrap();
        assert_eq!(
            (from_f32.input, from_f32.output),
            (DType::BF16, Some(DType::F32))
        );
        // Without low outputs it stays on the f32 list: a bf16 gradient is widened first.
        let policy = AutocastPolicy::new(LowPrecision::BF16);
        table.set(Some(&policy));
        assert_eq!(table.get(), Some(policy));
        let widened = plan(table.code(bias), dtypes(DType::BF16)).unwrap();
        assert_eq!((widened.input, widened.output), (DType::F32, None));
    }
}
