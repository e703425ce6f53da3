//! burn-train metrics of Frugal's memory figures, for the `Learner`'s dashboard and its metric
//! logs, and an optimizer wrapper that tells the ledger what the bytes are for (feature
//! `train`, on by default).
//!
//! ```ignore
//! let optim = frugal::train::RoleTracking::new(AdamConfig::new().init());
//! SupervisedTraining::new(dir, train, valid)
//!     .metric_train_numeric(frugal::train::MemoryMetric::live(device.clone()))
//!     .metric_train_numeric(frugal::train::MemoryMetric::peak(device.clone()))
//!     .metric_train_numeric(frugal::train::MemoryMetric::reserved(device.clone()))
//!     .metric_train_numeric(frugal::train::MemoryMetric::role_peak(device, Role::Activation))
//! ```

use std::sync::Arc;

use burn_backend::{Backend, DeviceOps};
use burn_core::module::AutodiffModule;
use burn_core::tensor::backend::AutodiffBackend;
use burn_optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn_train::metric::{
    Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes, NumericEntry,
    SerializedEntry,
};

use crate::backend::Frugal;
use crate::memory::{self, Phase, Role};

/// Which of a device's memory figures a [`MemoryMetric`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryFigure {
    /// Bytes the ledger counts live now ([`memory::live_bytes`]).
    Live,
    /// The ledger's peak since the process started or the last [`memory::reset_peak`].
    Peak,
    /// Bytes the device pool reserves ([`memory::pool_usage`]): CubeCL devices and frugal-cuda
    /// only; NaN elsewhere.
    Reserved,
    /// The live bytes of one role ([`memory::live_by_role`]).
    RoleLive(Role),
    /// The highest live bytes of one role ([`memory::peak_by_role`]).
    RolePeak(Role),
}

impl MemoryFigure {
    fn label(self) -> String {
        match self {
            Self::Live => "live".into(),
            Self::Peak => "peak".into(),
            Self::Reserved => "reserved".into(),
            Self::RoleLive(role) => format!("live {}", role.label()),
            Self::RolePeak(role) => format!("peak {}", role.label()),
        }
    }
}

/// One memory figure of one device as a numeric burn-train metric, in GB (10⁹ bytes). Its
/// value is the figure at the last iteration; its running value the highest over the epoch.
/// Reading `Reserved` is a round trip to the device's server, once per iteration.
#[derive(Clone)]
pub struct MemoryMetric<D> {
    device: D,
    figure: MemoryFigure,
    name: MetricName,
    last: f64,
    highest: f64,
}

impl<D: DeviceOps + 'static> MemoryMetric<D> {
    /// The metric of `figure` on `device`.
    pub fn new(device: D, figure: MemoryFigure) -> Self {
        let name = Arc::new(format!("Frugal memory {} ({device:?})", figure.label()));
        Self {
            device,
            figure,
            name,
            last: f64::NAN,
            highest: f64::NAN,
        }
    }

    /// Live bytes ([`MemoryFigure::Live`]).
    pub fn live(device: D) -> Self {
        Self::new(device, MemoryFigure::Live)
    }

    /// The ledger's peak ([`MemoryFigure::Peak`]).
    pub fn peak(device: D) -> Self {
        Self::new(device, MemoryFigure::Peak)
    }

    /// The pool's reserved bytes ([`MemoryFigure::Reserved`]).
    pub fn reserved(device: D) -> Self {
        Self::new(device, MemoryFigure::Reserved)
    }

    /// The live bytes of `role` ([`MemoryFigure::RoleLive`]).
    pub fn role_live(device: D, role: Role) -> Self {
        Self::new(device, MemoryFigure::RoleLive(role))
    }

    /// The peak of `role`'s live bytes ([`MemoryFigure::RolePeak`]).
    pub fn role_peak(device: D, role: Role) -> Self {
        Self::new(device, MemoryFigure::RolePeak(role))
    }

    /// The figure now, in bytes (`None`: the device's pool reports none).
    pub fn read_bytes(&self) -> Option<u64> {
        match self.figure {
            MemoryFigure::Live => Some(memory::live_bytes(&self.device)),
            MemoryFigure::Peak => Some(memory::peak_bytes(&self.device)),
            MemoryFigure::Reserved => memory::pool_usage(&self.device).map(|p| p.bytes_reserved),
            MemoryFigure::RoleLive(role) => Some(memory::live_by_role(&self.device).get(role)),
            MemoryFigure::RolePeak(role) => Some(memory::peak_by_role(&self.device).get(role)),
        }
    }
}

impl<D: DeviceOps + 'static> Metric for MemoryMetric<D> {
    type Input = ();

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: Some("GB".to_string()),
            higher_is_better: false,
        }
        .into()
    }

    fn update(&mut self, _item: &(), _metadata: &MetricMetadata) -> SerializedEntry {
        let bytes = self.read_bytes();
        let gb = bytes.map_or(f64::NAN, |b| b as f64 / 1e9);
        self.last = gb;
        if !gb.is_nan() {
            self.highest = if self.highest.is_nan() {
                gb
            } else {
                self.highest.max(gb)
            };
        }
        let formatted = match bytes {
            Some(bytes) => format!("{gb:.3} GB ({bytes} B)"),
            None => "not reported by this device".to_string(),
        };
        SerializedEntry::new(formatted, gb.to_string())
    }

    fn clear(&mut self) {
        self.highest = f64::NAN;
    }
}

impl<D: DeviceOps + 'static> Numeric for MemoryMetric<D> {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.last)
    }

    fn running_value(&self) -> NumericEntry {
        NumericEntry::Value(self.highest)
    }
}

/// An optimizer that tells the ledger what the bytes of a training step are for, for loops
/// that cannot set phases themselves, such as burn-train's `Learner`: before the inner
/// optimizer's step it tags the gradients and enters [`Phase::Optimizer`]; after it, it tags
/// the new parameters and enters [`Phase::Forward`] for the next step. The inner optimizer's
/// state and records are untouched.
///
/// Without a call before `backward()`, what backward makes counts as activations until the
/// optimizer step tags the gradients; a loop of its own can call
/// `memory::set_phase(device, Phase::Backward)` there for an exact split during backward.
#[derive(Clone)]
pub struct RoleTracking<O> {
    inner: O,
}

impl<O> RoleTracking<O> {
    /// Wraps `inner`.
    pub fn new(inner: O) -> Self {
        Self { inner }
    }

    /// The wrapped optimizer.
    pub fn into_inner(self) -> O {
        self.inner
    }
}

fn set_phase<B: Backend>(devices: &[B::Device], phase: Phase) {
    for device in devices {
        memory::set_phase(device, phase);
    }
}

impl<O, M, B, X> Optimizer<M, B> for RoleTracking<O>
where
    O: Optimizer<M, B>,
    M: AutodiffModule<B>,
    B: AutodiffBackend<InnerBackend = Frugal<X>>,
    X: Backend,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        let devices = module.devices();
        memory::tag_gradients(&module, &grads);
        set_phase::<B>(&devices, Phase::Optimizer);
        let module = self.inner.step(lr, module, grads);
        memory::tag_parameters(&module);
        set_phase::<B>(&devices, Phase::Forward);
        module
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        let devices = module.devices();
        set_phase::<B>(&devices, Phase::Optimizer);
        let module = self.inner.step_multi(lr, module, grads);
        memory::tag_parameters(&module);
        set_phase::<B>(&devices, Phase::Forward);
        module
    }

    fn to_record(&self) -> Self::Record {
        self.inner.to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self::new(self.inner.load_record(record))
    }
}
