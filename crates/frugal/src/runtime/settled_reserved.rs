//! What frugal-cuda's allocator reserved in the settled steps of a budget's plan, beside the
//! growth limit each began under: the bound known before those steps ran.

use serde::Serialize;

/// Reserved bytes in the settled steps that began with no growth-limit raise on trial, since
/// the allocator's peaks were last reset (frugal-cuda marks them; see
/// `frugal_cuda::mark_step`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SettledReserved {
    /// The most bytes reserved in one of those steps.
    pub peak_reserved: u64,
    /// The growth limit that step began under: what it was to reserve at most, unless
    /// reusing cached memory could not serve an allocation.
    pub limit: u64,
    /// Those steps that reserved past the limit they began under.
    pub steps_over_limit: u64,
}

/// The settled steps' reserved bytes on `device`; `None` on other devices than frugal-cuda's,
/// and where no settled step has ended since the peaks were reset.
pub fn settled_reserved<D: 'static>(device: &D) -> Option<SettledReserved> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let counters = frugal_cuda::memory_report(device).registry;
        return (counters.settled_peak_reserved_bytes > 0).then_some(SettledReserved {
            peak_reserved: counters.settled_peak_reserved_bytes,
            limit: counters.settled_peak_limit_bytes,
            steps_over_limit: counters.settled_steps_over_limit,
        });
    }
    let _ = device;
    None
}
