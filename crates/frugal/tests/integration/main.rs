//! Frugal's integration tests, in one binary: each file below was its own binary, and each
//! binary compiled and linked its own copy of the backends it trains on.
//!
//! The ledger, budget, policies, autocast table and NdArray's seed are process-wide, so every
//! test that touches them takes [`serial`] first.
//!
//! `tests/learner.rs` is a binary of its own: burn-train's `Learner` installs a process-wide
//! logger and panic hook.

mod adamw8bit;
mod attention;
mod autocast;
mod budget_cnn;
mod budget_props;
mod burn_nn_encoder;
mod burn_nn_families;
mod compressed_storage;
mod grad_scaler;
mod kernels;
mod layers;
mod ledger_props;
mod linear_cross_entropy;
mod memory_viz;
mod out_of_memory;
mod planned_budget;
mod recompute_limit;
mod roles;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The process-wide turn: held by a test while it uses a device's ledger, budget or settings
/// (a failed test's poisoned lock is taken all the same).
pub fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}
