//! Casts and fused scaled casts (wgpu or CUDA), bit for bit against `half`.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use frugal_kernels::{
    FloatDtype, KernelError, cast, cast_bf16_to_f32, cast_f16_to_f32, cast_f32_to_bf16,
    cast_f32_to_f16, cast_scaled, copy, vector_size_for,
};
use half::{bf16, f16};

/// The input for a given length: the awkward values first, then values spread over the whole
/// f32 range.
fn input_of_len(len: usize) -> Vec<f32> {
    let mut values = awkward_f32();
    values.extend(spread_f32(len.saturating_sub(values.len()), len as u64 + 1));
    values.truncate(len);
    values
}

#[test]
fn f32_to_f16_matches_half_bit_for_bit() {
    let client = client();
    assert!(
        FloatDtype::F16.is_supported(&client),
        "f16 is supported (lavapipe and CUDA both have it)"
    );
    let mut checked = 0;
    for len in LENGTHS.into_iter().chain([awkward_f32().len()]) {
        let input = input_of_len(len);
        let handle = upload_f32(&client, &input);
        let out = cast_f32_to_f16(&client, &handle, len).unwrap();
        let actual = read_u16(&client, &out, len);
        let expected: Vec<u16> = input.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        assert_bits16(
            &actual,
            &expected,
            f16_is_nan,
            &format!("f32->f16 len {len}"),
        );
        checked += len;
    }
    assert!(checked > 11_000);
}

#[test]
fn f16_to_f32_matches_half_for_every_f16() {
    let client = client();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    // Every pattern at once (a multiple of every vector width), then an odd-length slice.
    for len in [all.len(), 4_099, 1, 0] {
        let handle = upload_u16(&client, &all[..len]);
        let out = cast_f16_to_f32(&client, &handle, len).unwrap();
        let actual = read_f32(&client, &out, len);
        let expected: Vec<f32> = all[..len]
            .iter()
            .map(|&b| f16::from_bits(b).to_f32())
            .collect();
        assert_bits32(&actual, &expected, &format!("f16->f32 len {len}"));
    }
}

#[test]
fn bf16_casts_match_half_or_report_unsupported() {
    let client = client();
    let input = input_of_len(10_007);
    let handle = upload_f32(&client, &input);
    if FloatDtype::BF16.is_supported(&client) {
        for len in LENGTHS {
            let out = cast_f32_to_bf16(&client, &handle, len).unwrap();
            let actual = read_u16(&client, &out, len);
            let expected: Vec<u16> = input[..len]
                .iter()
                .map(|&x| bf16::from_f32(x).to_bits())
                .collect();
            assert_bits16(
                &actual,
                &expected,
                bf16_is_nan,
                &format!("f32->bf16 len {len}"),
            );
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let bits = upload_u16(&client, &all);
        let out = cast_bf16_to_f32(&client, &bits, all.len()).unwrap();
        let expected: Vec<f32> = all.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
        assert_bits32(&read_f32(&client, &out, all.len()), &expected, "bf16->f32");
    } else {
        let err = cast_f32_to_bf16(&client, &handle, input.len()).unwrap_err();
        assert!(
            matches!(&err, KernelError::UnsupportedDtype { dtype: FloatDtype::BF16, supported, .. }
                if supported.contains(&FloatDtype::F32) && !supported.contains(&FloatDtype::BF16)),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("bf16") && message.contains("accepted here: f32"),
            "{message}"
        );
        let err = cast_bf16_to_f32(&client, &handle, 8).unwrap_err();
        assert!(matches!(
            err,
            KernelError::UnsupportedDtype {
                dtype: FloatDtype::BF16,
                ..
            }
        ));
        let err =
            cast_scaled(&client, &handle, 8, FloatDtype::F32, FloatDtype::BF16, 2.0).unwrap_err();
        assert!(matches!(
            err,
            KernelError::UnsupportedDtype {
                dtype: FloatDtype::BF16,
                ..
            }
        ));
    }
}

#[test]
fn copy_is_bit_exact() {
    let client = client();
    for len in LENGTHS {
        let input = input_of_len(len);
        let handle = upload_f32(&client, &input);
        let out = copy(&client, &handle, len, FloatDtype::F32).unwrap();
        let actual = read_f32(&client, &out, len);
        let same = actual
            .iter()
            .zip(&input)
            .all(|(a, e)| a.to_bits() == e.to_bits());
        assert!(same, "copy of len {len} changed bits");
    }
}

/// Relative error of a rounded result against the exact product, in units of the dtype's
/// half-ulp bound `2^-(p)` (p = significand bits incl. the implicit one): the stated tolerance
/// of a single round-to-nearest is `|rounded - exact| <= 2^-p * |exact|` in the normal range.
fn within_half_ulp(rounded: f64, exact: f64, significand_bits: i32) -> bool {
    (rounded - exact).abs() <= 2f64.powi(-significand_bits) * exact.abs()
}

#[test]
fn scaled_cast_to_f16_is_one_rounding_of_the_f32_product() {
    let client = client();
    let len = 10_007;
    let input: Vec<f32> = grads_f32(len, 7).iter().map(|g| g / 1000.0).collect();
    let handle = upload_f32(&client, &input);
    for scale in [1.0f32, 1024.0, 3.0, 0.1, 65536.0] {
        let out = cast_scaled(
            &client,
            &handle,
            len,
            FloatDtype::F32,
            FloatDtype::F16,
            scale,
        )
        .unwrap();
        let actual = read_u16(&client, &out, len);
        let expected: Vec<u16> = input
            .iter()
            .map(|&x| f16::from_f32(x * scale).to_bits())
            .collect();
        assert_bits16(
            &actual,
            &expected,
            f16_is_nan,
            &format!("scaled f32->f16 x{scale}"),
        );
        for (&a, &x) in actual.iter().zip(&input) {
            let exact = x as f64 * scale as f64;
            let got = f16::from_bits(a).to_f64();
            if exact.abs() > 65504.0 {
                assert!(
                    got.is_infinite() || got.abs() == 65504.0,
                    "{x} * {scale} -> {got}"
                );
            } else if exact.abs() >= 2f64.powi(-14) {
                assert!(
                    within_half_ulp(got, exact, 11),
                    "{x} * {scale}: {got} vs {exact}"
                );
            } else {
                // Subnormal range: absolute error at most half the smallest subnormal step.
                assert!(
                    (got - exact).abs() <= 2f64.powi(-25),
                    "{x} * {scale}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn scaled_cast_from_f16_widens_then_scales() {
    let client = client();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let handle = upload_u16(&client, &all);
    for scale in [1.0f32, 1.0 / 65536.0, 0.3, 7.0] {
        let out = cast_scaled(
            &client,
            &handle,
            all.len(),
            FloatDtype::F16,
            FloatDtype::F32,
            scale,
        )
        .unwrap();
        let actual = read_f32(&client, &out, all.len());
        let expected: Vec<f32> = all
            .iter()
            .map(|&b| f16::from_bits(b).to_f32() * scale)
            .collect();
        assert_bits32(&actual, &expected, &format!("scaled f16->f32 x{scale}"));
        for (&a, &b) in actual.iter().zip(&all) {
            let exact = f16::from_bits(b).to_f64() * scale as f64;
            if exact.is_finite() && exact != 0.0 && exact.abs() >= f32::MIN_POSITIVE as f64 {
                assert!(
                    within_half_ulp(a as f64, exact, 24),
                    "{b:#06x} x {scale}: {a}"
                );
            }
        }
    }
}

#[test]
fn scaled_cast_overflows_to_inf_like_half() {
    let client = client();
    let input = [1.0f32, 2.0, 4.0, -8.0, 0.5];
    let handle = upload_f32(&client, &input);
    let out = cast_scaled(
        &client,
        &handle,
        input.len(),
        FloatDtype::F32,
        FloatDtype::F16,
        32768.0,
    )
    .unwrap();
    let actual: Vec<f16> = read_u16(&client, &out, input.len())
        .into_iter()
        .map(f16::from_bits)
        .collect();
    assert_eq!(
        actual,
        [
            32768.0f32,
            f32::INFINITY,
            f32::INFINITY,
            f32::NEG_INFINITY,
            16384.0
        ]
        .map(f16::from_f32)
    );
}

#[test]
fn invalid_arguments_are_errors_not_panics() {
    let client = client();
    let handle = upload_f32(&client, &[1.0, 2.0, 3.0]);
    let err = cast_f32_to_f16(&client, &handle, 4).unwrap_err();
    assert_eq!(
        err,
        KernelError::BufferTooSmall {
            what: "input".into(),
            len: 4,
            needed_bytes: 16,
            actual_bytes: 12
        }
    );
    assert!(
        err.to_string()
            .contains("4 elements need 16 bytes but the buffer holds 12")
    );
    for bad in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let err =
            cast_scaled(&client, &handle, 3, FloatDtype::F32, FloatDtype::F16, bad).unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidScale { what: "scale", .. }),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains("accepted: finite and > 0"));
    }
    let err = cast(
        &client,
        &handle,
        usize::MAX,
        FloatDtype::F32,
        FloatDtype::F16,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::LengthTooLarge { .. }), "{err:?}");
    // f16 input of 3 elements fits in 12 bytes, so this one is valid.
    assert!(cast(&client, &handle, 6, FloatDtype::F16, FloatDtype::F32).is_ok());
}

#[test]
fn vector_size_is_widest_divisor_or_one() {
    let client = client();
    let widest = client.io_optimized_vector_sizes(4).next().unwrap();
    assert!(
        widest >= 2,
        "the runtime should vectorise f32 loads (got {widest})"
    );
    assert_eq!(vector_size_for(&client, 1024, 4), widest);
    assert_eq!(vector_size_for(&client, 10_007, 4), 1);
    assert_eq!(vector_size_for(&client, 2, 4), 2);
    assert_eq!(vector_size_for(&client, 0, 4), widest);
}
