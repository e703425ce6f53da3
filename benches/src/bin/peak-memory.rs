//! `peak-memory`: peak memory and speed of the reference GPT training step under named
//! configurations, one child process each; see [`frugal_benches::peak_memory`] for the figures.
//! This file picks the backends of this build's devices; the rest is the library's.

use burn::backend::NdArray;
use clap::Parser;
use frugal_benches::configs::Config;
use frugal_benches::peak_memory::{self, Args, Line, run_named};
use gpt::cli::DeviceKind;
// The devices this build runs on: gpt's, whose features this package's turn on.
use gpt::run::BUILT;

/// Runs `config` on the backend of `--device`, or refuses a device this build lacks.
fn run_on(config: &Config, args: &Args) -> Result<Line, String> {
    match args.device {
        DeviceKind::Cpu => Ok(run_named::<NdArray>(config, args)),
        DeviceKind::Flex => Ok(run_named::<burn::backend::Flex>(config, args)),
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => Ok(run_named::<burn::backend::Wgpu>(config, args)),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda if !args.fuses() => Ok(run_named::<
            burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
        >(config, args)),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Ok(run_named::<burn::backend::Cuda>(config, args)),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => frugal_cuda::check_device(&Default::default())
            .map_err(|e| e.to_string())
            .map(|()| {
                if !args.fuses() {
                    run_named::<frugal_cuda::FrugalCudaUnfused>(config, args)
                } else {
                    run_named::<frugal_cuda::FrugalCuda>(config, args)
                }
            }),
        #[allow(unreachable_patterns)]
        other => Err(other.refused("peak-memory", BUILT)),
    }
}

fn main() {
    // Frugal's decisions (the budget's plan, evictions) through `log`, e.g.
    // `RUST_LOG=frugal::engine::plan=debug`; a dependency's warnings only when RUST_LOG asks.
    gpt::logging::init();
    peak_memory::main(&Args::parse(), run_on);
}
