//! Matrix products on frugal-cuda: cuBLASLt (`frugal::kernels::Products::Blas`, and TF32)
//! against CubeCL's kernels (Burn's own), on `Frugal<FrugalCuda>`.
//!
//! 1. **Differential cases** (before any timing): the same products through both paths, fused
//!    and unfused, in f32 (strict and TF32), f16 and bf16, over the layouts the dispatch handles (batched,
//!    transposed operands, broadcast batches, offset views, `linear` with its backward
//!    products under autodiff). Each case prints its error relative to the largest output
//!    element and fails the run (exit 1) above the dtype's tolerance, or if a product that
//!    should have run on cuBLASLt did not.
//! 2. **Throughput** of the reference GPT step's products (12 layers of `768 → 2304` (qkv),
//!    `768 → 768`, `768 → 3072`, `3072 → 768`, plus the `768 → 8192` head, over 4,096 tokens;
//!    each as the forward `x · W` and the backward `g · Wᵀ` and `xᵀ · g`), all products of one
//!    step queued, synced, timed; median over repetitions. `docs/runs/issue23/
//!    torch_products.py` times the same list with `torch.matmul`.
//!
//! ```sh
//! cargo run --release -p frugal-benches --features frugal-cuda --bin products-throughput
//! ```

use std::time::Instant;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, Tensor, TensorData};
use clap::Parser;
use frugal::Frugal;
use frugal::kernels::{Products, set_products, stats};
use frugal_benches::median;
use frugal_cuda::{FrugalCuda, FrugalCudaDevice, FrugalCudaUnfused};
use serde::Serialize;

/// Differential checks and throughput of matrix products on cuBLASLt vs CubeCL.
#[derive(Parser)]
struct Args {
    /// Timed repetitions of the step's products; the median is reported.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Untimed repetitions first (kernel compilation, autotuning, cuBLASLt's heuristics).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Layers of the reference model.
    #[arg(long, default_value_t = 12)]
    layers: usize,
    /// Tokens per step (batch × sequence).
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Only the differential cases.
    #[arg(long)]
    check_only: bool,
    /// Comma-separated dtypes to time: f32, bf16, f16.
    #[arg(long, value_delimiter = ',', default_values_t = ["f32".to_string(), "bf16".to_string()])]
    dtypes: Vec<String>,
}

/// One differential case's result.
#[derive(Serialize)]
struct Check {
    bench: &'static str,
    case: String,
    backend: &'static str,
    dtype: String,
    products: String,
    rel_error: f64,
    tolerance: f64,
    blas_products: u64,
    ok: bool,
}

/// One timed configuration.
#[derive(Serialize)]
struct Timing {
    bench: &'static str,
    dtype: String,
    products: String,
    step_ms: f64,
    tflops: f64,
    products_per_step: usize,
    blas_products_per_step: f64,
}

fn float_dtype(name: &str) -> FloatDType {
    match name {
        "f32" => FloatDType::F32,
        "f16" => FloatDType::F16,
        "bf16" => FloatDType::BF16,
        other => {
            eprintln!("error: unknown dtype {other:?} (expected f32, f16 or bf16)");
            std::process::exit(2);
        }
    }
}

/// Error allowed against CubeCL's product, relative to the largest output element. CubeCL
/// computes large f32 products on TF32 tensor cores, so strict f32 differs from it by TF32's
/// rounding (10-bit mantissa) as TF32 does; 16-bit outputs differ by at most their rounding.
fn tolerance(dtype: FloatDType) -> f64 {
    match dtype {
        FloatDType::F32 => 2e-3,
        FloatDType::F16 => 1e-2,
        _ => 2e-2,
    }
}

/// The settings compared with [`Products::Cube`] for `dtype`.
fn blas_modes(dtype: FloatDType) -> Vec<Products> {
    if dtype == FloatDType::F32 {
        vec![Products::Blas, Products::BlasTf32]
    } else {
        vec![Products::Auto]
    }
}

/// Largest `|a - b|` over the largest `|b|`.
fn rel_error(a: TensorData, b: TensorData) -> f64 {
    let a = a.convert::<f32>().to_vec::<f32>().unwrap();
    let b = b.convert::<f32>().to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (diff / scale) as f64
}

fn random<B: Backend, const D: usize>(
    shape: [usize; D],
    dtype: FloatDType,
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::<B, D>::random(shape, Distribution::Uniform(-1.0, 1.0), device).cast(dtype)
}

/// A case: inputs made once, then the outputs under a given [`Products`] setting.
type Case = Box<dyn Fn() -> Vec<TensorData>>;

fn cases<B: Backend>(dtype: FloatDType, device: &B::Device) -> Vec<(String, bool, Case)>
where
    B::Device: 'static,
{
    let mut out: Vec<(String, bool, Case)> = Vec::new();
    let d = device.clone();
    let (a, b) = (
        random::<B, 2>([37, 53], dtype, &d),
        random::<B, 2>([53, 29], dtype, &d),
    );
    out.push((
        "2d [37,53]x[53,29]".into(),
        true,
        Box::new(move || vec![a.clone().matmul(b.clone()).into_data()]),
    ));
    let (a, b) = (
        random::<B, 4>([2, 3, 17, 33], dtype, &d),
        random::<B, 4>([2, 3, 33, 19], dtype, &d),
    );
    out.push((
        "batched [2,3,17,33]x[2,3,33,19]".into(),
        true,
        Box::new(move || vec![a.clone().matmul(b.clone()).into_data()]),
    ));
    let (a, b) = (
        random::<B, 4>([2, 3, 17, 33], dtype, &d),
        random::<B, 4>([2, 3, 19, 33], dtype, &d),
    );
    out.push((
        "rhs transposed (q kᵀ)".into(),
        true,
        Box::new(move || vec![a.clone().matmul(b.clone().swap_dims(2, 3)).into_data()]),
    ));
    let (a, b) = (
        random::<B, 3>([4, 33, 17], dtype, &d),
        random::<B, 3>([4, 33, 19], dtype, &d),
    );
    out.push((
        "lhs transposed (xᵀ g)".into(),
        true,
        Box::new(move || vec![a.clone().swap_dims(1, 2).matmul(b.clone()).into_data()]),
    ));
    let (a, b) = (
        random::<B, 3>([4, 17, 33], dtype, &d),
        random::<B, 3>([1, 33, 19], dtype, &d),
    );
    out.push((
        "broadcast rhs [4,17,33]x[1,33,19]".into(),
        true,
        Box::new(move || vec![a.clone().matmul(b.clone()).into_data()]),
    ));
    let (a, b) = (
        random::<B, 4>([2, 1, 17, 33], dtype, &d),
        random::<B, 4>([1, 3, 33, 19], dtype, &d),
    );
    out.push((
        "mixed broadcast [2,1,..]x[1,3,..] (left to Burn)".into(),
        false,
        Box::new(move || vec![a.clone().matmul(b.clone()).into_data()]),
    ));
    let (a, b) = (
        random::<B, 2>([40, 60], dtype, &d),
        random::<B, 2>([53, 29], dtype, &d),
    );
    out.push((
        "offset view [3..40, 7..60]x[53,29]".into(),
        true,
        Box::new(move || {
            vec![
                a.clone()
                    .slice([3..40, 7..60])
                    .matmul(b.clone())
                    .into_data(),
            ]
        }),
    ));
    let (a, b) = (
        random::<B, 2>([512, 768], dtype, &d),
        random::<B, 2>([768, 3072], dtype, &d),
    );
    out.push((
        "large [512,768]x[768,3072]".into(),
        true,
        Box::new(move || vec![a.clone().matmul(b.clone()).into_data()]),
    ));
    out
}

/// `linear` with bias, forward and backward under autodiff: output and the three gradients.
fn linear_case<B: Backend>(dtype: FloatDType, device: &B::Device) -> Case {
    type A<B> = Autodiff<B>;
    let x = random::<A<B>, 3>([3, 45, 64], dtype, device);
    let w = random::<A<B>, 2>([64, 96], dtype, device);
    let bias = random::<A<B>, 1>([96], dtype, device);
    let r = random::<A<B>, 3>([3, 45, 96], dtype, device);
    Box::new(move || {
        let x = x.clone().detach().require_grad();
        let w = w.clone().detach().require_grad();
        let bias = bias.clone().detach().require_grad();
        let y = burn::tensor::module::linear(x.clone(), w.clone(), Some(bias.clone()));
        let grads = (y.clone() * r.clone()).sum().backward();
        vec![
            y.into_data(),
            x.grad(&grads).unwrap().into_data(),
            w.grad(&grads).unwrap().into_data(),
            bias.grad(&grads).unwrap().into_data(),
        ]
    })
}

fn check_backend<B: Backend>(
    backend: &'static str,
    device: &B::Device,
    dtypes: &[FloatDType],
    failures: &mut usize,
) where
    B::Device: 'static,
{
    for &dtype in dtypes {
        let modes = blas_modes(dtype);
        let mut all: Vec<(String, bool, Case)> = cases::<B>(dtype, device);
        let linear = linear_case::<B>(dtype, device);
        for products in modes {
            let mut run_case =
                |name: &str, expect_blas: bool, case: &dyn Fn() -> Vec<TensorData>| {
                    set_products(Products::Cube);
                    let reference = case();
                    set_products(products);
                    let before = stats().blas_products;
                    let got = case();
                    let blas = stats().blas_products - before;
                    set_products(Products::Cube);
                    let error = got
                        .into_iter()
                        .zip(reference)
                        .map(|(g, r)| rel_error(g, r))
                        .fold(0f64, f64::max);
                    let tol = tolerance(dtype);
                    let ok = error <= tol && (!expect_blas || blas > 0);
                    if !ok {
                        *failures += 1;
                    }
                    let check = Check {
                        bench: "products-check",
                        case: name.to_string(),
                        backend,
                        dtype: format!("{dtype:?}").to_lowercase(),
                        products: format!("{products:?}").to_lowercase(),
                        rel_error: error,
                        tolerance: tol,
                        blas_products: blas,
                        ok,
                    };
                    println!("{}", serde_json::to_string(&check).unwrap());
                };
            for (name, expect_blas, case) in &mut all {
                run_case(name, *expect_blas, case.as_ref());
            }
            run_case("linear + bias, forward and backward", true, linear.as_ref());
        }
    }
}

/// The step's products: `(m, k, n)` of `x · W` for every linear layer.
fn step_linears(layers: usize, tokens: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for _ in 0..layers {
        for (k, n) in [(768, 2304), (768, 768), (768, 3072), (3072, 768)] {
            out.push((tokens, k, n));
        }
    }
    out.push((tokens, 768, 8192));
    out
}

fn time_step(args: &Args, dtype: FloatDType, products: Products) -> Timing {
    type B = Frugal<FrugalCuda>;
    let device = FrugalCudaDevice::default();
    let linears = step_linears(args.layers, args.tokens);
    // One set of operands per distinct shape.
    let mut operands = std::collections::HashMap::new();
    for &(m, k, n) in &linears {
        operands.entry((m, k, n)).or_insert_with(|| {
            (
                random::<B, 2>([m, k], dtype, &device),
                random::<B, 2>([k, n], dtype, &device),
                random::<B, 2>([m, n], dtype, &device),
            )
        });
    }
    set_products(products);
    let step = || {
        for shape in &linears {
            let (x, w, g) = &operands[shape];
            let _y = x.clone().matmul(w.clone());
            let _dx = g.clone().matmul(w.clone().transpose());
            let _dw = x.clone().transpose().matmul(g.clone());
        }
        B::sync(&device).expect("device sync");
    };
    for _ in 0..args.warmup {
        step();
    }
    let before = stats().blas_products;
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let start = Instant::now();
        step();
        times.push(start.elapsed().as_secs_f64());
    }
    let blas = (stats().blas_products - before) as f64 / args.reps as f64;
    set_products(Products::Auto);
    let seconds = median(&mut times);
    let flops: f64 = linears
        .iter()
        .map(|&(m, k, n)| 3.0 * 2.0 * (m * k * n) as f64)
        .sum();
    Timing {
        bench: "products-throughput",
        dtype: format!("{dtype:?}").to_lowercase(),
        products: format!("{products:?}").to_lowercase(),
        step_ms: seconds * 1e3,
        tflops: flops / seconds / 1e12,
        products_per_step: linears.len() * 3,
        blas_products_per_step: blas,
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    if let Err(e) = frugal_cuda::check_device(&FrugalCudaDevice::default()) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    if !frugal_cuda::blas_available() {
        eprintln!("error: libcublasLt was not found on the library path; nothing to compare");
        std::process::exit(2);
    }
    let device = FrugalCudaDevice::default();
    let check_dtypes = [FloatDType::F32, FloatDType::F16, FloatDType::BF16];
    let mut failures = 0;
    check_backend::<Frugal<FrugalCuda>>("fused", &device, &check_dtypes, &mut failures);
    check_backend::<Frugal<FrugalCudaUnfused>>("unfused", &device, &check_dtypes, &mut failures);
    eprintln!("differential cases: {failures} failed");
    if failures > 0 {
        std::process::exit(1);
    }
    if args.check_only {
        return;
    }
    for name in &args.dtypes {
        let dtype = float_dtype(name);
        let mut modes = vec![Products::Cube];
        modes.extend(blas_modes(dtype));
        for products in modes {
            let timing = time_step(&args, dtype, products);
            println!("{}", serde_json::to_string(&timing).unwrap());
        }
    }
}
