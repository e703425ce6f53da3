//! The differential and coverage tests, in one binary: each file below was its own binary,
//! and each compiled its own copy of every op on every backend.
//!
//! Frugal's call counters, the kernel mode and NdArray's seed are process-wide, so every test
//! takes [`serial`] first.

mod adamw8bit;
#[cfg(feature = "wgpu")]
mod attention;
mod compare;
#[cfg(feature = "wgpu")]
mod conv;
mod coverage;
mod differential;
#[cfg(feature = "wgpu")]
mod embedding;
#[cfg(feature = "wgpu")]
mod layer_norm;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The process-wide turn (a failed test's poisoned lock is taken all the same).
pub fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}
