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
//!    step queued, synced, timed; median over repetitions. `docs/runs/scripts/
//!    torch_products.py` times the same list with `torch.matmul`.
//!
//! 3. **Attention as products** (`frugal::kernels::AttentionPath`): `frugal::nn::attention`
//!    under `Autodiff<Frugal<FrugalCuda>>`, its output and gradients with the forward and
//!    backward as products on cuBLASLt against the flash-attention kernels (differential
//!    cases: causal odd sizes, unmasked, a bias; f32 strict, f16, bf16, fused and unfused),
//!    then both timed on the reference shapes (`[8, 12, 512, 64]`,
//!    causal, forward + backward of 12 layers; `docs/runs/scripts/torch_attention.py` times
//!    PyTorch's SDPA on them).
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
use frugal::kernels::{AttentionPath, Products, set_attention_path, set_products, stats};
use frugal::nn::{AttentionOptions, attention};
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
    /// Comma-separated differential cases to run before timing: products, attention; empty
    /// for none.
    #[arg(long, value_delimiter = ',', default_values_t = ["products".to_string(), "attention".to_string()])]
    checks: Vec<String>,
    /// Only the differential cases.
    #[arg(long)]
    check_only: bool,
    /// Comma-separated dtypes to time attention in (products against the flash kernels): f32,
    /// bf16, f16; empty for none.
    #[arg(long, value_delimiter = ',', default_values_t = ["bf16".to_string()])]
    attention_dtypes: Vec<String>,
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

/// The largest [`rel_error`] over a case's outputs.
fn max_error(got: Vec<TensorData>, reference: Vec<TensorData>) -> f64 {
    got.into_iter()
        .zip(reference)
        .map(|(g, r)| rel_error(g, r))
        .fold(0f64, f64::max)
}

/// Prints `check`'s line; counts it in `failures` if it failed.
fn report(check: Check, failures: &mut usize) {
    if !check.ok {
        *failures += 1;
    }
    println!("{}", serde_json::to_string(&check).unwrap());
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
                    let error = max_error(got, reference);
                    let tol = tolerance(dtype);
                    let ok = error <= tol && (!expect_blas || blas > 0);
                    report(
                        Check {
                            bench: "products-check",
                            case: name.to_string(),
                            backend,
                            dtype: format!("{dtype:?}").to_lowercase(),
                            products: format!("{products:?}").to_lowercase(),
                            rel_error: error,
                            tolerance: tol,
                            blas_products: blas,
                            ok,
                        },
                        failures,
                    );
                };
            for (name, expect_blas, case) in &mut all {
                run_case(name, *expect_blas, case.as_ref());
            }
            run_case("linear + bias, forward and backward", true, linear.as_ref());
        }
    }
}

/// The products setting under which `dtype`'s attention products run on cuBLASLt.
fn attention_products(dtype: FloatDType) -> Products {
    if dtype == FloatDType::F32 {
        Products::Blas
    } else {
        Products::Auto
    }
}

/// `frugal::nn::attention` forward and backward on `[b, h, s, d]` inputs: the output and the
/// gradients of q, k and v, as the current settings compute them.
fn attention_case<B: Backend>(
    dtype: FloatDType,
    shape: [usize; 4],
    causal: bool,
    bias: bool,
    device: &B::Device,
) -> Case {
    type A<B> = Autodiff<B>;
    let t = || random::<A<B>, 4>(shape, dtype, device);
    let (q, k, v, g) = (t(), t(), t(), t());
    let [b, h, s, _] = shape;
    let bias = bias.then(|| random::<A<B>, 4>([b, h, s, s], dtype, device));
    Box::new(move || {
        let (q, k, v) = (
            q.clone().detach().require_grad(),
            k.clone().detach().require_grad(),
            v.clone().detach().require_grad(),
        );
        let mut options = if causal {
            AttentionOptions::causal()
        } else {
            AttentionOptions::new()
        };
        if let Some(bias) = &bias {
            options = options.with_bias(bias.clone());
        }
        let out = attention(q.clone(), k.clone(), v.clone(), options);
        let grads = (out.clone() * g.clone()).sum().backward();
        vec![
            out.into_data(),
            q.grad(&grads).unwrap().into_data(),
            k.grad(&grads).unwrap().into_data(),
            v.grad(&grads).unwrap().into_data(),
        ]
    })
}

/// Attention as products against the flash kernels: output and gradients of each case.
fn check_attention<B: Backend>(
    backend: &'static str,
    device: &B::Device,
    dtypes: &[FloatDType],
    failures: &mut usize,
) where
    B::Device: 'static,
{
    for &dtype in dtypes {
        let products = attention_products(dtype);
        set_products(products);
        for (name, shape, causal, bias) in [
            ("attention, causal, odd sizes", [2, 3, 33, 32], true, false),
            ("attention, unmasked", [1, 2, 17, 64], false, false),
            ("attention, bias, head dim 80", [2, 2, 40, 80], false, true),
            (
                "attention, causal, reference head",
                [1, 4, 512, 64],
                true,
                false,
            ),
        ] {
            let case = attention_case::<B>(dtype, shape, causal, bias, device);
            set_attention_path(AttentionPath::Flash);
            let reference = case();
            set_attention_path(AttentionPath::Products);
            let before = stats();
            let got = case();
            let after = stats();
            set_attention_path(AttentionPath::Auto);
            let by_products = after.attention_product_forwards + after.attention_product_backwards
                - before.attention_product_forwards
                - before.attention_product_backwards;
            let error = max_error(got, reference);
            let tol = tolerance(dtype);
            // One forward and one backward, both as products.
            let ok = error <= tol && by_products == 2;
            report(
                Check {
                    bench: "products-check",
                    case: name.to_string(),
                    backend,
                    dtype: format!("{dtype:?}").to_lowercase(),
                    products: "attention-products".to_string(),
                    rel_error: error,
                    tolerance: tol,
                    blas_products: after.blas_products - before.blas_products,
                    ok,
                },
                failures,
            );
        }
        set_products(Products::Auto);
    }
}

/// One timed attention configuration.
#[derive(Serialize)]
struct AttentionTiming {
    bench: &'static str,
    dtype: String,
    path: String,
    /// Forward and backward of all layers, synced.
    step_ms: f64,
    layers: usize,
    shape: [usize; 4],
    product_passes_per_step: f64,
}

/// The reference step's attention alone (`[8, 12, 512, 64]`, causal, one call per layer),
/// forward and backward under autodiff, on `path`.
fn time_attention(args: &Args, dtype: FloatDType, path: AttentionPath) -> AttentionTiming {
    type B = Autodiff<Frugal<FrugalCuda>>;
    let device = FrugalCudaDevice::default();
    let shape = [8, 12, 512, 64];
    let inputs: Vec<_> = (0..args.layers)
        .map(|_| [0; 4].map(|_| random::<B, 4>(shape, dtype, &device)))
        .collect();
    set_products(attention_products(dtype));
    set_attention_path(path);
    let step = || {
        let mut loss = None;
        let mut leaves = Vec::new();
        for [q, k, v, g] in &inputs {
            let (q, k, v) = (
                q.clone().require_grad(),
                k.clone().require_grad(),
                v.clone().require_grad(),
            );
            let out = attention(q.clone(), k.clone(), v.clone(), AttentionOptions::causal());
            let term = (out * g.clone()).sum();
            loss = Some(match loss {
                None => term,
                Some(l) => l + term,
            });
            leaves.push(q);
        }
        let grads = loss.expect("at least one layer").backward();
        // Reading one gradient keeps the backward's kernels from being dropped unexecuted.
        let _ = leaves[0].grad(&grads);
        <B as Backend>::sync(&device).expect("device sync");
    };
    for _ in 0..args.warmup {
        step();
    }
    let passes = || stats().attention_product_forwards + stats().attention_product_backwards;
    let before = passes();
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let start = Instant::now();
        step();
        times.push(start.elapsed().as_secs_f64());
    }
    let by_products = (passes() - before) as f64 / args.reps as f64;
    set_attention_path(AttentionPath::Auto);
    set_products(Products::Auto);
    AttentionTiming {
        bench: "attention-step",
        dtype: format!("{dtype:?}").to_lowercase(),
        path: format!("{path:?}").to_lowercase(),
        step_ms: median(&mut times) * 1e3,
        layers: args.layers,
        shape,
        product_passes_per_step: by_products,
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
    for check in args.checks.iter().filter(|name| !name.is_empty()) {
        match check.as_str() {
            "products" => {
                check_backend::<Frugal<FrugalCuda>>("fused", &device, &check_dtypes, &mut failures);
                check_backend::<Frugal<FrugalCudaUnfused>>(
                    "unfused",
                    &device,
                    &check_dtypes,
                    &mut failures,
                );
            }
            "attention" => {
                check_attention::<Frugal<FrugalCuda>>(
                    "fused",
                    &device,
                    &check_dtypes,
                    &mut failures,
                );
                check_attention::<Frugal<FrugalCudaUnfused>>(
                    "unfused",
                    &device,
                    &check_dtypes,
                    &mut failures,
                );
            }
            other => {
                eprintln!("error: unknown check {other:?} (expected products or attention)");
                std::process::exit(2);
            }
        }
    }
    eprintln!("differential cases: {failures} failed");
    if failures > 0 {
        std::process::exit(1);
    }
    if args.check_only {
        return;
    }
    for name in args.attention_dtypes.iter().filter(|name| !name.is_empty()) {
        let dtype = float_dtype(name);
        for path in [AttentionPath::Flash, AttentionPath::Products] {
            let timing = time_attention(&args, dtype, path);
            println!("{}", serde_json::to_string(&timing).unwrap());
        }
    }
    for name in args.dtypes.iter().filter(|name| !name.is_empty()) {
        let dtype = float_dtype(name);
        let mut modes = vec![Products::Cube];
        modes.extend(blas_modes(dtype));
        for products in modes {
            let timing = time_step(&args, dtype, products);
            println!("{}", serde_json::to_string(&timing).unwrap());
        }
    }
}
