//! What a training run asks of Frugal's memory management on its device — budget, eviction,
//! checkpoint scopes, autocast, compressed storage — as one value, applied in one place by the
//! `gpt` binary and by the `peak-memory` bench.

use burn::tensor::backend::{Backend, DeviceOps};
use frugal::memory;
use frugal::{AutocastPolicy, EvictionMode, LowPrecision, Policy, PrecisionError};

/// A run's memory settings. The default is Frugal watching only: no budget, no scopes, f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemorySettings {
    /// Keep live tensor bytes under this many (`None`: no budget).
    pub budget: Option<u64>,
    /// Which actions the budget may take to free memory.
    pub evict: EvictionMode,
    /// Under a budget, a checkpoint scope's end leaves its costly products for the budget to
    /// evict by score ([`Policy::scope_keeps_products`]).
    pub scope_keeps_products: bool,
    /// Under a budget, never score tensors by the learned step's predicted reads, only by
    /// staleness ([`Policy::planned`] off).
    pub no_plan: bool,
    /// Under a budget, never cut the learned step's forward pass into segments
    /// ([`Policy::forward_segments`] off).
    pub no_segments: bool,
    /// Each transformer block runs in a checkpoint scope. The training step reads this; it is
    /// not a device setting.
    pub checkpoint_blocks: bool,
    /// Autocast's low type (`None`: everything in f32).
    pub autocast: Option<LowPrecision>,
    /// With autocast, products stay in the low type instead of coming back as f32.
    pub low_outputs: bool,
    /// With autocast, cast weights and saved activations again in backward rather than keep
    /// forward's casts ([`AutocastPolicy::with_kept_casts`] off: less memory, more casts).
    pub recast: bool,
    /// The type the budget may keep evicted f32 tensors in on the device (`None`: no
    /// compression).
    pub storage: Option<LowPrecision>,
    /// On frugal-cuda: the reserved bytes beyond which its allocator reuses cached memory
    /// first (`None`: what the budget sets, [`frugal::memory::set_growth_limit`]).
    pub growth_limit: Option<u64>,
    /// Under a budget, a backward pass that recomputes more than
    /// [`frugal::PASS_RECOMPUTE_RATIO_LIMIT`] times its forward pass's work fails as out of
    /// memory ([`frugal::memory::set_recompute_limit`]), for the loop to retry the step with
    /// smaller micro-batches.
    pub fail_past_recompute_limit: bool,
}

/// A setting the device refused: its backend cannot compute in or store the asked type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingsError {
    /// The autocast type ([`MemorySettings::autocast`]).
    Autocast(PrecisionError),
    /// The storage type ([`MemorySettings::storage`]).
    Storage(PrecisionError),
}

impl SettingsError {
    /// Frugal's error, naming the backend and the types it has.
    pub fn precision_error(&self) -> &PrecisionError {
        match self {
            SettingsError::Autocast(e) | SettingsError::Storage(e) => e,
        }
    }
}

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingsError::Autocast(e) => write!(f, "autocast: {e}"),
            SettingsError::Storage(e) => write!(f, "compressed storage: {e}"),
        }
    }
}

impl std::error::Error for SettingsError {}

impl MemorySettings {
    /// The eviction policy these settings ask for.
    pub fn policy(&self) -> Policy {
        Policy {
            mode: self.evict,
            scope_keeps_products: self.scope_keeps_products,
            planned: !self.no_plan,
            forward_segments: !self.no_segments,
            ..Policy::default()
        }
    }

    /// The autocast policy these settings ask for, if any.
    pub fn autocast_policy(&self) -> Option<AutocastPolicy> {
        self.autocast.map(|low| {
            AutocastPolicy::new(low)
                .with_low_outputs(self.low_outputs)
                .with_kept_casts(!self.recast)
        })
    }

    /// Sets the policy, budget, autocast and storage type of `device` (of backend `B`, or of a
    /// backend with the same device type). Call it before the model exists, so that its
    /// parameters are managed too. The returned guard puts the device back to Frugal's
    /// defaults when dropped, however the run ends, so that later work on the device is not
    /// managed by mistake; a refused setting is undone the same way.
    pub fn apply<B: Backend>(&self, device: &B::Device) -> Result<Applied<B::Device>, SettingsError>
    where
        B::Device: DeviceOps + 'static,
    {
        memory::set_policy(device, self.policy());
        memory::set_budget(device, self.budget);
        if self.growth_limit.is_some() {
            memory::set_growth_limit(device, self.growth_limit);
        }
        let recompute_limit = (self.budget.is_some() && self.fail_past_recompute_limit)
            .then_some(frugal::PASS_RECOMPUTE_RATIO_LIMIT);
        memory::set_recompute_limit(device, recompute_limit);
        let applied = Applied(device.clone());
        frugal::set_autocast::<B>(device, self.autocast_policy())
            .map_err(SettingsError::Autocast)?;
        memory::set_storage_precision::<B>(device, self.storage).map_err(SettingsError::Storage)?;
        Ok(applied)
    }
}

/// Memory settings in force on a device; dropping it clears them (see
/// [`MemorySettings::apply`]).
#[must_use = "the settings are cleared when this is dropped"]
pub struct Applied<D: DeviceOps + 'static>(D);

impl<D: DeviceOps + 'static> Drop for Applied<D> {
    fn drop(&mut self) {
        memory::set_budget(&self.0, None);
        memory::set_recompute_limit(&self.0, None);
        memory::set_policy(&self.0, Policy::default());
        frugal::precision::clear(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};

    use super::*;

    #[test]
    fn apply_sets_every_setting_and_the_guard_clears_them() {
        let device = Default::default();
        let settings = MemorySettings {
            budget: Some(3 << 20),
            evict: EvictionMode::OffloadOnly,
            scope_keeps_products: true,
            no_plan: true,
            no_segments: true,
            checkpoint_blocks: true,
            autocast: Some(LowPrecision::BF16),
            low_outputs: true,
            recast: true,
            storage: Some(LowPrecision::F16),
            growth_limit: Some(4 << 20),
            fail_past_recompute_limit: true,
        };
        let applied = settings.apply::<Flex>(&device).unwrap();
        assert_eq!(memory::budget(&device), Some(3 << 20));
        assert_eq!(memory::policy(&device), settings.policy());
        assert_eq!(memory::policy(&device).mode, EvictionMode::OffloadOnly);
        assert!(memory::policy(&device).scope_keeps_products);
        assert!(!memory::policy(&device).planned);
        assert_eq!(
            frugal::precision::autocast(&device),
            settings.autocast_policy()
        );
        assert!(!frugal::precision::autocast(&device).unwrap().kept_casts());
        assert_eq!(memory::storage_precision(&device), Some(LowPrecision::F16));
        drop(applied);
        assert_eq!(memory::budget(&device), None);
        assert_eq!(memory::policy(&device), Policy::default());
        assert_eq!(frugal::precision::autocast(&device), None);
        assert_eq!(memory::storage_precision(&device), None);
    }

    #[test]
    fn a_refused_type_names_the_setting_and_leaves_the_device_cleared() {
        let device = Default::default();
        let asking = |autocast, storage| MemorySettings {
            budget: Some(1 << 20),
            autocast,
            storage,
            ..MemorySettings::default()
        };
        let error = asking(Some(LowPrecision::BF16), None)
            .apply::<NdArray>(&device)
            .err()
            .unwrap();
        assert!(matches!(error, SettingsError::Autocast(_)), "{error}");
        assert_eq!(memory::budget(&device), None);
        let error = asking(None, Some(LowPrecision::F16))
            .apply::<NdArray>(&device)
            .err()
            .unwrap();
        assert!(matches!(error, SettingsError::Storage(_)), "{error}");
        assert!(
            error.to_string().starts_with("compressed storage: "),
            "{error}"
        );
        assert_eq!(memory::budget(&device), None);
    }
}
