//! A GPT-style language model trained on `Autodiff<Frugal<B>>`, shared by the `gpt` example
//! binary and the benches.

pub mod autosave;
pub mod checkpoint;
pub mod cli;
pub mod compile_progress;
pub mod data;
pub mod diagnostics;
pub mod fitting;
pub mod kernel_profile;
pub mod logging;
pub mod memory_settings;
pub mod model;
pub mod plot;
pub mod report;
pub mod run;
pub mod train;

pub use memory_settings::MemorySettings;
pub use model::{Gpt, GptConfig};

/// The backend the `gpt` binary trains on: Burn's autodiff over Frugal over `B`.
pub type Ad<B> = burn::backend::Autodiff<frugal::Frugal<B>>;
