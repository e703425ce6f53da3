#![warn(missing_docs)]
//! # Frugal
//!
//! A Burn 0.21 backend decorator that forwards every op to the backend it wraps and keeps an
//! exact ledger of the memory tensors hold: live and peak bytes per device, which op produced
//! them, and a timeline.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::tensor::Tensor;
//! use frugal::Frugal;
//!
//! type B = Autodiff<Frugal<NdArray>>;
//! let device = Default::default();
//! let before = frugal::memory::live_bytes(&device);
//! let x = Tensor::<B, 2>::ones([256, 256], &device);
//! let y = x.clone().matmul(x.clone());
//! // x and y are live: two 256x256 f32 buffers.
//! assert_eq!(frugal::memory::live_bytes(&device) - before, 2 * 256 * 256 * 4);
//! println!("{}", frugal::memory::report(&device));
//! drop((x, y));
//! assert_eq!(frugal::memory::live_bytes(&device), before);
//! ```

mod backend;
mod budget;
pub mod kernels;
mod ledger;
pub mod memory;
pub mod ops;
mod policy;
mod pool;
pub mod precision;
mod remat;
mod report;
mod scaler;
mod scope;
mod tensor;

pub use backend::Frugal;
pub use budget::{ParseBytesError, RematStats, parse_bytes};
pub use policy::{Action, EvictionMode, Policy};
pub use precision::{AutocastPolicy, LowPrecision, OpPrecision, PrecisionError, set_autocast};
pub use scaler::{GradScaler, GradScalerConfig, GradScalerError, GradScalerState, ScaledStep};
pub use scope::{ScopeOutput, checkpoint};
pub use tensor::FrugalTensor;
