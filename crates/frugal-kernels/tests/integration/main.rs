//! The kernels' tests, in one binary (each file below was its own binary): on wgpu when that
//! feature is on (CI, Mesa's lavapipe), else on CUDA with the `cuda` feature (a GPU machine).

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod common;

mod adamw;
mod adamw8bit;
mod attention;
mod burn_cast;
mod casts;
mod cross_entropy;
mod embedding;
mod layer_norm;
mod unscale;
