//! The layer norm kernels (wgpu or CUDA) against an f64 host reference: forward output and
//! statistics, the input's and the parameters' gradients, with and without beta, widths that
//! take vectors of four and widths that take one value at a time, one row and many, and the
//! input checks.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use frugal_kernels::{
    FloatDtype, KernelError, LayerNormShape, layer_norm_backward, layer_norm_forward,
};

/// `(rows, width)`: one row; a width of odd length (one value per load); rows that fill
/// several chunks of the parameters' partial sums, one left over; a wide row; more chunks
/// than units that add one column's partial sums, and a width that leaves the last cube of
/// columns partly empty.
const CASES: [(usize, usize); 5] = [(1, 8), (37, 13), (100, 96), (9, 1_536), (1_100, 40)];

/// Deterministic values in about ±1.5.
fn moderate(len: usize, seed: u64) -> Vec<f32> {
    grads_f32(len, seed).iter().map(|v| v / 1000.0).collect()
}

struct Reference {
    output: Vec<f64>,
    mean: Vec<f64>,
    rstd: Vec<f64>,
    grad_input: Vec<f64>,
    grad_gamma: Vec<f64>,
    grad_beta: Vec<f64>,
}

/// The written-out layer norm and its gradients in f64.
fn reference(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    dy: &[f32],
    width: usize,
    eps: f64,
) -> Reference {
    let rows = x.len() / width;
    let mut r = Reference {
        output: vec![0.0; x.len()],
        mean: vec![0.0; rows],
        rstd: vec![0.0; rows],
        grad_input: vec![0.0; x.len()],
        grad_gamma: vec![0.0; width],
        grad_beta: vec![0.0; width],
    };
    for row in 0..rows {
        let xs: Vec<f64> = x[row * width..(row + 1) * width]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mean = xs.iter().sum::<f64>() / width as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / width as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        r.mean[row] = mean;
        r.rstd[row] = rstd;
        let x_hat: Vec<f64> = xs.iter().map(|v| (v - mean) * rstd).collect();
        let g: Vec<f64> = (0..width)
            .map(|c| dy[row * width + c] as f64 * gamma[c] as f64)
            .collect();
        let mean_g = g.iter().sum::<f64>() / width as f64;
        let mean_gx = g.iter().zip(&x_hat).map(|(g, h)| g * h).sum::<f64>() / width as f64;
        for c in 0..width {
            let at = row * width + c;
            r.output[at] = x_hat[c] * gamma[c] as f64 + beta[c] as f64;
            r.grad_input[at] = rstd * (g[c] - mean_g - x_hat[c] * mean_gx);
            r.grad_gamma[c] += dy[at] as f64 * x_hat[c];
            r.grad_beta[c] += dy[at] as f64;
        }
    }
    r
}

#[test]
fn forward_and_backward_match_the_host_in_f32() {
    let client = client();
    let eps = 1e-5;
    for (rows, width) in CASES {
        for with_beta in [true, false] {
            let ctx = format!("rows {rows}, width {width}, beta {with_beta}");
            let len = rows * width;
            // Rows with an offset, so the mean matters.
            let x: Vec<f32> = moderate(len, 3).iter().map(|v| v * 3.0 + 1.5).collect();
            let gamma: Vec<f32> = moderate(width, 5).iter().map(|v| 1.0 + v).collect();
            let beta: Vec<f32> = if with_beta {
                moderate(width, 7)
            } else {
                vec![0.0; width]
            };
            let dy = moderate(len, 11);
            let want = reference(&x, &gamma, &beta, &dy, width, eps);
            let shape = LayerNormShape { rows, width };
            let (x_h, gamma_h, beta_h, dy_h) = (
                upload_f32(&client, &x),
                upload_f32(&client, &gamma),
                upload_f32(&client, &beta),
                upload_f32(&client, &dy),
            );
            let fwd = layer_norm_forward(
                &client,
                &x_h,
                &gamma_h,
                with_beta.then_some(&beta_h),
                shape,
                FloatDtype::F32,
                eps as f32,
            )
            .unwrap();
            let tol = (1e-5, 1e-4);
            assert_close(
                &read_f32(&client, &fwd.output, len),
                &want.output,
                tol.0,
                tol.1,
                &ctx,
            );
            assert_close(
                &read_f32(&client, &fwd.mean, rows),
                &want.mean,
                tol.0,
                tol.1,
                &ctx,
            );
            assert_close(
                &read_f32(&client, &fwd.rstd, rows),
                &want.rstd,
                tol.0,
                tol.1,
                &ctx,
            );
            let grads = layer_norm_backward(
                &client,
                &dy_h,
                &x_h,
                &gamma_h,
                &fwd.mean,
                &fwd.rstd,
                shape,
                FloatDtype::F32,
                with_beta,
            )
            .unwrap();
            assert_close(
                &read_f32(&client, &grads.input, len),
                &want.grad_input,
                1e-4,
                1e-3,
                &ctx,
            );
            assert_close(
                &read_f32(&client, &grads.gamma, width),
                &want.grad_gamma,
                1e-4,
                1e-4,
                &ctx,
            );
            assert_eq!(grads.beta.is_some(), with_beta, "{ctx}");
            if let Some(beta) = grads.beta {
                assert_close(
                    &read_f32(&client, &beta, width),
                    &want.grad_beta,
                    1e-4,
                    1e-4,
                    &ctx,
                );
            }
        }
    }
}

#[test]
fn sixteen_bit_rows_keep_f32_statistics() {
    let client = client();
    if !FloatDtype::F16.is_supported(&client) {
        return;
    }
    let (rows, width) = (64, 256);
    let len = rows * width;
    let to_f16 =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect() };
    // A large offset: statistics in f16 would lose the variance to rounding.
    let x = to_f16(
        &moderate(len, 21)
            .iter()
            .map(|v| v + 40.0)
            .collect::<Vec<_>>(),
    );
    let gamma = to_f16(&vec![1.0; width]);
    let beta = to_f16(&vec![0.0; width]);
    let dy = to_f16(&moderate(len, 23));
    let want = reference(&x, &gamma, &beta, &dy, width, 1e-5);
    let up = |v: &[f32]| {
        upload_u16(
            &client,
            &v.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect::<Vec<_>>(),
        )
    };
    let (x_h, gamma_h, beta_h, dy_h) = (up(&x), up(&gamma), up(&beta), up(&dy));
    let shape = LayerNormShape { rows, width };
    let fwd = layer_norm_forward(
        &client,
        &x_h,
        &gamma_h,
        Some(&beta_h),
        shape,
        FloatDtype::F16,
        1e-5,
    )
    .unwrap();
    let read16 = |h: &cubecl::server::Handle, n: usize| -> Vec<f32> {
        read_u16(&client, h, n)
            .into_iter()
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect()
    };
    assert_close(
        &read16(&fwd.output, len),
        &want.output,
        4e-3,
        4e-3,
        "f16 output",
    );
    assert_close(
        &read_f32(&client, &fwd.mean, rows),
        &want.mean,
        1e-4,
        1e-5,
        "f16 mean",
    );
    let grads = layer_norm_backward(
        &client,
        &dy_h,
        &x_h,
        &gamma_h,
        &fwd.mean,
        &fwd.rstd,
        shape,
        FloatDtype::F16,
        true,
    )
    .unwrap();
    assert_close(
        &read16(&grads.input, len),
        &want.grad_input,
        4e-3,
        4e-3,
        "f16 grad input",
    );
    assert_close(
        &read16(&grads.gamma, width),
        &want.grad_gamma,
        2e-2,
        4e-3,
        "f16 grad gamma",
    );
}

#[test]
fn bad_inputs_are_refused_before_any_launch() {
    let client = client();
    let x = upload_f32(&client, &[0.0; 12]);
    let gamma = upload_f32(&client, &[1.0; 4]);
    let shape = LayerNormShape { rows: 3, width: 4 };
    let err = layer_norm_forward(&client, &x, &gamma, None, shape, FloatDtype::F32, f32::NAN)
        .unwrap_err();
    assert!(matches!(err, KernelError::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("epsilon"), "{err}");
    let wide = LayerNormShape { rows: 3, width: 5 };
    let err =
        layer_norm_forward(&client, &x, &gamma, None, wide, FloatDtype::F32, 1e-5).unwrap_err();
    assert!(matches!(err, KernelError::BufferTooSmall { .. }), "{err}");
    let empty = LayerNormShape { rows: 3, width: 0 };
    let err =
        layer_norm_forward(&client, &x, &gamma, None, empty, FloatDtype::F32, 1e-5).unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");
    let fwd = layer_norm_forward(&client, &x, &gamma, None, shape, FloatDtype::F32, 1e-5).unwrap();
    let short = upload_f32(&client, &[0.0; 2]);
    let err = layer_norm_backward(
        &client,
        &x,
        &x,
        &gamma,
        &short,
        &fwd.rstd,
        shape,
        FloatDtype::F32,
        false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("mean"), "{err}");
}
