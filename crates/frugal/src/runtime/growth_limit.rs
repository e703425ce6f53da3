//! frugal-cuda's growth limit as the budget sets it: the reserved bytes beyond which its
//! allocator reuses cached memory before asking the device for more.

/// Sets the growth limit of `device` (`None`: none) if it is a frugal-cuda device; whether it
/// is one.
pub(crate) fn set_growth_limit<D: 'static>(device: &D, limit: Option<u64>) -> bool {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::set_growth_limit(device, limit);
        return true;
    }
    let _ = (device, limit);
    false
}
