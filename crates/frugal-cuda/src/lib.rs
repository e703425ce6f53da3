//! # frugal-cuda
//!
//! A CubeCL runtime for NVIDIA GPUs whose device memory is a caching allocator of our own, so
//! that what the device reserves stays close to what tensors use, and a cap, a growth limit, an
//! out-of-memory handler and PyTorch-style memory snapshots are available to Frugal.
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
//!   the segments, blocks and trace behind a PyTorch memory_viz file), and
//!   [`set_launch_timing`] for the device time of every kernel, product and copy of a step.
//!   With feature `distributed` (off by default), Burn's data-parallel training: all-reduce
//!   and GPU-to-GPU copies through NCCL, loaded at run time.
//! - [`kernel_cache`]: compiled kernels on disk, so a second process skips NVRTC.
//! - [`gemm`](mod@gemm): matrix products on cuBLASLt (the shapes here; the call, `matmul()`, with
//!   feature `cuda`).
//!
//! # Example: the allocator on a simulated device
//!
//! The allocator is plain Rust over the [`allocator::DeviceMemory`] trait, so its behaviour can
//! be tried (and is tested) without a GPU:
//!
//! ```
//! use frugal_cuda::allocator::{AllocError, CachingAllocator, OomReason, SimulatedDevice};
//!
//! // A 64 MiB device that only keeps books: no driver, no GPU.
//! let mut allocator = CachingAllocator::new(SimulatedDevice::new().with_capacity(64 << 20));
//!
//! // Requests are rounded up to 512 B; small ones share 2 MiB segments of their own pool.
//! let small = allocator.alloc(1000)?;
//! assert_eq!(small.size(), 1024);
//! let big = allocator.alloc(24 << 20)?;
//!
//! // A freed block stays cached and serves the next request that fits without the driver.
//! allocator.dealloc(big)?;
//! let big = allocator.alloc(24 << 20)?;
//! let stats = allocator.stats();
//! assert_eq!(stats.cache_hits, 1);
//! assert_eq!(stats.allocated_bytes, 1024 + (24 << 20));
//! assert_eq!(stats.reserved_bytes, (2 << 20) + (24 << 20));
//!
//! // A cap on reserved bytes makes a request beyond it fail, with the reason, not panic.
//! allocator.set_cap(Some(32 << 20))?;
//! let refused = allocator.alloc(16 << 20);
//! assert!(matches!(refused, Err(AllocError::OutOfMemory { reason: OomReason::Cap, .. })));
//!
//! allocator.dealloc(big)?;
//! allocator.dealloc(small)?;
//! assert_eq!(allocator.stats().allocated_bytes, 0);
//! # Ok::<(), AllocError>(())
//! ```
//!
//! # Example: a GPU
//!
//! With feature `cuda`, Frugal wraps [`FrugalCuda`] as it wraps `burn::backend::Cuda`
//! (`Autodiff<Frugal<FrugalCuda>>`), and the same allocator serves the device. Not run here,
//! as it needs an NVIDIA GPU and its driver (and it compiles only with feature `cuda`):
//!
//! ```no_run
//! # #[cfg(feature = "cuda")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use frugal_cuda::{FrugalCudaDevice, check_device, memory_report, set_memory_cap};
//!
//! let device = FrugalCudaDevice::new(0);
//! check_device(&device)?; // an error, not a panic, where there is no such GPU
//! set_memory_cap(&device, Some(20 << 30))?; // never reserve more than 20 GiB
//! // ... run a Burn model on `FrugalCuda` with this device ...
//! let stats = memory_report(&device).stats;
//! println!("peak reserved: {} B", stats.peak_reserved_bytes);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "cuda"))]
//! # fn main() {}
//! ```
#![cfg_attr(
    not(feature = "cuda"),
    doc = "
# Without feature `cuda`

These docs were built without feature `cuda`, so the runtime's items named above
(`FrugalCudaRuntime`, `FrugalCuda`, `FrugalCudaUnfused`, `memory_report`, `set_memory_cap`,
`set_oom_handler`, `allocator_history`, ...) are absent. `cargo doc -p frugal-cuda --features
cuda` documents them; it builds without a GPU or CUDA toolkit, as the driver is loaded at run
time.

[`FrugalCudaRuntime`]: #without-feature-cuda
[`FrugalCuda`]: #without-feature-cuda
[`FrugalCudaUnfused`]: #without-feature-cuda
[`memory_report`]: #without-feature-cuda
[`set_memory_cap`]: #without-feature-cuda
[`set_oom_handler`]: #without-feature-cuda
[`allocator_history`]: #without-feature-cuda
[`set_launch_timing`]: #without-feature-cuda
"
)]
#![warn(missing_docs)]

pub mod allocator;
pub mod gemm;
pub mod kernel_cache;
pub mod miss_rule;
pub mod storage;

// The runtime's cache of kernel metadata on the device: plain logic over CubeCL handles, so
// it is tested without a GPU.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod launch_metadata;

// Host memory faulted in on several threads before it is pinned for transfers: plain memory
// and threads, so it is tested without a GPU.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod host_pages;

#[cfg(feature = "cuda")]
mod cuda;

#[cfg(feature = "cuda")]
pub use cuda::{
    COMPILE_THREADS_ENV, CompileWaitCause, CompileWaits, CudaDeviceMemory, DeviceUnavailable,
    FrugalCuda, FrugalCudaDevice, FrugalCudaRuntime, FrugalCudaServer, FrugalCudaUnfused,
    HeldDeviceMemory, KernelLoads, LaunchTimings, LaunchTotal, MemoryReport, NVRTC_OPTIONS_ENV,
    PRECOMPILED_HEADERS_ENV, allocator_history, allocator_snapshot, blas_available, check_device,
    clear_oom_handler, compile_waits, device_count, hold_device_memory, kernel_loads, mark_step,
    matmul, memory_report, nccl_available, record_allocation_trace, reset_peak_memory,
    set_growth_limit, set_launch_timing, set_memory_cap, set_miss_time_share, set_oom_handler,
    take_launch_timings, tf32_cores, upload, write_allocation_trace,
};
