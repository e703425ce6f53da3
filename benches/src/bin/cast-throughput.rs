//! Throughput of Frugal's CubeCL cast kernels against a device-to-device copy of the same
//! buffer, on one GPU.
//!
//! For each size (of the f32 side) it times f32→f16, f16→f32, f32→bf16 and bf16→f32 (bf16 where
//! the device supports it) and an f32→f32 copy through the same vectorised kernel. Each figure is
//! the median over repetitions, after warm-up, of the time per launch, with the device synced
//! before and after each repetition. Bandwidth counts the bytes read plus the bytes written;
//! the ratio is the cast's bandwidth over the copy's, measured in the same run.
//!
//! ```sh
//! cargo run --release -p frugal-benches --features cuda --bin cast-throughput -- --device cuda
//! ```

// Without a GPU feature the binary only explains which build it needs; the timing code is
// still compiled so that it stays in step with the kernels' API.
#![cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]

use std::time::Instant;

use clap::Parser;
use frugal_benches::median;
use frugal_kernels::cubecl::{Runtime, client::ComputeClient, future::block_on, server::Handle};
use frugal_kernels::{FloatDtype, KernelError, cast, copy};
use gpt::cli::DeviceKind;
use serde::Serialize;

/// The devices this build runs on: the kernels run on CubeCL's GPU runtimes only.
const BUILT: &[DeviceKind] = &[
    #[cfg(feature = "wgpu")]
    DeviceKind::Wgpu,
    #[cfg(feature = "cuda")]
    DeviceKind::Cuda,
];

/// Time the cast kernels against a device-to-device copy.
#[derive(Parser)]
struct Args {
    /// Where to run: cuda or wgpu, with a build of the matching feature (the kernels run on
    /// CubeCL's GPU runtimes, not on the CPU; frugal-cuda's allocator does not change them).
    #[arg(long, value_enum, default_value = "cuda")]
    device: DeviceKind,
    /// Sizes of the f32 buffer, in MiB.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 256, 1024])]
    sizes_mib: Vec<usize>,
    /// Timed repetitions per operation and size; the median is reported.
    #[arg(long, default_value_t = 15)]
    reps: usize,
    /// Untimed repetitions first (kernel compilation, pool growth).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Launches per repetition, so that launch and sync overheads are amortised; 0 picks enough
    /// to move about 4 GiB per repetition.
    #[arg(long, default_value_t = 0)]
    launches: usize,
}

/// One measured (or skipped) operation at one size.
#[derive(Serialize)]
struct Record {
    bench: &'static str,
    device: DeviceKind,
    runtime: &'static str,
    op: String,
    f32_mib: usize,
    elements: usize,
    bytes_moved: u64,
    launches_per_rep: usize,
    reps: usize,
    median_s_per_launch: Option<f64>,
    bytes_per_s: Option<f64>,
    ratio_to_copy: Option<f64>,
    skipped: Option<String>,
}

fn sync<R: Runtime>(client: &ComputeClient<R>) {
    block_on(client.sync()).expect("device sync failed");
}

/// Median seconds per launch of `op`, after `warmup` untimed repetitions.
fn time_op<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    launches: usize,
    mut op: impl FnMut() -> Result<Handle, KernelError>,
) -> Result<f64, KernelError> {
    let mut rep = |timed: bool| -> Result<Option<f64>, KernelError> {
        sync(client);
        let start = Instant::now();
        for _ in 0..launches {
            // The output is dropped at once; the pool hands the same memory to the next launch.
            drop(op()?);
        }
        sync(client);
        Ok(timed.then(|| start.elapsed().as_secs_f64() / launches as f64))
    };
    for _ in 0..args.warmup {
        rep(false)?;
    }
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        times.extend(rep(true)?);
    }
    Ok(median(&mut times))
}

fn run<R: Runtime>(client: ComputeClient<R>, args: &Args) {
    let runtime = R::name(&client);
    println!(
        "Cast throughput on {:?} ({runtime}): median of {} reps after {} warm-up; bandwidth = \
         (bytes read + bytes written) / time; ratio = cast bandwidth / f32 copy bandwidth",
        args.device, args.reps, args.warmup
    );
    println!(
        "{:>9} {:<10} {:>12} {:>12} {:>8}",
        "f32 MiB", "op", "us/launch", "GB/s", "ratio"
    );
    let mut records = Vec::new();
    for &mib in &args.sizes_mib {
        let n = mib * (1 << 20) / 4;
        let host: Vec<u8> = (0..n)
            .flat_map(|i| (((i % 4099) as f32 - 2049.0) * 0.37).to_le_bytes())
            .collect();
        let input_f32 = client.create_from_slice(&host);
        drop(host);
        let input_f16 = cast(&client, &input_f32, n, FloatDtype::F32, FloatDtype::F16)
            .expect("f32 -> f16 input");
        let bf16 = FloatDtype::BF16.is_supported(&client);
        let input_bf16 = bf16.then(|| {
            cast(&client, &input_f32, n, FloatDtype::F32, FloatDtype::BF16).expect("bf16 input")
        });
        let copy_bytes = (n * 8) as u64;
        let launches = if args.launches > 0 {
            args.launches
        } else {
            ((4u64 << 30) / copy_bytes).max(1) as usize
        };

        let ops: [(&str, FloatDtype, FloatDtype); 5] = [
            ("copy f32", FloatDtype::F32, FloatDtype::F32),
            ("f32->f16", FloatDtype::F32, FloatDtype::F16),
            ("f16->f32", FloatDtype::F16, FloatDtype::F32),
            ("f32->bf16", FloatDtype::F32, FloatDtype::BF16),
            ("bf16->f32", FloatDtype::BF16, FloatDtype::F32),
        ];
        let mut copy_bandwidth = None;
        for (name, from, to) in ops {
            let bytes_moved = (n * (from.size_bytes() + to.size_bytes())) as u64;
            let mut record = Record {
                bench: "cast-throughput",
                device: args.device,
                runtime,
                op: name.to_string(),
                f32_mib: mib,
                elements: n,
                bytes_moved,
                launches_per_rep: launches,
                reps: args.reps,
                median_s_per_launch: None,
                bytes_per_s: None,
                ratio_to_copy: None,
                skipped: None,
            };
            let input = match from {
                FloatDtype::F32 => Some(&input_f32),
                FloatDtype::F16 => Some(&input_f16),
                FloatDtype::BF16 => input_bf16.as_ref(),
            };
            let result = match input {
                None => Err(format!("bf16 unsupported on this {runtime} device")),
                Some(input) if from == to => {
                    time_op(&client, args, launches, || copy(&client, input, n, from))
                        .map_err(|e| e.to_string())
                }
                Some(input) => time_op(&client, args, launches, || {
                    cast(&client, input, n, from, to)
                })
                .map_err(|e| e.to_string()),
            };
            match result {
                Ok(seconds) => {
                    let bandwidth = bytes_moved as f64 / seconds;
                    if from == to {
                        copy_bandwidth = Some(bandwidth);
                    }
                    record.median_s_per_launch = Some(seconds);
                    record.bytes_per_s = Some(bandwidth);
                    record.ratio_to_copy = copy_bandwidth.map(|copy| bandwidth / copy);
                    println!(
                        "{:>9} {:<10} {:>12.1} {:>12.1} {:>8.3}",
                        mib,
                        name,
                        seconds * 1e6,
                        bandwidth / 1e9,
                        record.ratio_to_copy.unwrap_or(f64::NAN)
                    );
                }
                Err(reason) => {
                    println!("{mib:>9} {name:<10} skipped: {reason}");
                    record.skipped = Some(reason);
                }
            }
            records.push(record);
        }
    }
    for record in &records {
        println!("{}", serde_json::to_string(record).expect("json"));
    }
}

fn main() {
    let args = Args::parse();
    match args.device {
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            use frugal_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
            run(CudaRuntime::client(&CudaDevice::default()), &args)
        }
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => {
            use frugal_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};
            run(WgpuRuntime::client(&WgpuDevice::default()), &args)
        }
        #[allow(unreachable_patterns)]
        other => {
            let message = match other {
                DeviceKind::Cuda | DeviceKind::Wgpu => other.refused("cast-throughput", BUILT),
                _ => format!(
                    "--device {}: cast-throughput times kernels on CubeCL's GPU runtimes: use \
                     --device cuda or wgpu (built with `--features cuda` or `--features wgpu`)",
                    other.name()
                ),
            };
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    }
}
