//! The cross-entropy kernel (wgpu or CUDA) against an f64 host reference: each row's loss and
//! the logits' gradient, widths that take vectors and widths that take one value at a time,
//! one row and many, 32- and 64-bit targets, a target out of range, f16 logits, and the input
//! checks.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use frugal_kernels::{CrossEntropyShape, FloatDtype, IdDtype, KernelError, cross_entropy_rows};

/// `(rows, classes)`: one row of three classes; an odd width (one value per load); more rows
/// than the units of a row; a wide row with logits far from 0.
const CASES: [(usize, usize); 4] = [(1, 3), (37, 13), (300, 96), (9, 8_192)];

/// Each row's `log-sum-exp − logit[target]` and `softmax − one-hot`, in f64.
fn reference(logits: &[f32], targets: &[i64], classes: usize) -> (Vec<f64>, Vec<f64>) {
    let mut loss = Vec::new();
    let mut grad = vec![0.0; logits.len()];
    for (row, &target) in targets.iter().enumerate() {
        let z: Vec<f64> = logits[row * classes..(row + 1) * classes]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        let valid = (0..classes as i64).contains(&target);
        loss.push(if valid {
            lse - z[target as usize]
        } else {
            f64::NAN
        });
        for (c, v) in z.iter().enumerate() {
            let hit = valid && c == target as usize;
            grad[row * classes + c] = (v - lse).exp() - if hit { 1.0 } else { 0.0 };
        }
    }
    (loss, grad)
}

fn targets_for(rows: usize, classes: usize) -> Vec<i64> {
    (0..rows).map(|r| ((r * 7 + 3) % classes) as i64).collect()
}

fn assert_loss(got: &[f32], want: &[f64], ctx: &str) {
    for (row, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{ctx}: row {row}: loss {g}, want NaN");
        }
    }
    let (got, want): (Vec<f32>, Vec<f64>) = got
        .iter()
        .zip(want)
        .filter(|(_, w)| !w.is_nan())
        .map(|(g, w)| (*g, *w))
        .unzip();
    assert_close(&got, &want, 1e-4, 1e-5, ctx);
}

#[test]
fn losses_and_gradients_match_the_host_in_f32() {
    let client = client();
    for (rows, classes) in CASES {
        for ids in [IdDtype::I32, IdDtype::I64] {
            let ctx = format!("rows {rows}, classes {classes}, {ids:?}");
            let offset = if classes > 1_000 { 40.0 } else { 0.0 };
            let logits: Vec<f32> = grads_f32(rows * classes, 5)
                .iter()
                .map(|v| v / 200.0 + offset)
                .collect();
            let targets = targets_for(rows, classes);
            let (want_loss, want_grad) = reference(&logits, &targets, classes);
            let shape = CrossEntropyShape { rows, classes };
            let logits_h = upload_f32(&client, &logits);
            let targets_h = upload_ids(&client, &targets, ids);
            for with_grad in [true, false] {
                let out = cross_entropy_rows(
                    &client,
                    &logits_h,
                    &targets_h,
                    shape,
                    FloatDtype::F32,
                    ids,
                    with_grad,
                )
                .unwrap();
                assert_loss(&read_f32(&client, &out.loss, rows), &want_loss, &ctx);
                assert_eq!(out.grad.is_some(), with_grad, "{ctx}");
                if let Some(grad) = out.grad {
                    let got = read_f32(&client, &grad, rows * classes);
                    assert_close(&got, &want_grad, 1e-6, 1e-4, &ctx);
                }
            }
        }
    }
}

#[test]
fn a_target_out_of_range_gives_a_nan_loss_and_no_one_hot() {
    let client = client();
    let (rows, classes) = (4, 16);
    let logits: Vec<f32> = grads_f32(rows * classes, 9)
        .iter()
        .map(|v| v / 300.0)
        .collect();
    let targets = vec![3, -1, 16, 15];
    let (want_loss, want_grad) = reference(&logits, &targets, classes);
    let out = cross_entropy_rows(
        &client,
        &upload_f32(&client, &logits),
        &upload_ids(&client, &targets, IdDtype::I32),
        CrossEntropyShape { rows, classes },
        FloatDtype::F32,
        IdDtype::I32,
        true,
    )
    .unwrap();
    assert_loss(
        &read_f32(&client, &out.loss, rows),
        &want_loss,
        "out of range",
    );
    let got = read_f32(&client, &out.grad.unwrap(), rows * classes);
    assert_close(&got, &want_grad, 1e-6, 1e-4, "out of range");
}

/// A 16-bit dtype, its narrowing and widening, and the gradient's relative tolerance in it.
type SixteenBit = (FloatDtype, fn(f32) -> u16, fn(u16) -> f32, f64);

#[test]
fn sixteen_bit_logits_keep_f32_statistics() {
    let client = client();
    // bf16 runs where the device has it (CUDA; not Mesa's lavapipe).
    let kinds: [SixteenBit; 2] = [
        (
            FloatDtype::F16,
            |v| half::f16::from_f32(v).to_bits(),
            |b| half::f16::from_bits(b).to_f32(),
            2e-3,
        ),
        (
            FloatDtype::BF16,
            |v| half::bf16::from_f32(v).to_bits(),
            |b| half::bf16::from_bits(b).to_f32(),
            1e-2,
        ),
    ];
    for (dtype, narrow, widen, grad_rtol) in kinds {
        if !dtype.is_supported(&client) {
            continue;
        }
        let ctx = format!("{dtype:?}");
        let (rows, classes) = (64, 1_024);
        let logits: Vec<f32> = grads_f32(rows * classes, 13)
            .iter()
            .map(|v| widen(narrow(v / 100.0)))
            .collect();
        let targets = targets_for(rows, classes);
        let (want_loss, want_grad) = reference(&logits, &targets, classes);
        let bits: Vec<u16> = logits.iter().map(|&v| narrow(v)).collect();
        let out = cross_entropy_rows(
            &client,
            &upload_u16(&client, &bits),
            &upload_ids(&client, &targets, IdDtype::I32),
            CrossEntropyShape { rows, classes },
            dtype,
            IdDtype::I32,
            true,
        )
        .unwrap();
        // The loss is f32 throughout: as close as in f32.
        assert_loss(&read_f32(&client, &out.loss, rows), &want_loss, &ctx);
        let grad: Vec<f32> = read_u16(&client, &out.grad.unwrap(), rows * classes)
            .into_iter()
            .map(widen)
            .collect();
        assert_close(&grad, &want_grad, 1e-5, grad_rtol, &ctx);
    }
}

#[test]
fn bad_inputs_are_refused_before_any_launch() {
    let client = client();
    let logits = upload_f32(&client, &[0.0; 12]);
    let targets = upload_ids(&client, &[0, 1, 2], IdDtype::I32);
    let run = |shape: CrossEntropyShape, ids: IdDtype| {
        cross_entropy_rows(
            &client,
            &logits,
            &targets,
            shape,
            FloatDtype::F32,
            ids,
            true,
        )
        .unwrap_err()
    };
    let err = run(
        CrossEntropyShape {
            rows: 3,
            classes: 5,
        },
        IdDtype::I32,
    );
    assert!(matches!(err, KernelError::BufferTooSmall { .. }), "{err}");
    assert!(err.to_string().contains("logits"), "{err}");
    let err = run(
        CrossEntropyShape {
            rows: 3,
            classes: 4,
        },
        IdDtype::I64,
    );
    assert!(err.to_string().contains("targets"), "{err}");
    let err = run(
        CrossEntropyShape {
            rows: 3,
            classes: 0,
        },
        IdDtype::I32,
    );
    assert!(err.to_string().contains("classes"), "{err}");
}
