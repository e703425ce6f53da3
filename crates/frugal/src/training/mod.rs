//! The training add-ons, kept apart from the decorator's core as Burn keeps burn-optim and
//! burn-train apart from its backends: they use the public memory API and the kernels, and
//! nothing in the core imports them.
//!
//! By layer (`tests/integration/layers.rs` checks each file as the module it names):
//! - 10: [`accumulate`] (micro-batches summed into one batch's gradient), [`optim`] (the 8-bit
//!   and fused AdamW), [`scaler`] (dynamic loss scaling and its fused unscale);
//! - 11: [`abandoned`] (what a failed step's forward pass left in burn-autodiff's graph, given
//!   back), [`fit`] (`AutoFit`: a configuration from probe steps), [`micro_batching`]
//!   (`MicroBatching`: the split under a budget), `train` (burn-train metrics and
//!   `RoleTracking`, feature `train`).

pub(crate) mod abandoned; // 11: a failed step's graph given back
pub(crate) mod accumulate; // 10: gradient accumulation
pub(crate) mod fit; // 11: auto-fit
pub(crate) mod micro_batching; // 11: the split under a budget
pub mod optim; // 10: the 8-bit and fused AdamW
pub(crate) mod scaler; // 10: dynamic loss scaling
#[cfg(feature = "train")]
pub mod train; // 11: burn-train metrics of the memory figures
