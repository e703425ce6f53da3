//! Time of Frugal's flash-attention kernels alone (`frugal_kernels::attention`), forward and
//! forward + backward, on one GPU, for comparison with PyTorch's SDPA on the same shapes
//! (`docs/runs/scripts/torch_attention.py`).
//!
//! Each figure is the median over repetitions, after warm-up, of the time per call, with the
//! device synced before and after each repetition. FLOPs count the products only, as
//! FlashAttention's papers do: forward `4 · b · h · sq · sk · d`, halved when causal; backward
//! 2.5 times the forward.
//!
//! ```sh
//! cargo run --release -p frugal-benches --features cuda --bin attention-throughput -- --device cuda
//! ```

// Without a GPU feature the binary only explains which build it needs; the timing code is
// still compiled so that it stays in step with the kernels' API.
#![cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]

use std::time::Instant;

use clap::Parser;
use frugal_benches::median;
use frugal_kernels::attention::{
    AttentionArgs, AttentionConfig, AttentionSaved, AttentionShape, attention_backward,
    attention_forward,
};
use frugal_kernels::cubecl::{Runtime, client::ComputeClient, future::block_on};
use frugal_kernels::{FloatDtype, KernelError, cast};
use gpt::cli::DeviceKind;
use serde::Serialize;

/// The devices this build runs on: the kernels run on CubeCL's GPU runtimes only.
const BUILT: &[DeviceKind] = &[
    #[cfg(feature = "wgpu")]
    DeviceKind::Wgpu,
    #[cfg(feature = "cuda")]
    DeviceKind::Cuda,
];

/// Time the flash-attention kernels.
#[derive(Parser)]
struct Args {
    /// Where to run: cuda or wgpu, with a build of the matching feature (the kernels run on
    /// CubeCL's GPU runtimes, not on the CPU; frugal-cuda's allocator does not change them).
    #[arg(long, value_enum, default_value = "cuda")]
    device: DeviceKind,
    /// Batch size.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Heads.
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Sequence length (queries and keys).
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Layers the totals are given for (the reference GPT has 12).
    #[arg(long, default_value_t = 12)]
    layers: usize,
    /// Without the causal mask.
    #[arg(long)]
    unmasked: bool,
    /// Comma-separated dtypes: f32, f16, bf16.
    #[arg(long, value_delimiter = ',', default_values_t = ["f32".to_string(), "bf16".to_string()])]
    dtypes: Vec<String>,
    /// Timed repetitions; the median is reported.
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Untimed repetitions first (kernel compilation).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
}

/// One measured (or skipped) pass at one dtype.
#[derive(Serialize)]
struct Record {
    bench: &'static str,
    device: DeviceKind,
    runtime: &'static str,
    dtype: String,
    pass: &'static str,
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    causal: bool,
    median_ms: Option<f64>,
    ms_for_layers: Option<f64>,
    layers: usize,
    tflops: Option<f64>,
    skipped: Option<String>,
}

fn sync<R: Runtime>(client: &ComputeClient<R>) {
    block_on(client.sync()).expect("device sync failed");
}

/// Median seconds per call of `op`, after `warmup` untimed calls.
fn time_op<R: Runtime>(
    client: &ComputeClient<R>,
    args: &Args,
    mut op: impl FnMut() -> Result<(), KernelError>,
) -> Result<f64, KernelError> {
    for _ in 0..args.warmup {
        op()?;
    }
    sync(client);
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        sync(client);
        let start = Instant::now();
        op()?;
        sync(client);
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(median(&mut times))
}

fn dtype_named(name: &str) -> Option<FloatDtype> {
    match name {
        "f32" => Some(FloatDtype::F32),
        "f16" => Some(FloatDtype::F16),
        "bf16" => Some(FloatDtype::BF16),
        _ => None,
    }
}

fn run<R: Runtime>(client: ComputeClient<R>, args: &Args) {
    let runtime = R::name(&client);
    let shape = AttentionShape {
        batch: args.batch,
        heads: args.heads,
        seq_q: args.seq,
        seq_k: args.seq,
        head_dim: args.head_dim,
    };
    let config = AttentionConfig {
        causal: !args.unmasked,
        scale: None,
    };
    let causal_factor = if config.causal { 0.5 } else { 1.0 };
    let forward_flops = 4.0
        * (shape.batch * shape.heads) as f64
        * (shape.seq_q * shape.seq_k * shape.head_dim) as f64
        * causal_factor;
    println!(
        "Flash attention on {:?} ({runtime}): [{}, {}, {}, {}], causal {}; median of {} \
         calls after {} warm-up; totals for {} layers",
        args.device,
        shape.batch,
        shape.heads,
        shape.seq_q,
        shape.head_dim,
        config.causal,
        args.reps,
        args.warmup,
        args.layers
    );
    println!(
        "{:<6} {:<18} {:>10} {:>12} {:>9}",
        "dtype", "pass", "ms/call", "ms/layers", "TFLOP/s"
    );
    let values = |len: usize, seed: u32| -> Vec<u8> {
        (0..len)
            .flat_map(|i| {
                let x = ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32;
                (x / (1u32 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect()
    };
    let mut records = Vec::new();
    for name in &args.dtypes {
        let mut push = |pass: &'static str, result: Result<f64, String>, flops: f64| {
            let mut record = Record {
                bench: "attention-throughput",
                device: args.device,
                runtime,
                dtype: name.clone(),
                pass,
                batch: shape.batch,
                heads: shape.heads,
                seq: shape.seq_q,
                head_dim: shape.head_dim,
                causal: config.causal,
                median_ms: None,
                ms_for_layers: None,
                layers: args.layers,
                tflops: None,
                skipped: None,
            };
            match result {
                Ok(seconds) => {
                    record.median_ms = Some(seconds * 1e3);
                    record.ms_for_layers = Some(seconds * 1e3 * args.layers as f64);
                    record.tflops = Some(flops / seconds / 1e12);
                    println!(
                        "{:<6} {:<18} {:>10.3} {:>12.2} {:>9.2}",
                        name,
                        pass,
                        seconds * 1e3,
                        seconds * 1e3 * args.layers as f64,
                        flops / seconds / 1e12
                    );
                }
                Err(reason) => {
                    println!("{name:<6} {pass:<18} skipped: {reason}");
                    record.skipped = Some(reason);
                }
            }
            records.push(record);
        };
        let Some(dtype) = dtype_named(name) else {
            push("forward", Err(format!("unknown dtype {name:?}")), 0.0);
            continue;
        };
        if !dtype.is_supported(&client) {
            push(
                "forward",
                Err(format!("{name} unsupported on this device")),
                0.0,
            );
            continue;
        }
        let upload = |len: usize, seed: u32| {
            let f32s = client.create_from_slice(&values(len, seed));
            if dtype == FloatDtype::F32 {
                Ok(f32s)
            } else {
                cast(&client, &f32s, len, FloatDtype::F32, dtype)
            }
        };
        let inputs = (|| {
            Ok::<_, KernelError>((
                upload(shape.q_len(), 1)?,
                upload(shape.kv_len(), 2)?,
                upload(shape.kv_len(), 3)?,
                upload(shape.q_len(), 4)?,
            ))
        })();
        let (q, k, v, grad_out) = match inputs {
            Ok(inputs) => inputs,
            Err(e) => {
                push("forward", Err(e.to_string()), 0.0);
                continue;
            }
        };
        let call = AttentionArgs {
            q: &q,
            k: &k,
            v: &v,
            bias: None,
            shape,
            dtype,
            config,
        };
        let forward = || attention_forward(&client, call);
        let result = time_op(&client, args, || forward().map(drop)).map_err(|e| e.to_string());
        push("forward", result, forward_flops);
        let result = time_op(&client, args, || {
            let fwd = forward()?;
            let saved = AttentionSaved {
                out: &fwd.out,
                lse: &fwd.lse,
                grad_out: &grad_out,
            };
            let grads = attention_backward(&client, call, saved)?;
            drop((fwd, grads));
            Ok(())
        })
        .map_err(|e| e.to_string());
        push("forward+backward", result, forward_flops * 3.5);
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
                DeviceKind::Cuda | DeviceKind::Wgpu => other.refused("attention-throughput", BUILT),
                _ => format!(
                    "--device {}: attention-throughput times kernels on CubeCL's GPU runtimes: use \
                     --device cuda or wgpu (built with `--features cuda` or `--features wgpu`)",
                    other.name()
                ),
            };
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    }
}
