//! frugal-cuda's out-of-memory handler as Frugal uses it: which tensors may be dropped from
//! inside an allocation, and installing the handler on a device.
//!
//! The handler runs on the device's own thread, in the middle of the allocation that failed,
//! possibly while that thread executes a fused kernel. Dropping an unfused frugal-cuda tensor
//! there only lowers the count of its memory handle, which the pool reads at its next cleanup
//! (the allocator's retry). Dropping a fused tensor queues a drop operation for fusion's
//! server, which lives on that same thread and is busy: so fused tensors are never dropped
//! from the handler.

/// Whether dropping a tensor primitive of type `P` gives its device memory back at once, with
/// no call to the device: true only for frugal-cuda's unfused tensors (see the module's
/// documentation).
#[cfg_attr(
    not(feature = "frugal-cuda"),
    allow(clippy::extra_unused_type_parameters)
)]
pub(crate) fn drop_frees_at_once<P: 'static>() -> bool {
    #[cfg(feature = "frugal-cuda")]
    {
        use std::any::TypeId;
        TypeId::of::<P>()
            == TypeId::of::<burn_cubecl::tensor::CubeTensor<frugal_cuda::FrugalCudaRuntime>>()
    }
    #[cfg(not(feature = "frugal-cuda"))]
    false
}

/// What Frugal runs when a frugal-cuda allocation fails: given the bytes asked for, frees
/// what it can without device work and returns the bytes freed.
pub(crate) type OomRescue = Box<dyn FnMut(u64) -> u64 + Send>;

/// Installs `rescue` as the out-of-memory handler of `device` if it is a frugal-cuda device,
/// or removes Frugal's handler (`None`); whether `device` is one. The allocator retries the
/// allocation once after a rescue that freed something.
pub(crate) fn set_oom_rescue<D: 'static>(device: &D, rescue: Option<OomRescue>) -> bool {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        match rescue {
            Some(mut rescue) => {
                frugal_cuda::set_oom_handler(device, move |info| rescue(info.rounded) > 0)
            }
            None => frugal_cuda::clear_oom_handler(device),
        }
        return true;
    }
    let _ = (device, rescue);
    false
}
