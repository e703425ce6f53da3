//! The embedding backward (wgpu or CUDA): every token's gradient row added into its id's row,
//! against a host reference, with repeated ids, ids outside the table skipped, f32 and 16-bit
//! output gradients, 32- and 64-bit ids, and its input checks. The values are multiples of
//! 1/8 well inside f32's exact range, so sums do not depend on the order of the atomic adds
//! and the comparison is bit for bit.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use frugal_kernels::{EmbeddingGradBuffers, FloatDtype, IdDtype, KernelError, embedding_grad_add};

/// `(tokens, width, rows)` cases: a row shared by many tokens, a width that fills no whole
/// cube, more tokens than rows.
const CASES: [(usize, usize, usize); 3] = [(64, 5, 3), (1_000, 77, 50), (4_096, 128, 512)];

fn ids(tokens: usize, rows: usize) -> Vec<i64> {
    (0..tokens)
        .map(|t| match t % 97 {
            // Outside the table (skipped).
            13 => rows as i64 + 3,
            29 => -1,
            _ => ((t * 7 + t / 3) % rows) as i64,
        })
        .collect()
}

fn out_grad(tokens: usize, width: usize) -> Vec<f32> {
    (0..tokens * width)
        .map(|i| ((i * 37 % 41) as f32 - 20.0) / 8.0)
        .collect()
}

fn reference(grad: &mut [f32], out_grad: &[f32], ids: &[i64], width: usize) {
    let rows = grad.len() / width;
    for (t, &id) in ids.iter().enumerate() {
        if (0..rows as i64).contains(&id) {
            for d in 0..width {
                grad[id as usize * width + d] += out_grad[t * width + d];
            }
        }
    }
}

#[test]
fn rows_are_summed_as_the_host_sums_them() {
    let client = client();
    for (tokens, width, rows) in CASES {
        for ids_dtype in [IdDtype::I32, IdDtype::I64] {
            for dtype in FloatDtype::ALL {
                if !dtype.is_supported(&client) {
                    continue;
                }
                let ids = ids(tokens, rows);
                let values = out_grad(tokens, width);
                let out_grad_h = match dtype {
                    FloatDtype::F32 => upload_f32(&client, &values),
                    FloatDtype::F16 => upload_u16(
                        &client,
                        &values
                            .iter()
                            .map(|&v| half::f16::from_f32(v).to_bits())
                            .collect::<Vec<_>>(),
                    ),
                    FloatDtype::BF16 => upload_u16(
                        &client,
                        &values
                            .iter()
                            .map(|&v| half::bf16::from_f32(v).to_bits())
                            .collect::<Vec<_>>(),
                    ),
                };
                // Added into what the buffer holds: start from ones.
                let mut want = vec![1.0f32; rows * width];
                let grad_h = upload_f32(&client, &want);
                reference(&mut want, &values, &ids, width);
                let ids_h = upload_ids(&client, &ids, ids_dtype);
                let buffers = EmbeddingGradBuffers {
                    out_grad: &out_grad_h,
                    out_grad_dtype: dtype,
                    ids: &ids_h,
                    ids_dtype,
                    grad: &grad_h,
                    tokens,
                    width,
                    rows,
                };
                embedding_grad_add(&client, buffers).unwrap();
                let got = read_f32(&client, &grad_h, rows * width);
                let case =
                    format!("{tokens} tokens, width {width}, {rows} rows, {dtype}, {ids_dtype:?}");
                assert_bits32(&got, &want, &case);
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused_before_any_launch() {
    let client = client();
    let (tokens, width, rows) = (10, 4, 3);
    let out_grad_h = upload_f32(&client, &vec![1.0; tokens * width]);
    let ids_h = upload_ids(&client, &vec![0; tokens], IdDtype::I32);
    let grad_h = upload_f32(&client, &vec![0.0; rows * width]);
    let buffers = EmbeddingGradBuffers {
        out_grad: &out_grad_h,
        out_grad_dtype: FloatDtype::F32,
        ids: &ids_h,
        ids_dtype: IdDtype::I32,
        grad: &grad_h,
        tokens,
        width,
        rows,
    };
    for (what, bad) in [
        (
            "out_grad",
            EmbeddingGradBuffers {
                tokens: tokens + 1,
                ..buffers
            },
        ),
        (
            "grad",
            EmbeddingGradBuffers {
                rows: rows + 1,
                ..buffers
            },
        ),
        (
            "ids",
            EmbeddingGradBuffers {
                ids_dtype: IdDtype::I64,
                ..buffers
            },
        ),
    ] {
        let err = embedding_grad_add(&client, bad).unwrap_err();
        assert!(
            matches!(&err, KernelError::BufferTooSmall { what: w, .. } if w == what),
            "{what}: {err}"
        );
    }
}
