//! Device initialisation: the driver context, and the device properties and features CubeCL's
//! kernels are selected by.
//!
//! The properties are registered exactly as cubecl-cuda 0.10 registers them (same attributes,
//! same architecture thresholds, same WMMA/MMA combinations from the same `cubecl_cpp`
//! compiler), so autotune and kernel selection see the same device and pick the same kernels as
//! on `burn::backend::Cuda`. What differs is only where memory comes from.

use std::sync::Arc;

use cubecl_common::device::{Device, DeviceId, DeviceService};
use cubecl_common::profile::TimingMethod;
use cubecl_core::device::ServerUtilitiesHandle;
use cubecl_core::ir::{
    BarrierLevel, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, OpaqueType, SemanticType, StorageType, Type, VectorSize,
    features::{AtomicUsage, Plane, Tma, TypeUsage},
};
use cubecl_core::server::ServerUtilities;
use cubecl_cpp::DialectWmmaCompiler;
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::register_supported_types;
use cubecl_cpp::shared::{
    CompilationOptions, CppSupportedFeatures, register_mma_features, register_scaled_mma_features,
    register_wmma_features,
};
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::logging::ServerLogger;
use cudarc::driver::sys::CUDA_VERSION;
use cudarc::driver::sys::CUdevice_attribute::*;

use super::FrugalCudaDevice;
use super::compiler::KernelContext;
use super::memory::CudaDeviceMemory;
use super::server::{FrugalCudaServer, MemoryControl};
use crate::allocator::{AllocatorConfig, CachingAllocator};
use crate::storage::{BINDING_SLOTS, HandleRegistry};

/// Row alignment `cuMemAllocPitch` returns, which CubeCL's pitched layouts use.
const PITCH_ALIGNMENT: u64 = 512;

fn tensor_cores_per_sm(version: u32) -> Option<u32> {
    match version {
        70 | 75 => Some(8),
        80 | 86 | 89 | 90 | 91 | 92 | 100 => Some(4),
        _ => None,
    }
}

fn fail(what: &str, device: &FrugalCudaDevice, e: impl std::fmt::Debug) -> ! {
    panic!("frugal-cuda: {what} for {device:?} failed: {e:?}")
}

impl DeviceService for FrugalCudaServer {
    fn init(device_id: DeviceId) -> Self {
        let device = FrugalCudaDevice::from_id(device_id);
        // Setup failures (no driver, no such device) cannot be returned from `init`; the
        // public constructors check them first and return errors (see `super::device_count`).
        cudarc::driver::result::init().unwrap_or_else(|e| fail("cuInit", &device, e));
        let handle = cudarc::driver::result::device::get(device.index as i32)
            .unwrap_or_else(|e| fail("cuDeviceGet", &device, e));
        // SAFETY: read-only attribute queries of a valid device handle.
        let attribute = |attr| unsafe {
            cudarc::driver::result::device::get_attribute(handle, attr)
                .unwrap_or_else(|e| fail("cuDeviceGetAttribute", &device, e))
        };
        let arch_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let arch_version =
            (arch_major * 10 + attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)) as u32;
        let arch = CudaArchitecture {
            version: arch_version,
        };
        let wmma = CudaWmmaCompiler::supported_wmma_combinations(&arch);
        let mma = CudaWmmaCompiler::supported_mma_combinations(&arch);
        let scaled_mma = CudaWmmaCompiler::supported_scaled_mma_combinations(&arch);

        // SAFETY: the primary context of a valid device, made current for this thread.
        let context = unsafe {
            let ctx = cudarc::driver::result::primary_ctx::retain(handle)
                .unwrap_or_else(|e| fail("cuDevicePrimaryCtxRetain", &device, e));
            cudarc::driver::result::ctx::set_current(ctx)
                .unwrap_or_else(|e| fail("cuCtxSetCurrent", &device, e));
            ctx
        };

        let device_memory = CudaDeviceMemory::new(handle, device.index as i32)
            .unwrap_or_else(|e| fail("reading the memory properties", &device, e));
        let total = crate::allocator::DeviceMemory::total_memory(&device_memory);
        let mem_properties = MemoryDeviceProperties {
            max_page_size: total / 4,
            alignment: PITCH_ALIGNMENT,
        };

        let mut options = CompilationOptions {
            supports_features: CppSupportedFeatures {
                fast_math: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let warp_size = attribute(CU_DEVICE_ATTRIBUTE_WARP_SIZE) as u32;
        options.warp_size = warp_size;
        let hardware = HardwareProperties {
            load_width: 128,
            plane_size_min: warp_size,
            plane_size_max: warp_size,
            max_bindings: BINDING_SLOTS as u32,
            max_shared_memory_size: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                as usize,
            max_cube_count: (
                attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) as u32,
                attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) as u32,
                attribute(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z) as u32,
            ),
            max_units_per_cube: attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) as u32,
            max_cube_dim: (
                attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) as u32,
                attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) as u32,
                attribute(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) as u32,
            ),
            num_streaming_multiprocessors: Some(
                attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32,
            ),
            num_tensor_cores: tensor_cores_per_sm(arch_version),
            min_tensor_cores_dim: if wmma.is_empty() { None } else { Some(8) },
            num_cpu_cores: None,
            max_vector_size: VectorSize::MAX,
        };

        let mut props = DeviceProperties::new(
            Default::default(),
            mem_properties.clone(),
            hardware,
            TimingMethod::System,
        );
        register_features(&mut props, &mut options, arch_version, arch_major);
        register_wmma_features(wmma, &mut props);
        register_mma_features(mma, &mut props);
        register_scaled_mma_features(scaled_mma, &mut props);

        let logger = Arc::new(ServerLogger::default());
        let allocator = CachingAllocator::with_config(device_memory, allocator_config());
        let registry = HandleRegistry::new(allocator, logger.clone());
        let control = Arc::new(MemoryControl::default());
        let ctx = KernelContext::new(options, props.clone(), context, arch);
        let policy = PitchedMemoryLayoutPolicy::new(props.memory.alignment as usize);
        let utilities = ServerUtilities::new(props, logger, control.clone(), policy);
        FrugalCudaServer::new(
            device_id,
            ctx,
            registry,
            &mem_properties,
            control,
            utilities,
        )
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        cubecl_runtime::server::ComputeServer::utilities(self) as ServerUtilitiesHandle
    }
}

/// Requests of at least this many MiB get expandable segments of their own on the device
/// (see [`allocator_config`]).
pub const HUGE_THRESHOLD_MIB: u64 = 32;

/// The allocator's configuration on a device: the allocator's defaults, with requests of at
/// least [`HUGE_THRESHOLD_MIB`] in their own expandable segments ([`Pool::Huge`]). Measured on
/// the reference GPT step (H100, 14 steps): without it, reserved bytes crept up by whole
/// 128 MiB logits buffers while 48–96 MiB blocks split their holes, to 1.164x the peak of
/// live bytes; with it, 1.063x (64 MiB: 1.096x). `FRUGAL_CUDA_HUGE_THRESHOLD_MIB=<n>` sets
/// another threshold, `0` turns the huge pool off; an unparsable value is reported and
/// ignored.
///
/// [`Pool::Huge`]: crate::allocator::Pool::Huge
fn allocator_config() -> AllocatorConfig {
    let mut config = AllocatorConfig {
        huge_threshold: Some(HUGE_THRESHOLD_MIB << 20),
        ..AllocatorConfig::default()
    };
    if let Ok(value) = std::env::var("FRUGAL_CUDA_HUGE_THRESHOLD_MIB") {
        match value.trim().parse::<u64>() {
            Ok(0) => config.huge_threshold = None,
            Ok(mib) => config.huge_threshold = Some(mib << 20),
            Err(_) => log::warn!(
                "FRUGAL_CUDA_HUGE_THRESHOLD_MIB={value:?} ignored: expected a whole number of MiB (0: no huge pool)"
            ),
        }
    }
    config
}

/// The type, atomic and instruction features of an `sm_{arch_version}` device, as cubecl-cuda
/// registers them.
fn register_features(
    props: &mut DeviceProperties,
    options: &mut CompilationOptions,
    arch_version: u32,
    arch_major: i32,
) {
    register_supported_types(props);
    props.register_type_usage(ElemType::Float(FloatKind::TF32), TypeUsage::Conversion);
    let atomic = |ty: FloatKind, vector: usize| {
        let t = Type::new(StorageType::Atomic(ElemType::Float(ty)));
        if vector > 1 {
            t.with_vector_size(vector)
        } else {
            t
        }
    };
    if arch_version >= 60 {
        props.register_atomic_type_usage(
            atomic(FloatKind::F64, 1),
            AtomicUsage::Add | AtomicUsage::LoadStore,
        );
    }
    if arch_version >= 70 {
        props.register_atomic_type_usage(
            atomic(FloatKind::F16, 1),
            AtomicUsage::Add | AtomicUsage::LoadStore,
        );
        props.register_atomic_type_usage(
            atomic(FloatKind::F16, 2),
            AtomicUsage::Add | AtomicUsage::LoadStore,
        );
        props.register_semantic_type(SemanticType::Pipeline);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Unit), TypeUsage::Buffer);
        props.register_type_usage(OpaqueType::Barrier(BarrierLevel::Cube), TypeUsage::Buffer);
        props.features.plane.insert(Plane::Sync);
        options.supports_features.grid_constants = true;
    }
    if arch_version >= 75 {
        props
            .features
            .matmul
            .ldmatrix
            .insert(ElemType::Float(FloatKind::F16).into());
        props
            .features
            .matmul
            .ldmatrix
            .insert(ElemType::Float(FloatKind::BF16).into());
        options.supports_features.fast_tanh = CUDA_VERSION >= 12080;
    }
    if arch_version >= 80 {
        props.features.copy_async = true;
    }
    if arch_version >= 89 {
        for kind in [FloatKind::E4M3, FloatKind::E5M2] {
            props.register_type_usage(
                ElemType::Float(kind),
                TypeUsage::Conversion | TypeUsage::Buffer,
            );
        }
    }
    if arch_version >= 90 {
        props.features.tma.insert(Tma::Base);
        props.register_semantic_type(SemanticType::TensorMap);
        props.features.cube_cluster = true;
        options.supports_features.clusters = true;
        options.supports_features.elect_sync = true;
        props
            .features
            .matmul
            .stmatrix
            .insert(ElemType::Float(FloatKind::F16).into());
        props
            .features
            .matmul
            .stmatrix
            .insert(ElemType::Float(FloatKind::BF16).into());
        props.register_atomic_type_usage(
            atomic(FloatKind::F32, 2),
            AtomicUsage::LoadStore | AtomicUsage::Add,
        );
        props.register_atomic_type_usage(
            atomic(FloatKind::F32, 4),
            AtomicUsage::LoadStore | AtomicUsage::Add,
        );
    }
    if arch_version >= 100 {
        props.features.tma.insert(Tma::Im2colWide);
    }
    if (10..=12).contains(&arch_major) {
        props.register_type_usage(ElemType::Float(FloatKind::E2M1), TypeUsage::Conversion);
        props.register_type_usage(
            StorageType::Packed(ElemType::Float(FloatKind::E2M1), 2),
            TypeUsage::Conversion | TypeUsage::Buffer,
        );
        for kind in [FloatKind::E2M3, FloatKind::E3M2, FloatKind::UE8M0] {
            props.register_type_usage(
                ElemType::Float(kind),
                TypeUsage::Conversion | TypeUsage::Buffer,
            );
        }
        if CUDA_VERSION >= 12080 {
            props.features.tma.insert(Tma::SwizzleAtomicity);
        }
    }
    props.features.memory_reinterpret = true;
    props.features.alignment = true;
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::NonUniformControlFlow);
}
