//! An embedding's backward under `Autodiff<Frugal<_>>` on wgpu, with Burn's fusion (`Wgpu`)
//! and without (`CubeBackend<WgpuRuntime>`): Frugal's kernel (atomic adds) against Burn's own
//! backward (`KernelMode::Never`), the gradients of the table equal within the rounding of
//! another order of additions, and the counters show the kernel ran.
//!
//! Tolerance (f32): `1e-6 + 1e-5 * |want|` per element.
use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuRuntime};
use burn::nn::{Embedding, EmbeddingConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use frugal::Frugal;
use frugal::kernels::{self, KernelMode};

use crate::serial;

type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        kernels::set_mode(KernelMode::Auto);
    }
}

/// The table's gradient after a lookup of `[batch, seq]` ids (many repeated) into a table of
/// `rows × width`, with a random upstream gradient.
fn table_grad<B: AutodiffBackend>(batch: usize, seq: usize, rows: usize, width: usize) -> Vec<f32> {
    let device = Default::default();
    B::seed(&device, 11);
    let embedding: Embedding<B> = EmbeddingConfig::new(rows, width).init(&device);
    let ids: Vec<i64> = (0..batch * seq)
        .map(|t| ((t * 7 + t / 5) % rows) as i64)
        .collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
    let upstream = Tensor::<B, 3>::random(
        [batch, seq, width],
        Distribution::Uniform(-1.0, 1.0),
        &device,
    );
    let out = embedding.forward(ids);
    let grads = (out * upstream).sum().backward();
    let grad = embedding
        .weight
        .grad(&grads)
        .expect("the table has a gradient");
    grad.into_data().to_vec::<f32>().unwrap()
}

fn check<B: burn::tensor::backend::Backend>(name: &str) {
    let (batch, seq, rows, width) = (4, 33, 50, 24);
    kernels::set_mode(KernelMode::Never);
    let want = table_grad::<Autodiff<Frugal<B>>>(batch, seq, rows, width);
    kernels::set_mode(KernelMode::Auto);
    let before = kernels::stats();
    let got = table_grad::<Autodiff<Frugal<B>>>(batch, seq, rows, width);
    let ran = kernels::stats().embedding_backwards - before.embedding_backwards;
    assert_eq!(ran, 1, "{name}: Frugal's kernel ran once");
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
            "{name}: element {i}: {g} against Burn's {w}"
        );
    }
}

#[test]
fn the_kernel_gives_burns_gradient_fused_or_not() {
    let _serial = serial();
    let _reset = Reset;
    let before = kernels::stats().fused_embedding_backwards;
    check::<Wgpu>("fused");
    assert_eq!(kernels::stats().fused_embedding_backwards - before, 1);
    check::<Unfused>("unfused");
}
