//! burn-train metrics of Frugal's memory figures, for the `Learner`'s dashboard and its metric
//! logs (feature `train`, on by default).
//!
//! ```ignore
//! SupervisedTraining::new(dir, train, valid)
//!     .metric_train_numeric(frugal::train::MemoryMetric::live(device.clone()))
//!     .metric_train_numeric(frugal::train::MemoryMetric::peak(device.clone()))
//!     .metric_train_numeric(frugal::train::MemoryMetric::reserved(device))
//! ```

use std::sync::Arc;

use burn_backend::DeviceOps;
use burn_train::metric::{
    Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes, NumericEntry,
    SerializedEntry,
};

use crate::memory;

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
}

impl MemoryFigure {
    fn label(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Peak => "peak",
            Self::Reserved => "reserved",
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

    /// The figure now, in bytes (`None`: the device's pool reports none).
    pub fn read_bytes(&self) -> Option<u64> {
        match self.figure {
            MemoryFigure::Live => Some(memory::live_bytes(&self.device)),
            MemoryFigure::Peak => Some(memory::peak_bytes(&self.device)),
            MemoryFigure::Reserved => memory::pool_usage(&self.device).map(|p| p.bytes_reserved),
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
