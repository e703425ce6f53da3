//! The public memory API, keyed by device, with names a PyTorch user would guess:
//! `live_bytes` is `torch.cuda.memory_allocated`, `peak_bytes` is `max_memory_allocated`,
//! `report` is `memory_summary`, `snapshot` is `memory._snapshot`.
//!
//! The figures count every buffer held by a tensor of `Frugal<_>` on the device, once, at its
//! logical size (elements × dtype size). Views (reshape, transpose, permute, swap_dims, slice,
//! expand, detach) share their input's record. Where this can differ from the device's own
//! count: allocator padding and reserved pages are not tensor bytes (see [`PoolUsage`]);
//! when an inner backend copies for a view op (e.g. reshaping a non-contiguous tensor) while
//! the source is still held elsewhere, the copy is not counted; and when it reuses an input
//! buffer in place, the ledger counts input and output both until the op returns.

use burn_backend::DeviceOps;
use burn_core::module::{Module, ModuleVisitor, Param};
use burn_core::tensor::Tensor;
use burn_core::tensor::backend::{AutodiffBackend, Backend};
use burn_optim::GradientsParams;

use crate::backend::Frugal;
use crate::device::DeviceState;
use crate::engine::Reclaim;
pub use crate::engine::{EvictionMode, Policy, RematStats};
pub use crate::ledger::{Event, EventKind, Phase, Role, RoleBytes};
pub use crate::report::{Holder, MemoryReport, PeakHolders, Snapshot};
use crate::runtime::{self, OomRescue, set_oom_rescue};
pub use crate::runtime::{
    DeviceMemory, PoolUsage, SettledReserved, device_memory, pool_usage, settled_reserved,
};
pub use crate::units::{format_bytes, parse_bytes};

/// Bytes of live tensor storage on `device`.
pub fn live_bytes<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.live_bytes()
}

/// Highest [`live_bytes`] since the process started or [`reset_peak`] was last called.
pub fn peak_bytes<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.bytes().peak()
}

/// Number of live buffers on `device` (views of one buffer count once).
pub fn live_tensors<D: DeviceOps + 'static>(device: &D) -> u64 {
    DeviceState::of_device(device).ledger.buffers().current()
}

/// Sets the peak to the current live bytes, to measure the peak of what follows.
pub fn reset_peak<D: DeviceOps + 'static>(device: &D) {
    DeviceState::of_device(device).ledger.reset_peak()
}

/// A summary of `device`: live and peak bytes, buffer counts, the biggest holders by op, and
/// the CubeCL pool's own figures where the device has one. Print it with `{}`.
///
/// The pool figures are read as they are: call `B::sync(device)` first for settled numbers.
pub fn report<D: DeviceOps + 'static>(device: &D) -> MemoryReport {
    MemoryReport::of(
        DeviceState::of_device(device),
        pool_usage(device),
        settled_reserved(device),
    )
}

/// The ops whose outputs hold `device`'s live bytes now, biggest first. Reads the ledger's
/// counters only (no lock, no device call), so a panic hook can call it while the tensors of a
/// failing step are still alive; the same list as [`report`]'s `holders`.
pub fn holders<D: DeviceOps + 'static>(device: &D) -> Vec<Holder> {
    Holder::of(DeviceState::of_device(device))
}

/// The report plus the recorded timeline (see [`record_timeline`]), exportable as JSON.
pub fn snapshot<D: DeviceOps + 'static>(device: &D) -> Snapshot {
    let state = DeviceState::of_device(device);
    let report = MemoryReport::of(state, pool_usage(device), settled_reserved(device));
    let allocator = crate::runtime::allocator_view(device);
    state.ledger.with_timeline(|timeline| Snapshot {
        report,
        events: timeline.events.iter().cloned().collect(),
        dropped_events: timeline.dropped,
        allocator,
    })
}

/// Starts recording allocation, free and mark events on `device`, keeping the last `capacity`
/// of them; `0` stops recording. Clears earlier events. Recording costs a lock and a small
/// allocation per event, so it is off until asked for.
pub fn record_timeline<D: DeviceOps + 'static>(device: &D, capacity: usize) {
    DeviceState::of_device(device).ledger.set_timeline(capacity)
}

/// Adds a labelled mark to the timeline of `device` (when recording), e.g. between the
/// forward and backward passes, so plots can show the phases.
pub fn mark<D: DeviceOps + 'static>(device: &D, label: &str) {
    DeviceState::of_device(device).ledger.mark(label)
}

/// Sets the phase of the training step on `device`: buffers made from now on get its role
/// ([`Phase::role`]), so that [`live_by_role`] and the report split live bytes into
/// parameters, gradients, optimizer state, activations and other. Call it before the forward
/// pass, before `backward()` and before the optimizer step, then [`tag_parameters`] after the
/// step and `Phase::Outside` until the next forward pass; burn-train's `Learner` does this
/// through [`crate::train::RoleTracking`].
pub fn set_phase<D: DeviceOps + 'static>(device: &D, phase: Phase) {
    let state = DeviceState::of_device(device);
    state.ledger.set_phase(phase);
    state.budget.set_forward_phase(phase == Phase::Forward);
}

/// Live bytes of `device` per role now (see [`set_phase`]).
pub fn live_by_role<D: DeviceOps + 'static>(device: &D) -> RoleBytes {
    DeviceState::of_device(device).ledger.live_by_role()
}

/// Each role's highest live bytes on `device` since the start or [`reset_peak`] (each role's
/// own high, so they need not add up to [`peak_bytes`]).
pub fn peak_by_role<D: DeviceOps + 'static>(device: &D) -> RoleBytes {
    DeviceState::of_device(device).ledger.peak_by_role()
}

/// Tags the buffers of `module`'s float parameters as [`Role::Parameter`], through Burn's
/// `Module` visitor: the model needs no change. An optimizer step makes new parameter tensors
/// (as optimizer state, by their phase), so call it after each step.
pub fn tag_parameters<B, X, M>(module: &M)
where
    B: AutodiffBackend<InnerBackend = Frugal<X>>,
    X: Backend,
    M: Module<B>,
{
    struct Tagger;
    impl<B, X> ModuleVisitor<B> for Tagger
    where
        B: AutodiffBackend<InnerBackend = Frugal<X>>,
        X: Backend,
    {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            tag(param.val().inner(), Role::Parameter);
        }
    }
    module.visit(&mut Tagger);
}

/// Tags the buffers of `grads`, the gradients of `module`'s parameters, as
/// [`Role::Gradient`] (for loops that cannot set [`Phase::Backward`] before `backward()`).
pub fn tag_gradients<B, X, M>(module: &M, grads: &GradientsParams)
where
    B: AutodiffBackend<InnerBackend = Frugal<X>>,
    X: Backend,
    M: Module<B>,
{
    struct Tagger<'a>(&'a GradientsParams);
    impl<B, X> ModuleVisitor<B> for Tagger<'_>
    where
        B: AutodiffBackend<InnerBackend = Frugal<X>>,
        X: Backend,
    {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.get::<Frugal<X>, D>(param.id) {
                tag(grad, Role::Gradient);
            }
        }
    }
    module.visit(&mut Tagger(grads));
}

fn tag<X: Backend, const D: usize>(tensor: Tensor<Frugal<X>, D>, role: Role) {
    tensor.into_primitive().tensor().set_role(role);
}

/// Sets the memory budget of `device` in bytes (`None`: no budget), effective at once.
///
/// From then on every tensor Frugal creates on the device records how to recompute it, and
/// after each op Frugal evicts tensors (see [`Policy`]) until [`live_bytes`] is at most the
/// budget, restoring them when they are read. Tensors created before the first budget was set
/// are not evicted: set it before building the model, or its parameters stay until the first
/// optimizer step replaces them. An op whose own inputs and output hold more than the budget
/// takes live bytes over it while it runs (the learned step says so once, and
/// [`RematStats::plan_op_floor`] holds its bytes); if live bytes cannot come back within the
/// budget after an op, the op panics with a message naming the budget, the bytes it needed and
/// the biggest holders.
///
/// On a frugal-cuda device the budget also answers the allocator's out-of-memory handler:
/// when the allocator cannot grow (its cap, or the device is full), tensors the budget can
/// recompute are dropped from inside the allocation and the allocator tries again. That works
/// for unfused tensors (`frugal_cuda::FrugalCudaUnfused`) only: under fusion a drop is work
/// queued on the thread that is allocating, so nothing is dropped there. It also sets the
/// allocator's growth limit to the budget plus [`RESERVE_HEADROOM`] of it (see
/// [`set_growth_limit`]), and marks for the allocator each step that begins under the step
/// plan's cuts, and whether they had settled (`frugal_cuda::mark_step`): where misses the
/// device had to wait for took more than a share of a settled step, the allocator raises the
/// growth limit by an eighth, trading reserved bytes the device has free for the host time
/// each miss costs, and takes the raise back where the steps after it are no faster
/// (`frugal_cuda::set_miss_time_share` with `None` keeps the limit). When a settled step
/// begins after unsettled ones, the limit goes back to where the budget set it: what the
/// first steps reserved past it (kernels compiled and autotuned, the plan learned) is given
/// back to the device.
pub fn set_budget<D: DeviceOps + 'static>(device: &D, bytes: Option<u64>) {
    let state = DeviceState::of_device(device);
    match bytes {
        Some(bytes) => log::info!(
            "frugal: memory budget of {} on {device:?}",
            crate::units::format_bytes(bytes)
        ),
        None => log::info!("frugal: no memory budget on {device:?}"),
    }
    state.set_budget(bytes);
    let rescue = bytes.map(|_| -> OomRescue {
        Box::new(move |requested| state.reclaim(Reclaim::Allocation { bytes: requested }))
    });
    set_oom_rescue(device, rescue);
    state
        .budget
        .set_step_hook(bytes.and_then(|_| runtime::step_mark(device)));
    set_growth_limit(
        device,
        bytes.map(|b| b.saturating_add((b as f64 * RESERVE_HEADROOM) as u64)),
    );
}

/// The share of a budget that a frugal-cuda allocator may reserve beyond it before it reuses
/// cached memory first (see [`set_growth_limit`]): room for what the budget does not count
/// (buffers a fused kernel or a library call allocates for itself, and each tensor's rounding
/// to the allocator's block size) and for fragmentation. Below it, reserving memory is cheap;
/// above it, each allocation that finds no cached block gives back and maps memory again.
/// Where keeping to it costs the host much time in a settled step (each miss has CubeCL hand
/// back its free slots), frugal-cuda raises it (see [`set_budget`]).
pub const RESERVE_HEADROOM: f64 = 0.125;

/// Sets the soft limit on the bytes a frugal-cuda device's allocator reserves (`None`: none):
/// beyond it an allocation first reuses cached memory (the free ends of segments, then the
/// holes between live blocks, unmapped and mapped again where the request fits) and reserves
/// more only when that is not enough. It never makes an allocation fail; after it was passed
/// it rises to what was reserved. [`set_budget`] sets it to the budget plus
/// [`RESERVE_HEADROOM`]; call this after it to choose another. Returns whether `device` is a
/// frugal-cuda device (elsewhere it does nothing).
pub fn set_growth_limit<D: DeviceOps + 'static>(device: &D, bytes: Option<u64>) -> bool {
    runtime::set_growth_limit(device, bytes)
}

/// Makes a backward pass on `device` that recomputes more than `ratio` times its forward
/// pass's work (the cost model's estimates, [`RematStats::recomputed_cost`] against
/// [`RematStats::forward_cost`]) to keep the budget fail at once, as out of memory: a panic
/// whose message names the memory budget. For a loop that retries such a step with smaller
/// micro-batches (the `gpt` example does, and [`crate::MicroBatching`] follows), this ends in
/// seconds a step that would otherwise recompute the same ops for minutes. Passes are told
/// apart by the phases ([`set_phase`]): a forward op after other ops begins one. `None` (the
/// default): never.
pub fn set_recompute_limit<D: DeviceOps + 'static>(device: &D, ratio: Option<f64>) {
    DeviceState::of_device(device)
        .budget
        .set_recompute_limit(ratio);
}

/// Limits the host memory that the budget's offloads on `device` may hold to `bytes` (`None`:
/// no limit). Without a call, setting a budget limits it to 3/4 of the host memory available
/// at that moment. Past the limit a tensor that could only be offloaded stays on the device,
/// and if the budget cannot be kept the op fails with a message naming both limits.
pub fn set_host_limit<D: DeviceOps + 'static>(device: &D, bytes: Option<u64>) {
    DeviceState::of_device(device)
        .budget
        .set_host_limit(bytes, true);
}

/// The host memory the budget's offloads on `device` may hold, if limited.
pub fn host_limit<D: DeviceOps + 'static>(device: &D) -> Option<u64> {
    DeviceState::of_device(device).budget.host_limit()
}

/// The memory budget of `device`, if one is set.
pub fn budget<D: DeviceOps + 'static>(device: &D) -> Option<u64> {
    DeviceState::of_device(device).budget.limit()
}

/// Sets how `device`'s budget chooses what to evict and how.
pub fn set_policy<D: DeviceOps + 'static>(device: &D, policy: Policy) {
    DeviceState::of_device(device).budget.set_policy(policy)
}

/// The eviction policy of `device`.
pub fn policy<D: DeviceOps + 'static>(device: &D) -> Policy {
    DeviceState::of_device(device).budget.policy()
}

/// What the budget and checkpoint scopes have evicted, recomputed, offloaded and restored on
/// `device` since the process started.
pub fn remat_stats<D: DeviceOps + 'static>(device: &D) -> RematStats {
    DeviceState::of_device(device).budget.stats()
}

/// Lets the budget keep f32 tensors on `device` compressed to `dtype` (`LowPrecision::BF16` or
/// `F16`), as a third eviction action beside recomputation and offload (see
/// [`Action::Compress`](crate::Action::Compress)); `None` switches compression off (the default: it is lossy, a
/// compressed tensor reads back as its rounded value). Refused, naming the backend and the
/// types it accepts, when `B` cannot store that type on `device`.
pub fn set_storage_precision<B: burn_backend::Backend>(
    device: &B::Device,
    dtype: Option<crate::precision::LowPrecision>,
) -> Result<(), crate::precision::PrecisionError>
where
    B::Device: DeviceOps + 'static,
{
    if let Some(dtype) = dtype {
        crate::precision::check_supported::<B>(device, dtype.dtype())?;
    }
    DeviceState::of_device(device).budget.set_storage(dtype);
    Ok(())
}

/// The storage type of compressed tensors on `device`, or `None` when compression is off.
pub fn storage_precision<D: DeviceOps + 'static>(
    device: &D,
) -> Option<crate::precision::LowPrecision> {
    DeviceState::of_device(device).budget.storage()
}

/// How [`set_budget_auto`] chose its budget: the GPU's memory as read, the share of it the
/// pool turns into live tensor bytes, and the margin kept for what the runtime allocates
/// beside tensors. Print it with `{}`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct AutoBudget {
    /// The budget, in bytes of live tensors.
    pub bytes: u64,
    /// The GPU's memory when the budget was chosen.
    pub device: DeviceMemory,
    /// Live tensor bytes per reserved byte that the runtime's pool reaches under a budget.
    pub pool_efficiency: f64,
    /// Bytes kept aside for workspaces, autotune buffers and transfers.
    pub margin: u64,
}

/// The share of reserved bytes that are live tensors under a budget, per runtime. CubeCL's
/// pool (burn-cuda) rounds buffers up to its page sizes and keeps pages per size class: on
/// the reference GPT step it reserved 2.54× the live bytes under a third of the peak and
/// 2.13× with checkpoint scopes (`docs/results.md`), so a budget may use 0.38 of what the pool
/// can hold. frugal-cuda's caching allocator splits and coalesces blocks: 1.05× on the
/// reference step, but 1.12× (76.0 GiB reserved for 68.0 GiB allocated) on a 1.2 B-parameter
/// GPT whose 4 GiB buffers fragment its huge pool; 0.8 leaves room for that.
fn pool_efficiency(runtime: &str) -> f64 {
    match runtime {
        "frugal-cuda" => 0.8,
        _ => 0.38,
    }
}

impl AutoBudget {
    /// The budget for a GPU with `device` memory: what the pool may hold, times its
    /// efficiency, less a margin of 1/32 of that (at least 256 MiB).
    pub fn for_device(device: DeviceMemory) -> Self {
        let pool_efficiency = pool_efficiency(device.runtime);
        let usable = device.usable();
        let margin = (usable / 32).max(256 << 20);
        let bytes = ((usable as f64 * pool_efficiency) as u64).saturating_sub(margin);
        Self {
            bytes,
            device,
            pool_efficiency,
            margin,
        }
    }
}

impl std::fmt::Display for AutoBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.device;
        write!(
            f,
            "budget {} = ({} free on the GPU + {} held by {}'s pool{}) × {:.2} ({}'s live bytes \
             per reserved byte) − {} margin",
            format_bytes(self.bytes),
            format_bytes(d.free),
            format_bytes(d.reserved),
            d.runtime,
            d.cap
                .map(|cap| format!(", capped at {}", format_bytes(cap)))
                .unwrap_or_default(),
            self.pool_efficiency,
            d.runtime,
            format_bytes(self.margin),
        )
    }
}

/// Why [`set_budget_auto`] could not choose a budget.
#[derive(Clone, Debug, PartialEq)]
pub enum AutoBudgetError {
    /// The device has no GPU memory this build can read (NdArray, Flex, wgpu).
    NoDeviceMemory {
        /// The device, as printed.
        device: String,
    },
    /// The CUDA driver refused to report the GPU's memory.
    Driver(String),
    /// What the GPU has free is not more than what is already live plus the margin.
    TooLittle {
        /// The budget as computed.
        budget: AutoBudget,
        /// Live tensor bytes on the device now.
        live: u64,
    },
}

impl std::fmt::Display for AutoBudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoDeviceMemory { device } => write!(
                f,
                "an automatic budget reads the GPU's free memory, and {device} has none this \
                 build can read (CUDA devices: burn-cuda or frugal-cuda); give the budget in bytes"
            ),
            Self::Driver(e) => write!(f, "cannot read the GPU's free memory: {e}"),
            Self::TooLittle { budget, live } => write!(
                f,
                "{budget}, which is not above the {} already live: free memory on the GPU \
                 (other processes hold {}), or give the budget in bytes",
                format_bytes(*live),
                format_bytes(
                    budget
                        .device
                        .total
                        .saturating_sub(budget.device.free + budget.device.reserved)
                ),
            ),
        }
    }
}

impl std::error::Error for AutoBudgetError {}

/// The budget [`set_budget_auto`] would set on `device` now, and how it was chosen.
pub fn auto_budget<D: DeviceOps + 'static>(device: &D) -> Result<AutoBudget, AutoBudgetError> {
    let memory = device_memory(device)
        .ok_or_else(|| AutoBudgetError::NoDeviceMemory {
            device: format!("{device:?}"),
        })?
        .map_err(AutoBudgetError::Driver)?;
    let budget = AutoBudget::for_device(memory);
    let live = live_bytes(device);
    if budget.bytes <= live {
        return Err(AutoBudgetError::TooLittle { budget, live });
    }
    Ok(budget)
}

/// Sets `device`'s budget from the GPU's memory ([`AutoBudget::for_device`]: free bytes plus
/// what the pool holds, times the pool's efficiency, less a margin) and returns how it was
/// chosen. The budget stays fixed once set: call again to follow other processes' use.
pub fn set_budget_auto<D: DeviceOps + 'static>(device: &D) -> Result<AutoBudget, AutoBudgetError> {
    let budget = auto_budget(device)?;
    set_budget(device, Some(budget.bytes));
    Ok(budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(free: u64, reserved: u64, cap: Option<u64>, runtime: &'static str) -> DeviceMemory {
        DeviceMemory {
            free,
            total: 80 << 30,
            reserved,
            in_use: reserved / 2,
            cap,
            runtime,
        }
    }

    #[test]
    fn the_automatic_budget_is_what_the_pool_can_hold_times_its_efficiency_less_the_margin() {
        let burn = AutoBudget::for_device(gpu(60 << 30, 4 << 30, None, "burn-cuda"));
        let usable = 64u64 << 30;
        assert_eq!(burn.margin, usable / 32);
        assert_eq!(burn.bytes, (usable as f64 * 0.38) as u64 - usable / 32);
        // frugal-cuda's cap bounds what its pool may hold.
        let capped = AutoBudget::for_device(gpu(60 << 30, 4 << 30, Some(8 << 30), "frugal-cuda"));
        assert_eq!(capped.margin, 256 << 20);
        assert_eq!(
            capped.bytes,
            ((8u64 << 30) as f64 * 0.8) as u64 - (256 << 20)
        );
        assert!(
            capped.to_string().contains("capped at 8.00 GiB"),
            "{capped}"
        );
        // Nearly nothing free: the margin takes it all.
        assert_eq!(
            AutoBudget::for_device(gpu(100 << 20, 0, None, "burn-cuda")).bytes,
            0
        );
    }

    #[test]
    fn a_device_without_gpu_memory_gets_no_automatic_budget() {
        let device = burn::backend::ndarray::NdArrayDevice::Cpu;
        let error = set_budget_auto(&device).unwrap_err();
        assert!(matches!(error, AutoBudgetError::NoDeviceMemory { .. }));
        assert!(
            error.to_string().contains("give the budget in bytes"),
            "{error}"
        );
        assert_eq!(budget(&device), None);
    }
}
