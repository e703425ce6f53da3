//! Flash attention (forward, logsumexp, and the three gradients) against a CPU reference in f64
//! written here, and against Burn's written-out attention (matmul, mask, softmax, matmul)
//! differentiated by Burn's autodiff, on wgpu (the latter on wgpu only), and in bf16 on CUDA
//! (`--features cuda`, on a GPU machine; lavapipe has no bf16).
//!
//! Tolerances, per element `|got - want| <= atol + rtol * |want|`:
//! - f32 inputs: atol 2e-5, rtol 1e-3 (f32 arithmetic with a different summation order);
//! - f16 inputs: atol 3e-3, rtol 1e-2 against the f64 reference computed from the same
//!   f16-rounded inputs (the outputs are rounded to f16, ulp 2^-11 relative);
//! - bf16 inputs: atol 2e-2, rtol 3e-2 likewise (ulp 2^-8 relative).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
#[cfg(feature = "wgpu")]
use burn::{
    backend::{Autodiff, Wgpu},
    tensor::{Tensor, TensorData, activation::softmax},
};
use cubecl::server::Handle;
use frugal_kernels::{
    FloatDtype, KernelError,
    attention::{
        AttentionArgs, AttentionBias, AttentionConfig, AttentionSaved, AttentionShape,
        attention_backward, attention_delta, attention_forward, scores_backward, scores_softmax,
    },
};
use half::{bf16, f16};

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A bias in `[batch or 1, heads, seq_q, seq_k]` layout.
struct Bias {
    values: Vec<f32>,
    batch_stride: usize,
    head_stride: usize,
    row_stride: usize,
}

/// What the reference computes: output, logsumexp and the three gradients.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    grad_q: Vec<f64>,
    grad_k: Vec<f64>,
    grad_v: Vec<f64>,
}

/// Attention and its gradients in f64, written out row by row.
#[allow(clippy::too_many_arguments)]
fn reference(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    grad_out: &[f32],
    bias: Option<&Bias>,
    causal: bool,
    scale: f64,
) -> Reference {
    let d = s.head_dim;
    let mut r = Reference {
        out: vec![0.0; s.q_len()],
        lse: vec![0.0; s.rows()],
        grad_q: vec![0.0; s.q_len()],
        grad_k: vec![0.0; s.kv_len()],
        grad_v: vec![0.0; s.kv_len()],
    };
    for bh in 0..s.batch * s.heads {
        let (b, h) = (bh / s.heads, bh % s.heads);
        let qo = bh * s.seq_q * d;
        let ko = bh * s.seq_k * d;
        for i in 0..s.seq_q {
            let mut scores = vec![f64::NEG_INFINITY; s.seq_k];
            for (j, score) in scores.iter_mut().enumerate() {
                if causal && j > i {
                    continue;
                }
                let dot: f64 = (0..d)
                    .map(|x| q[qo + i * d + x] as f64 * k[ko + j * d + x] as f64)
                    .sum();
                let mut value = dot * scale;
                if let Some(bias) = bias {
                    let at = b * bias.batch_stride + h * bias.head_stride + i * bias.row_stride + j;
                    value += bias.values[at] as f64;
                }
                *score = value;
            }
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if max == f64::NEG_INFINITY {
                r.lse[bh * s.seq_q + i] = f64::NEG_INFINITY;
                continue;
            }
            let sum: f64 = scores.iter().map(|x| (x - max).exp()).sum();
            let probs: Vec<f64> = scores.iter().map(|x| (x - max).exp() / sum).collect();
            r.lse[bh * s.seq_q + i] = max + sum.ln();
            for x in 0..d {
                r.out[qo + i * d + x] = (0..s.seq_k)
                    .map(|j| probs[j] * v[ko + j * d + x] as f64)
                    .sum();
            }
            let g = |x: usize| grad_out[qo + i * d + x] as f64;
            let dp: Vec<f64> = (0..s.seq_k)
                .map(|j| (0..d).map(|x| g(x) * v[ko + j * d + x] as f64).sum())
                .collect();
            let expected: f64 = (0..s.seq_k).map(|j| probs[j] * dp[j]).sum();
            for j in 0..s.seq_k {
                let ds = probs[j] * (dp[j] - expected);
                for x in 0..d {
                    r.grad_v[ko + j * d + x] += probs[j] * g(x);
                    r.grad_q[qo + i * d + x] += scale * ds * k[ko + j * d + x] as f64;
                    r.grad_k[ko + j * d + x] += scale * ds * q[qo + i * d + x] as f64;
                }
            }
        }
    }
    r
}

fn upload(client: &cubecl::client::ComputeClient<R>, data: &[f32], dtype: FloatDtype) -> Handle {
    match dtype {
        FloatDtype::F32 => upload_f32(client, data),
        FloatDtype::F16 => {
            let bits: Vec<u16> = data.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
            upload_u16(client, &bits)
        }
        FloatDtype::BF16 => {
            let bits: Vec<u16> = data.iter().map(|x| bf16::from_f32(*x).to_bits()).collect();
            upload_u16(client, &bits)
        }
    }
}

fn download(
    client: &cubecl::client::ComputeClient<R>,
    h: &Handle,
    len: usize,
    dtype: FloatDtype,
) -> Vec<f32> {
    match dtype {
        FloatDtype::F32 => read_f32(client, h, len),
        FloatDtype::F16 => read_u16(client, h, len)
            .into_iter()
            .map(|b| f16::from_bits(b).to_f32())
            .collect(),
        FloatDtype::BF16 => read_u16(client, h, len)
            .into_iter()
            .map(|b| bf16::from_bits(b).to_f32())
            .collect(),
    }
}

/// Rounds values through the dtype, as the device will see them.
fn rounded(data: Vec<f32>, dtype: FloatDtype) -> Vec<f32> {
    match dtype {
        FloatDtype::F16 => data.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
        FloatDtype::BF16 => data.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
        FloatDtype::F32 => data,
    }
}

/// Runs forward and backward on the device and checks all five results against the reference.
fn check(shape: AttentionShape, causal: bool, bias: Option<Bias>, dtype: FloatDtype, seed: u64) {
    let client = client();
    let q = rounded(values(shape.q_len(), seed), dtype);
    let k = rounded(values(shape.kv_len(), seed + 1), dtype);
    let v = rounded(values(shape.kv_len(), seed + 2), dtype);
    let grad_out = rounded(values(shape.q_len(), seed + 3), dtype);
    let config = AttentionConfig {
        causal,
        scale: None,
    };
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let bias = bias.map(|b| Bias {
        values: rounded(b.values, dtype),
        ..b
    });
    let want = reference(&shape, &q, &k, &v, &grad_out, bias.as_ref(), causal, scale);

    let (qh, kh, vh) = (
        upload(&client, &q, dtype),
        upload(&client, &k, dtype),
        upload(&client, &v, dtype),
    );
    let bias_handle = bias.as_ref().map(|b| upload(&client, &b.values, dtype));
    let bias_arg = bias.as_ref().map(|b| AttentionBias {
        handle: bias_handle.as_ref().unwrap(),
        batch_stride: b.batch_stride,
        head_stride: b.head_stride,
        row_stride: b.row_stride,
    });
    let args = AttentionArgs {
        q: &qh,
        k: &kh,
        v: &vh,
        bias: bias_arg,
        shape,
        dtype,
        config,
    };
    let fwd = attention_forward(&client, args).unwrap();
    let goh = upload(&client, &grad_out, dtype);
    let saved = AttentionSaved {
        out: &fwd.out,
        lse: &fwd.lse,
        grad_out: &goh,
    };
    let grads = attention_backward(&client, args, saved).unwrap();

    let (atol, rtol) = match dtype {
        FloatDtype::F32 => (2e-5, 1e-3),
        FloatDtype::F16 => (3e-3, 1e-2),
        FloatDtype::BF16 => (2e-2, 3e-2),
    };
    let ctx = format!("{shape:?} causal {causal} bias {} {dtype}", bias.is_some());
    let out = download(&client, &fwd.out, shape.q_len(), dtype);
    assert_close(&out, &want.out, atol, rtol, &format!("out, {ctx}"));
    let lse = read_f32(&client, &fwd.lse, shape.rows());
    let want_lse: Vec<f64> = want
        .lse
        .iter()
        .map(|x| if x.is_finite() { *x } else { -1.0e38 })
        .collect();
    assert_close(&lse, &want_lse, 1e-4, 1e-5, &format!("lse, {ctx}"));
    for (name, handle, len, want) in [
        ("grad_q", &grads.grad_q, shape.q_len(), &want.grad_q),
        ("grad_k", &grads.grad_k, shape.kv_len(), &want.grad_k),
        ("grad_v", &grads.grad_v, shape.kv_len(), &want.grad_v),
    ] {
        let got = download(&client, handle, len, dtype);
        assert_close(&got, want, atol, rtol, &format!("{name}, {ctx}"));
    }
}

fn shape(
    batch: usize,
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
) -> AttentionShape {
    AttentionShape {
        batch,
        heads,
        seq_q,
        seq_k,
        head_dim,
    }
}

#[test]
fn f32_unmasked_odd_sequence() {
    check(shape(2, 3, 17, 17, 32), false, None, FloatDtype::F32, 1);
}

#[test]
fn f32_causal_seq_100_head_dim_64() {
    check(shape(1, 2, 100, 100, 64), true, None, FloatDtype::F32, 2);
}

#[test]
fn f32_one_query_row_and_a_short_causal_sequence_head_dim_80() {
    // One query row against five keys; causal with three rows (the first row sees one key, so
    // its gradients are zero: a single key's softmax is constant).
    check(shape(2, 1, 1, 5, 80), false, None, FloatDtype::F32, 3);
    check(shape(2, 1, 3, 3, 80), true, None, FloatDtype::F32, 4);
}

#[test]
fn f32_one_head_head_dim_128_causal() {
    check(shape(1, 1, 33, 33, 128), true, None, FloatDtype::F32, 5);
}

#[test]
fn f32_more_keys_than_queries() {
    check(shape(1, 2, 5, 70, 32), false, None, FloatDtype::F32, 6);
    check(shape(1, 2, 70, 5, 32), true, None, FloatDtype::F32, 7);
}

/// A `[heads, seq_q, seq_k]` bias broadcast over the batch, with every `every`-th pair and all
/// of query row `masked_row` set to `-inf`.
fn masked_bias(s: &AttentionShape, seed: u64, every: usize, masked_row: usize) -> Bias {
    let mut values = values(s.heads * s.seq_q * s.seq_k, seed);
    for (i, b) in values.iter_mut().enumerate() {
        let row = (i / s.seq_k) % s.seq_q;
        if i % every == 0 || row == masked_row {
            *b = f32::NEG_INFINITY;
        }
    }
    Bias {
        values,
        batch_stride: 0,
        head_stride: s.seq_q * s.seq_k,
        row_stride: s.seq_k,
    }
}

#[test]
fn f32_bias_broadcast_over_batch_with_masked_entries() {
    let s = shape(2, 2, 19, 23, 32);
    // Every seventh pair and all of query row 3 (which then outputs 0) masked.
    let bias = masked_bias(&s, 40, 7, 3);
    check(s, false, Some(bias), FloatDtype::F32, 8);
}

#[test]
fn f16_causal_and_unmasked() {
    check(shape(1, 2, 37, 37, 64), true, None, FloatDtype::F16, 9);
    check(shape(2, 1, 17, 17, 32), false, None, FloatDtype::F16, 10);
}

#[cfg(feature = "cuda")]
#[test]
fn bf16_causal_and_unmasked_on_cuda() {
    check(shape(2, 3, 77, 77, 64), true, None, FloatDtype::BF16, 11);
    check(shape(1, 2, 33, 65, 128), false, None, FloatDtype::BF16, 12);
}

/// `out[b] = a[b] · op(c[b])` for row-major `a` (`m × k` per batch) and `c` (`k × n`, or
/// `n × k` used transposed when `transpose_c`), in f64: the products the score-matrix path
/// leaves to its caller's matrix library.
fn batched_product(
    a: &[f32],
    c: &[f32],
    batch: usize,
    [m, k, n]: [usize; 3],
    transpose_a: bool,
    transpose_c: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(b * m + i) * n + j] = (0..k)
                    .map(|x| {
                        let av = if transpose_a {
                            a[(b * k + x) * m + i]
                        } else {
                            a[(b * m + i) * k + x]
                        };
                        let cv = if transpose_c {
                            c[(b * n + j) * k + x]
                        } else {
                            c[(b * k + x) * n + j]
                        };
                        av as f64 * cv as f64
                    })
                    .sum();
            }
        }
    }
    out
}

fn round_f64(data: &[f64], dtype: FloatDtype) -> Vec<f32> {
    rounded(data.iter().map(|x| *x as f32).collect(), dtype)
}

/// The score-matrix path (`scores_softmax`, `attention_delta`, `scores_backward`) with its
/// products done here in f64 and rounded to the dtype, as a matrix library would return them:
/// output, logsumexp and the three gradients against the f64 reference.
fn check_scores_path(
    shape: AttentionShape,
    causal: bool,
    bias: Option<Bias>,
    dtype: FloatDtype,
    seed: u64,
) {
    let client = client();
    let s = shape;
    let (bh, sq, sk, d) = (s.batch * s.heads, s.seq_q, s.seq_k, s.head_dim);
    let q = rounded(values(s.q_len(), seed), dtype);
    let k = rounded(values(s.kv_len(), seed + 1), dtype);
    let v = rounded(values(s.kv_len(), seed + 2), dtype);
    let grad_out = rounded(values(s.q_len(), seed + 3), dtype);
    let config = AttentionConfig {
        causal,
        scale: None,
    };
    let bias = bias.map(|b| Bias {
        values: rounded(b.values, dtype),
        ..b
    });
    let scale = 1.0 / (d as f64).sqrt();
    let want = reference(&s, &q, &k, &v, &grad_out, bias.as_ref(), causal, scale);
    let bias_handle = bias.as_ref().map(|b| upload(&client, &b.values, dtype));
    let bias_arg = bias.as_ref().map(|b| AttentionBias {
        handle: bias_handle.as_ref().unwrap(),
        batch_stride: b.batch_stride,
        head_stride: b.head_stride,
        row_stride: b.row_stride,
    });

    let scores = round_f64(
        &batched_product(&q, &k, bh, [sq, d, sk], false, true),
        dtype,
    );
    let scores_h = upload(&client, &scores, dtype);
    let fwd = scores_softmax(&client, &scores_h, bias_arg, s, dtype, config).unwrap();
    let probs = download(&client, &fwd.probs, bh * sq * sk, dtype);
    let out = round_f64(
        &batched_product(&probs, &v, bh, [sq, sk, d], false, false),
        dtype,
    );

    let (atol, rtol) = match dtype {
        FloatDtype::F32 => (2e-5, 1e-3),
        FloatDtype::F16 => (3e-3, 1e-2),
        FloatDtype::BF16 => (2e-2, 3e-2),
    };
    let ctx = format!(
        "scores path, {s:?} causal {causal} bias {} {dtype}",
        bias.is_some()
    );
    assert_close(&out, &want.out, atol, rtol, &format!("out, {ctx}"));
    let lse = read_f32(&client, &fwd.lse, s.rows());
    let want_lse: Vec<f64> = want
        .lse
        .iter()
        .map(|x| if x.is_finite() { *x } else { -1.0e38 })
        .collect();
    let lse_atol = if dtype == FloatDtype::F32 { 1e-4 } else { atol };
    assert_close(&lse, &want_lse, lse_atol, 1e-5, &format!("lse, {ctx}"));

    let out_h = upload(&client, &out, dtype);
    let go_h = upload(&client, &grad_out, dtype);
    let delta = attention_delta(&client, &out_h, &go_h, s, dtype).unwrap();
    let grad_probs = round_f64(
        &batched_product(&grad_out, &v, bh, [sq, d, sk], false, true),
        dtype,
    );
    let grad_probs_h = upload(&client, &grad_probs, dtype);
    let back = scores_backward(
        &client,
        &scores_h,
        &grad_probs_h,
        bias_arg,
        &fwd.lse,
        &delta,
        s,
        dtype,
        config,
    )
    .unwrap();
    let probs_again = download(&client, &back.probs, bh * sq * sk, dtype);
    let want_probs: Vec<f64> = probs.iter().map(|x| *x as f64).collect();
    assert_close(
        &probs_again,
        &want_probs,
        1e-6,
        1e-2,
        &format!("probs, {ctx}"),
    );
    let grad_scores = download(&client, &back.grad_scores, bh * sq * sk, dtype);
    let grad_q = batched_product(&grad_scores, &k, bh, [sq, sk, d], false, false);
    let grad_k = batched_product(&grad_scores, &q, bh, [sk, sq, d], true, false);
    let grad_v = batched_product(&probs_again, &grad_out, bh, [sk, sq, d], true, false);
    for (name, got, want) in [
        ("grad_q", grad_q, &want.grad_q),
        ("grad_k", grad_k, &want.grad_k),
        ("grad_v", grad_v, &want.grad_v),
    ] {
        assert_close(
            &round_f64(&got, dtype),
            want,
            atol,
            rtol,
            &format!("{name}, {ctx}"),
        );
    }
}

#[test]
fn scores_path_f32_causal_odd_sizes_and_unmasked() {
    check_scores_path(shape(2, 3, 33, 33, 32), true, None, FloatDtype::F32, 30);
    check_scores_path(shape(1, 2, 17, 70, 64), false, None, FloatDtype::F32, 31);
    // Rows of 64 keys: the kernels read and write whole vectors of keys.
    check_scores_path(shape(2, 2, 64, 64, 32), true, None, FloatDtype::F32, 37);
}

#[test]
fn scores_path_f32_bias_with_masked_rows_and_one_row() {
    let s = shape(2, 2, 19, 23, 80);
    let bias = masked_bias(&s, 41, 5, 2);
    check_scores_path(s, false, Some(bias), FloatDtype::F32, 32);
    check_scores_path(shape(3, 1, 1, 9, 32), false, None, FloatDtype::F32, 33);
}

#[test]
fn scores_path_f16_causal() {
    check_scores_path(shape(1, 2, 37, 37, 64), true, None, FloatDtype::F16, 34);
    check_scores_path(shape(1, 2, 48, 48, 64), true, None, FloatDtype::F16, 38);
}

#[cfg(feature = "cuda")]
#[test]
fn scores_path_bf16_causal_and_unmasked_on_cuda() {
    check_scores_path(shape(2, 3, 77, 77, 64), true, None, FloatDtype::BF16, 35);
    check_scores_path(shape(1, 2, 33, 65, 128), false, None, FloatDtype::BF16, 36);
}

/// The written-out attention on Burn's wgpu backend, differentiated by Burn's autodiff:
/// output and the gradients of q, k, v for the loss `sum(out * grad_out)`.
#[cfg(feature = "wgpu")]
fn burn_written_out(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    grad_out: &[f32],
    causal: bool,
) -> [Vec<f32>; 4] {
    type B = Autodiff<Wgpu>;
    let device = Default::default();
    let q_shape = [s.batch, s.heads, s.seq_q, s.head_dim];
    let kv_shape = [s.batch, s.heads, s.seq_k, s.head_dim];
    let t = |data: &[f32], shape: [usize; 4]| {
        Tensor::<B, 4>::from_data(TensorData::new(data.to_vec(), shape), &device).require_grad()
    };
    let (qt, kt, vt) = (t(q, q_shape), t(k, kv_shape), t(v, kv_shape));
    let scores = qt
        .clone()
        .matmul(kt.clone().swap_dims(2, 3))
        .mul_scalar(1.0 / (s.head_dim as f32).sqrt());
    let scores = if causal {
        let mask = Tensor::<B, 2, burn::tensor::Bool>::tril_mask([s.seq_q, s.seq_k], 0, &device)
            .unsqueeze::<4>();
        scores.mask_fill(mask, f32::NEG_INFINITY)
    } else {
        scores
    };
    let out = softmax(scores, 3).matmul(vt.clone());
    let go = Tensor::<B, 4>::from_data(TensorData::new(grad_out.to_vec(), q_shape), &device);
    let grads = (out.clone() * go).sum().backward();
    let read = |t: Tensor<Wgpu, 4>| t.into_data().to_vec::<f32>().unwrap();
    [
        read(out.inner()),
        read(qt.grad(&grads).unwrap()),
        read(kt.grad(&grads).unwrap()),
        read(vt.grad(&grads).unwrap()),
    ]
}

#[cfg(feature = "wgpu")]
#[test]
fn matches_burns_written_out_attention() {
    let client = client();
    for (s, causal) in [
        (shape(2, 2, 17, 17, 32), true),
        (shape(1, 3, 40, 40, 64), false),
    ] {
        let q = values(s.q_len(), 20);
        let k = values(s.kv_len(), 21);
        let v = values(s.kv_len(), 22);
        let grad_out = values(s.q_len(), 23);
        let burn = burn_written_out(&s, &q, &k, &v, &grad_out, causal);
        let config = AttentionConfig {
            causal,
            scale: None,
        };
        let dtype = FloatDtype::F32;
        let (qh, kh, vh) = (
            upload_f32(&client, &q),
            upload_f32(&client, &k),
            upload_f32(&client, &v),
        );
        let args = AttentionArgs {
            q: &qh,
            k: &kh,
            v: &vh,
            bias: None,
            shape: s,
            dtype,
            config,
        };
        let fwd = attention_forward(&client, args).unwrap();
        let goh = upload_f32(&client, &grad_out);
        let saved = AttentionSaved {
            out: &fwd.out,
            lse: &fwd.lse,
            grad_out: &goh,
        };
        let grads = attention_backward(&client, args, saved).unwrap();
        let ours = [
            read_f32(&client, &fwd.out, s.q_len()),
            read_f32(&client, &grads.grad_q, s.q_len()),
            read_f32(&client, &grads.grad_k, s.kv_len()),
            read_f32(&client, &grads.grad_v, s.kv_len()),
        ];
        for (name, (ours, theirs)) in ["out", "grad_q", "grad_k", "grad_v"]
            .iter()
            .zip(ours.iter().zip(&burn))
        {
            let want: Vec<f64> = theirs.iter().map(|x| *x as f64).collect();
            assert_close(ours, &want, 5e-5, 2e-3, &format!("{name} vs Burn, {s:?}"));
        }
    }
}

#[test]
fn invalid_arguments_are_errors_not_panics() {
    let client = client();
    let config = AttentionConfig::default();
    let s = shape(1, 1, 4, 4, 32);
    let buf = upload_f32(&client, &values(s.q_len(), 1));
    /// An f32 call on `q` with `kv` for keys and values.
    fn args<'a>(
        s: AttentionShape,
        q: &'a Handle,
        kv: &'a Handle,
        config: AttentionConfig,
    ) -> AttentionArgs<'a> {
        AttentionArgs {
            q,
            k: kv,
            v: kv,
            bias: None,
            shape: s,
            dtype: FloatDtype::F32,
            config,
        }
    }
    let run = |s: AttentionShape, q: &Handle, config: AttentionConfig| {
        attention_forward(&client, args(s, q, &buf, config))
    };
    let err = run(shape(1, 1, 4, 4, 129), &buf, config).unwrap_err();
    assert!(
        matches!(&err, KernelError::InvalidArgument { what, .. } if what == "head_dim"),
        "{err}"
    );
    assert!(err.to_string().contains("1..=128"), "{err}");
    let err = run(shape(0, 1, 4, 4, 32), &buf, config).unwrap_err();
    assert!(
        matches!(&err, KernelError::InvalidArgument { what, .. } if what == "batch"),
        "{err}"
    );
    let small = upload_f32(&client, &[0.0; 8]);
    let err = run(s, &small, config).unwrap_err();
    assert!(
        matches!(&err, KernelError::BufferTooSmall { what, .. } if what == "q"),
        "{err}"
    );
    let bad_scale = AttentionConfig {
        causal: false,
        scale: Some(f32::NAN),
    };
    let err = run(s, &buf, bad_scale).unwrap_err();
    assert!(
        matches!(&err, KernelError::InvalidArgument { what, .. } if what == "scale"),
        "{err}"
    );
    let fwd = run(s, &buf, config).unwrap();
    // Four query rows need four f32 logsumexp values; two are given.
    let short_lse = upload_f32(&client, &[0.0; 2]);
    let saved = AttentionSaved {
        out: &fwd.out,
        lse: &short_lse,
        grad_out: &buf,
    };
    let err = attention_backward(&client, args(s, &buf, &buf, config), saved).unwrap_err();
    assert!(
        matches!(&err, KernelError::BufferTooSmall { what, .. } if what == "lse"),
        "{err}"
    );
}
