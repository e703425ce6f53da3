//! The 8-bit AdamW update (wgpu or CUDA): against a scalar host reference over several steps
//! (block sizes, a partial last block, a zero block, both decay kinds), bit for bit on wgpu and
//! within a stated tolerance on CUDA, and its input checks.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::*;
use cubecl::client::ComputeClient;
use cubecl::server::Handle;
use frugal_kernels::{
    AdamW8bitBuffers, AdamWScalars, KernelError, MAP_LEN, TABLES_LEN, WeightDecay,
    adamw8bit_layout, adamw8bit_update,
};

/// Linear test maps (the kernel takes any sorted map): signed `(k - 127) / 128`, unsigned
/// `k / 255`, and their midpoint bounds, in the kernel's table layout.
fn tables() -> Vec<f32> {
    let signed: Vec<f32> = (0..MAP_LEN).map(|k| (k as f32 - 127.0) / 128.0).collect();
    let unsigned: Vec<f32> = (0..MAP_LEN).map(|k| k as f32 / 255.0).collect();
    let bounds = |map: &[f32]| {
        let mut b = vec![f32::NEG_INFINITY; MAP_LEN];
        for k in 1..MAP_LEN {
            b[k] = (map[k - 1] + map[k]) / 2.0;
        }
        b
    };
    [
        signed.clone(),
        bounds(&signed),
        unsigned.clone(),
        bounds(&unsigned),
    ]
    .concat()
}

fn quantise(x: f32, bounds: &[f32]) -> u8 {
    let mut code = 0;
    for bit in 0..8 {
        let candidate = code + (128 >> bit);
        if bounds[candidate] <= x {
            code = candidate;
        }
    }
    code as u8
}

/// The step on the host: codes are one byte per element here, `2 * padded` of them.
fn reference(
    param: &mut [f32],
    grad: &[f32],
    codes: &mut [u8],
    absmax: &mut [f32],
    block_size: usize,
    s: &AdamWScalars,
    t: &[f32],
) {
    let len = param.len();
    let (blocks, _) = adamw8bit_layout(len, block_size);
    let padded = blocks * block_size;
    let (map_m, bounds_m) = (&t[..MAP_LEN], &t[MAP_LEN..2 * MAP_LEN]);
    let (map_v, bounds_v) = (&t[2 * MAP_LEN..3 * MAP_LEN], &t[3 * MAP_LEN..]);
    for b in 0..blocks {
        let range = b * block_size..(b + 1) * block_size;
        let moments: Vec<(f32, f32)> = range
            .clone()
            .map(|e| {
                let g = if e < len { grad[e] } else { 0.0 };
                let m0 = map_m[codes[e] as usize] * absmax[b];
                let v0 = map_v[codes[padded + e] as usize] * absmax[blocks + b];
                (
                    m0 * s.beta_1 + g * s.one_minus_beta_1,
                    v0 * s.beta_2 + (g * g) * s.one_minus_beta_2,
                )
            })
            .collect();
        let am = moments.iter().fold(0f32, |a, (m, _)| a.max(m.abs()));
        let av = moments.iter().fold(0f32, |a, (_, v)| a.max(*v));
        let (sm, sv) = (
            if am == 0.0 { 1.0 } else { am },
            if av == 0.0 { 1.0 } else { av },
        );
        for (e, (m, v)) in range.zip(moments) {
            if e < len {
                let delta =
                    (m / s.bias_correction_1) / ((v / s.bias_correction_2).sqrt() + s.epsilon);
                let p = param[e];
                let decayed = match s.decay {
                    WeightDecay::None => p,
                    WeightDecay::Plain { factor } => p * factor,
                    WeightDecay::Cautious { rate } if (p >= 0.0) == (m >= 0.0) => p - p * rate,
                    WeightDecay::Cautious { .. } => p,
                };
                param[e] = decayed - delta * s.lr;
            }
            codes[e] = quantise(m / sm, bounds_m);
            codes[padded + e] = quantise(v / sv, bounds_v);
        }
        absmax[b] = am;
        absmax[blocks + b] = av;
    }
}

fn upload_u32(client: &ComputeClient<R>, words: &[u32]) -> Handle {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    client.create_from_slice(&bytes)
}

fn read_bytes(client: &ComputeClient<R>, handle: &Handle, len: usize) -> Vec<u8> {
    client.read_one(handle.clone()).expect("read")[..len].to_vec()
}

#[test]
fn steps_match_the_host_reference() {
    let client = client();
    let t = tables();
    let table = upload_f32(&client, &t);
    for (len, block_size, decay) in [
        (4_991, 256, WeightDecay::Plain { factor: 0.99999 }),
        (1_000, 64, WeightDecay::Cautious { rate: 1e-2 }),
        (37, 4, WeightDecay::None),
        (70_000, 2048, WeightDecay::Plain { factor: 0.9999 }),
    ] {
        let (blocks, words) = adamw8bit_layout(len, block_size);
        let padded = blocks * block_size;
        let mut param: Vec<f32> = spread_f32(len, 3)
            .into_iter()
            .map(|x| {
                if x.is_finite() {
                    x.clamp(-4.0, 4.0)
                } else {
                    0.5
                }
            })
            .collect();
        let mut codes = vec![127u8; padded];
        codes.extend(vec![0u8; padded]);
        let mut absmax = vec![0f32; 2 * blocks];
        let param_h = upload_f32(&client, &param);
        let words_host: Vec<u32> = codes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(words_host.len(), 2 * words);
        let codes_h = upload_u32(&client, &words_host);
        let absmax_h = upload_f32(&client, &absmax);
        for step in 1..=3 {
            let mut grad: Vec<f32> = grads_f32(len, step as u64 + 7);
            grad[..len.min(block_size)].fill(0.0);
            let grad_h = upload_f32(&client, &grad);
            let s = adamw_scalars(step, decay);
            reference(
                &mut param,
                &grad,
                &mut codes,
                &mut absmax,
                block_size,
                &s,
                &t,
            );
            let buffers = AdamW8bitBuffers {
                param: &param_h,
                grad: &grad_h,
                codes: &codes_h,
                absmax: &absmax_h,
                len,
            };
            adamw8bit_update(&client, buffers, &table, block_size, &s).unwrap();
        }
        let case = format!("len {len}, block {block_size}, {decay:?}");
        let got_param = read_f32(&client, &param_h, len);
        let got_codes = read_bytes(&client, &codes_h, 2 * padded);
        let got_absmax = read_f32(&client, &absmax_h, 2 * blocks);
        if cfg!(feature = "wgpu") {
            assert_bits32(&got_param, &param, &case);
            assert_eq!(got_codes, codes, "{case}: codes");
            assert_bits32(&got_absmax, &absmax, &case);
        } else {
            // NVRTC contracts a multiply and an add into one fused multiply-add (CubeCL
            // compiles without `--fmad=false`), rounding once where the host rounds twice; a
            // moment one rounding apart may then fall on the other side of a code's bound.
            let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            assert_close(
                &got_param,
                &wide(&param),
                1e-5,
                1e-5,
                &format!("{case}: param"),
            );
            assert_close(
                &got_absmax,
                &wide(&absmax),
                1e-5,
                1e-5,
                &format!("{case}: absmax"),
            );
            let differing = got_codes.iter().zip(&codes).filter(|(a, b)| a != b);
            let far = differing
                .clone()
                .filter(|(a, b)| a.abs_diff(**b) > 1)
                .count();
            assert_eq!(far, 0, "{case}: codes more than one step apart");
            assert!(
                differing.count() * 1000 <= codes.len(),
                "{case}: more than 0.1% of the codes differ"
            );
        }
        assert_eq!(got_absmax[0], 0.0, "{case}: the zero block stays zero");
    }
}

#[test]
fn bad_inputs_are_refused_before_any_launch() {
    let client = client();
    let table = upload_f32(&client, &tables());
    let len = 1000;
    let (blocks, words) = adamw8bit_layout(len, 256);
    let param = upload_f32(&client, &vec![0.0; len]);
    let grad = upload_f32(&client, &vec![0.0; len]);
    let codes = upload_u32(&client, &vec![0; 2 * words]);
    let absmax = upload_f32(&client, &vec![0.0; 2 * blocks]);
    let buffers = AdamW8bitBuffers {
        param: &param,
        grad: &grad,
        codes: &codes,
        absmax: &absmax,
        len,
    };
    let s = adamw_scalars(1, WeightDecay::None);
    for bad in [0, 6, 1 << 17] {
        let err = adamw8bit_update(&client, buffers, &table, bad, &s).unwrap_err();
        assert!(
            matches!(err, KernelError::InvalidBlockSize { block_size, .. } if block_size == bad)
        );
        assert!(err.to_string().contains("multiple of 4"), "{err}");
    }
    let short = upload_u32(&client, &vec![0; words]);
    let err = adamw8bit_update(
        &client,
        AdamW8bitBuffers {
            codes: &short,
            ..buffers
        },
        &table,
        256,
        &s,
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("codes:"), "{err}");
    let small_table = upload_f32(&client, &vec![0.0; TABLES_LEN - 1]);
    let err = adamw8bit_update(&client, buffers, &small_table, 256, &s).unwrap_err();
    assert!(err.to_string().starts_with("tables:"), "{err}");
    assert!(adamw8bit_update(&client, buffers, &table, 256, &s).is_ok());
}
