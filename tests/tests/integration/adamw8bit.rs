//! `frugal::optim::AdamW8bit`'s fused CubeCL kernel against its portable path (plain Burn
//! ops), on wgpu with Burn's fusion (`Wgpu`) and without it (`CubeBackend<WgpuRuntime>`),
//! directly and under `Frugal`: the same parameters, codes and absmax, bit for bit, and the
//! kernel counters show the kernel ran. Also the same training and the same ledger figures
//! through burn-optim's `OptimizerAdaptor` on `Autodiff<Frugal<Wgpu>>`, and, with every moment
//! in f32 (`AdamW8bitConfig::full_precision`), burn-optim's own `AdamW`'s bits from one fused
//! launch per parameter.
//!
//! Runs on wgpu (CI: Mesa's software Vulkan driver).
#![cfg(feature = "wgpu")]

use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuRuntime};
use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer, SimpleOptimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use frugal::Frugal;
use frugal::kernels::{self, KernelMode};
use frugal::optim::{AdamW8bit, AdamW8bitConfig, AdamW8bitState, Moments};

/// CubeCL's wgpu backend without fusion.
type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// Puts the kernel mode back when a test ends, even by a panic.
struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        kernels::set_mode(KernelMode::Auto);
    }
}

/// A deterministic generator, the same values on every backend.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32) / (1u64 << 24) as f32
    }
    fn spread(&mut self) -> f32 {
        let sign = if self.next() < 0.5 { -1.0 } else { 1.0 };
        sign * self.next() * 10f32.powi((self.next() * 8.0) as i32 - 6)
    }
}

const LR: f64 = 1e-3;

/// Final parameter bits, codes and absmax bits.
type Outcome = (Vec<u32>, Vec<u8>, Vec<u32>);

/// [`steps_on`] for one backend.
type StepsOn = fn(&AdamW8bit, &[f32], [usize; 2], &[Vec<f32>]) -> Outcome;

/// `grads.len()` steps of `optim` on `B` through `SimpleOptimizer::step`.
fn steps_on<B: Backend>(
    optim: &AdamW8bit,
    init: &[f32],
    shape: [usize; 2],
    grads: &[Vec<f32>],
) -> Outcome {
    let device = B::Device::default();
    let mut param = Tensor::<B, 2>::from_data(TensorData::new(init.to_vec(), shape), &device);
    let mut state: Option<AdamW8bitState<B, 2>> = None;
    for g in grads {
        let grad = Tensor::<B, 2>::from_data(TensorData::new(g.clone(), shape), &device);
        let (next, next_state) = SimpleOptimizer::<B>::step(optim, LR, param, grad, state);
        param = next;
        state = next_state;
    }
    let Some(AdamW8bitState {
        moments: Moments::Quantized(q),
        ..
    }) = state
    else {
        panic!("8-bit moments expected");
    };
    assert_eq!(q.codes.dtype(), DType::U32);
    let (codes, absmax) = q.to_host();
    let param = param.into_data().to_vec::<f32>().unwrap();
    (
        param.into_iter().map(f32::to_bits).collect(),
        codes,
        absmax.into_iter().map(f32::to_bits).collect(),
    )
}

/// Where two outcomes differ, as counts (parameters, codes, absmax).
fn differences(a: &Outcome, b: &Outcome) -> (usize, usize, usize) {
    let count = |x: &[u32], y: &[u32]| x.iter().zip(y).filter(|(p, q)| p != q).count();
    let codes = a.1.iter().zip(&b.1).filter(|(p, q)| p != q).count();
    (count(&a.0, &b.0), codes, count(&a.2, &b.2))
}

#[test]
fn the_fused_kernel_gives_the_portable_paths_bits_fused_or_not_under_frugal_or_not() {
    let _serial = crate::serial();
    let _reset = Reset;
    // 7 x 713 = 4991 elements: a partial last block; a zero block; a huge gradient.
    let shape = [7, 713];
    let len = shape[0] * shape[1];
    let mut rng = Lcg(9);
    let init: Vec<f32> = (0..len).map(|_| rng.next() - 0.5).collect();
    for (block_size, cautious) in [(256, false), (64, true), (2048, false)] {
        let optim = AdamW8bitConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(0.01)
            .with_cautious_weight_decay(cautious)
            .with_block_size(block_size)
            .try_build()
            .unwrap();
        let grads: Vec<Vec<f32>> = (0..4)
            .map(|_| {
                let mut g: Vec<f32> = (0..len).map(|_| rng.spread()).collect();
                g[64..128].fill(0.0);
                g[300] = 40.0;
                g
            })
            .collect();
        let case = format!("block {block_size}, cautious {cautious}");

        kernels::set_mode(KernelMode::Never);
        let before = kernels::stats();
        let portable = steps_on::<Unfused>(&optim, &init, shape, &grads);
        let cpu = steps_on::<NdArray>(&optim, &init, shape, &grads);
        assert_eq!(
            kernels::stats().adamw8bit_launches,
            before.adamw8bit_launches
        );
        assert_eq!(
            differences(&portable, &cpu),
            (0, 0, 0),
            "{case}: wgpu vs NdArray portable"
        );

        kernels::set_mode(KernelMode::Auto);
        let runs: [(&str, StepsOn, bool); 4] = [
            ("CubeBackend", steps_on::<Unfused>, false),
            ("Wgpu (fusion)", steps_on::<Wgpu>, true),
            ("Frugal<CubeBackend>", steps_on::<Frugal<Unfused>>, false),
            ("Frugal<Wgpu>", steps_on::<Frugal<Wgpu>>, true),
        ];
        for (name, run, fused) in runs {
            let before = kernels::stats();
            let kernel = run(&optim, &init, shape, &grads);
            let after = kernels::stats();
            assert_eq!(
                after.adamw8bit_launches - before.adamw8bit_launches,
                grads.len() as u64,
                "{case}, {name}: one launch per step"
            );
            let registered = after.fused_adamw8bit - before.fused_adamw8bit;
            assert_eq!(registered, if fused { grads.len() as u64 } else { 0 });
            assert_eq!(
                differences(&kernel, &portable),
                (0, 0, 0),
                "{case}, {name}: (parameters, codes, absmax) differing from the portable path"
            );
        }
    }
}

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    a: Linear<B>,
    b: Linear<B>,
    relu: Relu,
}

fn mlp<B: Backend>(device: &B::Device) -> Mlp<B> {
    Mlp {
        a: LinearConfig::new(64, 256).init(device),
        b: LinearConfig::new(256, 16).init(device),
        relu: Relu::new(),
    }
}

fn param_bits<B: Backend>(model: &Mlp<B>) -> Vec<u32> {
    struct Bits(Vec<u32>);
    impl<B: Backend> ModuleVisitor<B> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().to_vec::<f32>().unwrap();
            self.0.extend(data.into_iter().map(f32::to_bits));
        }
    }
    let mut bits = Bits(Vec::new());
    model.visit(&mut bits);
    bits.0
}

/// Losses and parameter bits after `steps` steps, and the live bytes of the optimizer's state
/// (what dropping it gives back).
fn train<B: AutodiffBackend>(init: Mlp<B>, steps: usize) -> (Vec<f32>, Vec<u32>, u64) {
    let optim = AdamW8bitConfig::new()
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init::<B, Mlp<B>>();
    train_with(init, steps, optim)
}

/// [`train`] with the optimizer `optim`.
fn train_with<B: AutodiffBackend, O: Optimizer<Mlp<B>, B>>(
    init: Mlp<B>,
    steps: usize,
    mut optim: O,
) -> (Vec<f32>, Vec<u32>, u64) {
    let device = B::Device::default();
    let mut model = init;
    let mut losses = Vec::new();
    for step in 0..steps {
        let mut rng = Lcg(step as u64 + 1);
        let x: Vec<f32> = (0..32 * 64).map(|_| rng.next() - 0.5).collect();
        let y: Vec<f32> = (0..32 * 16).map(|_| rng.next() - 0.5).collect();
        let x = Tensor::<B, 2>::from_data(TensorData::new(x, [32, 64]), &device);
        let y = Tensor::<B, 2>::from_data(TensorData::new(y, [32, 16]), &device);
        let h = model.relu.forward(model.a.forward(x));
        let loss = (model.b.forward(h) - y).square().mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        losses.push(loss.into_scalar().to_string().parse().unwrap());
        model = optim.step(1e-2, model, grads);
    }
    let bits = param_bits(&model);
    let with_state = frugal::memory::live_bytes(&device);
    drop(optim);
    let state = with_state - frugal::memory::live_bytes(&device);
    drop(model);
    (losses, bits, state)
}

/// One run of [`train`] with the portable path and one with the kernel, from the same
/// parameters on `Autodiff<Frugal<Wgpu>>`.
struct PortableAndFused {
    portable: (Vec<f32>, Vec<u32>, u64),
    fused: (Vec<f32>, Vec<u32>, u64),
    /// Kernel launches in the fused run.
    launched: u64,
}

fn portable_and_fused(steps: usize) -> PortableAndFused {
    type B = Autodiff<Frugal<Wgpu>>;
    let init = mlp::<B>(&Default::default());
    // Burn initialises parameters lazily, on first read: read them once so that both runs
    // start from the same values rather than each drawing its own.
    param_bits(&init);
    kernels::set_mode(KernelMode::Never);
    let portable = train(init.clone(), steps);
    kernels::set_mode(KernelMode::Auto);
    let before = kernels::stats();
    let fused = train(init, steps);
    let launched = kernels::stats().adamw8bit_launches - before.adamw8bit_launches;
    let f32_launches = kernels::stats().adamw_launches - before.adamw_launches;
    // The biases keep f32 moments: their step is the f32 kernel's.
    assert_eq!(
        f32_launches,
        2 * steps as u64,
        "one launch per step and bias"
    );
    PortableAndFused {
        portable,
        fused,
        launched,
    }
}

#[test]
fn training_through_the_optimizer_adaptor_takes_the_kernel_with_the_portable_results() {
    let _serial = crate::serial();
    let _reset = Reset;
    let PortableAndFused {
        portable: (losses, bits, state),
        fused: (fused_losses, fused_bits, fused_state),
        launched,
    } = portable_and_fused(5);
    // Two 8-bit weights (64 x 256 and 256 x 16 = 4096 elements; the biases stay f32).
    assert_eq!(launched, 2 * 5, "one launch per step and 8-bit weight");
    assert_eq!(losses, fused_losses);
    assert!(bits == fused_bits, "parameters differ");
    // The ledger charges the fused step's state as the portable step's: codes, absmax and
    // the biases' f32 moments.
    let quantised = |len: u64| 2 * len + 2 * 4 * len.div_ceil(256);
    let expected = quantised(64 * 256) + quantised(256 * 16) + 8 * (256 + 16);
    assert_eq!(state, expected);
    assert_eq!(fused_state, expected);
}

#[test]
fn under_a_budget_the_kernel_takes_managed_tensors_with_the_portable_results() {
    let _serial = crate::serial();
    let _reset = Reset;
    let device = burn::backend::wgpu::WgpuDevice::default();
    // Under a budget every new tensor is managed (a cell that may be evicted and restored),
    // the gradients and moments the step reads included. This one is tight enough to evict.
    frugal::memory::set_budget(&device, Some(BUDGET_BYTES));
    let evictions_before = frugal::memory::remat_stats(&device).evictions;
    let PortableAndFused {
        portable: (losses, bits, _),
        fused: (fused_losses, fused_bits, _),
        launched,
    } = portable_and_fused(5);
    let evictions = frugal::memory::remat_stats(&device).evictions - evictions_before;
    frugal::memory::set_budget(&device, None);
    assert!(evictions > 0, "the budget evicted nothing");
    assert_eq!(launched, 2 * 5, "one launch per step and 8-bit weight");
    assert_eq!(losses, fused_losses);
    assert!(bits == fused_bits, "parameters differ");
}

/// A budget below the MLP step's unconstrained peak (the test checks that it evicts) but
/// above what one op needs.
const BUDGET_BYTES: u64 = 400_000;

#[test]
fn full_precision_gives_burn_optims_adamw_bits_in_one_launch_per_parameter() {
    let _serial = crate::serial();
    let _reset = Reset;
    type B = Autodiff<Frugal<Wgpu>>;
    let steps = 5;
    let init = mlp::<B>(&Default::default());
    param_bits(&init);
    let adamw = AdamWConfig::new()
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init::<B, Mlp<B>>();
    let (losses, bits, state) = train_with(init.clone(), steps, adamw);
    let before = kernels::stats();
    let fused = AdamW8bitConfig::full_precision()
        .with_epsilon(1e-8)
        .with_weight_decay(0.01)
        .init::<B, Mlp<B>>();
    let (fused_losses, fused_bits, fused_state) = train_with(init, steps, fused);
    let stats = kernels::stats();
    assert_eq!(
        stats.adamw_launches - before.adamw_launches,
        4 * steps as u64,
        "one launch per step and parameter (two weights, two biases)"
    );
    assert_eq!(stats.fused_adamw - before.fused_adamw, 4 * steps as u64);
    assert_eq!(stats.adamw8bit_launches, before.adamw8bit_launches);
    assert_eq!(losses, fused_losses);
    assert!(
        bits == fused_bits,
        "parameters differ from burn-optim's AdamW"
    );
    // Two f32 moments per parameter value, charged as burn-optim's are.
    let values = 64 * 256 + 256 + 256 * 16 + 16;
    assert_eq!(state, 8 * values);
    assert_eq!(fused_state, state);
}

#[test]
fn casts_kept_by_autocast_are_dropped_when_the_kernel_updates_a_parameter_in_place() {
    use frugal::precision::{self, AutocastPolicy, LowPrecision};
    let _serial = crate::serial();
    let _reset = Reset;
    type B = Autodiff<Frugal<Wgpu>>;
    let device = burn::backend::wgpu::WgpuDevice::default();
    let init = mlp::<B>(&device);
    param_bits(&init);
    let run = |keep: bool| {
        let policy = AutocastPolicy::new(LowPrecision::F16).with_kept_casts(keep);
        frugal::set_autocast::<Wgpu>(&device, Some(policy)).unwrap();
        let fused = AdamW8bitConfig::full_precision().init::<B, Mlp<B>>();
        let launches = kernels::stats().adamw_launches;
        let out = train_with(init.clone(), 4, fused);
        frugal::set_autocast::<Wgpu>(&device, None).unwrap();
        (out, kernels::stats().adamw_launches - launches)
    };
    let reused = precision::kept_casts_reused(&device);
    let ((losses, bits, _), launches) = run(true);
    let reused = precision::kept_casts_reused(&device) - reused;
    let ((plain_losses, plain_bits, _), _) = run(false);
    assert_eq!(launches, 4 * 4, "the kernel updated every parameter");
    assert!(reused > 0, "backward found no kept cast");
    // A weight's cast kept past its update would make the later steps' losses differ.
    assert_eq!(losses, plain_losses);
    assert!(bits == plain_bits, "parameters differ");
}
