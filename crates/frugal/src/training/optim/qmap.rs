//! bitsandbytes' dynamic (tree) quantisation maps and block-wise quantisation on the host
//! (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR 2022,
//! arXiv 2110.02861).
//!
//! A map is 256 sorted f32 values in [-1, 1] (signed, for the first moment) or [0, 1]
//! (unsigned, for the second). Each code is a decimal exponent e (a run of leading zero bits)
//! and a linear fraction over the bits left: the map holds `10^-e * mean` for the means of
//! adjacent points of `linspace(0.1, 1, 2^k + 1)`, so small magnitudes keep more relative
//! precision than a linear 8-bit code would give them.

/// Entries of a map.
pub const MAP_LEN: usize = 256;

/// bitsandbytes' `create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8)`, the maps
/// its 8-bit optimizers use (`dynamic` for the first moment, `udynamic` for the second).
///
/// The construction is bitsandbytes', in f32 as its torch code computes it: boundaries by
/// torch's `linspace` (the scalar CPU formula: `start + step * i` for the first half of the
/// points, `end - step * (n - 1 - i)` for the rest), means `(b[i] + b[i + 1]) / 2`, each scaled
/// by `10^e` rounded to f32; then 0 and 1 appended and the whole sorted. (torch's vectorised
/// CPU path of `linspace` can round some boundaries one ulp apart from the scalar formula,
/// depending on the SIMD width of the machine that built the map; no quantised value moves by
/// more than that ulp.)
pub fn dynamic_map(signed: bool) -> [f32; MAP_LEN] {
    const MAX_EXPONENT_BITS: i32 = 7;
    const TOTAL_BITS: i32 = 8;
    let non_sign_bits = TOTAL_BITS - 1;
    let mut data: Vec<f32> = Vec::with_capacity(MAP_LEN);
    for i in 0..MAX_EXPONENT_BITS {
        let fraction_items = if signed {
            (1usize << (i + non_sign_bits - MAX_EXPONENT_BITS)) + 1
        } else {
            (1usize << (i + non_sign_bits - MAX_EXPONENT_BITS + 1)) + 1
        };
        let boundaries = linspace(0.1, 1.0, fraction_items);
        let scale = 10f64.powi(-(MAX_EXPONENT_BITS - 1) + i) as f32;
        let means = boundaries.windows(2).map(|b| (b[0] + b[1]) / 2.0);
        for mean in means {
            data.push(scale * mean);
            if signed {
                data.push(-scale * mean);
            }
        }
    }
    // With 7 exponent bits of 7 non-sign bits there are no additional items.
    data.push(0.0);
    data.push(1.0);
    debug_assert_eq!(data.len(), MAP_LEN);
    data.sort_by(f32::total_cmp);
    data.try_into().expect("256 entries")
}

/// torch's `linspace(start, end, n)` in f32, its scalar CPU formula.
fn linspace(start: f32, end: f32, n: usize) -> Vec<f32> {
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (n - 1 - i) as f32
            }
        })
        .collect()
}

/// The quantisation bounds of a sorted map: `bounds[k]` (k ≥ 1) is the midpoint of
/// `map[k - 1]` and `map[k]`, so that the nearest entry to `x` is the largest `k` with
/// `bounds[k] <= x` (ties go to the larger entry). `bounds[0]` is −∞ and never compared.
pub fn bounds(map: &[f32; MAP_LEN]) -> [f32; MAP_LEN] {
    let mut out = [f32::NEG_INFINITY; MAP_LEN];
    for k in 1..MAP_LEN {
        out[k] = (map[k - 1] + map[k]) / 2.0;
    }
    out
}

/// The code of `x` (a value already divided by its block's absmax): the largest `k` with
/// `bounds[k] <= x`, found by the same 8-step binary search the portable path and the kernel
/// run. NaN gives 0.
pub fn quantise(x: f32, bounds: &[f32; MAP_LEN]) -> u8 {
    let mut code = 0usize;
    for bit in 0..8 {
        let candidate = code + (128 >> bit);
        if bounds[candidate] <= x {
            code = candidate;
        }
    }
    code as u8
}

/// The four tables the fused kernel reads, in its order: signed map, its bounds, unsigned
/// map, its bounds.
#[derive(Clone, Debug)]
pub struct Tables {
    /// The first moment's map ([`dynamic_map`]`(true)`).
    pub signed: [f32; MAP_LEN],
    /// Its bounds.
    pub signed_bounds: [f32; MAP_LEN],
    /// The second moment's map ([`dynamic_map`]`(false)`).
    pub unsigned: [f32; MAP_LEN],
    /// Its bounds.
    pub unsigned_bounds: [f32; MAP_LEN],
}

impl Tables {
    /// bitsandbytes' two maps and their bounds, except that a positive second moment never
    /// quantises to zero: it takes the unsigned map's smallest positive entry instead. A second
    /// moment of zero beside a first moment that is not divides that moment by ε alone, and
    /// the parameter jumps (seen on an MLP whose gradient went to zero after one step: a
    /// parameter moved 1.03 where AdamW moved it 0.04). Rounding up overestimates the
    /// second moment of such elements, which shortens their steps instead.
    pub fn new() -> Self {
        let signed = dynamic_map(true);
        let unsigned = dynamic_map(false);
        let mut unsigned_bounds = bounds(&unsigned);
        // The smallest normal f32, not a subnormal: kernels may flush subnormals to zero.
        unsigned_bounds[1] = f32::MIN_POSITIVE;
        Self {
            signed_bounds: bounds(&signed),
            unsigned_bounds,
            signed,
            unsigned,
        }
    }

    /// The code of 0 in the signed map (the unsigned map's is 0).
    pub fn signed_zero(&self) -> u8 {
        quantise(0.0, &self.signed_bounds)
    }

    /// The four tables back to back, as the kernel reads them.
    pub fn concatenated(&self) -> Vec<f32> {
        [
            &self.signed[..],
            &self.signed_bounds[..],
            &self.unsigned[..],
            &self.unsigned_bounds[..],
        ]
        .concat()
    }
}

impl Default for Tables {
    fn default() -> Self {
        Self::new()
    }
}

/// Block-wise quantisation of `values` on the host: one absmax per block of `block_size`
/// (the last block padded with zeros) and one code per element, padded to whole blocks.
/// The reference the device paths are tested against.
pub fn quantise_blocks(
    values: &[f32],
    block_size: usize,
    bounds: &[f32; MAP_LEN],
) -> (Vec<u8>, Vec<f32>) {
    let blocks = values.len().div_ceil(block_size);
    let mut codes = vec![0u8; blocks * block_size];
    let mut absmax = vec![0f32; blocks];
    for b in 0..blocks {
        let chunk = &values[b * block_size..values.len().min((b + 1) * block_size)];
        let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        absmax[b] = max;
        let scale = if max == 0.0 { 1.0 } else { max };
        for (k, code) in codes[b * block_size..(b + 1) * block_size]
            .iter_mut()
            .enumerate()
        {
            let v = chunk.get(k).copied().unwrap_or(0.0);
            *code = quantise(v / scale, bounds);
        }
    }
    (codes, absmax)
}

/// The values of block-wise codes: `map[code] * absmax` of the code's block.
pub fn dequantise_blocks(
    codes: &[u8],
    absmax: &[f32],
    block_size: usize,
    map: &[f32; MAP_LEN],
) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(i, &c)| map[c as usize] * absmax[i / block_size])
        .collect()
}
