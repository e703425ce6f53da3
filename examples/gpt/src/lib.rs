//! A GPT-style language model trained on `Autodiff<Frugal<B>>`, shared by the `gpt` example
//! binary and the benches.

pub mod data;
pub mod model;
pub mod plot;
pub mod run;
pub mod train;

pub use model::{Gpt, GptConfig};
