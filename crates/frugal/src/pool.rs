//! The device pool's own figures, for inner backends built on CubeCL runtimes.
//!
//! The ledger counts the bytes tensors need; a CubeCL pool also holds padding and pages it
//! has reserved but not handed out. Reading the pool is a blocking round trip to the device
//! server, so it is done only when a report asks for it, never per op.

use serde::Serialize;

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

/// Reads the pool of `device` if its type belongs to a CubeCL runtime this build knows
/// (features `cuda`, `wgpu`, `frugal-cuda`: for the latter, `bytes_reserved` is
/// its allocator's); `None` for other devices (NdArray, Flex, ...).
pub fn pool_usage<D: 'static>(device: &D) -> Option<PoolUsage> {
    #[allow(unused_variables)]
    let any = device as &dyn std::any::Any;
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) = any.downcast_ref::<frugal_cuda::FrugalCudaDevice>() {
        return read::<frugal_cuda::FrugalCudaRuntime>(device);
    }
    #[cfg(feature = "cuda")]
    if let Some(device) = any.downcast_ref::<cubecl::cuda::CudaDevice>() {
        return read::<cubecl::cuda::CudaRuntime>(device);
    }
    #[cfg(feature = "wgpu")]
    if let Some(device) = any.downcast_ref::<cubecl::wgpu::WgpuDevice>() {
        return read::<cubecl::wgpu::WgpuRuntime>(device);
    }
    None
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn read<R: cubecl::Runtime>(device: &R::Device) -> Option<PoolUsage> {
    let usage = R::client(device).memory_usage().ok()?;
    Some(PoolUsage {
        bytes_in_use: usage.bytes_in_use,
        bytes_padding: usage.bytes_padding,
        bytes_reserved: usage.bytes_reserved,
        allocations: usage.number_allocs,
    })
}
