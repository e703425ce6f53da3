//! A GPT-style language model trained on `Autodiff<Frugal<B>>`, shared by the `gpt` example
//! binary, the benches and the `ddp` example.
//!
//! The model, its data and its training step build on any autodiff backend. The binary's
//! machinery (devices, flags, checkpoints, reports) is the default feature `app`: it trains on
//! `Autodiff<Frugal<B>>` for any `B`, which a build with Burn's `distributed` feature (where
//! autodiff requires collectives of `B`) cannot compile.

pub mod data;
pub mod model;
pub mod train;

#[cfg(feature = "app")]
pub mod autosave;
#[cfg(feature = "app")]
pub mod checkpoint;
#[cfg(feature = "app")]
pub mod cli;
#[cfg(feature = "app")]
pub mod compile_progress;
#[cfg(feature = "app")]
pub mod diagnostics;
#[cfg(feature = "app")]
pub mod fitting;
#[cfg(feature = "app")]
pub mod kernel_profile;
#[cfg(feature = "app")]
pub mod logging;
#[cfg(feature = "app")]
pub mod memory_settings;
#[cfg(feature = "app")]
pub mod plot;
#[cfg(feature = "app")]
pub mod report;
#[cfg(feature = "app")]
pub mod run;

#[cfg(feature = "app")]
pub use memory_settings::MemorySettings;
pub use model::{Gpt, GptConfig};

/// The backend the `gpt` binary trains on: Burn's autodiff over Frugal over `B`.
pub type Ad<B> = burn::backend::Autodiff<frugal::Frugal<B>>;
