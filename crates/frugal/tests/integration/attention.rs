//! `frugal::nn::attention` on NdArray: under `Autodiff<Frugal<NdArray>>` (the portable path,
//! one autodiff node) the output and the gradients of q, k and v match the written-out
//! attention differentiated by Burn's autodiff; the forward keeps no `seq × seq` tensor; it
//! works inside checkpoint scopes and under a budget; on other backends it is the written-out
//! attention itself.
//!
//! Tolerance (f32): `|fused - written| <= 1e-5 + 1e-4 * |written|` per element.

use burn::backend::{Autodiff, NdArray, ndarray::NdArrayDevice};
use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, Tensor};
use frugal::nn::{
    AttentionOptions, MhaInput, MultiHeadAttentionConfig, attention, attention_packed,
    attention_written_out,
};
use frugal::{Frugal, memory};

use crate::serial;

type B = Autodiff<Frugal<NdArray>>;

fn input<Bk: Backend>(shape: [usize; 4], seed: u64, device: &Bk::Device) -> Tensor<Bk, 4> {
    Bk::seed(device, seed);
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

fn assert_close<Bk: Backend>(got: Tensor<Bk, 4>, want: Tensor<Bk, 4>, ctx: &str) {
    let got = got.into_data().to_vec::<f32>().unwrap();
    let want = want.into_data().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
            "{ctx}: [{i}] fused {g}, written out {w}"
        );
    }
    assert!(want.iter().any(|w| w.abs() > 1e-3), "{ctx}: all but zero");
}

/// The output and the gradients of q, k, v for the loss `sum(out * g)`.
fn run<Bk: AutodiffBackend>(
    q: &Tensor<Bk, 4>,
    k: &Tensor<Bk, 4>,
    v: &Tensor<Bk, 4>,
    g: &Tensor<Bk, 4>,
    options: AttentionOptions<Bk>,
    fused: bool,
) -> [Tensor<Bk::InnerBackend, 4>; 4] {
    let (q, k, v) = (
        q.clone().require_grad(),
        k.clone().require_grad(),
        v.clone().require_grad(),
    );
    let out = if fused {
        attention(q.clone(), k.clone(), v.clone(), options)
    } else {
        attention_written_out(q.clone(), k.clone(), v.clone(), options)
    };
    let grads = (out.clone() * g.clone()).sum().backward();
    [
        out.inner(),
        q.grad(&grads).unwrap(),
        k.grad(&grads).unwrap(),
        v.grad(&grads).unwrap(),
    ]
}

fn compare(q_shape: [usize; 4], seq_k: usize, options: impl Fn() -> AttentionOptions<B>) {
    let device = NdArrayDevice::default();
    let [b, h, _, d] = q_shape;
    let q = input::<B>(q_shape, 1, &device);
    let k = input::<B>([b, h, seq_k, d], 2, &device);
    let v = input::<B>([b, h, seq_k, d], 3, &device);
    let g = input::<B>(q_shape, 4, &device);
    let fused = run(&q, &k, &v, &g, options(), true);
    let written = run(&q, &k, &v, &g, options(), false);
    for (name, (f, w)) in ["out", "grad q", "grad k", "grad v"]
        .iter()
        .zip(fused.into_iter().zip(written))
    {
        assert_close(f, w, &format!("{name}, q {q_shape:?}, seq_k {seq_k}"));
    }
}

fn attention_calls() -> u64 {
    frugal::ops::call_counts()
        .into_iter()
        .find(|(family, name, _)| *family == "ModuleOps" && *name == "attention")
        .map(|(_, _, count)| count)
        .expect("attention is a forwarded method")
}

#[test]
fn fused_matches_written_out_unmasked_and_causal_odd_sizes() {
    let _serial = serial();
    let before = attention_calls();
    // One query row against five keys (one key would give zero gradients for q and k: a
    // single key's softmax is constant).
    for (shape, seq_k) in [
        ([2, 3, 17, 32], 17),
        ([1, 1, 1, 80], 5),
        ([1, 2, 100, 32], 100),
        ([2, 1, 5, 64], 70),
    ] {
        compare(shape, seq_k, AttentionOptions::new);
    }
    for (shape, seq_k) in [
        ([2, 3, 17, 32], 17),
        ([1, 1, 3, 80], 3),
        ([1, 2, 100, 32], 100),
    ] {
        compare(shape, seq_k, AttentionOptions::causal);
    }
    // The fused op ran (one forward and one backward call per comparison), not the fallback.
    assert!(attention_calls() - before >= 14);
}

#[test]
fn fused_matches_written_out_with_mask_bias_and_scale() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let (b, h, s) = (2, 2, 19);
    let mask = input::<B>([b, 1, s, s], 9, &device)
        .greater_elem(0.6)
        // Keep the diagonal so no row is masked entirely (the written-out softmax is NaN there).
        .bool_and(Tensor::<B, 2, Bool>::diag_mask([s, s], 0, &device).unsqueeze::<4>());
    let bias = input::<B>([1, h, s, s], 10, &device);
    compare([b, h, s, 32], s, || {
        AttentionOptions::causal()
            .with_mask(mask.clone())
            .with_bias(bias.clone())
            .with_scale(0.3)
    });
}

#[test]
fn forward_keeps_no_score_sized_tensor() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let (b, h, s, d) = (2, 2, 128, 32);
    let live_after_forward = |fused: bool| {
        let q = input::<B>([b, h, s, d], 1, &device).require_grad();
        let k = input::<B>([b, h, s, d], 2, &device).require_grad();
        let v = input::<B>([b, h, s, d], 3, &device).require_grad();
        let before = memory::live_bytes(&device);
        let out = if fused {
            attention(q.clone(), k.clone(), v.clone(), AttentionOptions::causal())
        } else {
            attention_written_out(q.clone(), k.clone(), v.clone(), AttentionOptions::causal())
        };
        let kept = memory::live_bytes(&device) - before;
        // The backward still works after the measurement.
        let grads = out.sum().backward();
        assert!(q.grad(&grads).is_some());
        kept
    };
    let fused = live_after_forward(true);
    let written = live_after_forward(false);
    let scores = (b * h * s * s * 4) as u64;
    let out = (b * h * s * d * 4) as u64;
    let lse = (b * h * s * 4) as u64;
    // Fused: the output and the logsumexp, nothing else.
    assert!(
        fused <= out + lse,
        "fused kept {fused} B, output + lse {}",
        out + lse
    );
    // Written out: at least the scores and the probabilities besides the output.
    assert!(
        written >= fused + 2 * scores,
        "written out kept {written} B, fused {fused} B, one score tensor {scores} B"
    );
}

#[test]
fn gradients_are_right_in_a_checkpoint_scope_and_under_a_budget() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let shape = [2, 2, 40, 32];
    let q = input::<B>(shape, 1, &device);
    let k = input::<B>(shape, 2, &device);
    let v = input::<B>(shape, 3, &device);
    let g = input::<B>(shape, 4, &device);
    let want = run(&q, &k, &v, &g, AttentionOptions::causal(), false);

    // In a scope: a block (attention then an element-wise op) whose saved tensors are evicted
    // at the end of the scope and recomputed in the backward pass.
    let (qg, kg, vg) = (
        q.clone().require_grad(),
        k.clone().require_grad(),
        v.clone().require_grad(),
    );
    let evictions = memory::remat_stats(&device).evictions;
    let out = frugal::checkpoint(&device, || {
        attention(
            qg.clone(),
            kg.clone(),
            vg.clone(),
            AttentionOptions::causal(),
        )
        .mul_scalar(1.0)
    });
    assert!(memory::remat_stats(&device).evictions > evictions);
    let grads = (out.clone() * g.clone()).sum().backward();
    let got = [
        out.inner(),
        qg.grad(&grads).unwrap(),
        kg.grad(&grads).unwrap(),
        vg.grad(&grads).unwrap(),
    ];
    for (name, (f, w)) in ["out", "grad q", "grad k", "grad v"]
        .iter()
        .zip(got.into_iter().zip(want.clone()))
    {
        assert_close(f, w, &format!("{name} in a scope"));
    }

    // Under a budget a little above what the inputs hold.
    let budget = memory::live_bytes(&device) + 3 * (2 * 2 * 40 * 40 * 4);
    memory::set_budget(&device, Some(budget));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&q, &k, &v, &g, AttentionOptions::causal(), true)
    }));
    memory::set_budget(&device, None);
    let got = result.expect("attention under a budget");
    for (name, (f, w)) in ["out", "grad q", "grad k", "grad v"]
        .iter()
        .zip(got.into_iter().zip(want))
    {
        assert_close(f, w, &format!("{name} under a budget"));
    }
}

#[test]
fn plain_backends_get_the_written_out_attention() {
    type Plain = Autodiff<NdArray>;
    let device = NdArrayDevice::default();
    let q = input::<Plain>([1, 2, 9, 32], 1, &device);
    let k = input::<Plain>([1, 2, 9, 32], 2, &device);
    let v = input::<Plain>([1, 2, 9, 32], 3, &device);
    let a = attention(q.clone(), k.clone(), v.clone(), AttentionOptions::causal());
    let b = attention_written_out(q, k, v, AttentionOptions::causal());
    assert_eq!(a.into_data(), b.into_data());
}

#[test]
fn frugal_without_autodiff_runs_the_same_forward() {
    let _serial = serial();
    type Inference = Frugal<NdArray>;
    let device = NdArrayDevice::default();
    let q = input::<Inference>([1, 2, 21, 32], 1, &device);
    let k = input::<Inference>([1, 2, 21, 32], 2, &device);
    let v = input::<Inference>([1, 2, 21, 32], 3, &device);
    let before = attention_calls();
    let fused = attention(q.clone(), k.clone(), v.clone(), AttentionOptions::causal());
    assert_eq!(attention_calls() - before, 1);
    assert_close(
        fused,
        attention_written_out(q, k, v, AttentionOptions::causal()),
        "forward",
    );
}

#[test]
fn multi_head_attention_matches_burn_nns_layer() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let burn_mha = burn::nn::attention::MultiHeadAttentionConfig::new(64, 4)
        .with_dropout(0.0)
        .init::<B>(&device);
    // Burn initialises parameters lazily and a clone of an uninitialised parameter draws its
    // own values, so the parameters are materialised before the layer is cloned.
    for linear in [
        &burn_mha.query,
        &burn_mha.key,
        &burn_mha.value,
        &burn_mha.output,
    ] {
        let _ = linear.weight.val();
        if let Some(bias) = &linear.bias {
            let _ = bias.val();
        }
    }
    // Ours with the same parameters.
    let mha = frugal::nn::MultiHeadAttention::from(burn_mha.clone());
    let fresh = MultiHeadAttentionConfig::new(64, 4).init::<B>(&device);
    assert_eq!(fresh.num_params(), burn_mha.num_params());
    B::seed(&device, 5);
    let x = Tensor::<B, 3>::random([2, 13, 64], Distribution::Default, &device).require_grad();
    let mask = || {
        Tensor::<B, 2, Bool>::tril_mask([13, 13], 0, &device)
            .unsqueeze::<3>()
            .expand([2, 13, 13])
    };
    let by_flag = mha.forward(MhaInput::self_attn(x.clone()).causal()).context;
    let by_mask = mha
        .forward(MhaInput::self_attn(x.clone()).mask_attn(mask()))
        .context;
    let reference = burn_mha
        .forward(burn::nn::attention::MhaInput::self_attn(x.clone()).mask_attn(mask()))
        .context;
    let as4 = |t: Tensor<B, 3>| t.unsqueeze::<4>();
    assert_close(
        as4(by_flag.clone()),
        as4(reference.clone()),
        "causal flag vs burn-nn",
    );
    assert_close(as4(by_mask), as4(reference), "mask vs burn-nn");
    let grads = by_flag.sum().backward();
    assert!(x.grad(&grads).is_some());
}

/// The output and the packed tensor's gradient of `attention_packed` for the loss
/// `sum(out * g)`, on `Bk`.
fn run_packed<Bk: AutodiffBackend>(
    qkv: &Tensor<Bk, 3>,
    g: &Tensor<Bk, 3>,
    heads: usize,
    options: AttentionOptions<Bk>,
) -> [Tensor<Bk::InnerBackend, 3>; 2] {
    let qkv = qkv.clone().require_grad();
    let out = attention_packed(qkv.clone(), heads, options);
    let grads = (out.clone() * g.clone()).sum().backward();
    [out.inner(), qkv.grad(&grads).unwrap()]
}

#[test]
fn packed_attention_matches_sliced_heads_and_plain_burn() {
    let _serial = serial();
    let device = NdArrayDevice::default();
    let (batch, seq, heads, head_dim) = (2, 9, 3, 4);
    let width = 3 * heads * head_dim;
    let packed =
        |seed: u64| input::<B>([1, batch, seq, width], seed, &device).reshape([batch, seq, width]);
    let (qkv, g) = (
        packed(11),
        packed(12).slice([0..batch, 0..seq, 0..heads * head_dim]),
    );
    let to_plain =
        |t: &Tensor<B, 3>| Tensor::<Autodiff<NdArray>, 3>::from_data(t.to_data(), &device);
    let options = || AttentionOptions::causal();
    let calls = attention_calls();
    let fused = run_packed(&qkv, &g, heads, options());
    // One node: its forward and its backward.
    assert_eq!(attention_calls() - calls, 2, "one attention node");
    // The same, written by hand: three slices, heads split, `attention`, heads merged.
    let sliced = {
        let x = qkv.clone().require_grad();
        let d = heads * head_dim;
        let part = |i: usize| {
            x.clone()
                .slice([0..batch, 0..seq, i * d..(i + 1) * d])
                .reshape([batch, seq, heads, head_dim])
                .swap_dims(1, 2)
        };
        let out = attention(part(0), part(1), part(2), options())
            .swap_dims(1, 2)
            .reshape([batch, seq, d]);
        let grads = (out.clone() * g.clone()).sum().backward();
        [out.inner(), x.grad(&grads).unwrap()]
    };
    let plain = run_packed(
        &to_plain(&qkv),
        &to_plain(&g),
        heads,
        AttentionOptions::causal(),
    );
    for (i, name) in ["out", "grad qkv"].iter().enumerate() {
        let f = fused[i].clone().unsqueeze::<4>();
        assert_close(
            f.clone(),
            sliced[i].clone().unsqueeze::<4>(),
            &format!("{name}, sliced"),
        );
        let p = Tensor::<Frugal<NdArray>, 3>::from_data(plain[i].to_data(), &device);
        assert_close(f, p.unsqueeze::<4>(), &format!("{name}, plain Burn"));
    }
}

#[test]
#[should_panic(expected = "a multiple of 3 · heads")]
fn packed_attention_names_a_width_it_cannot_split() {
    let device = NdArrayDevice::default();
    let qkv = Tensor::<B, 3>::zeros([1, 4, 20], &device);
    let _ = attention_packed(qkv, 3, AttentionOptions::causal());
}
