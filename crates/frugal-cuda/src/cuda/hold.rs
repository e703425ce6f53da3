//! Device memory held outside every pool, as another process on the GPU would hold it: a way
//! to see how a run copes when memory is taken from it mid-run.

use cudarc::driver::result;
use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr};

/// Bytes of device memory allocated straight from the driver, given back when dropped.
#[derive(Debug)]
pub struct HeldDeviceMemory {
    device: CUdevice,
    context: CUcontext,
    pointer: CUdeviceptr,
    bytes: u64,
}

impl HeldDeviceMemory {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Allocates `bytes` on GPU `index` from the driver (`cuMemAlloc` in its primary context), past
/// the pools of burn-cuda and frugal-cuda, which then find that much less free. An error names
/// the size and what the driver said.
pub fn hold_device_memory(index: usize, bytes: u64) -> Result<HeldDeviceMemory, String> {
    let fail = |what: &str, e: cudarc::driver::DriverError| {
        format!("cannot hold {bytes} B on GPU {index}: {what}: {e:?}")
    };
    result::init().map_err(|e| fail("cuInit", e))?;
    let device = result::device::get(index as i32).map_err(|e| fail("cuDeviceGet", e))?;
    // SAFETY: a valid device handle; the context is released in `drop`.
    let context = unsafe { result::primary_ctx::retain(device) }
        .map_err(|e| fail("cuDevicePrimaryCtxRetain", e))?;
    // SAFETY: the context was just retained.
    let pointer = unsafe { result::ctx::set_current(context) }
        .and_then(|()| unsafe { result::malloc_sync(bytes as usize) })
        .map_err(|e| {
            // SAFETY: balances the retain above.
            let _ = unsafe { result::primary_ctx::release(device) };
            fail("cuMemAlloc", e)
        })?;
    Ok(HeldDeviceMemory {
        device,
        context,
        pointer,
        bytes,
    })
}

impl Drop for HeldDeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `cuMemAlloc` in this context, which is still retained.
        unsafe {
            let _ = result::ctx::set_current(self.context);
            let _ = result::free_sync(self.pointer);
            let _ = result::primary_ctx::release(self.device);
        }
    }
}
