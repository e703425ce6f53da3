use cubecl::{prelude::*, server::Handle};

use crate::{AdamWScalars, FloatDtype, KernelError, adamw::updated_param, cast::check_buffer};

/// Entries of one quantisation map (8-bit codes).
pub const MAP_LEN: usize = 256;

/// f32 entries of the table buffer [`adamw8bit_update`] reads: the first moment's (signed) map,
/// its bounds, the second moment's (unsigned) map, its bounds, 256 each.
///
/// `bounds[k]` (k = 1..=255) is the value at and above which code `k` is nearer than code
/// `k - 1` (the midpoint of `map[k - 1]` and `map[k]`); `bounds[0]` is never read. A value is
/// quantised to the largest `k` with `bounds[k] <= x` (0 if none), which is the nearest map
/// entry, ties to the larger. The caller computes the bounds, so that its portable path and
/// the kernel compare against the same f32 values.
pub const TABLES_LEN: usize = 4 * MAP_LEN;

/// The largest block size the kernel takes (its cube reduces one block at a time).
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

/// Reads code `lane` (0..4) of a word of four little-endian codes, dequantises it with the map
/// at `map_offset` of `tables`, and scales it by the block's absmax.
#[cube]
fn dequantise(
    word: u32,
    #[comptime] lane: u32,
    tables: &Array<f32>,
    #[comptime] map_offset: usize,
    absmax: f32,
) -> f32 {
    let code = (word >> (lane * 8)) & 255u32;
    tables[map_offset + code as usize] * absmax
}

/// The code of `x` (already divided by the block's absmax): the largest `k` with
/// `bounds[k] <= x`, by an 8-step binary search over the bounds at `bounds_offset`.
#[cube]
fn quantise(x: f32, tables: &Array<f32>, #[comptime] bounds_offset: usize) -> u32 {
    let mut code = 0u32;
    #[unroll]
    for bit in 0..8u32 {
        let candidate = code + comptime!(128u32 >> bit);
        if tables[bounds_offset + candidate as usize] <= x {
            code = candidate;
        }
    }
    code
}

/// The new moments of one element: `m = m₀·β₁ + g·(1 − β₁)`, `v = v₀·β₂ + g²·(1 − β₂)`, in
/// the order burn-optim's `AdamW` computes them.
#[cube]
#[allow(clippy::too_many_arguments)]
fn moments(
    word_m: u32,
    word_v: u32,
    #[comptime] lane: u32,
    grad: f32,
    tables: &Array<f32>,
    absmax_m: f32,
    absmax_v: f32,
    beta_1: f32,
    one_minus_beta_1: f32,
    beta_2: f32,
    one_minus_beta_2: f32,
) -> (f32, f32) {
    let m0 = dequantise(word_m, lane, tables, 0usize, absmax_m);
    let v0 = dequantise(word_v, lane, tables, comptime!(2 * MAP_LEN), absmax_v);
    let m = m0 * beta_1 + grad * one_minus_beta_1;
    let v = v0 * beta_2 + (grad * grad) * one_minus_beta_2;
    (m, v)
}

/// One AdamW step on 8-bit block-wise quantised moments, in place.
///
/// `codes` holds the first moment's codes (`blocks * words_per_block` words of four codes
/// each), then the second moment's; `absmax` the first moment's absmax per block, then the
/// second's. One cube walks whole blocks: pass 1 computes the new moments of its block and
/// reduces their absmax in shared memory; pass 2 computes them again (the same operations, so
/// the same bits), updates the parameter and writes the codes quantised against the new
/// absmax. Elements past `len` (the last block's padding) are updated with a zero gradient and
/// never write a parameter.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn adamw8bit_kernel(
    param: &mut Array<f32>,
    grad: &Array<f32>,
    codes: &mut Array<u32>,
    absmax: &mut Array<f32>,
    tables: &Array<f32>,
    len: u32,
    blocks: u32,
    beta_1: f32,
    one_minus_beta_1: f32,
    beta_2: f32,
    one_minus_beta_2: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    lr: f32,
    decay_value: f32,
    #[comptime] words_per_block: u32,
    #[comptime] units: u32,
    #[comptime] decay_kind: u32,
) {
    let mut shared = SharedMemory::<f32>::new(comptime!(2 * units as usize));
    let total_words = blocks * words_per_block;
    let unit = UNIT_POS;
    let mut block = CUBE_POS as u32;
    let cube_count = CUBE_COUNT as u32;
    while block < blocks {
        let absmax_m = absmax[block as usize];
        let absmax_v = absmax[(blocks + block) as usize];

        // Pass 1: the block's new absmax of each moment.
        let mut max_m = 0.0f32;
        let mut max_v = 0.0f32;
        let mut w = unit;
        while w < words_per_block {
            let word = block * words_per_block + w;
            let word_m = codes[word as usize];
            let word_v = codes[(total_words + word) as usize];
            #[unroll]
            for lane in 0..4u32 {
                let e = word * 4 + lane;
                let mut g = 0.0f32;
                if e < len {
                    g = grad[e as usize];
                }
                let (m, v) = moments(
                    word_m,
                    word_v,
                    lane,
                    g,
                    tables,
                    absmax_m,
                    absmax_v,
                    beta_1,
                    one_minus_beta_1,
                    beta_2,
                    one_minus_beta_2,
                );
                max_m = max(max_m, m.abs());
                max_v = max(max_v, v);
            }
            w += units;
        }
        shared[unit as usize] = max_m;
        shared[(units + unit) as usize] = max_v;
        sync_cube();
        let mut stride = comptime!(units / 2).runtime();
        while stride > 0 {
            if unit < stride {
                let a = shared[unit as usize];
                let b = shared[(unit + stride) as usize];
                shared[unit as usize] = max(a, b);
                let c = shared[(units + unit) as usize];
                let d = shared[(units + unit + stride) as usize];
                shared[(units + unit) as usize] = max(c, d);
            }
            sync_cube();
            stride /= 2;
        }
        let new_m = shared[0];
        let new_v = shared[units as usize];
        // An all-zero block keeps its zeros: divide by 1 instead of 0.
        let mut scale_m = new_m;
        if new_m == 0.0 {
            scale_m = 1.0;
        }
        let mut scale_v = new_v;
        if new_v == 0.0 {
            scale_v = 1.0;
        }

        // Pass 2: the parameter update and the new codes.
        let mut w = unit;
        while w < words_per_block {
            let word = block * words_per_block + w;
            let word_m = codes[word as usize];
            let word_v = codes[(total_words + word) as usize];
            let mut out_m = 0u32;
            let mut out_v = 0u32;
            #[unroll]
            for lane in 0..4u32 {
                let e = word * 4 + lane;
                let mut g = 0.0f32;
                if e < len {
                    g = grad[e as usize];
                }
                let (m, v) = moments(
                    word_m,
                    word_v,
                    lane,
                    g,
                    tables,
                    absmax_m,
                    absmax_v,
                    beta_1,
                    one_minus_beta_1,
                    beta_2,
                    one_minus_beta_2,
                );
                if e < len {
                    param[e as usize] = updated_param(
                        param[e as usize],
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
                out_m |= quantise(m / scale_m, tables, comptime!(MAP_LEN)) << (lane * 8);
                out_v |= quantise(v / scale_v, tables, comptime!(3 * MAP_LEN)) << (lane * 8);
            }
            codes[word as usize] = out_m;
            codes[(total_words + word) as usize] = out_v;
            w += units;
        }
        if unit == 0 {
            absmax[block as usize] = new_m;
            absmax[(blocks + block) as usize] = new_v;
        }
        // Every unit has read the shared maxima before the next block overwrites them.
        sync_cube();
        block += cube_count;
    }
}

/// The buffers of one parameter tensor for [`adamw8bit_update`], all contiguous.
#[derive(Clone, Copy, Debug)]
pub struct AdamW8bitBuffers<'a> {
    /// The parameter, `len` f32 values, updated in place.
    pub param: &'a Handle,
    /// Its gradient, `len` f32 values (read only).
    pub grad: &'a Handle,
    /// The codes: `2 * words` u32 words of four 8-bit codes each, little-endian, element `i`
    /// in byte `i % 4` of word `i / 4`; the first moment's `words` words, then the second's,
    /// where `words = blocks * block_size / 4` and `blocks = ceil(len / block_size)`.
    /// Updated in place.
    pub codes: &'a Handle,
    /// The absmax of each block: the first moment's `blocks` f32 values, then the second's.
    /// Updated in place.
    pub absmax: &'a Handle,
    /// Elements of the parameter.
    pub len: usize,
}

/// Blocks and code words of a tensor of `len` elements in blocks of `block_size`.
pub fn adamw8bit_layout(len: usize, block_size: usize) -> (usize, usize) {
    let blocks = len.div_ceil(block_size.max(1));
    (blocks, blocks * block_size / 4)
}

/// One AdamW step of a parameter whose moments are stored as 8-bit block-wise quantised codes
/// (the bitsandbytes scheme): dequantises both moments, updates them with the gradient,
/// updates the parameter (bias correction, decoupled weight decay, as burn-optim's `AdamW`),
/// and requantises the moments against their new per-block absmax, writing the parameter,
/// codes and absmax in place. One launch; nothing is read back.
///
/// `tables` holds [`TABLES_LEN`] f32 values laid out as [`TABLES_LEN`] describes. Errors
/// (before anything is launched) if `block_size` is not a multiple of 4 in `4..=`
/// [`MAX_BLOCK_SIZE`], a buffer is smaller than the layout needs, or `len` exceeds 32-bit
/// indexing. The buffers must not overlap.
pub fn adamw8bit_update<R: Runtime>(
    client: &ComputeClient<R>,
    buffers: AdamW8bitBuffers<'_>,
    tables: &Handle,
    block_size: usize,
    scalars: &AdamWScalars,
) -> Result<(), KernelError> {
    if block_size < 4 || !block_size.is_multiple_of(4) || block_size > MAX_BLOCK_SIZE {
        return Err(KernelError::InvalidBlockSize {
            block_size,
            max: MAX_BLOCK_SIZE,
        });
    }
    let len = buffers.len;
    let (blocks, words) = adamw8bit_layout(len, block_size);
    // Element indices (4 per word) must fit in 32 bits.
    let max_len = (u32::MAX as usize / 4) / block_size * block_size;
    if len > max_len {
        return Err(KernelError::LengthTooLarge {
            what: "param".to_string(),
            len,
            max: max_len,
        });
    }
    check_buffer("param", buffers.param, len, FloatDtype::F32)?;
    check_buffer("grad", buffers.grad, len, FloatDtype::F32)?;
    // u32 words and f32 values have the same size.
    check_buffer("codes", buffers.codes, 2 * words, FloatDtype::F32)?;
    check_buffer("absmax", buffers.absmax, 2 * blocks, FloatDtype::F32)?;
    check_buffer("tables", tables, TABLES_LEN, FloatDtype::F32)?;
    if len == 0 {
        return Ok(());
    }

    let words_per_block = (block_size / 4) as u32;
    let hardware = &client.properties().hardware;
    // A power of two (the reduction halves it), at most 128 and what the device allows.
    let device_units = hardware.max_units_per_cube.max(1);
    let device_units = 1u32 << (31 - device_units.leading_zeros());
    let units = words_per_block
        .next_power_of_two()
        .min(128)
        .min(device_units);
    let cubes = (blocks as u32).clamp(1, hardware.max_cube_count.0.clamp(1, 65_535));
    let (decay_kind, decay_value) = scalars.decay.kind_and_value();
    // SAFETY: every index is below its array's length: parameter and gradient indices are
    // checked against `len`; word indices are below `2 * blocks * words_per_block` (the codes
    // length checked above); absmax indices below `2 * blocks`; table indices below
    // `TABLES_LEN` (codes and binary-search candidates are at most 255); shared memory is
    // indexed below `2 * units`.
    unsafe {
        adamw8bit_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_1d(units),
            ArrayArg::from_raw_parts(buffers.param.clone(), len),
            ArrayArg::from_raw_parts(buffers.grad.clone(), len),
            ArrayArg::from_raw_parts(buffers.codes.clone(), 2 * words),
            ArrayArg::from_raw_parts(buffers.absmax.clone(), 2 * blocks),
            ArrayArg::from_raw_parts(tables.clone(), TABLES_LEN),
            len as u32,
            blocks as u32,
            scalars.beta_1,
            scalars.one_minus_beta_1,
            scalars.beta_2,
            scalars.one_minus_beta_2,
            scalars.bias_correction_1,
            scalars.bias_correction_2,
            scalars.epsilon,
            scalars.lr,
            decay_value,
            words_per_block,
            units,
            decay_kind,
        );
    }
    Ok(())
}
