//! Attention as matrix products: the element-wise passes over a materialised score matrix
//! that sit between the products, for runtimes whose products run on a matrix library
//! (tensor cores) and would leave the flash kernels' CUDA-core arithmetic behind.
//!
//! The caller computes `scores = q kᵀ` (unscaled, `[batch * heads, seq_q, seq_k]`,
//! contiguous, in the input dtype) with its own product, then:
//! - forward: [`scores_softmax`] gives the probabilities (input dtype, 0 where masked) and
//!   each row's f32 logsumexp; `out = probs · v` is the caller's product;
//! - backward: [`attention_delta`] gives `delta = rowsum(dO ∘ O)`; with `grad_probs = dO vᵀ`
//!   (the caller's product), [`scores_backward`] recomputes the probabilities from the scores
//!   and the logsumexp and gives them with the scores' gradient `scale · P ∘ (dP − delta)`
//!   (both in the input dtype), so `dq = grad_scores · k`, `dk = grad_scoresᵀ · q` and
//!   `dv = probsᵀ · dO` are three more products.
//!
//! The scale, bias, causal mask and masked-score rules are those of the flash kernels
//! (`mask.rs`), and the arithmetic is f32; only the stored scores and probabilities are rounded
//! to the input dtype (as in PyTorch's written-out attention under autocast).

use cubecl::{prelude::*, server::Handle};

use super::mask::{MASKED, MASKED_SCORE, Mask, ScoreArgs, masked_score, prob};
use super::{AttentionBias, AttentionConfig, AttentionShape, BiasArg, array, check_call, invalid};
use crate::{FloatDtype, KernelError, cast::check_buffer};

/// Units that share one row of scores in [`scores_softmax`] (a power of two).
const SOFTMAX_UNITS: u32 = 128;
/// Units per cube of the element-wise [`scores_backward`] kernel.
const GRAD_UNITS: u32 = 256;

/// What [`scores_softmax`] returns.
#[derive(Debug, Clone)]
pub struct ScoresSoftmax {
    /// `softmax(scale · scores + bias, masked)` per row, `[batch * heads, seq_q, seq_k]` in
    /// the input dtype (0 for masked keys).
    pub probs: Handle,
    /// Each row's logsumexp of the scaled and biased scores, f32 (as the flash forward's).
    pub lse: Handle,
}

/// What [`scores_backward`] returns, both `[batch * heads, seq_q, seq_k]` in the input dtype.
#[derive(Debug, Clone)]
pub struct ScoreGrads {
    /// The probabilities, recomputed from the scores and the logsumexp.
    pub probs: Handle,
    /// The gradient of the unscaled scores: `scale · P ∘ (dP − delta)`.
    pub grad_scores: Handle,
}

/// The vector width of the score kernels: the widest the runtime favours for the dtype that
/// divides `seq_k`, so a vector never spans two rows.
fn vector_width<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: FloatDtype,
) -> usize {
    crate::vector_size_for(client, shape.seq_k, dtype.size_bytes())
}

/// Elements of the score matrix.
fn score_len(shape: &AttentionShape) -> usize {
    shape.batch * shape.heads * shape.seq_q * shape.seq_k
}

/// A cube count covering `cubes` cubes within the device's grid (X first, then Y).
pub(crate) fn grid<R: Runtime>(
    client: &ComputeClient<R>,
    cubes: usize,
) -> Result<CubeCount, KernelError> {
    let (max_x, max_y, _) = client.properties().hardware.max_cube_count;
    let x = cubes.clamp(1, max_x as usize);
    let y = cubes.div_ceil(x);
    if y > max_y as usize {
        return Err(invalid(
            "score matrix",
            cubes,
            format!(
                "at most {} cubes on this device",
                max_x as u64 * max_y as u64
            ),
        ));
    }
    Ok(CubeCount::Static(x as u32, y as u32, 1))
}

/// The cube's index in a grid laid out by [`grid`].
#[cube]
pub(crate) fn cube_index() -> usize {
    CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize
}

/// Merges the running maximum and sum of `exp(x − maximum)` that each of `2 · half_units`
/// units left in `maxima[unit]` and `sums[unit]` into `maxima[0]` and `sums[0]` (a tree;
/// `half_units` a power of two, or 0 for one unit).
#[cube]
pub(crate) fn merge_running_max_sum(
    maxima: &mut SharedMemory<f32>,
    sums: &mut SharedMemory<f32>,
    unit: usize,
    half_units: usize,
) {
    sync_cube();
    let mut stride = half_units;
    while stride > 0 {
        if unit < stride {
            let (m1, m2) = (maxima[unit], maxima[unit + stride]);
            let m = max(m1, m2);
            sums[unit] = sums[unit] * (m1 - m).exp() + sums[unit + stride] * (m2 - m).exp();
            maxima[unit] = m;
        }
        sync_cube();
        stride /= 2;
    }
}

/// One cube per row, each unit taking vectors of `N` keys (`seq_k` is a multiple of `N`): a
/// running maximum and sum per unit, combined in shared memory, then the probabilities
/// written in a second pass.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_kernel<E: Float, N: Size>(
    scores: &Array<Vector<E, N>>,
    bias: &Array<E>,
    probs: &mut Array<Vector<E, N>>,
    lse: &mut Array<f32>,
    rows: usize,
    args: ScoreArgs,
    half_units: usize,
    #[comptime] units: usize,
    #[comptime] mask: Mask,
    #[define(E)] _dtype: StorageType,
) {
    let row_id = cube_index();
    if row_id >= rows {
        terminate!();
    }
    let width = N::value();
    let bh = row_id / args.seq_q;
    let row = row_id % args.seq_q;
    let vectors = args.seq_k / width;
    let base = row_id * vectors;
    let unit = UNIT_POS as usize;

    let mut running_max = f32::new(MASKED_SCORE);
    let mut running_sum = 0.0f32;
    let mut at = unit;
    while at < vectors {
        let raw = scores[base + at];
        #[unroll]
        for c in 0..width {
            let key = at * width + c;
            let score = masked_score::<E>(f32::cast_from(raw[c]), bias, bh, row, key, &args, mask);
            let new_max = max(running_max, score);
            running_sum = running_sum * (running_max - new_max).exp() + prob(score, new_max);
            running_max = new_max;
        }
        at += units;
    }

    let mut maxima = SharedMemory::<f32>::new(units);
    let mut sums = SharedMemory::<f32>::new(units);
    maxima[unit] = running_max;
    sums[unit] = running_sum;
    merge_running_max_sum(&mut maxima, &mut sums, unit, half_units);
    let total = sums[0];
    // A row with every key masked has no probability mass: its probabilities are 0.
    let log_sum = select(total > 0.0f32, maxima[0] + total.ln(), MASKED_SCORE);
    if unit == 0 {
        lse[row_id] = log_sum;
    }

    let mut at = unit;
    while at < vectors {
        let raw = scores[base + at];
        let mut out = Vector::<E, N>::new(E::from_int(0));
        #[unroll]
        for c in 0..width {
            let key = at * width + c;
            let score = masked_score::<E>(f32::cast_from(raw[c]), bias, bh, row, key, &args, mask);
            let keep = score > MASKED && total > 0.0f32;
            out[c] = E::cast_from(select(keep, (score - log_sum).exp(), 0.0f32));
        }
        probs[base + at] = out;
        at += units;
    }
}

/// Element-wise over vectors of `N` keys of one row (`seq_k` is a multiple of `N`): the
/// probability from the score and its row's logsumexp, and the scores' gradient
/// `scale · p · (dP − delta)`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn score_grads_kernel<E: Float, N: Size>(
    scores: &Array<Vector<E, N>>,
    grad_probs: &Array<Vector<E, N>>,
    bias: &Array<E>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    probs: &mut Array<Vector<E, N>>,
    grad_scores: &mut Array<Vector<E, N>>,
    vectors: usize,
    args: ScoreArgs,
    #[comptime] mask: Mask,
    #[define(E)] _dtype: StorageType,
) {
    let at = cube_index() * CUBE_DIM as usize + UNIT_POS as usize;
    if at >= vectors {
        terminate!();
    }
    let width = N::value();
    let first = at * width;
    let row_id = first / args.seq_k;
    let key = first % args.seq_k;
    let bh = row_id / args.seq_q;
    let row = row_id % args.seq_q;
    let row_lse = lse[row_id];
    let row_delta = delta[row_id];
    let raw = scores[at];
    let grad_p = grad_probs[at];
    let mut p_out = Vector::<E, N>::new(E::from_int(0));
    let mut ds_out = Vector::<E, N>::new(E::from_int(0));
    #[unroll]
    for c in 0..width {
        let score = masked_score::<E>(f32::cast_from(raw[c]), bias, bh, row, key + c, &args, mask);
        let keep = score > MASKED;
        let p = prob(score, row_lse);
        let grad = p * (f32::cast_from(grad_p[c]) - row_delta) * args.scale;
        p_out[c] = E::cast_from(p);
        ds_out[c] = E::cast_from(select(keep, grad, 0.0f32));
    }
    probs[at] = p_out;
    grad_scores[at] = ds_out;
}

/// Checks the shape, dtype, score buffer and bias of a call on the score matrix; returns the
/// scale.
fn check_scores<R: Runtime>(
    client: &ComputeClient<R>,
    scores: &Handle,
    bias: Option<&AttentionBias<'_>>,
    shape: &AttentionShape,
    dtype: FloatDtype,
    config: &AttentionConfig,
) -> Result<f32, KernelError> {
    let buffers = [("scores", scores, score_len(shape))];
    check_call(client, &buffers, bias, shape, dtype, config)
}

/// The probabilities and logsumexp of the scores `q kᵀ` (see the module docs). Errors, before
/// anything is launched, as the flash kernels do, or when the score buffer is smaller than
/// `[batch * heads, seq_q, seq_k]`.
pub fn scores_softmax<R: Runtime>(
    client: &ComputeClient<R>,
    scores: &Handle,
    bias: Option<AttentionBias<'_>>,
    shape: AttentionShape,
    dtype: FloatDtype,
    config: AttentionConfig,
) -> Result<ScoresSoftmax, KernelError> {
    let scale = check_scores(client, scores, bias.as_ref(), &shape, dtype, &config)?;
    let len = score_len(&shape);
    let rows = shape.rows();
    let width = vector_width(client, &shape, dtype);
    // A power of two (for the tree that combines the units' sums), no more than the row's
    // vectors need.
    let max_units = SOFTMAX_UNITS.min(client.properties().hardware.max_units_per_cube.max(1));
    let max_units = 1u32 << (31 - max_units.leading_zeros());
    let units = ((shape.seq_k / width).next_power_of_two() as u32).clamp(1, max_units);
    let count = grid(client, rows)?;
    let probs = client.empty(len * dtype.size_bytes());
    let lse = client.empty(rows * 4);
    let bias = BiasArg::new(scores, &shape, bias.as_ref());
    // SAFETY: `scores` and `probs` hold `rows * seq_k` elements, a multiple of the vector
    // width, and `lse` `rows` (checked or just allocated); a cube past the last row returns
    // before reading, and every vector index is below `rows * seq_k / width`; the bias spans
    // every index its strides reach.
    unsafe {
        softmax_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(units),
            width,
            array(scores, len),
            bias.array(),
            array(&probs, len),
            array(&lse, rows),
            rows,
            bias.score_args(&shape, scale),
            units as usize / 2,
            units as usize,
            bias.mask(config.causal),
            dtype.storage_type(),
        );
    }
    Ok(ScoresSoftmax { probs, lse })
}

/// `delta = rowsum(dO ∘ O)` in f32, one per query row: the backward's prepass.
pub fn attention_delta<R: Runtime>(
    client: &ComputeClient<R>,
    out: &Handle,
    grad_out: &Handle,
    shape: AttentionShape,
    dtype: FloatDtype,
) -> Result<Handle, KernelError> {
    check_buffer("out", out, shape.q_len(), dtype)?;
    check_buffer("grad_out", grad_out, shape.q_len(), dtype)?;
    Ok(super::delta(client, out, grad_out, &shape, dtype))
}

/// The probabilities and the scores' gradient from the scores `q kᵀ`, the output's
/// probability gradient `grad_probs = dO vᵀ`, the forward's logsumexp and `delta` (see the
/// module docs). Errors, before anything is launched, as [`scores_softmax`], or when
/// `grad_probs`, `lse` or `delta` is smaller than its shape.
#[allow(clippy::too_many_arguments)]
pub fn scores_backward<R: Runtime>(
    client: &ComputeClient<R>,
    scores: &Handle,
    grad_probs: &Handle,
    bias: Option<AttentionBias<'_>>,
    lse: &Handle,
    delta: &Handle,
    shape: AttentionShape,
    dtype: FloatDtype,
    config: AttentionConfig,
) -> Result<ScoreGrads, KernelError> {
    let scale = check_scores(client, scores, bias.as_ref(), &shape, dtype, &config)?;
    let len = score_len(&shape);
    let rows = shape.rows();
    check_buffer("grad_probs", grad_probs, len, dtype)?;
    check_buffer("lse", lse, rows, FloatDtype::F32)?;
    check_buffer("delta", delta, rows, FloatDtype::F32)?;
    let width = vector_width(client, &shape, dtype);
    let vectors = len / width;
    let units = GRAD_UNITS.min(client.properties().hardware.max_units_per_cube.max(1));
    let count = grid(client, vectors.div_ceil(units as usize))?;
    let probs = client.empty(len * dtype.size_bytes());
    let grad_scores = client.empty(len * dtype.size_bytes());
    let bias = BiasArg::new(scores, &shape, bias.as_ref());
    // SAFETY: the score-sized buffers hold `len` elements, a multiple of the vector width,
    // and `lse`, `delta` `rows` (checked or just allocated); units past the last vector
    // return before reading.
    unsafe {
        score_grads_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(units),
            width,
            array(scores, len),
            array(grad_probs, len),
            bias.array(),
            array(lse, rows),
            array(delta, rows),
            array(&probs, len),
            array(&grad_scores, len),
            vectors,
            bias.score_args(&shape, scale),
            bias.mask(config.causal),
            dtype.storage_type(),
        );
    }
    Ok(ScoreGrads { probs, grad_scores })
}
