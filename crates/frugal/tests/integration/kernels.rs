//! Frugal's own CubeCL kernels reached through `Frugal<B>` for CubeCL inner backends, with
//! Burn's fusion (`Wgpu`) and without it (`CubeBackend<WgpuRuntime>`): casts, compressed
//! storage and the GradScaler's fused unscale give the same bits as the inner backend's ops
//! (the portable path), and the kernel counters show Frugal's kernels actually ran.
//!
//! Runs on wgpu (CI: Mesa's software Vulkan driver, which has f16 but not bf16).
#![cfg(feature = "wgpu")]

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuDevice, WgpuRuntime};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData};
use frugal::kernels::{self, KernelMode};
use frugal::{Frugal, GradScaler, GradScalerConfig, LowPrecision, memory};

/// CubeCL's wgpu backend without fusion.
type Unfused = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// Puts the kernel mode and the budget back when a test ends, even by a panic.
struct Reset;
impl Drop for Reset {
    fn drop(&mut self) {
        kernels::set_mode(KernelMode::Auto);
        let device = WgpuDevice::default();
        memory::set_budget(&device, None);
    }
}

/// Awkward values: subnormal in f16, ties, overflow past f16's range, signed zeros, NaN.
fn values(n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        65520.0,
        1e6,
        -1e-7,
        3e-5,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        f32::NAN,
        f32::INFINITY,
    ];
    (0..n)
        .map(|i| {
            special.get(i).copied().unwrap_or_else(|| {
                let x = (i as f32 * 0.618_034).fract() - 0.5;
                x * 10f32.powi((i % 9) as i32 - 4)
            })
        })
        .collect()
}

fn bits(data: TensorData) -> Vec<u32> {
    data.convert::<f32>()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// `x.cast(f16).cast(f32)` on `B` (Frugal's) and on `Plain` (the inner backend alone).
fn round_trip<B: Backend, Plain: Backend<Device = B::Device>>(
    data: &TensorData,
    device: &B::Device,
) -> (Vec<u32>, Vec<u32>) {
    let ours = Tensor::<B, 2>::from_data(data.clone(), device)
        .cast(DType::F16)
        .cast(DType::F32)
        .into_data();
    let theirs = Tensor::<Plain, 2>::from_data(data.clone(), device)
        .cast(DType::F16)
        .cast(DType::F32)
        .into_data();
    (bits(ours), bits(theirs))
}

#[test]
fn casts_without_fusion_run_frugals_kernel_with_burns_bits() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    let data = TensorData::new(values(96 * 33), [96, 33]);
    let before = kernels::stats();
    let (ours, theirs) = round_trip::<Frugal<Unfused>, Unfused>(&data, &device);
    assert_eq!(ours, theirs, "Frugal's kernel vs CubeCL's cast");
    let after = kernels::stats();
    assert_eq!(
        after.casts - before.casts,
        2,
        "both casts ran Frugal's kernel"
    );
    assert_eq!(after.fused_casts, before.fused_casts);

    // A transposed (strided) tensor is left to the inner backend, with the same result.
    let t = Tensor::<Frugal<Unfused>, 2>::from_data(data.clone(), &device).transpose();
    let p = Tensor::<Unfused, 2>::from_data(data.clone(), &device).transpose();
    let before = kernels::stats();
    assert_eq!(
        bits(t.cast(DType::F16).cast(DType::F32).into_data()),
        bits(p.cast(DType::F16).cast(DType::F32).into_data())
    );
    // The f16 -> f32 cast of the (now contiguous) result still runs ours.
    assert_eq!(kernels::stats().casts - before.casts, 1);

    kernels::set_mode(KernelMode::Never);
    let before = kernels::stats();
    let (ours, theirs) = round_trip::<Frugal<Unfused>, Unfused>(&data, &device);
    assert_eq!(ours, theirs);
    assert_eq!(
        kernels::stats(),
        before,
        "Never: only the inner backend's ops"
    );
}

#[test]
fn casts_under_fusion_are_burns_by_default_and_frugals_when_asked() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    let data = TensorData::new(values(64 * 40), [64, 40]);

    let before = kernels::stats();
    let (ours, theirs) = round_trip::<Frugal<Wgpu>, Wgpu>(&data, &device);
    assert_eq!(ours, theirs);
    assert_eq!(
        kernels::stats(),
        before,
        "Auto: fusion keeps its own (fusable) casts"
    );

    kernels::set_mode(KernelMode::Always);
    let before = kernels::stats();
    let (ours, theirs) = round_trip::<Frugal<Wgpu>, Wgpu>(&data, &device);
    assert_eq!(
        ours, theirs,
        "Frugal's kernel as a fusion custom op vs Burn's cast"
    );
    let after = kernels::stats();
    assert_eq!(after.fused_casts - before.fused_casts, 2);
    assert_eq!(
        after.casts - before.casts,
        2,
        "and it ran when fusion flushed"
    );

    // In the middle of a fused element-wise chain, on both sides of the custom op.
    let x = Tensor::<Frugal<Wgpu>, 2>::from_data(data.clone(), &device);
    let y = Tensor::<Wgpu, 2>::from_data(data, &device);
    let ours = ((x.clone() * 3.0 + 1.0).exp().cast(DType::F16) + 2.0).cast(DType::F32) * x;
    let theirs = ((y.clone() * 3.0 + 1.0).exp().cast(DType::F16) + 2.0).cast(DType::F32) * y;
    assert_eq!(bits(ours.into_data()), bits(theirs.into_data()));
}

#[test]
fn compressed_storage_uses_frugals_kernel_under_fusion() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    let data = TensorData::new(values(128 * 128), [128, 128]);
    let rounded = bits(
        Tensor::<Wgpu, 2>::from_data(data.clone(), &device)
            .cast(DType::F16)
            .cast(DType::F32)
            .into_data(),
    );
    memory::set_storage_precision::<Frugal<Wgpu>>(&device, Some(LowPrecision::F16)).unwrap();
    memory::set_budget(&device, Some(1 << 30));
    let start = memory::remat_stats(&device);
    let before = kernels::stats();
    let t = Tensor::<Frugal<Wgpu>, 2>::from_data(data, &device);
    let live = memory::live_bytes(&device);
    // Below the tensor's 64 KiB: the upload cannot be recomputed, so it is compressed.
    memory::set_budget(&device, Some(live - 16 * 1024));
    let stats = memory::remat_stats(&device).since(&start);
    assert_eq!(stats.compressions, 1, "{stats:?}");
    assert_eq!(
        memory::live_bytes(&device),
        live - 32 * 1024,
        "half is freed"
    );
    memory::set_budget(&device, None);
    assert_eq!(
        bits(t.into_data()),
        rounded,
        "reads back as its f16 rounding"
    );
    let after = kernels::stats();
    assert_eq!(
        after.fused_casts - before.fused_casts,
        2,
        "compress and decompress ran Frugal's kernel, even in Auto mode"
    );
    memory::set_storage_precision::<Frugal<Wgpu>>(&device, None).unwrap();
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
}

fn net<B: Backend>(device: &B::Device) -> Net<B> {
    Net {
        first: LinearConfig::new(24, 40).init(device),
        second: LinearConfig::new(40, 6).init(device),
    }
}

/// Every gradient's bits, in parameter order.
fn grad_bits<B: AutodiffBackend>(model: &Net<B>, grads: &GradientsParams) -> Vec<u32> {
    struct Collect<'a>(&'a GradientsParams, Vec<u32>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.get::<B::InnerBackend, D>(param.id) {
                self.1.extend(bits(grad.into_data()));
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// Gradients of a scaled loss before and after a fresh `GradScaler` in `mode` unscaled them,
/// and whether it found a non-finite one.
fn unscaled<B: AutodiffBackend>(
    mode: KernelMode,
    poison: bool,
    device: &B::Device,
) -> (Vec<u32>, Vec<u32>, bool) {
    unscaled_in::<B>(mode, poison, None, device)
}

/// As [`unscaled`], with the gradients first cast to `grad_dtype` (as autocast with 16-bit
/// outputs can leave them).
fn unscaled_in<B: AutodiffBackend>(
    mode: KernelMode,
    poison: bool,
    grad_dtype: Option<DType>,
    device: &B::Device,
) -> (Vec<u32>, Vec<u32>, bool) {
    kernels::set_mode(mode);
    B::seed(device, 7);
    let model = net::<B>(device);
    let inputs: Vec<f32> = (0..8 * 24).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut x = Tensor::<B, 2>::from_data(TensorData::new(inputs, [8, 24]), device);
    if poison {
        // Large enough that the scaled loss overflows f32.
        x = x * 1e30;
    }
    let scaler = GradScaler::new(GradScalerConfig::default()).unwrap();
    let loss = model
        .second
        .forward(model.first.forward(x))
        .powi_scalar(2)
        .mean();
    let grads = scaler.scale_loss(loss).backward();
    let mut grads = GradientsParams::from_grads(grads, &model);
    if let Some(dtype) = grad_dtype {
        struct Cast<'a>(&'a mut GradientsParams, DType);
        impl<B: AutodiffBackend> ModuleVisitor<B> for Cast<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if let Some(grad) = self.0.remove::<B::InnerBackend, D>(param.id) {
                    self.0.register(param.id, grad.cast(self.1));
                }
            }
        }
        model.visit(&mut Cast(&mut grads, dtype));
    }
    let scaled = grad_bits(&model, &grads);
    let found = scaler.unscale(&model, &mut grads);
    (scaled, grad_bits(&model, &grads), found)
}

#[test]
fn grad_scaler_unscales_with_the_fused_kernel_fused_or_not() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    for poison in [false, true] {
        let (scaled, portable, portable_found) =
            unscaled::<Autodiff<Frugal<Unfused>>>(KernelMode::Never, poison, &device);
        assert_eq!(portable_found, poison);
        if !poison {
            assert_ne!(scaled, portable, "unscaling changed the gradients");
        }

        let before = kernels::stats();
        let (_, kernel, found) =
            unscaled::<Autodiff<Frugal<Unfused>>>(KernelMode::Auto, poison, &device);
        let after = kernels::stats();
        assert_eq!(kernel, portable, "without fusion, poison {poison}");
        assert_eq!(found, poison);
        assert_eq!(
            after.unscaled_tensors - before.unscaled_tensors,
            4,
            "4 gradients"
        );
        assert!(after.unscale_launches > before.unscale_launches);

        let before = kernels::stats();
        let (_, kernel, found) =
            unscaled::<Autodiff<Frugal<Wgpu>>>(KernelMode::Auto, poison, &device);
        let after = kernels::stats();
        assert_eq!(kernel, portable, "with fusion, poison {poison}");
        assert_eq!(found, poison);
        assert_eq!(after.unscaled_tensors - before.unscaled_tensors, 4);

        // The plain backend (no Frugal) takes the kernel too.
        let before = kernels::stats();
        let (_, kernel, found) = unscaled::<Autodiff<Wgpu>>(KernelMode::Auto, poison, &device);
        assert_eq!(kernel, portable, "plain Autodiff<Wgpu>, poison {poison}");
        assert_eq!(found, poison);
        assert_eq!(
            kernels::stats().unscaled_tensors - before.unscaled_tensors,
            4
        );
    }
}

#[test]
fn sixteen_bit_gradients_are_widened_by_the_fused_scaled_cast() {
    let _turn = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    let f16 = Some(DType::F16);
    for poison in [false, true] {
        let (_, portable, portable_found) =
            unscaled_in::<Autodiff<Frugal<Unfused>>>(KernelMode::Never, poison, f16, &device);
        assert_eq!(portable_found, poison);

        let before = kernels::stats();
        let (_, kernel, found) =
            unscaled_in::<Autodiff<Frugal<Unfused>>>(KernelMode::Auto, poison, f16, &device);
        let after = kernels::stats();
        assert_eq!(kernel, portable, "without fusion, poison {poison}");
        assert_eq!(found, poison);
        assert_eq!(
            after.scaled_casts - before.scaled_casts,
            4,
            "4 f16 gradients widened"
        );

        let before = kernels::stats();
        let (_, kernel, found) =
            unscaled_in::<Autodiff<Frugal<Wgpu>>>(KernelMode::Auto, poison, f16, &device);
        let after = kernels::stats();
        assert_eq!(kernel, portable, "with fusion, poison {poison}");
        assert_eq!(found, poison);
        assert_eq!(after.scaled_casts - before.scaled_casts, 4);
    }
    // The widened gradients are charged as f32 tensors: nothing is left behind.
    let live = memory::live_bytes(&device);
    let _ = unscaled_in::<Autodiff<Frugal<Unfused>>>(KernelMode::Auto, false, f16, &device);
    assert_eq!(
        memory::live_bytes(&device),
        live,
        "no bytes leak through the widening"
    );
}

/// The loss and the gradients of x, the weight and the bias through
/// `frugal::nn::linear_cross_entropy` in chunks of 16 rows, on `B`.
fn head_loss_and_grads<B: AutodiffBackend>(classes: usize, device: &B::Device) -> Vec<Vec<f32>> {
    let (rows, features) = (37, 24);
    let wave = |n: usize, k: f32| -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * k).sin() * 1.5)
            .collect::<Vec<_>>()
    };
    let param = |data: Vec<f32>, shape: Vec<usize>| {
        Tensor::<B, 1>::from_data(
            TensorData::new(data, [shape.iter().product::<usize>()]),
            device,
        )
    };
    let x = param(wave(rows * features, 0.37), vec![rows, features])
        .reshape([rows, features])
        .require_grad();
    let weight = param(wave(features * classes, 0.11), vec![features, classes])
        .reshape([features, classes])
        .require_grad();
    let bias = param(wave(classes, 0.7), vec![classes]).require_grad();
    let targets: Vec<i32> = (0..rows).map(|i| ((i * 7919) % classes) as i32).collect();
    let targets =
        Tensor::<B, 1, burn::tensor::Int>::from_data(TensorData::new(targets, [rows]), device);
    let loss = frugal::nn::linear_cross_entropy(
        x.clone(),
        weight.clone(),
        Some(bias.clone()),
        targets,
        Some(16),
    );
    let grads = (loss.clone() * 4.0).backward();
    let read =
        |t: Tensor<B::InnerBackend, 2>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    vec![
        loss.inner().into_data().convert::<f32>().to_vec().unwrap(),
        read(x.grad(&grads).unwrap()),
        read(weight.grad(&grads).unwrap()),
        bias.grad(&grads)
            .unwrap()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap(),
    ]
}

#[test]
fn the_head_loss_runs_frugals_kernel_fused_or_not() {
    let _serial = crate::serial();
    let _reset = Reset;
    let device = WgpuDevice::default();
    // 53 classes: one value per load; 64: vectors.
    for classes in [53, 64] {
        kernels::set_mode(KernelMode::Never);
        let want = head_loss_and_grads::<Autodiff<Frugal<Wgpu>>>(classes, &device);
        kernels::set_mode(KernelMode::Auto);
        for fused in [true, false] {
            let before = kernels::stats().cross_entropy_rows;
            let got = if fused {
                head_loss_and_grads::<Autodiff<Frugal<Wgpu>>>(classes, &device)
            } else {
                head_loss_and_grads::<Autodiff<Frugal<Unfused>>>(classes, &device)
            };
            // Three chunks of 16, 16 and 5 rows.
            assert_eq!(kernels::stats().cross_entropy_rows - before, 3);
            for (name, (g, w)) in ["loss", "grad x", "grad weight", "grad bias"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_eq!(g.len(), w.len(), "{name}");
                for (i, (g, w)) in g.iter().zip(w).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-6 + 1e-4 * w.abs(),
                        "{name}, classes {classes}, fused {fused}: [{i}] kernel {g}, written out {w}"
                    );
                }
                assert!(w.iter().any(|w| w.abs() > 1e-4), "{name}: all but zero");
            }
        }
    }
}
