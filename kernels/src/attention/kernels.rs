//! The device code: the forward pass, the `D = rowsum(dO ∘ O)` prepass, and the two backward
//! kernels (dK/dV with the key blocks outermost, dQ with the query blocks outermost), so that no
//! kernel needs atomics and none stores an s² tensor.
//!
//! Layout: every tensor is `[batch * heads, seq, head_dim]`, contiguous; the cube's X position
//! is the `(batch, head)` pair, its Y position the block of rows it owns. One unit owns one row
//! (a query row in the forward and dQ kernels, a key row in the dK/dV kernel) and keeps it and
//! its accumulators in registers (`head_dim` is a compile-time constant, so those loops unroll);
//! the rows of the other side are staged block by block in shared memory as f32, and every unit
//! reads the same address at a time there (a broadcast, free of bank conflicts).
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
//!
//! Masked scores are represented by a large finite negative number rather than `-inf`, and a
//! probability is computed only for unmasked scores, so that fast-math compilers and rows with
//! every key masked give 0 rather than NaN.

// `if has_bias { if play { .. } }`: the outer test is comptime, so a kernel built without a
// bias has no branch at all; merged into one condition it would become a runtime test.
#![allow(clippy::collapsible_if)]

use cubecl::prelude::*;

/// A score at or below this is masked (an additive bias of `-inf` or of a very large negative
/// value masks too).
pub(crate) const MASKED: f32 = -1.0e30;
/// What a masked score is stored as.
pub(crate) const MASKED_SCORE: f32 = -1.0e38;

/// Whether the pair (`row`, `key`) takes part: both in range and, when causal, `key <= row`
/// (keys after the query are masked, aligned at the top left as Burn's own causal mask is).
#[cube]
fn in_play(row: usize, key: usize, seq_q: usize, seq_k: usize, #[comptime] causal: bool) -> bool {
    let mut ok = row < seq_q && key < seq_k;
    if causal {
        ok = ok && key <= row;
    }
    ok
}

/// The bias added to the score of (`row`, `key`) of the `(batch, head)` pair `bh`: the bias is
/// indexed with strides `bias_batch`, `bias_head`, `bias_row` (0 where it broadcasts) and 1.
#[cube]
fn bias_at<E: Float>(
    bias: &Array<E>,
    bh: usize,
    heads: usize,
    row: usize,
    key: usize,
    bias_batch: usize,
    bias_head: usize,
    bias_row: usize,
) -> f32 {
    let index = (bh / heads) * bias_batch + (bh % heads) * bias_head + row * bias_row + key;
    f32::cast_from(bias[index])
}

/// The block of query rows this cube owns: its Y position, counted from the last block when
/// causal (later query blocks see more keys, so the heaviest start first).
#[cube]
fn query_block(#[comptime] causal: bool) -> usize {
    let mut block = CUBE_POS_Y as usize;
    if causal {
        let blocks = CUBE_COUNT_Y as usize;
        block = blocks - 1 - block;
    }
    block
}

/// The sum of a vector's lanes.
#[cube]
fn lane_sum<N: Size>(value: Vector<f32, N>) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for c in 0..N::value() {
        sum += value[c];
    }
    sum
}

/// `N` consecutive elements of `src` from `start` as an f32 vector; zeros unless `ok`.
#[cube]
fn load_lanes<E: Float, N: Size>(src: &Array<E>, start: usize, ok: bool) -> Vector<f32, N> {
    let mut value = Vector::<f32, N>::new(0.0f32);
    if ok {
        #[unroll]
        for c in 0..N::value() {
            value[c] = f32::cast_from(src[start + c]);
        }
    }
    value
}

/// Writes an f32 vector scaled by `factor` to `N` consecutive elements of `dst` from `start`.
#[cube]
fn store_lanes<E: Float, N: Size>(
    dst: &mut Array<E>,
    start: usize,
    value: Vector<f32, N>,
    factor: f32,
) {
    #[unroll]
    for c in 0..N::value() {
        dst[start + c] = E::cast_from(value[c] * factor);
    }
}

/// Adds a row's partial sums across the `split` units that share it (neighbours in a plane).
#[cube]
fn combine(value: f32, #[comptime] split: usize) -> f32 {
    let mut sum = value;
    if comptime!(split > 1) {
        sum += plane_shuffle_xor(value, 1u32);
    }
    sum
}

/// Copies `rows` rows of `lanes` vectors starting at row `first` of `src` (offset `base`) into
/// shared memory as f32 (rows `lanes + split - 1` vectors apart, parts one vector apart), zeros
/// past `limit`; every unit of the cube takes part.
#[cube]
fn stage_rows<E: Float, N: Size>(
    src: &Array<E>,
    dst: &mut SharedMemory<Vector<f32, N>>,
    base: usize,
    first: usize,
    limit: usize,
    #[comptime] rows: usize,
    #[comptime] lanes: usize,
    #[comptime] split: usize,
    #[comptime] units: usize,
) {
    let width = N::value();
    let part_lanes = comptime!(lanes / split);
    let stride = comptime!(lanes + split - 1);
    let mut idx = UNIT_POS as usize;
    while idx < rows * lanes {
        let row = idx / lanes;
        let lane = idx % lanes;
        let start = base + first * lanes * width + idx * width;
        let at = row * stride + (lane / part_lanes) * (part_lanes + 1) + lane % part_lanes;
        dst[at] = load_lanes::<E, N>(src, start, first + row < limit);
        idx += units;
    }
}

/// Flash-attention forward: `out = softmax(scale * q kᵀ + bias, masked) v` and each query
/// row's logsumexp (natural log, of the scaled and biased scores) in f32.
#[cube(launch_unchecked)]
pub(crate) fn forward_kernel<E: Float, N: Size>(
    q: &Array<E>,
    k: &Array<E>,
    v: &Array<E>,
    bias: &Array<E>,
    out: &mut Array<E>,
    lse: &mut Array<f32>,
    seq_q: usize,
    seq_k: usize,
    heads: usize,
    bias_batch: usize,
    bias_head: usize,
    bias_row: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[comptime] split: usize,
    #[comptime] block_q: usize,
    #[comptime] block_k: usize,
    #[comptime] causal: bool,
    #[comptime] has_bias: bool,
    #[comptime] unroll: bool,
    #[define(E)] _dtype: StorageType,
) {
    let width = N::value();
    let part_lanes = comptime!(lanes / split);
    let stride = comptime!(lanes + split - 1);
    let units = comptime!(block_q * split);
    let bh = CUBE_POS_X as usize;
    let first_row = query_block(causal) * block_q;
    let row = first_row + UNIT_POS as usize / split;
    let part = UNIT_POS as usize % split;
    let part_at = part * (part_lanes + 1);
    let q_base = bh * seq_q * head_dim;
    let kv_base = bh * seq_k * head_dim;
    let row_start = q_base + row * head_dim + part * part_lanes * width;

    let mut k_tile = SharedMemory::<Vector<f32, N>>::new(block_k * stride);
    let mut v_tile = SharedMemory::<Vector<f32, N>>::new(block_k * stride);
    let mut scores = Array::<f32>::new(block_k);
    let mut q_row = Array::<Vector<f32, N>>::new(part_lanes);
    let mut acc = Array::<Vector<f32, N>>::new(part_lanes);

    let row_ok = row < seq_q;
    #[unroll(unroll)]
    for d in 0..part_lanes {
        q_row[d] = load_lanes::<E, N>(q, row_start + d * width, row_ok);
        acc[d] = Vector::<f32, N>::new(0.0f32);
    }

    let mut running_max = f32::new(MASKED_SCORE);
    let mut running_sum = 0.0f32;

    // Causal: the block's last row sees keys up to itself, none after.
    let mut kv_end = seq_k;
    if causal {
        kv_end = min(seq_k, first_row + block_q);
    }

    let mut kv_start = 0usize;
    while kv_start < kv_end {
        sync_cube();
        stage_rows::<E, N>(
            k,
            &mut k_tile,
            kv_base,
            kv_start,
            seq_k,
            block_k,
            lanes,
            split,
            units,
        );
        stage_rows::<E, N>(
            v,
            &mut v_tile,
            kv_base,
            kv_start,
            seq_k,
            block_k,
            lanes,
            split,
            units,
        );
        sync_cube();

        let mut tile_max = f32::new(MASKED_SCORE);
        for j in 0..block_k {
            let key = kv_start + j;
            let tile_at = j * stride + part_at;
            let mut dot = Vector::<f32, N>::new(0.0f32);
            #[unroll(unroll)]
            for d in 0..part_lanes {
                dot += q_row[d] * k_tile[tile_at + d];
            }
            let mut score = combine(lane_sum::<N>(dot), split) * scale;
            let play = in_play(row, key, seq_q, seq_k, causal);
            if has_bias {
                if play {
                    score +=
                        bias_at::<E>(bias, bh, heads, row, key, bias_batch, bias_head, bias_row);
                }
            }
            let keep = play && score > MASKED;
            score = select(keep, score, MASKED_SCORE);
            scores[j] = score;
            tile_max = max(tile_max, score);
        }

        let new_max = max(running_max, tile_max);
        let correction = (running_max - new_max).exp();
        running_sum *= correction;
        let correction_lanes = Vector::<f32, N>::new(correction);
        #[unroll(unroll)]
        for d in 0..part_lanes {
            acc[d] = acc[d] * correction_lanes;
        }
        for j in 0..block_k {
            let score = scores[j];
            let p = select(score > MASKED, (score - new_max).exp(), 0.0f32);
            running_sum += p;
            let p_lanes = Vector::<f32, N>::new(p);
            let tile_at = j * stride + part_at;
            #[unroll(unroll)]
            for d in 0..part_lanes {
                acc[d] += p_lanes * v_tile[tile_at + d];
            }
        }
        running_max = new_max;
        kv_start += block_k;
    }

    if row_ok {
        // A row with every key masked has no probability mass: its output is 0.
        let inv = select(running_sum > 0.0f32, 1.0f32 / running_sum, 0.0f32);
        #[unroll(unroll)]
        for d in 0..part_lanes {
            store_lanes::<E, N>(out, row_start + d * width, acc[d], inv);
        }
        if part == 0 {
            let log_sum = select(
                running_sum > 0.0f32,
                running_max + running_sum.ln(),
                MASKED_SCORE,
            );
            lse[bh * seq_q + row] = log_sum;
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
    q: &Array<E>,
    k: &Array<E>,
    v: &Array<E>,
    bias: &Array<E>,
    grad_out: &Array<E>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    grad_k: &mut Array<E>,
    grad_v: &mut Array<E>,
    seq_q: usize,
    seq_k: usize,
    heads: usize,
    bias_batch: usize,
    bias_head: usize,
    bias_row: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[comptime] split: usize,
    #[comptime] block_q: usize,
    #[comptime] block_k: usize,
    #[comptime] causal: bool,
    #[comptime] has_bias: bool,
    #[comptime] unroll: bool,
    #[define(E)] _dtype: StorageType,
) {
    let width = N::value();
    let part_lanes = comptime!(lanes / split);
    let stride = comptime!(lanes + split - 1);
    let units = comptime!(block_k * split);
    let bh = CUBE_POS_X as usize;
    let first_key = CUBE_POS_Y as usize * block_k;
    let key = first_key + UNIT_POS as usize / split;
    let part = UNIT_POS as usize % split;
    let part_at = part * (part_lanes + 1);
    let q_base = bh * seq_q * head_dim;
    let kv_base = bh * seq_k * head_dim;
    let key_start = kv_base + key * head_dim + part * part_lanes * width;

    let mut q_tile = SharedMemory::<Vector<f32, N>>::new(block_q * stride);
    let mut do_tile = SharedMemory::<Vector<f32, N>>::new(block_q * stride);
    let mut lse_tile = SharedMemory::<f32>::new(block_q);
    let mut delta_tile = SharedMemory::<f32>::new(block_q);

    let mut k_row = Array::<Vector<f32, N>>::new(part_lanes);
    let mut v_row = Array::<Vector<f32, N>>::new(part_lanes);
    let mut dk = Array::<Vector<f32, N>>::new(part_lanes);
    let mut dv = Array::<Vector<f32, N>>::new(part_lanes);
    let key_ok = key < seq_k;
    #[unroll(unroll)]
    for d in 0..part_lanes {
        k_row[d] = load_lanes::<E, N>(k, key_start + d * width, key_ok);
        v_row[d] = load_lanes::<E, N>(v, key_start + d * width, key_ok);
        dk[d] = Vector::<f32, N>::new(0.0f32);
        dv[d] = Vector::<f32, N>::new(0.0f32);
    }

    // Causal: queries before the block's first key see none of its keys.
    let mut q_start = 0usize;
    if causal {
        q_start = first_key - first_key % block_q;
    }

    while q_start < seq_q {
        sync_cube();
        stage_rows::<E, N>(
            q,
            &mut q_tile,
            q_base,
            q_start,
            seq_q,
            block_q,
            lanes,
            split,
            units,
        );
        stage_rows::<E, N>(
            grad_out,
            &mut do_tile,
            q_base,
            q_start,
            seq_q,
            block_q,
            lanes,
            split,
            units,
        );
        let mut idx = UNIT_POS as usize;
        while idx < block_q {
            let row = q_start + idx;
            let mut l = 0.0f32;
            let mut dl = 0.0f32;
            if row < seq_q {
                l = lse[bh * seq_q + row];
                dl = delta[bh * seq_q + row];
            }
            lse_tile[idx] = l;
            delta_tile[idx] = dl;
            idx += units;
        }
        sync_cube();

        for i in 0..block_q {
            let row = q_start + i;
            let tile_at = i * stride + part_at;
            let mut dot = Vector::<f32, N>::new(0.0f32);
            #[unroll(unroll)]
            for d in 0..part_lanes {
                dot += q_tile[tile_at + d] * k_row[d];
            }
            let mut score = combine(lane_sum::<N>(dot), split) * scale;
            let play = in_play(row, key, seq_q, seq_k, causal);
            if has_bias {
                if play {
                    score +=
                        bias_at::<E>(bias, bh, heads, row, key, bias_batch, bias_head, bias_row);
                }
            }
            let keep = play && score > MASKED;
            let p = select(keep, (score - lse_tile[i]).exp(), 0.0f32);
            let p_lanes = Vector::<f32, N>::new(p);
            let mut dp = Vector::<f32, N>::new(0.0f32);
            #[unroll(unroll)]
            for d in 0..part_lanes {
                let g = do_tile[tile_at + d];
                dv[d] += p_lanes * g;
                dp += g * v_row[d];
            }
            let dp_sum = combine(lane_sum::<N>(dp), split);
            let ds = Vector::<f32, N>::new(p * (dp_sum - delta_tile[i]));
            #[unroll(unroll)]
            for d in 0..part_lanes {
                dk[d] += ds * q_tile[tile_at + d];
            }
        }
        q_start += block_q;
    }

    if key_ok {
        #[unroll(unroll)]
        for d in 0..part_lanes {
            store_lanes::<E, N>(grad_k, key_start + d * width, dk[d], scale);
            store_lanes::<E, N>(grad_v, key_start + d * width, dv[d], 1.0f32);
        }
    }
}

/// dQ: one unit (or `split` units) per query row, walking the key blocks
/// (`dQ = scale Σ_j p_ij (dO_i · v_j − delta_i) k_j`).
#[cube(launch_unchecked)]
pub(crate) fn grad_q_kernel<E: Float, N: Size>(
    q: &Array<E>,
    k: &Array<E>,
    v: &Array<E>,
    bias: &Array<E>,
    grad_out: &Array<E>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    grad_q: &mut Array<E>,
    seq_q: usize,
    seq_k: usize,
    heads: usize,
    bias_batch: usize,
    bias_head: usize,
    bias_row: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[comptime] split: usize,
    #[comptime] block_q: usize,
    #[comptime] block_k: usize,
    #[comptime] causal: bool,
    #[comptime] has_bias: bool,
    #[comptime] unroll: bool,
    #[define(E)] _dtype: StorageType,
) {
    let width = N::value();
    let part_lanes = comptime!(lanes / split);
    let stride = comptime!(lanes + split - 1);
    let units = comptime!(block_q * split);
    let bh = CUBE_POS_X as usize;
    let first_row = query_block(causal) * block_q;
    let row = first_row + UNIT_POS as usize / split;
    let part = UNIT_POS as usize % split;
    let part_at = part * (part_lanes + 1);
    let q_base = bh * seq_q * head_dim;
    let kv_base = bh * seq_k * head_dim;
    let row_start = q_base + row * head_dim + part * part_lanes * width;

    let mut k_tile = SharedMemory::<Vector<f32, N>>::new(block_k * stride);
    let mut v_tile = SharedMemory::<Vector<f32, N>>::new(block_k * stride);

    let mut q_row = Array::<Vector<f32, N>>::new(part_lanes);
    let mut do_row = Array::<Vector<f32, N>>::new(part_lanes);
    let mut dq = Array::<Vector<f32, N>>::new(part_lanes);
    let row_ok = row < seq_q;
    #[unroll(unroll)]
    for d in 0..part_lanes {
        q_row[d] = load_lanes::<E, N>(q, row_start + d * width, row_ok);
        do_row[d] = load_lanes::<E, N>(grad_out, row_start + d * width, row_ok);
        dq[d] = Vector::<f32, N>::new(0.0f32);
    }
    let mut row_lse = 0.0f32;
    let mut row_delta = 0.0f32;
    if row_ok {
        row_lse = lse[bh * seq_q + row];
        row_delta = delta[bh * seq_q + row];
    }

    let mut kv_end = seq_k;
    if causal {
        kv_end = min(seq_k, first_row + block_q);
    }

    let mut kv_start = 0usize;
    while kv_start < kv_end {
        sync_cube();
        stage_rows::<E, N>(
            k,
            &mut k_tile,
            kv_base,
            kv_start,
            seq_k,
            block_k,
            lanes,
            split,
            units,
        );
        stage_rows::<E, N>(
            v,
            &mut v_tile,
            kv_base,
            kv_start,
            seq_k,
            block_k,
            lanes,
            split,
            units,
        );
        sync_cube();

        for j in 0..block_k {
            let key = kv_start + j;
            let tile_at = j * stride + part_at;
            let mut dot = Vector::<f32, N>::new(0.0f32);
            let mut dp = Vector::<f32, N>::new(0.0f32);
            #[unroll(unroll)]
            for d in 0..part_lanes {
                dot += q_row[d] * k_tile[tile_at + d];
                dp += do_row[d] * v_tile[tile_at + d];
            }
            let mut score = combine(lane_sum::<N>(dot), split) * scale;
            let dp_sum = combine(lane_sum::<N>(dp), split);
            let play = in_play(row, key, seq_q, seq_k, causal);
            if has_bias {
                if play {
                    score +=
                        bias_at::<E>(bias, bh, heads, row, key, bias_batch, bias_head, bias_row);
                }
            }
            let keep = play && score > MASKED;
            let p = select(keep, (score - row_lse).exp(), 0.0f32);
            let ds = Vector::<f32, N>::new(p * (dp_sum - row_delta));
            #[unroll(unroll)]
            for d in 0..part_lanes {
                dq[d] += ds * k_tile[tile_at + d];
            }
        }
        kv_start += block_k;
    }

    if row_ok {
        #[unroll(unroll)]
        for d in 0..part_lanes {
            store_lanes::<E, N>(grad_q, row_start + d * width, dq[d], scale);
        }
    }
}
