//! Layer normalisation over the last dimension, forward and backward, in four launches where
//! a written-out LayerNorm and its autodiff take a dozen or more (mean, centring, variance,
//! root, division, scale, shift, and the reductions of their gradients).
//!
//! Rows are `rows × width` contiguous values of one dtype (`gamma` and `beta` too); the
//! statistics are f32, as is every sum. The forward keeps each row's mean and reciprocal
//! standard deviation (`1 / sqrt(var + epsilon)`, biased variance) for the backward, which
//! recomputes the normalised row from them.

use cubecl::{prelude::*, server::Handle};

use crate::attention::{
    invalid,
    scores::{cube_index, grid},
};
use crate::cast::{check_buffer, check_rows};
use crate::{FloatDtype, KernelError};

/// Most units that share one row.
const ROW_UNITS: u32 = 256;
/// Rows summed by one unit of the parameter-gradient kernel before its partial sum is
/// written: short enough that the unit's chain of dependent loads is short and that the
/// units fill the device, long enough that the partial sums stay few to add up.
const CHUNK_ROWS: usize = 8;
/// Columns of one cube of the kernel that adds the partial sums.
const TOTALS_COLUMNS: usize = 8;
/// Units that share one column's partial sums in that kernel.
const TOTALS_CHUNK_LANES: usize = 32;
/// Units of one cube of that kernel.
const TOTALS_UNITS: usize = TOTALS_COLUMNS * TOTALS_CHUNK_LANES;

/// The shape of a layer norm call: `rows` rows of `width` values each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerNormShape {
    /// Rows normalised independently (every dimension but the last, multiplied).
    pub rows: usize,
    /// Values per row (the last dimension; `gamma` and `beta` hold this many).
    pub width: usize,
}

impl LayerNormShape {
    /// Values of the input.
    pub fn len(&self) -> usize {
        self.rows * self.width
    }

    /// Whether the input has no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What [`layer_norm_forward`] returns.
#[derive(Debug, Clone)]
pub struct LayerNormForward {
    /// `(x - mean) * rstd * gamma + beta`, `rows × width` in the input dtype.
    pub output: Handle,
    /// Each row's mean, f32.
    pub mean: Handle,
    /// Each row's `1 / sqrt(var + epsilon)`, f32.
    pub rstd: Handle,
}

/// What [`layer_norm_backward`] returns, each in the input dtype.
#[derive(Debug, Clone)]
pub struct LayerNormGrads {
    /// The input's gradient, `rows × width`.
    pub input: Handle,
    /// `gamma`'s gradient, `width` values.
    pub gamma: Handle,
    /// `beta`'s gradient, `width` values, when asked for.
    pub beta: Option<Handle>,
}

/// Sums `partial[0..units]` into `partial[0]` (a tree; `half_units` is half of `units`, a
/// power of two).
#[cube]
fn cube_sum(partial: &mut SharedMemory<f32>, unit: usize, half_units: usize) -> f32 {
    sync_cube();
    let mut stride = half_units;
    while stride > 0 {
        if unit < stride {
            partial[unit] += partial[unit + stride];
        }
        sync_cube();
        stride /= 2;
    }
    let total = partial[0];
    // Every unit has read the total before the memory is used again.
    sync_cube();
    total
}

/// One cube per row: the mean, then the variance about it (two passes, as Burn's
/// `var_mean_bias` computes them), then the normalised, scaled and shifted row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<E: Float, N: Size>(
    input: &Array<Vector<E, N>>,
    gamma: &Array<Vector<E, N>>,
    beta: &Array<Vector<E, N>>,
    output: &mut Array<Vector<E, N>>,
    mean: &mut Array<f32>,
    rstd: &mut Array<f32>,
    rows: usize,
    vectors: usize,
    width: usize,
    epsilon: f32,
    half_units: usize,
    #[comptime] units: usize,
    #[comptime] has_beta: bool,
    #[define(E)] _dtype: StorageType,
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let lanes = N::value();
    let unit = UNIT_POS as usize;
    let base = row * vectors;
    let count = f32::cast_from(width);
    let mut partial = SharedMemory::<f32>::new(units);

    let mut sum = 0.0f32;
    let mut at = unit;
    while at < vectors {
        let x = input[base + at];
        #[unroll]
        for c in 0..lanes {
            sum += f32::cast_from(x[c]);
        }
        at += units;
    }
    partial[unit] = sum;
    let mu = cube_sum(&mut partial, unit, half_units) / count;

    let mut squares = 0.0f32;
    let mut at = unit;
    while at < vectors {
        let x = input[base + at];
        #[unroll]
        for c in 0..lanes {
            let centred = f32::cast_from(x[c]) - mu;
            squares += centred * centred;
        }
        at += units;
    }
    partial[unit] = squares;
    let var = cube_sum(&mut partial, unit, half_units) / count;
    let r = 1.0f32 / (var + epsilon).sqrt();
    if unit == 0 {
        mean[row] = mu;
        rstd[row] = r;
    }

    let mut at = unit;
    while at < vectors {
        let x = input[base + at];
        let g = gamma[at];
        let mut out = Vector::<E, N>::new(E::from_int(0));
        #[unroll]
        for c in 0..lanes {
            let mut y = (f32::cast_from(x[c]) - mu) * r * f32::cast_from(g[c]);
            if has_beta {
                y += f32::cast_from(beta[at][c]);
            }
            out[c] = E::cast_from(y);
        }
        output[base + at] = out;
        at += units;
    }
}

/// One cube per row: `dx = rstd · (g − mean(g) − x̂ · mean(g ∘ x̂))` with `g = dy ∘ gamma`
/// and `x̂ = (x − mean) · rstd`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn input_grad_kernel<E: Float, N: Size>(
    grad_output: &Array<Vector<E, N>>,
    input: &Array<Vector<E, N>>,
    gamma: &Array<Vector<E, N>>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    grad_input: &mut Array<Vector<E, N>>,
    rows: usize,
    vectors: usize,
    width: usize,
    half_units: usize,
    #[comptime] units: usize,
    #[define(E)] _dtype: StorageType,
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let lanes = N::value();
    let unit = UNIT_POS as usize;
    let base = row * vectors;
    let count = f32::cast_from(width);
    let mu = mean[row];
    let r = rstd[row];
    let mut partial = SharedMemory::<f32>::new(units);

    let mut sum_g = 0.0f32;
    let mut sum_gx = 0.0f32;
    let mut at = unit;
    while at < vectors {
        let x = input[base + at];
        let dy = grad_output[base + at];
        let w = gamma[at];
        #[unroll]
        for c in 0..lanes {
            let g = f32::cast_from(dy[c]) * f32::cast_from(w[c]);
            sum_g += g;
            sum_gx += g * (f32::cast_from(x[c]) - mu) * r;
        }
        at += units;
    }
    partial[unit] = sum_g;
    let mean_g = cube_sum(&mut partial, unit, half_units) / count;
    partial[unit] = sum_gx;
    let mean_gx = cube_sum(&mut partial, unit, half_units) / count;

    let mut at = unit;
    while at < vectors {
        let x = input[base + at];
        let dy = grad_output[base + at];
        let w = gamma[at];
        let mut dx = Vector::<E, N>::new(E::from_int(0));
        #[unroll]
        for c in 0..lanes {
            let g = f32::cast_from(dy[c]) * f32::cast_from(w[c]);
            let x_hat = (f32::cast_from(x[c]) - mu) * r;
            dx[c] = E::cast_from(r * (g - mean_g - x_hat * mean_gx));
        }
        grad_input[base + at] = dx;
        at += units;
    }
}

/// One unit per (chunk of rows, vector of columns): the chunk's sums of `dy ∘ x̂` and `dy`
/// for those columns, in f32.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn param_partials_kernel<E: Float, N: Size>(
    grad_output: &Array<Vector<E, N>>,
    input: &Array<Vector<E, N>>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    partial_gamma: &mut Array<Vector<f32, N>>,
    partial_beta: &mut Array<Vector<f32, N>>,
    rows: usize,
    vectors: usize,
    chunks: usize,
    chunk_rows: usize,
    #[define(E)] _dtype: StorageType,
) {
    let at = cube_index() * CUBE_DIM as usize + UNIT_POS as usize;
    if at >= chunks * vectors {
        terminate!();
    }
    let lanes = N::value();
    let column = at % vectors;
    let chunk = at / vectors;
    let mut row = chunk * chunk_rows;
    let end = min(row + chunk_rows, rows);
    let mut sum_gamma = Vector::<f32, N>::new(0.0f32);
    let mut sum_beta = Vector::<f32, N>::new(0.0f32);
    while row < end {
        let x = input[row * vectors + column];
        let dy = grad_output[row * vectors + column];
        let mu = mean[row];
        let r = rstd[row];
        #[unroll]
        for c in 0..lanes {
            let d = f32::cast_from(dy[c]);
            sum_gamma[c] = sum_gamma[c] + d * (f32::cast_from(x[c]) - mu) * r;
            sum_beta[c] = sum_beta[c] + d;
        }
        row += 1;
    }
    partial_gamma[at] = sum_gamma;
    partial_beta[at] = sum_beta;
}

/// One cube per [`TOTALS_COLUMNS`] columns, [`TOTALS_CHUNK_LANES`] units per column: each
/// unit adds every `TOTALS_CHUNK_LANES`-th chunk's partial sum, four loads in flight at a
/// time, then the first unit of each column adds the lanes' sums and writes the total in the
/// dtype of the parameters. One unit per column walking all chunks would wait on one load
/// after another.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn param_totals_kernel<E: Float>(
    partial_gamma: &Array<f32>,
    partial_beta: &Array<f32>,
    grad_gamma: &mut Array<E>,
    grad_beta: &mut Array<E>,
    width: usize,
    chunks: usize,
    #[comptime] has_beta: bool,
    #[define(E)] _dtype: StorageType,
) {
    let unit = UNIT_POS as usize;
    let lane = unit / TOTALS_COLUMNS;
    let column = cube_index() * TOTALS_COLUMNS + unit % TOTALS_COLUMNS;
    let mut sums_gamma = SharedMemory::<f32>::new(TOTALS_UNITS);
    let mut sums_beta = SharedMemory::<f32>::new(TOTALS_UNITS);
    let mut sum_gamma = 0.0f32;
    let mut sum_beta = 0.0f32;
    if column < width {
        let step = TOTALS_CHUNK_LANES * width;
        let end = chunks * width;
        let mut at = lane * width + column;
        while at + 3 * step < end {
            let g = (partial_gamma[at] + partial_gamma[at + step])
                + (partial_gamma[at + 2 * step] + partial_gamma[at + 3 * step]);
            let b = (partial_beta[at] + partial_beta[at + step])
                + (partial_beta[at + 2 * step] + partial_beta[at + 3 * step]);
            sum_gamma += g;
            sum_beta += b;
            at += 4 * step;
        }
        while at < end {
            sum_gamma += partial_gamma[at];
            sum_beta += partial_beta[at];
            at += step;
        }
    }
    sums_gamma[unit] = sum_gamma;
    sums_beta[unit] = sum_beta;
    // Every unit reaches the barrier: none returns early.
    sync_cube();
    if lane == 0 && column < width {
        #[unroll]
        for other in 1..TOTALS_CHUNK_LANES {
            sum_gamma += sums_gamma[other * TOTALS_COLUMNS + unit];
            sum_beta += sums_beta[other * TOTALS_COLUMNS + unit];
        }
        grad_gamma[column] = E::cast_from(sum_gamma);
        if has_beta {
            grad_beta[column] = E::cast_from(sum_beta);
        }
    }
}

/// Checks what every call checks; returns the vector width.
fn check<R: Runtime>(
    client: &ComputeClient<R>,
    shape: LayerNormShape,
    dtype: FloatDtype,
) -> Result<usize, KernelError> {
    check_rows(
        client,
        dtype,
        shape.rows,
        shape.width,
        "layer norm width",
        "layer norm input",
    )?;
    Ok(crate::vector_size_for(
        client,
        shape.width,
        dtype.size_bytes(),
    ))
}

/// Units per row: a power of two, no more than the row's vectors need or the device allows.
pub(crate) fn row_units<R: Runtime>(client: &ComputeClient<R>, vectors: usize) -> u32 {
    let max_units = ROW_UNITS.min(client.properties().hardware.max_units_per_cube.max(1));
    let max_units = 1u32 << (31 - max_units.leading_zeros());
    (vectors.next_power_of_two() as u32).clamp(1, max_units)
}

/// The layer norm of `input` (`rows × width` of `dtype`) with `gamma` and, if given, `beta`
/// (`width` values each, same dtype): the output and each row's mean and `rstd` for
/// [`layer_norm_backward`]. One launch.
///
/// Errors, before anything is launched, if the dtype is not supported on the device, a buffer
/// is smaller than its shape, the width is 0, `epsilon` is negative or not finite, or the
/// input exceeds 32-bit addressing or the device's grid.
pub fn layer_norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    gamma: &Handle,
    beta: Option<&Handle>,
    shape: LayerNormShape,
    dtype: FloatDtype,
    epsilon: f32,
) -> Result<LayerNormForward, KernelError> {
    let lanes = check(client, shape, dtype)?;
    if !(epsilon.is_finite() && epsilon >= 0.0) {
        return Err(invalid("epsilon", epsilon, "a finite value >= 0"));
    }
    check_buffer("input", input, shape.len(), dtype)?;
    check_buffer("gamma", gamma, shape.width, dtype)?;
    if let Some(beta) = beta {
        check_buffer("beta", beta, shape.width, dtype)?;
    }
    let count = grid(client, shape.rows)?;
    let output = client.empty(shape.len() * dtype.size_bytes());
    let mean = client.empty(shape.rows.max(1) * 4);
    let rstd = client.empty(shape.rows.max(1) * 4);
    if shape.is_empty() {
        return Ok(LayerNormForward { output, mean, rstd });
    }
    let vectors = shape.width / lanes;
    let units = row_units(client, vectors);
    // SAFETY: `input` and `output` hold `rows * width` values, `gamma` and `beta` `width`
    // (checked or just allocated), all multiples of the vector width; `mean` and `rstd` one
    // f32 per row. A cube past the last row returns before reading; every vector index is
    // below `rows * vectors` (input, output) or `vectors` (gamma, beta). Without a beta the
    // kernel never reads its argument, which is then `gamma`.
    unsafe {
        forward_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(units),
            lanes,
            ArrayArg::from_raw_parts(input.clone(), shape.len()),
            ArrayArg::from_raw_parts(gamma.clone(), shape.width),
            ArrayArg::from_raw_parts(beta.unwrap_or(gamma).clone(), shape.width),
            ArrayArg::from_raw_parts(output.clone(), shape.len()),
            ArrayArg::from_raw_parts(mean.clone(), shape.rows),
            ArrayArg::from_raw_parts(rstd.clone(), shape.rows),
            shape.rows,
            vectors,
            shape.width,
            epsilon,
            units as usize / 2,
            units as usize,
            beta.is_some(),
            dtype.storage_type(),
        );
    }
    Ok(LayerNormForward { output, mean, rstd })
}

/// The gradients of a [`layer_norm_forward`] call from its output's gradient: the input's,
/// `gamma`'s and (if `with_beta`) `beta`'s, in `dtype`. `mean` and `rstd` are the forward's.
/// Three launches: the input's gradient (one cube per row), the parameters' partial sums per
/// chunk of rows (f32), and their totals.
///
/// Errors, before anything is launched, as [`layer_norm_forward`], or when `mean` or `rstd`
/// holds fewer than `rows` f32 values.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    grad_output: &Handle,
    input: &Handle,
    gamma: &Handle,
    mean: &Handle,
    rstd: &Handle,
    shape: LayerNormShape,
    dtype: FloatDtype,
    with_beta: bool,
) -> Result<LayerNormGrads, KernelError> {
    let lanes = check(client, shape, dtype)?;
    check_buffer("grad_output", grad_output, shape.len(), dtype)?;
    check_buffer("input", input, shape.len(), dtype)?;
    check_buffer("gamma", gamma, shape.width, dtype)?;
    check_buffer("mean", mean, shape.rows, FloatDtype::F32)?;
    check_buffer("rstd", rstd, shape.rows, FloatDtype::F32)?;
    let vectors = shape.width / lanes;
    let chunks = shape.rows.div_ceil(CHUNK_ROWS).max(1);
    let row_count = grid(client, shape.rows)?;
    let partial_cube =
        CubeDim::new_1d(ROW_UNITS.min(client.properties().hardware.max_units_per_cube));
    let partial_count = grid(
        client,
        (chunks * vectors).div_ceil(partial_cube.num_elems() as usize),
    )?;
    let grad_input = client.empty(shape.len() * dtype.size_bytes());
    let grad_gamma = client.empty(shape.width * dtype.size_bytes());
    let grad_beta = with_beta.then(|| client.empty(shape.width * dtype.size_bytes()));
    let partial_len = chunks * shape.width;
    let partial_gamma = client.empty(partial_len * 4);
    let partial_beta = client.empty(partial_len * 4);
    let units = row_units(client, vectors);
    let totals_count = grid(client, shape.width.div_ceil(TOTALS_COLUMNS))?;
    // SAFETY: `grad_output`, `input` and `grad_input` hold `rows * width` values, `gamma`,
    // `grad_gamma` and `grad_beta` `width`, the partial sums `chunks * width` f32 values, and
    // `mean` and `rstd` `rows` (checked or just allocated); all lengths are multiples of the
    // vector width. Each kernel returns before reading past its last row, unit or column.
    // Without a beta gradient the totals kernel never writes its argument, which is then
    // `grad_gamma`.
    unsafe {
        if shape.rows > 0 {
            input_grad_kernel::launch_unchecked::<R>(
                client,
                row_count,
                CubeDim::new_1d(units),
                lanes,
                ArrayArg::from_raw_parts(grad_output.clone(), shape.len()),
                ArrayArg::from_raw_parts(input.clone(), shape.len()),
                ArrayArg::from_raw_parts(gamma.clone(), shape.width),
                ArrayArg::from_raw_parts(mean.clone(), shape.rows),
                ArrayArg::from_raw_parts(rstd.clone(), shape.rows),
                ArrayArg::from_raw_parts(grad_input.clone(), shape.len()),
                shape.rows,
                vectors,
                shape.width,
                units as usize / 2,
                units as usize,
                dtype.storage_type(),
            );
        }
        param_partials_kernel::launch_unchecked::<R>(
            client,
            partial_count,
            partial_cube,
            lanes,
            ArrayArg::from_raw_parts(grad_output.clone(), shape.len()),
            ArrayArg::from_raw_parts(input.clone(), shape.len()),
            ArrayArg::from_raw_parts(mean.clone(), shape.rows),
            ArrayArg::from_raw_parts(rstd.clone(), shape.rows),
            ArrayArg::from_raw_parts(partial_gamma.clone(), partial_len),
            ArrayArg::from_raw_parts(partial_beta.clone(), partial_len),
            shape.rows,
            vectors,
            chunks,
            CHUNK_ROWS,
            dtype.storage_type(),
        );
        param_totals_kernel::launch_unchecked::<R>(
            client,
            totals_count,
            CubeDim::new_1d(TOTALS_UNITS as u32),
            ArrayArg::from_raw_parts(partial_gamma, partial_len),
            ArrayArg::from_raw_parts(partial_beta, partial_len),
            ArrayArg::from_raw_parts(grad_gamma.clone(), shape.width),
            ArrayArg::from_raw_parts(
                grad_beta.as_ref().unwrap_or(&grad_gamma).clone(),
                shape.width,
            ),
            shape.width,
            chunks,
            with_beta,
            dtype.storage_type(),
        );
    }
    Ok(LayerNormGrads {
        input: grad_input,
        gamma: grad_gamma,
        beta: grad_beta,
    })
}
