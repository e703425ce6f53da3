//! Per-op overhead of `Frugal<NdArray>` over `NdArray` on small CPU tensors, where the
//! decorator's bookkeeping is the largest share of an op's cost.
//!
//! Both backends run the same op suite in interleaved rounds (so machine noise hits both
//! alike); each figure is the median over rounds of the mean time per call. The ratio is
//! Frugal's time over NdArray's, measured in the same run.
//!
//! ```sh
//! cargo bench -p frugal-benches --bench overhead -- --rounds 7 --iters 1000
//! ```

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use clap::Parser;
use frugal::Frugal;
use frugal_benches::{median, ns_per_call};

/// Measure Frugal's per-op overhead on the CPU.
#[derive(Parser)]
struct Args {
    /// Interleaved rounds; the median over rounds is reported.
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Calls per op per round.
    #[arg(long, default_value_t = 2000)]
    iters: u32,
    /// Elements per side of the small square tensors.
    #[arg(long, default_value_t = 16)]
    size: usize,
    /// Print one JSON line per op as well.
    #[arg(long)]
    json: bool,
    /// Passed by `cargo bench` to every bench target; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

type Op = (&'static str, Box<dyn FnMut()>);

fn suite<B: Backend>(size: usize) -> Vec<Op> {
    let device = B::Device::default();
    let a = Tensor::<B, 2>::random([size, size], Distribution::Default, &device);
    let b = Tensor::<B, 2>::random([size, size], Distribution::Default, &device);
    let idx = Tensor::<B, 1, Int>::arange(0..size as i64, &device);
    macro_rules! op {
        ($name:literal, |$($v:ident),*| $body:expr) => {{
            $(let $v = $v.clone();)*
            ($name, Box::new(move || { let _ = $body; }) as Box<dyn FnMut()>)
        }};
    }
    vec![
        op!("add", |a, b| a.clone() + b.clone()),
        op!("mul_scalar", |a| a.clone() * 2.0),
        op!("exp", |a| a.clone().exp()),
        op!("matmul", |a, b| a.clone().matmul(b.clone())),
        op!("sum_dim", |a| a.clone().sum_dim(1)),
        op!("reshape (view)", |a| a.clone().reshape([size * size])),
        op!("transpose (view)", |a| a.clone().transpose()),
        op!("slice (view)", |a| a.clone().slice([0..size / 2, 0..size])),
        op!("select", |a, idx| a.clone().select(0, idx.clone())),
        op!("zeros", |a| Tensor::<B, 2>::zeros(
            [size, size],
            &a.device()
        )),
        op!("clone+drop", |a| a.clone()),
    ]
}

fn main() {
    let args = Args::parse();
    let mut plain = suite::<NdArray>(args.size);
    let mut frugal = suite::<Frugal<NdArray>>(args.size);
    let n = plain.len();
    let mut times = vec![(Vec::new(), Vec::new()); n];
    for _ in 0..args.rounds {
        for i in 0..n {
            times[i].0.push(ns_per_call(args.iters, &mut plain[i].1));
            times[i].1.push(ns_per_call(args.iters, &mut frugal[i].1));
        }
    }
    println!(
        "Per-op time on {}x{} f32 tensors, NdArray vs Frugal<NdArray>: median of {} rounds x {} calls",
        args.size, args.size, args.rounds, args.iters
    );
    println!(
        "{:<18} {:>12} {:>12} {:>12} {:>8}",
        "op", "ndarray ns", "frugal ns", "overhead ns", "ratio"
    );
    let mut ratios = Vec::new();
    for (i, (p, f)) in times.iter_mut().enumerate() {
        let (p, f) = (median(p), median(f));
        ratios.push(f / p);
        println!(
            "{:<18} {:>12.0} {:>12.0} {:>12.0} {:>8.3}",
            plain[i].0,
            p,
            f,
            f - p,
            f / p
        );
        if args.json {
            println!(
                "{}",
                serde_json::json!({"bench": "overhead", "op": plain[i].0, "ndarray_ns": p, "frugal_ns": f, "ratio": f / p})
            );
        }
    }
    println!("median ratio over ops: {:.3}", median(&mut ratios));
}
