//! # frugal-cuda
//!
//! A CubeCL runtime for NVIDIA GPUs whose device memory is a caching allocator of our own, so
//! that what the device reserves stays close to what tensors use (issue 6).
//!
//! - [`allocator`]: the caching allocator — size rounding, best fit over cached free blocks,
//!   block splitting and coalescing, separate small and large pools, expandable segments (one
//!   virtual range per segment, physical granules mapped as it grows), a hard byte cap
//!   changeable at run time, an out-of-memory handler tried before failing, and statistics. Its
//!   whole logic runs on [`allocator::SimulatedDevice`] without a GPU.
//! - [`storage`]: the glue to CubeCL — CubeCL's `MemoryManagement` kept as the handle registry,
//!   the allocator below it as its `ComputeStorage`, free slots handed back on a miss.
//! - `cuda` (feature `cuda`): the runtime itself — [`FrugalCudaRuntime`], the Burn backends
//!   [`FrugalCuda`] (fused, the counterpart of `burn::backend::Cuda`) and [`FrugalCudaUnfused`],
//!   the driver implementation of [`allocator::DeviceMemory`], and the memory API
//!   ([`memory_report`], [`set_memory_cap`], [`set_oom_handler`], [`allocator_history`] for
//!   the segments, blocks and trace behind a PyTorch memory_viz file).
//! - [`kernel_cache`]: compiled kernels on disk, so a second process skips NVRTC.
//! - [`gemm`](mod@gemm): matrix products on cuBLASLt (the shapes here; the call, `matmul()`, with
//!   feature `cuda`).

#![warn(missing_docs)]

pub mod allocator;
pub mod gemm;
pub mod kernel_cache;
pub mod storage;

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(feature = "cuda")]
pub use cuda::{
    CudaDeviceMemory, DeviceUnavailable, FrugalCuda, FrugalCudaDevice, FrugalCudaRuntime,
    FrugalCudaServer, FrugalCudaUnfused, KernelLoads, MemoryReport, allocator_history,
    allocator_snapshot, blas_available, check_device, clear_oom_handler, device_count,
    kernel_loads, matmul, memory_report, record_allocation_trace, reset_peak_memory,
    set_growth_limit, set_memory_cap, set_oom_handler, upload, write_allocation_trace,
};
