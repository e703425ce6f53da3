use cubecl::{calculate_cube_count_elemwise, prelude::*, server::Handle};

use crate::{FloatDtype, KernelError, cast::check_buffer, vector_size_for};

/// The scalars of one AdamW step, computed on the host exactly as burn-optim's `AdamW`
/// computes them (in f32, or in f64 then rounded to f32 where it converts an f64 scalar). Both
/// updates take them: [`adamw_update`] (f32 moments) and
/// [`adamw8bit_update`](crate::adamw8bit_update) (8-bit moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// β₁.
    pub beta_1: f32,
    /// 1 − β₁.
    pub one_minus_beta_1: f32,
    /// β₂.
    pub beta_2: f32,
    /// 1 − β₂.
    pub one_minus_beta_2: f32,
    /// 1 − β₁ᵗ, the first moment's bias correction (a divisor).
    pub bias_correction_1: f32,
    /// 1 − β₂ᵗ, the second moment's bias correction (a divisor).
    pub bias_correction_2: f32,
    /// ε, added to the square root of the corrected second moment.
    pub epsilon: f32,
    /// The learning rate.
    pub lr: f32,
    /// How the decoupled weight decay is applied before the update.
    pub decay: WeightDecay,
}

/// The decoupled weight decay of one step, as burn-optim's `AdamW` applies it to the parameter
/// `p` before subtracting `lr * update`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WeightDecay {
    /// No decay (`lr * weight_decay == 0`): `p` as it is.
    None,
    /// `p * factor`, with `factor = 1 − lr · weight_decay`.
    Plain {
        /// 1 − lr · weight_decay.
        factor: f32,
    },
    /// Cautious weight decay: `p − p · rate` where the signs of `p` and of the new first moment
    /// agree (both ≥ 0 or both < 0), `p` elsewhere.
    Cautious {
        /// lr · weight_decay.
        rate: f32,
    },
}

impl WeightDecay {
    /// The kernels' comptime kind (0 none, 1 plain, 2 cautious) and runtime value.
    pub(crate) fn kind_and_value(self) -> (u32, f32) {
        match self {
            WeightDecay::None => (0, 0.0),
            WeightDecay::Plain { factor } => (1, factor),
            WeightDecay::Cautious { rate } => (2, rate),
        }
    }
}

/// The parameter after one step, from this step's moments `m` and `v`, in burn-optim's order:
/// bias correction, `m̂ / (√v̂ + ε)`, decoupled weight decay, then `- lr · delta`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn updated_param(
    p: f32,
    m: f32,
    v: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    lr: f32,
    decay_value: f32,
    #[comptime] decay_kind: u32,
) -> f32 {
    let m_hat = m / bias_correction_1;
    let v_hat = v / bias_correction_2;
    let delta = m_hat / (v_hat.sqrt() + epsilon);
    let mut decayed = p;
    if comptime!(decay_kind == 1) {
        decayed = p * decay_value;
    }
    // Nested: the outer test is resolved when the kernel is compiled.
    #[allow(clippy::collapsible_if)]
    if comptime!(decay_kind == 2) {
        if (p >= 0.0) == (m >= 0.0) {
            decayed = p - p * decay_value;
        }
    }
    decayed - delta * lr
}

/// One AdamW step on f32 moments, one element per unit, in place: the moments as burn-optim's
/// `AdamW` updates them (`m = m₀·β₁ + g·(1 − β₁)`, `v = v₀·β₂ + g²·(1 − β₂)`), then the
/// parameter. On the first step (`first_step`) the old moments are not read: burn-optim
/// starts them from the gradient alone.
// burn-optim's operations, operands in its order (not `x op= y`).
#[allow(clippy::assign_op_pattern)]
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel(
    param: &mut Array<f32>,
    grad: &Array<f32>,
    moment_1: &mut Array<f32>,
    moment_2: &mut Array<f32>,
    beta_1: f32,
    one_minus_beta_1: f32,
    beta_2: f32,
    one_minus_beta_2: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    lr: f32,
    decay_value: f32,
    #[comptime] decay_kind: u32,
    #[comptime] first_step: bool,
) {
    if ABSOLUTE_POS >= param.len() {
        terminate!();
    }
    let g = grad[ABSOLUTE_POS];
    let mut m = g * one_minus_beta_1;
    let mut v = (g * g) * one_minus_beta_2;
    if comptime!(!first_step) {
        m = moment_1[ABSOLUTE_POS] * beta_1 + m;
        v = moment_2[ABSOLUTE_POS] * beta_2 + v;
    }
    moment_1[ABSOLUTE_POS] = m;
    moment_2[ABSOLUTE_POS] = v;
    param[ABSOLUTE_POS] = updated_param(
        param[ABSOLUTE_POS],
        m,
        v,
        bias_correction_1,
        bias_correction_2,
        epsilon,
        lr,
        decay_value,
        decay_kind,
    );
}

/// [`adamw_kernel()`] on vectors of `N` values, for the decays without a per-value test (none,
/// plain): the same operations in the same order, four to sixteen bytes per load.
// burn-optim's operations, operands in its order (not `x op= y`).
#[allow(clippy::assign_op_pattern)]
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw_vector_kernel<N: Size>(
    param: &mut Array<Vector<f32, N>>,
    grad: &Array<Vector<f32, N>>,
    moment_1: &mut Array<Vector<f32, N>>,
    moment_2: &mut Array<Vector<f32, N>>,
    beta_1: f32,
    one_minus_beta_1: f32,
    beta_2: f32,
    one_minus_beta_2: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    lr: f32,
    decay_value: f32,
    #[comptime] plain_decay: bool,
    #[comptime] first_step: bool,
) {
    if ABSOLUTE_POS >= param.len() {
        terminate!();
    }
    let g = grad[ABSOLUTE_POS];
    let mut m = g * Vector::new(one_minus_beta_1);
    let mut v = (g * g) * Vector::new(one_minus_beta_2);
    if comptime!(!first_step) {
        m = moment_1[ABSOLUTE_POS] * Vector::new(beta_1) + m;
        v = moment_2[ABSOLUTE_POS] * Vector::new(beta_2) + v;
    }
    moment_1[ABSOLUTE_POS] = m;
    moment_2[ABSOLUTE_POS] = v;
    let m_hat = m / Vector::new(bias_correction_1);
    let v_hat = v / Vector::new(bias_correction_2);
    let delta = m_hat / (v_hat.sqrt() + Vector::new(epsilon));
    let mut p = param[ABSOLUTE_POS];
    if comptime!(plain_decay) {
        p = p * Vector::new(decay_value);
    }
    param[ABSOLUTE_POS] = p - delta * Vector::new(lr);
}

/// The buffers of one parameter tensor for [`adamw_update`], all contiguous f32.
#[derive(Clone, Copy, Debug)]
pub struct AdamWBuffers<'a> {
    /// The parameter, `len` values, updated in place.
    pub param: &'a Handle,
    /// Its gradient, `len` values (read only).
    pub grad: &'a Handle,
    /// The first moment, `len` values, updated in place (only written on the first step).
    pub moment_1: &'a Handle,
    /// The second moment, `len` values, updated in place (only written on the first step).
    pub moment_2: &'a Handle,
    /// Elements of the parameter.
    pub len: usize,
}

/// One AdamW step of a parameter with f32 moments, as burn-optim's `AdamW` computes it
/// (without AMSGrad), in one launch and in place: parameter, first and second moment.
///
/// `first_step` is the parameter's first step: the moments start from the gradient alone and
/// their buffers' old contents are not read (they may be uninitialised). Errors (before
/// anything is launched) if a buffer is smaller than `len` values or `len` exceeds 32-bit
/// indexing. The buffers must not overlap.
pub fn adamw_update<R: Runtime>(
    client: &ComputeClient<R>,
    buffers: AdamWBuffers<'_>,
    scalars: &AdamWScalars,
    first_step: bool,
) -> Result<(), KernelError> {
    let len = buffers.len;
    check_buffer("param", buffers.param, len, FloatDtype::F32)?;
    check_buffer("grad", buffers.grad, len, FloatDtype::F32)?;
    check_buffer("moment_1", buffers.moment_1, len, FloatDtype::F32)?;
    check_buffer("moment_2", buffers.moment_2, len, FloatDtype::F32)?;
    if len == 0 {
        return Ok(());
    }
    let (decay_kind, decay_value) = scalars.decay.kind_and_value();
    // Cautious decay tests each value's sign: one value per unit.
    let vector_size = if decay_kind == 2 {
        1
    } else {
        vector_size_for(client, len, 4)
    };
    let units = len / vector_size;
    let cube_dim = CubeDim::new(client, units);
    let cube_count = calculate_cube_count_elemwise(client, units, cube_dim);
    // SAFETY: all four buffers hold at least `len` f32 values (checked above), `len` is a
    // multiple of the vector size, and the kernels touch index `ABSOLUTE_POS` only after
    // checking it against the parameter's length in vectors, the same for every array.
    unsafe {
        let param = ArrayArg::from_raw_parts(buffers.param.clone(), len);
        let grad = ArrayArg::from_raw_parts(buffers.grad.clone(), len);
        let moment_1 = ArrayArg::from_raw_parts(buffers.moment_1.clone(), len);
        let moment_2 = ArrayArg::from_raw_parts(buffers.moment_2.clone(), len);
        if decay_kind == 2 {
            adamw_kernel::launch_unchecked::<R>(
                client,
                cube_count,
                cube_dim,
                param,
                grad,
                moment_1,
                moment_2,
                scalars.beta_1,
                scalars.one_minus_beta_1,
                scalars.beta_2,
                scalars.one_minus_beta_2,
                scalars.bias_correction_1,
                scalars.bias_correction_2,
                scalars.epsilon,
                scalars.lr,
                decay_value,
                decay_kind,
                first_step,
            );
        } else {
            adamw_vector_kernel::launch_unchecked::<R>(
                client,
                cube_count,
                cube_dim,
                vector_size,
                param,
                grad,
                moment_1,
                moment_2,
                scalars.beta_1,
                scalars.one_minus_beta_1,
                scalars.beta_2,
                scalars.one_minus_beta_2,
                scalars.bias_correction_1,
                scalars.bias_correction_2,
                scalars.epsilon,
                scalars.lr,
                decay_value,
                decay_kind == 1,
                first_step,
            );
        }
    }
    Ok(())
}
