//! What the GPU behind a device has: free and total memory as the driver reports them, what
//! this process's pool for the device holds, and frugal-cuda's cap. Read for an automatic
//! budget, never per op (each read is a driver call and a round trip to the device server).

use serde::Serialize;

/// The memory of the GPU behind a device, read at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Bytes the driver reports free on the GPU (`cuMemGetInfo`), for every process.
    pub free: u64,
    /// Bytes of memory the GPU has.
    pub total: u64,
    /// Bytes this process's pool for the device holds from it, used or not.
    pub reserved: u64,
    /// Bytes of live buffers in that pool.
    pub in_use: u64,
    /// frugal-cuda's cap on reserved bytes, if one is set.
    pub cap: Option<u64>,
    /// Which pool holds the device's memory: `"burn-cuda"` (CubeCL's) or `"frugal-cuda"`.
    pub runtime: &'static str,
}

impl DeviceMemory {
    /// Bytes the pool may hold at most: what it holds now plus what is free on the GPU,
    /// limited by the cap.
    pub fn usable(&self) -> u64 {
        let device = self.free.saturating_add(self.reserved);
        self.cap.map_or(device, |cap| cap.min(device))
    }
}

/// Reads the memory of the GPU behind `device`; `None` for devices without one this build
/// knows (NdArray, Flex, wgpu), `Some(Err)` naming the driver's error when it cannot be read.
pub fn device_memory<D: 'static>(device: &D) -> Option<Result<DeviceMemory, String>> {
    #[allow(unused_variables)]
    let any = device as &dyn std::any::Any;
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) = any.downcast_ref::<frugal_cuda::FrugalCudaDevice>() {
        let report = frugal_cuda::memory_report(device);
        return Some(
            driver_free_total(device.index).map(|(free, total)| DeviceMemory {
                free,
                total,
                reserved: report.stats.reserved_bytes,
                in_use: report.bytes_in_use,
                cap: report.stats.cap,
                runtime: "frugal-cuda",
            }),
        );
    }
    #[cfg(feature = "cuda")]
    if let Some(cuda) = any.downcast_ref::<cubecl::cuda::CudaDevice>() {
        let pool = super::pool_usage(device).unwrap_or_default();
        return Some(
            driver_free_total(cuda.index).map(|(free, total)| DeviceMemory {
                free,
                total,
                reserved: pool.bytes_reserved,
                in_use: pool.bytes_in_use,
                cap: None,
                runtime: "burn-cuda",
            }),
        );
    }
    None
}

/// `cuMemGetInfo` on the primary context of GPU `ordinal`, the context CubeCL's CUDA runtime
/// and frugal-cuda both run in (retaining it keeps it alive; it is not released, as the
/// runtime holds it for the whole process anyway).
#[cfg(feature = "cuda")]
fn driver_free_total(ordinal: usize) -> Result<(u64, u64), String> {
    use cudarc::driver::result;
    let failed = |what: &str, e: result::DriverError| format!("CUDA {what} failed: {e:?}");
    result::init().map_err(|e| failed("cuInit", e))?;
    let gpu = result::device::get(ordinal as i32).map_err(|e| failed("cuDeviceGet", e))?;
    // One retain per GPU and process, so repeated reads do not pile up references.
    static RETAINED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());
    let mut retained = RETAINED.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = match retained.iter().find(|(gpu, _)| *gpu == ordinal) {
        Some(&(_, ctx)) => ctx as cudarc::driver::sys::CUcontext,
        None => {
            // SAFETY: `gpu` is a valid device handle.
            let ctx = unsafe { result::primary_ctx::retain(gpu) }
                .map_err(|e| failed("cuDevicePrimaryCtxRetain", e))?;
            retained.push((ordinal, ctx as usize));
            ctx
        }
    };
    // SAFETY: the primary context stays retained for the process, so it is valid while
    // current on this thread.
    unsafe { result::ctx::set_current(ctx) }.map_err(|e| failed("cuCtxSetCurrent", e))?;
    let (free, total) = result::mem_get_info().map_err(|e| failed("cuMemGetInfo", e))?;
    Ok((free as u64, total as u64))
}
