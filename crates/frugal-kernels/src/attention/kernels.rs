//! The device code: the forward pass, the `D = rowsum(dO ∘ O)` prepass, and the two backward
//! kernels (dK/dV with the key blocks outermost, dQ with the query blocks outermost), so that no
//! kernel needs atomics and none stores an s² tensor.
//!
//! Layout: every tensor is `[batch * heads, seq, head_dim]`, contiguous; the cube's X position
//! is the `(batch, head)` pair, its Y position the block of rows it owns. One unit owns one row
//! (a query row in the forward and dQ kernels, a key row in the dK/dV kernel) and keeps it and
//! its accumulators in registers (`head_dim` is a compile-time constant, so those loops unroll);
//! the rows of the other side are staged block by block in shared memory as f32, and every unit
//! reads the same address at a time there (a broadcast, free of bank conflicts). The rows and
//! tiles, and the helpers that load, stage, multiply and store them, are in `tiles.rs`; the
//! scale, bias and mask rules in `mask.rs`.
//!
//! Rows are held as vectors of `N` f32 lanes (`head_dim = lanes * N`; the host picks 4 where
//! `head_dim` allows): one shared-memory load then feeds `N` multiply-adds, and a dot product
//! runs as `N` independent sums, so neither the loads nor the adds' latency set the pace.
//!
//! With `split = 2` (chosen by the host on native GPUs) two neighbouring units share a row, each
//! owning half of its lanes, and add their partial dot products with one shuffle: the dK/dV
//! kernel would otherwise keep four full rows per unit in registers (its key and value rows and
//! two accumulators), more than a unit has. Staged rows then carry one vector of padding between
//! their halves, so that the two halves read at once fall in different banks.
//!
//! Causal kernels whose blocks get heavier with their position (the forward and dQ kernels:
//! later query blocks see more keys) take their blocks in reverse order, so the heaviest start
//! first and the last wave is short.
//!
//! With `unroll` (chosen by the host) the loops over `head_dim` are unrolled so a unit's rows
//! stay in registers; without it they are plain loops, which software rasterisers such as
//! Mesa's lavapipe compile in a fraction of the time.

use cubecl::prelude::*;

use super::mask::{MASKED_SCORE, ScoreArgs, masked_score, prob};
use super::tiles::{
    Flash, Place, accumulate, combine, keys_seen, lane_sum, load_row, new_tile, place,
    read_or_zero, row_dot, stage_pair, store_row, zero_row,
};

/// The tensors every flash kernel reads: q, k, v and the bias (q stands in for a call without
/// one; the kernel is then built without reading it).
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Operands<E: Float> {
    /// `[batch * heads, seq_q, head_dim]`.
    pub q: Array<E>,
    /// `[batch * heads, seq_k, head_dim]`.
    pub k: Array<E>,
    /// `[batch * heads, seq_k, head_dim]`.
    pub v: Array<E>,
    /// The additive bias, indexed by [`ScoreArgs`]' strides.
    pub bias: Array<E>,
}

/// What the backward kernels read besides the [`Operands`]: the output's gradient and, per
/// query row, the forward's logsumexp and `delta`.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Saved<E: Float> {
    /// `[batch * heads, seq_q, head_dim]`.
    pub grad_out: Array<E>,
    /// One f32 per query row.
    pub lse: Array<f32>,
    /// One f32 per query row: `rowsum(dO ∘ O)`.
    pub delta: Array<f32>,
}

/// Stages the keys and values from `kv_start` (zeros past the last) for a cube of query rows,
/// once every unit is done with the previous tiles, and waits until every unit has staged its
/// share.
#[cube]
fn stage_keys<E: Float, N: Size>(
    ops: &Operands<E>,
    k_tile: &mut SharedMemory<Vector<f32, N>>,
    v_tile: &mut SharedMemory<Vector<f32, N>>,
    at: &Place,
    kv_start: usize,
    args: &ScoreArgs,
    #[comptime] flash: Flash,
) {
    let (base, limit) = (at.other_base, args.seq_k);
    stage_pair::<E, N>(&ops.k, &ops.v, k_tile, v_tile, base, kv_start, limit, flash);
    sync_cube();
}

/// The masked score of the unit's query row against staged key `j` (key `kv_start + j`), in a
/// cube of query rows.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_score<E: Float, N: Size>(
    ops: &Operands<E>,
    q_row: &Array<Vector<f32, N>>,
    k_tile: &SharedMemory<Vector<f32, N>>,
    j: usize,
    kv_start: usize,
    at: &Place,
    args: &ScoreArgs,
    #[comptime] flash: Flash,
) -> f32 {
    let dot = row_dot::<N>(q_row, k_tile, j, at, flash);
    masked_score::<E>(
        dot,
        &ops.bias,
        at.bh,
        at.row,
        kv_start + j,
        args,
        flash.mask,
    )
}

/// Flash-attention forward: `out = softmax(scale * q kᵀ + bias, masked) v` and each query
/// row's logsumexp (natural log, of the scaled and biased scores) in f32.
#[cube(launch_unchecked)]
pub(crate) fn forward_kernel<E: Float, N: Size>(
    ops: &Operands<E>,
    out: &mut Array<E>,
    lse: &mut Array<f32>,
    args: ScoreArgs,
    #[comptime] flash: Flash,
    #[define(E)] _dtype: StorageType,
) {
    let part_lanes = comptime!(flash.part_lanes());
    let at = place::<N>(&args, true, flash);
    let mut k_tile = new_tile::<N>(flash);
    let mut v_tile = new_tile::<N>(flash);
    let mut scores = Array::<f32>::new(flash.staged);
    let q_row = load_row::<E, N>(&ops.q, &at, flash);
    let mut acc = zero_row::<N>(flash);

    let mut running_max = f32::new(MASKED_SCORE);
    let mut running_sum = 0.0f32;

    let kv_end = keys_seen(at.first, args.seq_k, flash);
    let mut kv_start = 0usize;
    while kv_start < kv_end {
        stage_keys::<E, N>(ops, &mut k_tile, &mut v_tile, &at, kv_start, &args, flash);

        let mut tile_max = f32::new(MASKED_SCORE);
        for j in 0..flash.staged {
            let score = key_score::<E, N>(ops, &q_row, &k_tile, j, kv_start, &at, &args, flash);
            scores[j] = score;
            tile_max = max(tile_max, score);
        }

        let new_max = max(running_max, tile_max);
        let correction = (running_max - new_max).exp();
        running_sum *= correction;
        let correction_lanes = Vector::<f32, N>::new(correction);
        #[unroll(flash.unroll)]
        for d in 0..part_lanes {
            acc[d] = acc[d] * correction_lanes;
        }
        for j in 0..flash.staged {
            let p = prob(scores[j], new_max);
            running_sum += p;
            accumulate::<N>(&mut acc, p, &v_tile, j, &at, flash);
        }
        running_max = new_max;
        kv_start += flash.staged;
    }

    if at.ok {
        // A row with every key masked has no probability mass: its output is 0.
        let inv = select(running_sum > 0.0f32, 1.0f32 / running_sum, 0.0f32);
        store_row::<E, N>(out, &at, &acc, inv, flash);
        if at.part == 0 {
            let log_sum = select(
                running_sum > 0.0f32,
                running_max + running_sum.ln(),
                MASKED_SCORE,
            );
            lse[at.bh * args.seq_q + at.row] = log_sum;
        }
    }
}

/// The backward prepass: `delta[row] = Σ_d grad_out[row, d] · out[row, d]` in f32.
#[cube(launch_unchecked)]
pub(crate) fn delta_kernel<E: Float>(
    out: &Array<E>,
    grad_out: &Array<E>,
    delta: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] unroll: bool,
    #[define(E)] _dtype: StorageType,
) {
    let row = ABSOLUTE_POS;
    if row >= delta.len() {
        terminate!();
    }
    let mut sum = 0.0f32;
    #[unroll(unroll)]
    for d in 0..head_dim {
        let index = row * head_dim + d;
        sum += f32::cast_from(out[index]) * f32::cast_from(grad_out[index]);
    }
    delta[row] = sum;
}

/// dK and dV: one unit (or `split` units) per key row, walking the query blocks
/// (`dV = Σ_i p_ij dO_i`, `dK = scale Σ_i p_ij (dO_i · v_j − delta_i) q_i`).
#[cube(launch_unchecked)]
pub(crate) fn grad_kv_kernel<E: Float, N: Size>(
    ops: &Operands<E>,
    saved: &Saved<E>,
    grad_k: &mut Array<E>,
    grad_v: &mut Array<E>,
    args: ScoreArgs,
    #[comptime] flash: Flash,
    #[define(E)] _dtype: StorageType,
) {
    let part_lanes = comptime!(flash.part_lanes());
    let stride = comptime!(flash.stride());
    let units = comptime!(flash.units());
    let at = place::<N>(&args, false, flash);
    let mut q_tile = new_tile::<N>(flash);
    let mut do_tile = new_tile::<N>(flash);
    let mut lse_tile = SharedMemory::<f32>::new(flash.staged);
    let mut delta_tile = SharedMemory::<f32>::new(flash.staged);
    let k_row = load_row::<E, N>(&ops.k, &at, flash);
    let v_row = load_row::<E, N>(&ops.v, &at, flash);
    let mut dk = zero_row::<N>(flash);
    let mut dv = zero_row::<N>(flash);

    // Causal: queries before the block's first key see none of its keys.
    let mut q_start = 0usize;
    if flash.mask.causal {
        q_start = at.first - at.first % flash.staged;
    }

    while q_start < args.seq_q {
        stage_pair::<E, N>(
            &ops.q,
            &saved.grad_out,
            &mut q_tile,
            &mut do_tile,
            at.other_base,
            q_start,
            args.seq_q,
            flash,
        );
        let mut idx = UNIT_POS as usize;
        while idx < flash.staged {
            let row = q_start + idx;
            let ok = row < args.seq_q;
            lse_tile[idx] = read_or_zero(&saved.lse, at.bh * args.seq_q + row, ok);
            delta_tile[idx] = read_or_zero(&saved.delta, at.bh * args.seq_q + row, ok);
            idx += units;
        }
        sync_cube();

        for i in 0..flash.staged {
            let row = q_start + i;
            let dot = row_dot::<N>(&k_row, &q_tile, i, &at, flash);
            let score = masked_score::<E>(dot, &ops.bias, at.bh, row, at.row, &args, flash.mask);
            let p = prob(score, lse_tile[i]);
            let p_lanes = Vector::<f32, N>::new(p);
            let tile_at = i * stride + at.part_at;
            let mut dp = Vector::<f32, N>::new(0.0f32);
            #[unroll(flash.unroll)]
            for d in 0..part_lanes {
                let g = do_tile[tile_at + d];
                dv[d] += p_lanes * g;
                dp += g * v_row[d];
            }
            let dp_sum = combine(lane_sum::<N>(dp), flash.split);
            accumulate::<N>(
                &mut dk,
                p * (dp_sum - delta_tile[i]),
                &q_tile,
                i,
                &at,
                flash,
            );
        }
        q_start += flash.staged;
    }

    if at.ok {
        store_row::<E, N>(grad_k, &at, &dk, args.scale, flash);
        store_row::<E, N>(grad_v, &at, &dv, 1.0f32, flash);
    }
}

/// dQ: one unit (or `split` units) per query row, walking the key blocks
/// (`dQ = scale Σ_j p_ij (dO_i · v_j − delta_i) k_j`).
#[cube(launch_unchecked)]
pub(crate) fn grad_q_kernel<E: Float, N: Size>(
    ops: &Operands<E>,
    saved: &Saved<E>,
    grad_q: &mut Array<E>,
    args: ScoreArgs,
    #[comptime] flash: Flash,
    #[define(E)] _dtype: StorageType,
) {
    let at = place::<N>(&args, true, flash);
    let mut k_tile = new_tile::<N>(flash);
    let mut v_tile = new_tile::<N>(flash);
    let q_row = load_row::<E, N>(&ops.q, &at, flash);
    let do_row = load_row::<E, N>(&saved.grad_out, &at, flash);
    let mut dq = zero_row::<N>(flash);
    let row_lse = read_or_zero(&saved.lse, at.bh * args.seq_q + at.row, at.ok);
    let row_delta = read_or_zero(&saved.delta, at.bh * args.seq_q + at.row, at.ok);

    let kv_end = keys_seen(at.first, args.seq_k, flash);
    let mut kv_start = 0usize;
    while kv_start < kv_end {
        stage_keys::<E, N>(ops, &mut k_tile, &mut v_tile, &at, kv_start, &args, flash);

        for j in 0..flash.staged {
            let score = key_score::<E, N>(ops, &q_row, &k_tile, j, kv_start, &at, &args, flash);
            let dp_sum = row_dot::<N>(&do_row, &v_tile, j, &at, flash);
            let p = prob(score, row_lse);
            accumulate::<N>(&mut dq, p * (dp_sum - row_delta), &k_tile, j, &at, flash);
        }
        kv_start += flash.staged;
    }

    if at.ok {
        store_row::<E, N>(grad_q, &at, &dq, args.scale, flash);
    }
}
