//! `alloc-latency`: device allocation speed and correctness, burn-cuda's runtime (CubeCL's CUDA
//! pools) beside frugal-cuda's (the caching allocator), in one process.
//!
//! - **Latency**: a sliding window of live buffers; each iteration allocates one (sizes drawn
//!   log-uniformly from 256 B to 64 MiB by a fixed generator, the same sequence for both
//!   runtimes) and frees the oldest, as a training step's temporaries do. Reported: alloc+free
//!   pairs per second (after a warm-up pass), and the ratio frugal-cuda / cuda.
//! - **Stress** (frugal-cuda): random sizes and lifetimes under a cap, every buffer filled with
//!   its own pattern on creation and checked when read back (random live ones during the run,
//!   all at the end), so overlapping blocks would show as corrupted data; then one allocation
//!   over the cap, which must come back as an error from the next sync, not an abort.
//!
//! Prints one JSON line per measurement. Needs `--features frugal-cuda` and a GPU.

use std::collections::VecDeque;
use std::time::Instant;

use clap::Parser;
use cubecl::Runtime;
use serde_json::json;

/// Allocation latency and a stress test of frugal-cuda's allocator.
#[derive(Parser, Debug)]
struct Args {
    /// Alloc+free pairs per measurement.
    #[arg(long, default_value_t = 200_000)]
    pairs: usize,
    /// Live buffers in the sliding window.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Stress: buffers created.
    #[arg(long, default_value_t = 20_000)]
    stress_buffers: usize,
    /// Stress: the cap, in MiB.
    #[arg(long, default_value_t = 2048)]
    stress_cap_mib: u64,
}

/// A small deterministic generator (SplitMix64), so both runtimes see the same sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Log-uniform in [2^lo, 2^hi), rounded to 4 bytes.
    fn size(&mut self, lo: u32, hi: u32) -> usize {
        let exp = lo as f64 + (self.next() % 1_000_000) as f64 / 1e6 * (hi - lo) as f64;
        ((2f64.powf(exp) as usize) / 4).max(1) * 4
    }
}

fn latency<R: Runtime>(device: &R::Device, args: &Args) -> f64 {
    let client = R::client(device);
    let run = |pairs: usize| {
        let mut rng = Rng(7);
        let mut live = VecDeque::with_capacity(args.window + 1);
        let started = Instant::now();
        for _ in 0..pairs {
            live.push_back(client.empty(rng.size(8, 26)));
            if live.len() > args.window {
                live.pop_front();
            }
        }
        drop(live);
        cubecl::future::block_on(client.sync()).expect("sync");
        started.elapsed().as_secs_f64()
    };
    run(args.pairs / 10);
    let seconds = run(args.pairs);
    let usage = client.memory_usage().expect("memory usage");
    let rate = args.pairs as f64 / seconds;
    println!(
        "{}",
        json!({
            "measure": "latency",
            "runtime": std::any::type_name::<R>(),
            "pairs": args.pairs,
            "window": args.window,
            "pairs_per_s": rate,
            "ns_per_pair": seconds * 1e9 / args.pairs as f64,
            "bytes_reserved_after": usage.bytes_reserved,
        })
    );
    rate
}

fn pattern(id: u32, bytes: usize) -> Vec<u8> {
    (0..bytes / 4)
        .flat_map(|i| (id.wrapping_mul(2_654_435_761) ^ i as u32).to_le_bytes())
        .collect()
}

fn stress(args: &Args) {
    use frugal_cuda::{FrugalCudaDevice, FrugalCudaRuntime};
    let device = FrugalCudaDevice::new(0);
    let client = FrugalCudaRuntime::client(&device);
    let cap = args.stress_cap_mib << 20;
    frugal_cuda::set_memory_cap(&device, Some(cap)).expect("cap");
    let mut rng = Rng(11);
    let mut live: Vec<(u32, usize, cubecl::server::Handle)> = Vec::new();
    let (mut checked, mut live_bytes, mut peak_live) = (0u64, 0usize, 0usize);
    let started = Instant::now();
    for id in 0..args.stress_buffers as u32 {
        // Mostly small, some large: 64 B .. 32 MiB.
        let bytes = rng.size(6, 25);
        // Stay under the cap with room for fragmentation; free random buffers otherwise.
        while live_bytes + bytes > (cap as usize) * 3 / 4 && !live.is_empty() {
            let i = (rng.next() as usize) % live.len();
            live_bytes -= live.swap_remove(i).1;
        }
        let handle = client.create_from_slice(&pattern(id, bytes));
        live.push((id, bytes, handle));
        live_bytes += bytes;
        peak_live = peak_live.max(live_bytes);
        if rng.next().is_multiple_of(3) {
            let i = (rng.next() as usize) % live.len();
            live_bytes -= live.swap_remove(i).1;
        }
        if id.is_multiple_of(97) {
            let (pid, pbytes, handle) = &live[(rng.next() as usize) % live.len()];
            let data = client.read_one(handle.clone()).expect("read back");
            assert_eq!(
                &data[..],
                &pattern(*pid, *pbytes)[..],
                "buffer {pid} corrupted"
            );
            checked += 1;
        }
    }
    for (id, bytes, handle) in &live {
        let data = client.read_one(handle.clone()).expect("read back");
        assert_eq!(
            &data[..],
            &pattern(*id, *bytes)[..],
            "buffer {id} corrupted"
        );
        checked += 1;
    }
    let report = frugal_cuda::memory_report(&device);
    // One allocation over the cap: an error at the next sync, naming the cap.
    let too_big = client.empty(cap as usize + (1 << 20));
    let error = cubecl::future::block_on(client.sync())
        .err()
        .map(|e| e.to_string())
        .expect("an allocation over the cap is reported");
    assert!(error.contains("cap"), "the error names the cap: {error}");
    drop(too_big);
    drop(live);
    println!(
        "{}",
        json!({
            "measure": "stress",
            "buffers": args.stress_buffers,
            "buffers_checked": checked,
            "cap_bytes": cap,
            "peak_live_bytes": peak_live,
            "peak_reserved_bytes": report.stats.peak_reserved_bytes,
            "peak_allocated_bytes": report.stats.peak_allocated_bytes,
            "misses": report.registry.misses,
            "over_cap_error": error.lines().find(|l| l.contains("cap")).unwrap_or_default(),
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
}

fn main() {
    let args = Args::parse();
    if let Err(e) = frugal_cuda::check_device(&frugal_cuda::FrugalCudaDevice::new(0)) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let cuda = latency::<cubecl::cuda::CudaRuntime>(&Default::default(), &args);
    let frugal = latency::<frugal_cuda::FrugalCudaRuntime>(&Default::default(), &args);
    println!(
        "{}",
        json!({"measure": "latency_ratio", "frugal_cuda_over_cuda": frugal / cuda})
    );
    stress(&args);
}
