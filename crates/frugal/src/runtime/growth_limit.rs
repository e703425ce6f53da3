//! frugal-cuda's growth limit as the budget sets it: the reserved bytes beyond which its
//! allocator reuses cached memory before asking the device for more, and the steps it is
//! judged on.

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

/// What marks a training step on `device` for its allocator (told whether it is settled), if
/// it is a frugal-cuda device: the allocator then judges whether its misses took too much of
/// the settled step before (see `frugal_cuda::mark_step`) and raises the growth limit if so.
pub(crate) fn step_mark<D: Clone + Send + Sync + 'static>(
    device: &D,
) -> Option<Box<dyn Fn(bool) + Send + Sync>> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let device = *device;
        return Some(Box::new(move |settled| {
            frugal_cuda::mark_step(&device, settled)
        }));
    }
    let _ = device;
    None
}
