//! `frugal::nn::attention` under `Autodiff<Frugal<_>>` on wgpu, with Burn's fusion (`Wgpu`) and
//! without (`CubeBackend<WgpuRuntime>`): the flash-attention kernels' output and gradients
//! against the portable path (`KernelMode::Never`) and the written-out attention, and the
//! kernel counters show the kernels ran.
//!
//! Tolerance (f32): `1e-5 + 1e-3 * |want|` per element.
use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuRuntime};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use frugal::Frugal;
use frugal::kernels::{self, KernelMode};
use frugal::nn::{AttentionOptions, attention, attention_written_out};

use crate::serial;

type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        kernels::set_mode(KernelMode::Auto);
    }
}

#[derive(Clone, Copy)]
enum Path {
    Kernels,
    Portable,
    WrittenOut,
}

fn run<B: AutodiffBackend>(shape: [usize; 4], causal: bool, path: Path) -> Vec<Vec<f32>> {
    let device = Default::default();
    B::seed(&device, 7);
    let t = || Tensor::<B, 4>::random(shape, Distribution::Uniform(-1.0, 1.0), &device);
    let (q, k, v, g) = (
        t().require_grad(),
        t().require_grad(),
        t().require_grad(),
        t(),
    );
    let options = || {
        if causal {
            AttentionOptions::causal()
        } else {
            AttentionOptions::new()
        }
    };
    kernels::set_mode(match path {
        Path::Portable => KernelMode::Never,
        _ => KernelMode::Auto,
    });
    let out = match path {
        Path::WrittenOut => attention_written_out(q.clone(), k.clone(), v.clone(), options()),
        _ => attention(q.clone(), k.clone(), v.clone(), options()),
    };
    let grads = (out.clone() * g).sum().backward();
    let read = |t: Tensor<B::InnerBackend, 4>| t.into_data().to_vec::<f32>().unwrap();
    let result = vec![
        read(out.inner()),
        read(q.grad(&grads).unwrap()),
        read(k.grad(&grads).unwrap()),
        read(v.grad(&grads).unwrap()),
    ];
    kernels::set_mode(KernelMode::Auto);
    result
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], ctx: &str) {
    for (name, (g, w)) in ["out", "grad q", "grad k", "grad v"]
        .iter()
        .zip(got.iter().zip(want))
    {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-3 * b.abs(),
                "{ctx}, {name}: [{i}] {a} vs {b}"
            );
        }
        assert!(
            w.iter().any(|x| x.abs() > 1e-3),
            "{ctx}, {name}: all but zero"
        );
    }
}

fn compare<B: AutodiffBackend>(label: &str) {
    for (shape, causal) in [([2, 3, 33, 32], true), ([1, 2, 17, 64], false)] {
        let before = kernels::stats();
        let fused = run::<B>(shape, causal, Path::Kernels);
        let after = kernels::stats();
        assert_eq!(
            after.attention_forwards - before.attention_forwards,
            1,
            "{label}"
        );
        assert_eq!(
            after.attention_backwards - before.attention_backwards,
            1,
            "{label}"
        );
        let portable = run::<B>(shape, causal, Path::Portable);
        assert_eq!(
            kernels::stats().attention_forwards,
            after.attention_forwards
        );
        let written = run::<B>(shape, causal, Path::WrittenOut);
        let ctx = format!("{label} {shape:?} causal {causal}");
        assert_close(&fused, &portable, &format!("kernels vs portable, {ctx}"));
        assert_close(&fused, &written, &format!("kernels vs written out, {ctx}"));
    }
}

#[test]
fn kernels_match_the_portable_path_with_fusion() {
    let _serial = serial();
    let _reset = Reset;
    compare::<Autodiff<Frugal<Wgpu>>>("fused wgpu");
}

#[test]
fn kernels_match_the_portable_path_without_fusion() {
    let _serial = serial();
    let _reset = Reset;
    compare::<Autodiff<Frugal<Unfused>>>("cube wgpu");
}
