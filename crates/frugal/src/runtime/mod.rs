//! Layer 2, the CubeCL runtimes this build knows (features `cuda`, `wgpu`, `frugal-cuda`):
//! the one place that lists them, for the code that finds a CubeCL primitive or device behind
//! a generic type, and the device pool's own figures.
//!
//! Owns: the runtime list ([`each_runtime!`]), [`pool_usage`], [`device_memory()`] (the
//! driver's free and total bytes, for an automatic budget), [`allocator_view()`] (frugal-cuda's
//! segments, blocks and allocator trace, for the memory_viz file), the host's available
//! memory ([`available_host_memory`], which bounds offloads), what frugal-cuda reserved in a
//! plan's settled steps beside the growth limit they began under ([`settled_reserved()`]),
//! and frugal-cuda's out-of-memory
//! handler and growth limit as the budget sets them (`oom_rescue.rs`, `growth_limit.rs`). Imports nothing from the
//! crate. Reading a pool is a blocking round trip to the device server, so it is done only
//! when a report asks for it, never per op.

use serde::Serialize;

mod allocator_view;
mod device_memory;
mod growth_limit;
mod host_memory;
mod oom_rescue;
mod settled_reserved;
pub use allocator_view::{
    AllocatorBlock, AllocatorEvent, AllocatorSegment, AllocatorView, allocator_view,
};
pub use device_memory::{DeviceMemory, device_memory};
pub(crate) use growth_limit::{set_growth_limit, step_mark};
pub use host_memory::available_host_memory;
pub(crate) use oom_rescue::{OomRescue, drop_frees_at_once, set_oom_rescue};
pub use settled_reserved::{SettledReserved, settled_reserved};

/// What a CubeCL device pool reports about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PoolUsage {
    /// Bytes of live allocations, without padding.
    pub bytes_in_use: u64,
    /// Bytes of padding inside live allocations.
    pub bytes_padding: u64,
    /// Bytes the pool holds from the device, used or not.
    pub bytes_reserved: u64,
    /// Number of live allocations.
    pub allocations: u64,
}

/// Calls `$f::<R>(args)` for each CubeCL runtime whose kernels this build runs (features
/// `cuda`, `frugal-cuda`, `wgpu`), in that order, and returns the first `Some` (`None` if none
/// matched or no runtime is built in). `$f` typically downcasts a `dyn Any` to one of `R`'s
/// types, so the runtimes' types must differ (frugal-cuda's are its own, though its kernels
/// are CubeCL's CUDA ones).
macro_rules! each_runtime {
    ($f:ident($($arg:expr),* $(,)?)) => {{
        #[allow(unused_mut)]
        let mut found = None;
        #[cfg(feature = "cuda")]
        if found.is_none() {
            found = $f::<cubecl::cuda::CudaRuntime>($($arg),*);
        }
        #[cfg(feature = "frugal-cuda")]
        if found.is_none() {
            found = $f::<frugal_cuda::FrugalCudaRuntime>($($arg),*);
        }
        #[cfg(feature = "wgpu")]
        if found.is_none() {
            found = $f::<cubecl::wgpu::WgpuRuntime>($($arg),*);
        }
        #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
        let _ = ($(&$arg),*);
        found
    }};
}
#[allow(unused_imports)]
pub(crate) use each_runtime;

/// Reads the pool of `device` if its type belongs to a CubeCL runtime this build knows
/// (features `cuda`, `wgpu`, `frugal-cuda`: for the latter, `bytes_reserved` is
/// its allocator's); `None` for other devices (NdArray, Flex, ...).
pub fn pool_usage<D: 'static>(device: &D) -> Option<PoolUsage> {
    #[allow(unused_variables)]
    let any = device as &dyn std::any::Any;
    each_runtime!(read(any))
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn read<R: cubecl::Runtime>(any: &dyn std::any::Any) -> Option<PoolUsage> {
    let device = any.downcast_ref::<R::Device>()?;
    let usage = R::client(device).memory_usage().ok()?;
    Some(PoolUsage {
        bytes_in_use: usage.bytes_in_use,
        bytes_padding: usage.bytes_padding,
        bytes_reserved: usage.bytes_reserved,
        allocations: usage.number_allocs,
    })
}
