//! Helpers shared by the kernel tests (wgpu, or CUDA when only that feature is on).
#![allow(dead_code)]

use cubecl::{Runtime, client::ComputeClient, server::Handle};
use half::{bf16, f16};

/// The runtime under test: wgpu when its feature is on (CI, Mesa's lavapipe), else CUDA
/// (`cargo test -p frugal-kernels --features frugal-kernels/cuda`, on a GPU machine).
#[cfg(feature = "wgpu")]
pub type R = cubecl::wgpu::WgpuRuntime;
#[cfg(all(feature = "cuda", not(feature = "wgpu")))]
pub type R = cubecl::cuda::CudaRuntime;

pub fn client() -> ComputeClient<R> {
    R::client(&Default::default())
}

pub fn upload_f32(client: &ComputeClient<R>, values: &[f32]) -> Handle {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    client.create_from_slice(&bytes)
}

pub fn upload_u16(client: &ComputeClient<R>, bits: &[u16]) -> Handle {
    let bytes: Vec<u8> = bits.iter().flat_map(|v| v.to_le_bytes()).collect();
    client.create_from_slice(&bytes)
}

/// Uploads class or token ids as `dtype`.
pub fn upload_ids(
    client: &ComputeClient<R>,
    ids: &[i64],
    dtype: frugal_kernels::IdDtype,
) -> Handle {
    let bytes: Vec<u8> = match dtype {
        frugal_kernels::IdDtype::I32 => {
            ids.iter().flat_map(|&i| (i as i32).to_le_bytes()).collect()
        }
        frugal_kernels::IdDtype::I64 => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
    };
    client.create_from_slice(&bytes)
}

pub fn read_f32(client: &ComputeClient<R>, handle: &Handle, len: usize) -> Vec<f32> {
    let bytes = client.read_one(handle.clone()).expect("read f32 buffer");
    assert!(
        bytes.len() >= len * 4,
        "buffer has {} bytes, want {}",
        bytes.len(),
        len * 4
    );
    bytes[..len * 4]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn read_u16(client: &ComputeClient<R>, handle: &Handle, len: usize) -> Vec<u16> {
    let bytes = client.read_one(handle.clone()).expect("read u16 buffer");
    assert!(
        bytes.len() >= len * 2,
        "buffer has {} bytes, want {}",
        bytes.len(),
        len * 2
    );
    bytes[..len * 2]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// Awkward f32 inputs for narrowing to f16 or bf16: signed zeros, infinities, NaN, f32
/// subnormals, f16 subnormals and their rounding ties, ties at 1.0 for both widths, the f16
/// overflow boundary and huge values.
pub fn awkward_f32() -> Vec<f32> {
    let p = |e: i32| 2f32.powi(e);
    vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        1.0,
        -1.0,
        0.1,
        -2.5,
        core::f32::consts::PI,
        // f32 subnormals (become ±0 in f16, subnormal or ±0 in bf16).
        f32::from_bits(1),
        -f32::from_bits(1),
        1e-40,
        f32::MIN_POSITIVE,
        // f16: smallest subnormal 2^-24, its half (tie with 0, rounds to 0), 3 * 2^-26
        // (rounds up), 3 * 2^-25 (tie between 2^-24 and 2^-23, rounds to even 2^-23).
        p(-24),
        p(-25),
        -p(-25),
        3.0 * p(-26),
        3.0 * p(-25),
        5.0 * p(-25),
        // f16 normal boundary and just below it.
        p(-14),
        p(-14) - p(-24),
        p(-14) - p(-25),
        // Ties at 1.0 for f16 (ulp 2^-10) and bf16 (ulp 2^-7).
        1.0 + p(-11),
        1.0 + 3.0 * p(-11),
        1.0 + p(-11) + p(-20),
        1.0 + p(-8),
        1.0 + 3.0 * p(-8),
        1.0 + p(-8) + p(-20),
        -(1.0 + 3.0 * p(-8)),
        // f16 overflow: 65504 is the largest finite, 65519.996 still rounds to it, 65520 is
        // the tie that rounds (to even) to inf.
        65504.0,
        65519.996,
        65520.0,
        -65520.0,
        70000.0,
        1e6,
        -1e6,
        f32::MAX,
        f32::MIN,
        // bf16 overflow: values that round up past bf16's largest finite.
        f32::from_bits(0x7f7f_ffff),
        f32::from_bits(0x7f7f_8000),
        f32::from_bits(0x7f7f_7fff),
    ]
}

/// Deterministic f32 values spread over the whole exponent range, both signs.
pub fn spread_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = (state >> 32) as u32;
            let v = f32::from_bits(bits);
            // Keep NaN/inf patterns rare but present: map most of them to a finite value.
            if v.is_finite() || bits.is_multiple_of(7) {
                v
            } else {
                (bits % 1000) as f32 - 500.0
            }
        })
        .collect()
}

/// Deterministic finite f32 values of moderate magnitude (like gradients).
pub fn grads_f32(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3000.0
        })
        .collect()
}

/// Asserts bit equality of `actual` with `expected` (u16 dtype bits), any NaN matching any NaN.
pub fn assert_bits16(actual: &[u16], expected: &[u16], is_nan: impl Fn(u16) -> bool, ctx: &str) {
    assert_eq!(actual.len(), expected.len(), "{ctx}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if is_nan(*e) {
            assert!(is_nan(*a), "{ctx}: [{i}] expected NaN, got {a:#06x}");
        } else {
            assert_eq!(a, e, "{ctx}: [{i}] got {a:#06x}, expected {e:#06x}");
        }
    }
}

pub fn f16_is_nan(bits: u16) -> bool {
    f16::from_bits(bits).is_nan()
}

pub fn bf16_is_nan(bits: u16) -> bool {
    bf16::from_bits(bits).is_nan()
}

/// Asserts bit equality of f32 values, any NaN matching any NaN.
pub fn assert_bits32(actual: &[f32], expected: &[f32], ctx: &str) {
    assert_eq!(actual.len(), expected.len(), "{ctx}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if e.is_nan() {
            assert!(a.is_nan(), "{ctx}: [{i}] expected NaN, got {a}");
        } else {
            assert_eq!(
                a.to_bits(),
                e.to_bits(),
                "{ctx}: [{i}] got {a:e} ({:#010x}), expected {e:e} ({:#010x})",
                a.to_bits(),
                e.to_bits()
            );
        }
    }
}

/// Lengths that cover the empty case, single elements, and lengths that are and are not
/// multiples of every vector width.
pub const LENGTHS: [usize; 9] = [0, 1, 2, 3, 4, 5, 8, 1023, 10_007];

/// Asserts `|got - want| <= atol + rtol * |want|` element by element, and that the reference is
/// not all but zero (where any result would pass).
pub fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= atol + rtol * w.abs(),
            "{ctx}: [{i}] got {g}, want {w} (error {err:e})"
        );
    }
    assert!(
        want.iter().any(|w| w.abs() > 1e-3),
        "{ctx}: the reference is all but zero, the comparison says nothing"
    );
}

/// An AdamW step's scalars at step `time` (β₁ 0.9, β₂ 0.999, ε 1e-8, lr 1e-3), computed as
/// burn-optim computes them.
pub fn adamw_scalars(
    time: i32,
    decay: frugal_kernels::WeightDecay,
) -> frugal_kernels::AdamWScalars {
    let (beta_1, beta_2) = (0.9f32, 0.999f32);
    frugal_kernels::AdamWScalars {
        beta_1,
        one_minus_beta_1: 1.0 - beta_1,
        beta_2,
        one_minus_beta_2: 1.0 - beta_2,
        bias_correction_1: 1.0 - beta_1.powi(time),
        bias_correction_2: 1.0 - beta_2.powi(time),
        epsilon: 1e-8,
        lr: 1e-3,
        decay,
    }
}
