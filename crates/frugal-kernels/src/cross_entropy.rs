//! The softmax cross-entropy of rows of logits against one target class per row, and the
//! logits' gradient, in one launch where the written-out loss takes a dozen (a cast, the
//! row maxima, a shift, the exponentials, their sums, a gather, a logarithm, the loss's sum,
//! the softmax's division, a scatter of −1 at the targets and a cast back).
//!
//! One cube per row: one read of the row for its log-sum-exp (an online maximum and sum in
//! f32, as flash attention keeps them), one more for the gradient `softmax − one-hot` and the
//! target's logit. Each row's loss is `log-sum-exp − logit[target]`, f32; the gradient is the
//! summed (not averaged) loss's, in the logits' dtype.

use cubecl::{prelude::*, server::Handle};

use crate::attention::scores::{cube_index, grid, merge_running_max_sum};
use crate::cast::{check_buffer, check_rows};
use crate::layer_norm::row_units;
use crate::{FloatDtype, IdDtype, KernelError};

/// The running maximum before a row's first logit: finite, so that the first rescaling
/// `exp(start − value)` is 0 rather than NaN.
const START_MAX: f32 = -1.0e38;

/// The shape of a cross-entropy call: `rows` rows of `classes` logits each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrossEntropyShape {
    /// Rows, each with one target.
    pub rows: usize,
    /// Logits per row.
    pub classes: usize,
}

impl CrossEntropyShape {
    /// Logits in all.
    pub fn len(&self) -> usize {
        self.rows * self.classes
    }

    /// Whether there are no logits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What [`cross_entropy_rows`] returns.
#[derive(Debug, Clone)]
pub struct CrossEntropyRows {
    /// Each row's loss, `log-sum-exp − logit[target]`, f32 `[rows]`; NaN for a row whose
    /// target is outside `0..classes`.
    pub loss: Handle,
    /// When asked for: `softmax(row) − one-hot(target)`, `rows × classes` in the logits'
    /// dtype (no one-hot where the target is out of range).
    pub grad: Option<Handle>,
}

/// One cube per row; see the module's documentation.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rows_kernel<E: Float, I: Int, N: Size>(
    logits: &Array<Vector<E, N>>,
    targets: &Array<I>,
    loss: &mut Array<f32>,
    grad: &mut Array<Vector<E, N>>,
    rows: usize,
    vectors: usize,
    classes: usize,
    half_units: usize,
    // NaN, the loss of a row without a valid target: a launch argument, as neither CUDA C++
    // nor WGSL has a NaN literal.
    nan: f32,
    #[comptime] units: usize,
    #[comptime] with_grad: bool,
    #[define(E, I)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let lanes = N::value();
    let unit = UNIT_POS as usize;
    let base = row * vectors;
    let id = targets[row];
    let valid = id >= I::new(0) && usize::cast_from(id) < classes;
    let target = select(valid, usize::cast_from(id), classes);

    let mut running_max = f32::new(START_MAX);
    let mut running_sum = 0.0f32;
    let mut at = unit;
    while at < vectors {
        let z = logits[base + at];
        #[unroll]
        for c in 0..lanes {
            let value = f32::cast_from(z[c]);
            let new_max = max(running_max, value);
            running_sum = running_sum * (running_max - new_max).exp() + (value - new_max).exp();
            running_max = new_max;
        }
        at += units;
    }

    let mut maxima = SharedMemory::<f32>::new(units);
    let mut sums = SharedMemory::<f32>::new(units);
    let mut picked = SharedMemory::<f32>::new(1usize);
    maxima[unit] = running_max;
    sums[unit] = running_sum;
    if unit == 0 {
        picked[0] = nan;
    }
    merge_running_max_sum(&mut maxima, &mut sums, unit, half_units);
    let log_sum = maxima[0] + sums[0].ln();

    // The unit holding the target's logit hands it over; the one-hot is subtracted there.
    let mut at = unit;
    while at < vectors {
        let z = logits[base + at];
        let mut out = Vector::<E, N>::new(E::from_int(0));
        #[unroll]
        for c in 0..lanes {
            let value = f32::cast_from(z[c]);
            let hit = at * lanes + c == target;
            if hit {
                picked[0] = value;
            }
            if with_grad {
                out[c] = E::cast_from((value - log_sum).exp() - select(hit, 1.0f32, 0.0f32));
            }
        }
        if with_grad {
            grad[base + at] = out;
        }
        at += units;
    }
    sync_cube();
    if unit == 0 {
        loss[row] = log_sum - picked[0];
    }
}

/// The softmax cross-entropy of each row of `logits` (`rows × classes` of `dtype`, contiguous)
/// against `targets` (`rows` class indices of `ids`), and with `with_grad` the logits'
/// gradient of the summed loss. One launch.
///
/// Errors, before anything is launched, if the dtype is not supported on the device, a buffer
/// is smaller than its shape, there are no classes, or the logits exceed 32-bit addressing or
/// the device's grid.
pub fn cross_entropy_rows<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &Handle,
    targets: &Handle,
    shape: CrossEntropyShape,
    dtype: FloatDtype,
    ids: IdDtype,
    with_grad: bool,
) -> Result<CrossEntropyRows, KernelError> {
    check_rows(
        client,
        dtype,
        shape.rows,
        shape.classes,
        "cross-entropy classes",
        "cross-entropy logits",
    )?;
    check_buffer("logits", logits, shape.len(), dtype)?;
    let id_bytes = shape.rows as u64 * ids.size_bytes() as u64;
    if id_bytes > targets.size_in_used() {
        return Err(KernelError::BufferTooSmall {
            what: "targets".to_string(),
            len: shape.rows,
            needed_bytes: id_bytes,
            actual_bytes: targets.size_in_used(),
        });
    }
    let count = grid(client, shape.rows)?;
    let loss = client.empty(shape.rows.max(1) * 4);
    let grad = with_grad.then(|| client.empty(shape.len().max(1) * dtype.size_bytes()));
    if shape.rows == 0 {
        return Ok(CrossEntropyRows { loss, grad });
    }
    let lanes = crate::vector_size_for(client, shape.classes, dtype.size_bytes());
    let vectors = shape.classes / lanes;
    let units = row_units(client, vectors);
    // SAFETY: `logits` and `grad` hold `rows * classes` values (checked or just allocated), a
    // multiple of the vector width, and are read or written below `rows * vectors` vectors;
    // `targets` holds `rows` ids and `loss` `rows` f32 values, each touched at its row only.
    // A cube past the last row returns before reading. Without a gradient the kernel never
    // writes its argument, which is then `loss` (declared at one vector).
    unsafe {
        rows_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(units),
            lanes,
            ArrayArg::from_raw_parts(logits.clone(), shape.len()),
            ArrayArg::from_raw_parts(targets.clone(), shape.rows),
            ArrayArg::from_raw_parts(loss.clone(), shape.rows),
            match &grad {
                Some(grad) => ArrayArg::from_raw_parts(grad.clone(), shape.len()),
                None => ArrayArg::from_raw_parts(loss.clone(), 1),
            },
            shape.rows,
            vectors,
            shape.classes,
            units as usize / 2,
            f32::NAN,
            units as usize,
            with_grad,
            [dtype.storage_type(), ids.storage_type()],
        );
    }
    Ok(CrossEntropyRows { loss, grad })
}
