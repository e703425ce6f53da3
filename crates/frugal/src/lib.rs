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

// The layers, bottom to top; a module imports only from layers below its own
// (`tests/integration/layers.rs` checks it; `docs/architecture.md` describes them).
mod autocast; // 2: autocast's policy and per-device table
mod backend; // 7: the backend type
mod catch; // 0: catching a step's panic quietly
mod checkpoint; // 9: checkpoint scopes, the public entry
mod device; // 4: the per-device state
mod engine; // 2: the eviction engine behind `Evictable`, the step plan and its cuts
pub mod kernels; // 3: Frugal's kernels in place of the inner backend's ops
mod ledger; // 1: counting and the timeline
pub mod memory; // 10: the public memory API
mod memory_viz; // 10: PyTorch's memory_viz file of a snapshot
pub mod nn; // 9: attention without s² storage, a MultiHeadAttention drop-in, layer norm
pub mod ops; // 8: every Backend op, forwarded
pub mod precision; // 9: autocast switches
mod remat; // 5: managed cells
mod report; // 9: memory reports
mod runtime; // 2: the CubeCL runtimes this build knows, pool figures
mod scope; // 3: the program's own checkpoint scopes
mod tensor; // 6: the tensor primitive
mod training; // 10–11: the training add-ons (accumulation, AdamW, loss scaling, fit, split)
mod units; // 0: byte sizes, tensor bytes, the 16-bit types
mod vocabulary; // 0: the op vocabulary: op ids, the op facts table, the cost model

pub use training::optim;
#[cfg(feature = "train")]
pub use training::train;

pub use backend::Frugal;
pub use catch::{CaughtPanic, catch_quietly, panic_message};
pub use checkpoint::{ScopeOutput, checkpoint};
pub use engine::{Action, EvictionMode, Policy, RematStats};
pub use precision::{AutocastPolicy, LowPrecision, OpPrecision, PrecisionError, set_autocast};
pub use runtime::{AllocatorBlock, AllocatorEvent, AllocatorSegment, AllocatorView};
pub use tensor::FrugalTensor;
pub use training::abandoned::release_abandoned_graph;
pub use training::accumulate::{AccumulationError, GradientAccumulation, micro_batch_size};
pub use training::fit::{
    AutoFit, FitCandidate, FitChoice, FitError, FitOutcome, FitPolicy, FitProbe, FitRow,
};
pub use training::micro_batching::{
    MicroBatchChange, MicroBatchReason, MicroBatching, PASS_RECOMPUTE_RATIO_LIMIT,
    RECOMPUTE_RATIO_LIMIT, TRIAL_RECOMPUTE_RATIO, UNPLANNED_RECOMPUTE_RATIO_LIMIT,
};
pub use training::scaler::{
    GradScaler, GradScalerConfig, GradScalerError, GradScalerState, ScaledStep,
};
pub use units::{ParseBytesError, format_bytes, parse_bytes};

// The README's Rust examples, compiled and run as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
