//! `gpt`: trains the GPT of `model.rs` on `Autodiff<Frugal<B>>` and reports its memory.
//!
//! The default configuration is small and runs on the CPU in a few minutes; `--device cuda`
//! (built with `--features cuda`) runs the same code on a GPU.

use clap::Parser;
use gpt::run::{DeviceKind, TrainArgs, train};

fn main() {
    let args = TrainArgs::parse();
    let result = match args.device {
        DeviceKind::Cpu => train::<burn::backend::NdArray>(&args, Default::default()),
        DeviceKind::Flex => train::<burn::backend::Flex>(&args, Default::default()),
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => train::<burn::backend::Wgpu>(&args, Default::default()),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => train::<burn::backend::Cuda>(&args, Default::default()),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => frugal_cuda::check_device(&Default::default())
            .map_err(|e| e.to_string())
            .and_then(|()| train::<frugal_cuda::FrugalCuda>(&args, Default::default())),
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "--device {0} needs a build with `--features {0}`; this binary supports: cpu, flex{1}{2}{3}",
            clap::ValueEnum::to_possible_value(&other)
                .map_or_else(String::new, |v| v.get_name().to_string()),
            if cfg!(feature = "wgpu") { ", wgpu" } else { "" },
            if cfg!(feature = "cuda") { ", cuda" } else { "" },
            if cfg!(feature = "frugal-cuda") {
                ", frugal-cuda"
            } else {
                ""
            },
        )),
    };
    if let Err(message) = result {
        eprintln!("error: {message}");
        std::process::exit(2);
    }
}
