//! The example's tests, in one binary: each file below was its own binary, and each binary
//! compiled and linked its own copy of the model and the backends it trains on.
//!
//! NdArray's seed, the ledger, budgets and a GPU's memory cap are process-wide, so every test
//! takes [`serial`] first.

mod adamw8bit;
mod budget;
mod cli;
mod common;
mod device_oom_rescue;
mod device_out_of_memory;
mod equivalence;
mod loss_scale;
mod model;
mod out_of_memory;
mod plot;
mod precision;
mod resume;
mod roles;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The process-wide turn: held by a test while it trains or sets a device's limits (a failed
/// test's poisoned lock is taken all the same).
pub fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}
