//! Rows in registers and tiles in shared memory, as the flash kernels hold them: where a unit's
//! row is, and how rows are loaded, staged, multiplied and stored.
//!
//! Layout: every tensor is `[batch * heads, seq, head_dim]`, contiguous; the cube's X position
//! is the `(batch, head)` pair, its Y position the block of rows it owns. One unit owns one row
//! (or, with `split = 2`, half of one) and keeps it and its accumulators in registers as
//! `lanes / split` vectors of `N` f32 lanes; the rows of the other side are staged block by
//! block in shared memory as f32, a staged row `lanes + split - 1` vectors long (one vector of
//! padding between its parts, so that the parts read at once fall in different banks).

use cubecl::prelude::*;

use super::mask::{Mask, ScoreArgs};

/// The compile-time shape of a flash kernel, chosen by the host for the device and the call.
#[derive(Debug, Hash, PartialEq, Eq, Clone, Copy)]
pub(crate) struct Flash {
    /// Elements per row of q, k and v.
    pub head_dim: usize,
    /// Vectors per row (`head_dim / N`).
    pub lanes: usize,
    /// Units sharing a row (1 or 2), neighbours in a plane.
    pub split: usize,
    /// Rows the cube owns: query rows in the forward and dQ kernels, key rows in dK/dV.
    pub rows: usize,
    /// Rows of the other side staged in shared memory per step.
    pub staged: usize,
    /// The masks the kernel is built with.
    pub mask: Mask,
    /// Whether the loops over a row unroll (keeping the row in registers).
    pub unroll: bool,
}

impl Flash {
    /// Vectors of a row that one unit owns.
    pub fn part_lanes(&self) -> usize {
        self.lanes / self.split
    }

    /// Vectors from one staged row to the next (one of padding between parts).
    pub fn stride(&self) -> usize {
        self.lanes + self.split - 1
    }

    /// Units per cube.
    pub fn units(&self) -> usize {
        self.rows * self.split
    }
}

/// Where a unit works.
#[derive(CubeType)]
pub(crate) struct Place {
    /// The `(batch, head)` pair.
    pub bh: usize,
    /// The cube's first row.
    pub first: usize,
    /// The unit's row.
    pub row: usize,
    /// Which part of the row the unit owns (0 without a split).
    pub part: usize,
    /// Where that part starts in a staged row, in vectors.
    pub part_at: usize,
    /// The element index of the pair's first row on the other side (the staged one).
    pub other_base: usize,
    /// The element index of the unit's part of its row.
    pub start: usize,
    /// Whether the row is in range (a unit past the end still helps to stage rows).
    pub ok: bool,
}

/// The place of this unit in a cube of a kernel that owns query rows (`queries`: the forward
/// and dQ kernels) or key rows (the dK/dV kernel).
#[cube]
pub(crate) fn place<N: Size>(
    args: &ScoreArgs,
    #[comptime] queries: bool,
    #[comptime] flash: Flash,
) -> Place {
    let part_lanes = comptime!(flash.part_lanes());
    let (block, own_len, other_len) = if queries {
        (query_block(flash.mask.causal), args.seq_q, args.seq_k)
    } else {
        (CUBE_POS_Y as usize, args.seq_k, args.seq_q)
    };
    let bh = CUBE_POS_X as usize;
    let first = block * flash.rows;
    let row = first + UNIT_POS as usize / flash.split;
    let part = UNIT_POS as usize % flash.split;
    let own_base = bh * own_len * flash.head_dim;
    Place {
        bh,
        first,
        row,
        part,
        part_at: part * (part_lanes + 1),
        other_base: bh * other_len * flash.head_dim,
        start: own_base + row * flash.head_dim + part * part_lanes * N::value(),
        ok: row < own_len,
    }
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

/// The keys a cube of query rows whose first row is `first` needs: all of them, or when causal
/// those up to its last row.
#[cube]
pub(crate) fn keys_seen(first: usize, seq_k: usize, #[comptime] flash: Flash) -> usize {
    let mut end = seq_k;
    if flash.mask.causal {
        end = min(seq_k, first + flash.rows);
    }
    end
}

/// The sum of a vector's lanes.
#[cube]
pub(crate) fn lane_sum<N: Size>(value: Vector<f32, N>) -> f32 {
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

/// Adds a row's partial sums across the `split` units that share it (neighbours in a plane).
#[cube]
pub(crate) fn combine(value: f32, #[comptime] split: usize) -> f32 {
    let mut sum = value;
    if comptime!(split > 1) {
        sum += plane_shuffle_xor(value, 1u32);
    }
    sum
}

/// The unit's part of its row of `src` as f32 vectors (zeros past the end).
#[cube]
pub(crate) fn load_row<E: Float, N: Size>(
    src: &Array<E>,
    at: &Place,
    #[comptime] flash: Flash,
) -> Array<Vector<f32, N>> {
    let part_lanes = comptime!(flash.part_lanes());
    let width = N::value();
    let mut row = Array::<Vector<f32, N>>::new(part_lanes);
    #[unroll(flash.unroll)]
    for d in 0..part_lanes {
        row[d] = load_lanes::<E, N>(src, at.start + d * width, at.ok);
    }
    row
}

/// An accumulator for the unit's part of a row, zeroed.
#[cube]
pub(crate) fn zero_row<N: Size>(#[comptime] flash: Flash) -> Array<Vector<f32, N>> {
    let part_lanes = comptime!(flash.part_lanes());
    let mut row = Array::<Vector<f32, N>>::new(part_lanes);
    #[unroll(flash.unroll)]
    for d in 0..part_lanes {
        row[d] = Vector::<f32, N>::new(0.0f32);
    }
    row
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

/// Writes the unit's part of its row, scaled by `factor`, to `dst`.
#[cube]
pub(crate) fn store_row<E: Float, N: Size>(
    dst: &mut Array<E>,
    at: &Place,
    row: &Array<Vector<f32, N>>,
    factor: f32,
    #[comptime] flash: Flash,
) {
    let part_lanes = comptime!(flash.part_lanes());
    let width = N::value();
    #[unroll(flash.unroll)]
    for d in 0..part_lanes {
        store_lanes::<E, N>(dst, at.start + d * width, row[d], factor);
    }
}

/// A shared-memory tile of staged rows (`staged` rows, `stride` vectors apart).
#[cube]
pub(crate) fn new_tile<N: Size>(#[comptime] flash: Flash) -> SharedMemory<Vector<f32, N>> {
    let size = comptime!(flash.staged * flash.stride());
    SharedMemory::<Vector<f32, N>>::new(size)
}

/// Copies `staged` rows starting at row `first` of `src` (offset `base`) into `dst` as f32,
/// zeros past `limit`; every unit of the cube takes part.
#[cube]
fn stage_rows<E: Float, N: Size>(
    src: &Array<E>,
    dst: &mut SharedMemory<Vector<f32, N>>,
    base: usize,
    first: usize,
    limit: usize,
    #[comptime] flash: Flash,
) {
    let width = N::value();
    let lanes = comptime!(flash.lanes);
    let part_lanes = comptime!(flash.part_lanes());
    let stride = comptime!(flash.stride());
    let units = comptime!(flash.units());
    let mut idx = UNIT_POS as usize;
    while idx < flash.staged * lanes {
        let row = idx / lanes;
        let lane = idx % lanes;
        let start = base + first * lanes * width + idx * width;
        let at = row * stride + (lane / part_lanes) * (part_lanes + 1) + lane % part_lanes;
        dst[at] = load_lanes::<E, N>(src, start, first + row < limit);
        idx += units;
    }
}

/// Stages the same `staged` rows of two tensors (from row `first`, zeros past `limit`) once
/// every unit is done with the previous tiles.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_pair<E: Float, N: Size>(
    a: &Array<E>,
    b: &Array<E>,
    a_tile: &mut SharedMemory<Vector<f32, N>>,
    b_tile: &mut SharedMemory<Vector<f32, N>>,
    base: usize,
    first: usize,
    limit: usize,
    #[comptime] flash: Flash,
) {
    sync_cube();
    stage_rows::<E, N>(a, a_tile, base, first, limit, flash);
    stage_rows::<E, N>(b, b_tile, base, first, limit, flash);
}

/// The dot product of the unit's row with staged row `j` of `tile`, over the whole row (the
/// parts of a split row added up).
#[cube]
pub(crate) fn row_dot<N: Size>(
    row: &Array<Vector<f32, N>>,
    tile: &SharedMemory<Vector<f32, N>>,
    j: usize,
    at: &Place,
    #[comptime] flash: Flash,
) -> f32 {
    let part_lanes = comptime!(flash.part_lanes());
    let stride = comptime!(flash.stride());
    let tile_at = j * stride + at.part_at;
    let mut dot = Vector::<f32, N>::new(0.0f32);
    #[unroll(flash.unroll)]
    for d in 0..part_lanes {
        dot += row[d] * tile[tile_at + d];
    }
    combine(lane_sum::<N>(dot), flash.split)
}

/// `acc += factor · (staged row j of tile)` over the unit's part of the row.
#[cube]
pub(crate) fn accumulate<N: Size>(
    acc: &mut Array<Vector<f32, N>>,
    factor: f32,
    tile: &SharedMemory<Vector<f32, N>>,
    j: usize,
    at: &Place,
    #[comptime] flash: Flash,
) {
    let part_lanes = comptime!(flash.part_lanes());
    let stride = comptime!(flash.stride());
    let tile_at = j * stride + at.part_at;
    let factor_lanes = Vector::<f32, N>::new(factor);
    #[unroll(flash.unroll)]
    for d in 0..part_lanes {
        acc[d] += factor_lanes * tile[tile_at + d];
    }
}

/// `src[index]`, or 0 unless `ok`.
#[cube]
pub(crate) fn read_or_zero(src: &Array<f32>, index: usize, ok: bool) -> f32 {
    let mut value = 0.0f32;
    if ok {
        value = src[index];
    }
    value
}
