//! The f32 AdamW update (wgpu or CUDA): against a scalar host reference of burn-optim's
//! arithmetic over several steps (the first step without old moments, every decay kind,
//! lengths that take vectors and lengths that do not), bit for bit on wgpu and within a stated tolerance on CUDA,
//! and its input checks.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use frugal_kernels::{AdamWBuffers, AdamWScalars, KernelError, WeightDecay, adamw_update};

/// One step on the host, in burn-optim's order of operations.
fn reference(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    s: &AdamWScalars,
    first: bool,
) {
    for e in 0..param.len() {
        let g = grad[e];
        let (m0, v0) = (m[e], v[e]);
        m[e] = if first {
            g * s.one_minus_beta_1
        } else {
            m0 * s.beta_1 + g * s.one_minus_beta_1
        };
        v[e] = if first {
            (g * g) * s.one_minus_beta_2
        } else {
            v0 * s.beta_2 + (g * g) * s.one_minus_beta_2
        };
        let delta =
            (m[e] / s.bias_correction_1) / ((v[e] / s.bias_correction_2).sqrt() + s.epsilon);
        let p = param[e];
        let decayed = match s.decay {
            WeightDecay::None => p,
            WeightDecay::Plain { factor } => p * factor,
            WeightDecay::Cautious { rate } if (p >= 0.0) == (m[e] >= 0.0) => p - p * rate,
            WeightDecay::Cautious { .. } => p,
        };
        param[e] = decayed - delta * s.lr;
    }
}

#[test]
fn steps_match_the_host_reference() {
    let client = client();
    for (len, decay) in [
        // Lengths that take vectors of four (or more) and lengths that take one value per unit.
        (4_992, WeightDecay::Plain { factor: 0.99999 }),
        (4_096, WeightDecay::None),
        (1_000, WeightDecay::Cautious { rate: 1e-2 }),
        (37, WeightDecay::None),
        (70_001, WeightDecay::Plain { factor: 0.9999 }),
    ] {
        let mut param: Vec<f32> = spread_f32(len, 5)
            .into_iter()
            .map(|x| {
                if x.is_finite() {
                    x.clamp(-4.0, 4.0)
                } else {
                    0.5
                }
            })
            .collect();
        // The first step must not read the moments' buffers: fill them with garbage.
        let (mut m, mut v) = (vec![f32::NAN; len], vec![f32::NAN; len]);
        let param_h = upload_f32(&client, &param);
        let m_h = upload_f32(&client, &m);
        let v_h = upload_f32(&client, &v);
        for step in 1..=3 {
            let grad = grads_f32(len, step as u64 + 11);
            let grad_h = upload_f32(&client, &grad);
            let s = adamw_scalars(step, decay);
            reference(&mut param, &grad, &mut m, &mut v, &s, step == 1);
            let buffers = AdamWBuffers {
                param: &param_h,
                grad: &grad_h,
                moment_1: &m_h,
                moment_2: &v_h,
                len,
            };
            adamw_update(&client, buffers, &s, step == 1).unwrap();
        }
        let case = format!("len {len}, {decay:?}");
        let got = [
            (read_f32(&client, &param_h, len), &param, "param"),
            (read_f32(&client, &m_h, len), &m, "moment_1"),
            (read_f32(&client, &v_h, len), &v, "moment_2"),
        ];
        for (got, want, what) in got {
            let ctx = format!("{case}: {what}");
            if cfg!(feature = "wgpu") {
                assert_bits32(&got, want, &ctx);
            } else {
                // NVRTC contracts a multiply and an add into one fused multiply-add (CubeCL
                // compiles without `--fmad=false`), rounding once where the host rounds twice.
                // A moment is a sum of terms as large as the largest values in its buffer
                // (gradients up to ±1,500), so one rounding apart means an ulp of those, even
                // where the terms cancel to a small result: the absolute tolerance follows the
                // buffer's largest value.
                let wide: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
                let largest = wide.iter().fold(1.0f64, |a, w| a.max(w.abs()));
                assert_close(&got, &wide, 1e-6 * largest, 1e-5, &ctx);
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused_before_any_launch() {
    let client = client();
    let len = 1000;
    let full = upload_f32(&client, &vec![0.0; len]);
    let short = upload_f32(&client, &vec![0.0; len - 1]);
    let buffers = AdamWBuffers {
        param: &full,
        grad: &full,
        moment_1: &full,
        moment_2: &full,
        len,
    };
    let s = adamw_scalars(1, WeightDecay::None);
    for (what, buffers) in [
        (
            "param",
            AdamWBuffers {
                param: &short,
                ..buffers
            },
        ),
        (
            "grad",
            AdamWBuffers {
                grad: &short,
                ..buffers
            },
        ),
        (
            "moment_1",
            AdamWBuffers {
                moment_1: &short,
                ..buffers
            },
        ),
        (
            "moment_2",
            AdamWBuffers {
                moment_2: &short,
                ..buffers
            },
        ),
    ] {
        let err = adamw_update(&client, buffers, &s, false).unwrap_err();
        assert!(
            matches!(&err, KernelError::BufferTooSmall { what: w, .. } if w == what),
            "{what}: {err}"
        );
    }
}
