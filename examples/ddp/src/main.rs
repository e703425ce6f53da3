//! Data-parallel training of the `gpt` example's model on several GPUs of one host, with
//! Burn's own machinery: every GPU holds a replica, the parameters are marked distributed, and
//! Burn's autodiff hands each gradient to its sync server as soon as backward has it, which
//! averages it across the GPUs through the backend's all-reduce (NCCL). The backend is
//! `Autodiff<Frugal<B>>`, so each GPU may train under a memory budget of its own.
//!
//! One index (`--devices 0`) trains on one GPU without collectives: the baseline. Every step
//! draws a global batch of `--batch` sequences per GPU and gives each GPU its rows, so a run on
//! N GPUs and a run on one GPU with N times the batch see the same data and, the gradients
//! being averaged, take the same steps.
//!
//! ```text
//! ddp --devices 0,1 --steps 20 --budget 2GiB
//! ```
//! prints a line per step and one JSON line at the end (losses, step times, throughput, each
//! GPU's peak live bytes).

use std::sync::mpsc::channel;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::distributed::{
    DistributedBackend, DistributedConfig, DistributedParamId, ReduceOperation,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::{Parser, ValueEnum};
use gpt::GptConfig;
use gpt::data::random_tokens;
use gpt::train::{OptimizerKind, optimizer, step_full};

/// The backend each GPU trains on.
type Ad<B> = burn::backend::Autodiff<frugal::Frugal<B>>;

/// Data-parallel training of the reference GPT.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
struct Args {
    /// GPUs by index, comma-separated (`0,1`). One index trains on one GPU, no collectives.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    devices: Vec<usize>,
    /// The CUDA runtime under Frugal. Without fusion by default: Burn 0.21's fusion makes the
    /// gradient sync cost several times the step (`docs/results.md`).
    #[arg(long, value_enum, default_value_t = Runtime::default())]
    runtime: Runtime,
    /// Sequences per GPU per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Training steps.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// First steps left out of the step-time figures (compilation, autotuning, the learned
    /// step of a budget).
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// A memory budget for every GPU (`2GiB`), or one per GPU in `--devices` order
    /// (`2GiB,3GiB`); `auto`: chosen from each GPU's free memory, the smallest applied to
    /// every GPU (they run the same step).
    #[arg(long, value_delimiter = ',', value_parser = parse_budget)]
    budget: Vec<Budget>,
    /// Transformer blocks.
    #[arg(long, default_value_t = 12)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 768)]
    d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Context length.
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Vocabulary (tokens are uniformly random, as `torch_gpt.py` trains on).
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// Seed of the parameters and the data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    optimizer: OptimizerKind,
    /// Syncs the gradients through the collectives even on one GPU (a one-rank all-reduce):
    /// the sync's own cost, and a check of the whole path, on a single GPU.
    #[arg(long, conflicts_with = "never_sync")]
    always_sync: bool,
    /// Never syncs the gradients: each GPU trains a replica of its own. Not training, a
    /// measurement: the step on several GPUs at once without the sync's cost.
    #[arg(long)]
    never_sync: bool,
    /// Plain Burn: `Autodiff<B>` without Frugal (no budget), the baseline of Frugal's cost.
    #[arg(long)]
    plain: bool,
}

/// `--runtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Runtime {
    /// Burn's CUDA backend (burn-cuda, with fusion).
    Cuda,
    /// frugal-cuda's runtime, with fusion.
    #[cfg(feature = "frugal-cuda")]
    FrugalCuda,
    /// frugal-cuda's runtime without Burn's fusion.
    #[cfg(feature = "frugal-cuda")]
    FrugalCudaUnfused,
}

impl Default for Runtime {
    fn default() -> Self {
        #[cfg(feature = "frugal-cuda")]
        return Runtime::FrugalCudaUnfused;
        #[cfg(not(feature = "frugal-cuda"))]
        return Runtime::Cuda;
    }
}

/// One value of `--budget`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Budget {
    Bytes(u64),
    Auto,
}

fn parse_budget(value: &str) -> Result<Budget, String> {
    match value {
        "auto" => Ok(Budget::Auto),
        size => frugal::parse_bytes(size)
            .map(Budget::Bytes)
            .map_err(|e| format!("{e} (or `auto`)")),
    }
}

/// Marks every parameter as distributed, under its parameter id: what burn-train's DDP
/// strategy does to each replica (its `ModuleSharder`).
struct MarkDistributed;

impl<B: AutodiffBackend> ModuleMapper<B> for MarkDistributed {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = tensor.set_distributed(DistributedParamId::from(id.val()));
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// One GPU's figures for one step.
struct StepOf {
    rank: usize,
    step: usize,
    loss: f32,
    elapsed: Duration,
}

/// What a run measured.
struct Outcome {
    budgets: Vec<Option<u64>>,
    losses: Vec<f32>,
    step_ms: Vec<f64>,
    peak_live: Vec<u64>,
}

fn main() {
    let args = Args::parse();
    if let Err(message) = check(&args) {
        eprintln!("ddp: {message}");
        std::process::exit(2);
    }
    let outcome = match args.runtime {
        Runtime::Cuda => on_runtime::<burn::backend::Cuda>(
            &args,
            args.devices
                .iter()
                .map(|&i| burn::backend::cuda::CudaDevice::new(i))
                .collect(),
        ),
        #[cfg(feature = "frugal-cuda")]
        Runtime::FrugalCuda => on_runtime::<frugal_cuda::FrugalCuda>(
            &args,
            args.devices
                .iter()
                .map(|&i| frugal_cuda::FrugalCudaDevice::new(i))
                .collect(),
        ),
        #[cfg(feature = "frugal-cuda")]
        Runtime::FrugalCudaUnfused => on_runtime::<frugal_cuda::FrugalCudaUnfused>(
            &args,
            args.devices
                .iter()
                .map(|&i| frugal_cuda::FrugalCudaDevice::new(i))
                .collect(),
        ),
    };
    match outcome {
        Ok(outcome) => print_summary(&args, &outcome),
        Err(message) => {
            eprintln!("ddp: {message}");
            std::process::exit(1);
        }
    }
}

/// Refuses flags that cannot run, naming the value and what to change.
fn check(args: &Args) -> Result<(), String> {
    let mut seen = args.devices.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != args.devices.len() {
        return Err(format!(
            "--devices {:?} names a GPU twice; give each index once",
            args.devices
        ));
    }
    if !args.budget.is_empty() && args.budget.len() != 1 && args.budget.len() != args.devices.len()
    {
        return Err(format!(
            "--budget gives {} values for {} GPUs; give one for all or one per GPU",
            args.budget.len(),
            args.devices.len()
        ));
    }
    if args.budget.len() > 1 && args.budget.contains(&Budget::Auto) {
        return Err("--budget auto applies to every GPU: give it alone".into());
    }
    if args.plain && !args.budget.is_empty() {
        return Err("--plain trains without Frugal, which keeps the budget: drop --budget".into());
    }
    if args.batch == 0 || args.steps == 0 {
        return Err("--batch and --steps must be at least 1".into());
    }
    #[cfg(feature = "frugal-cuda")]
    for &index in &args.devices {
        frugal_cuda::check_device(&frugal_cuda::FrugalCudaDevice::new(index))
            .map_err(|e| format!("--devices {index}: {e}"))?;
    }
    Ok(())
}

/// Trains on runtime `B`'s `devices`: through Frugal, or plain with `--plain`.
fn on_runtime<B: DistributedBackend>(
    args: &Args,
    devices: Vec<B::Device>,
) -> Result<Outcome, String> {
    match args.plain {
        false => run::<Ad<B>>(args, devices),
        true => run::<burn::backend::Autodiff<B>>(args, devices),
    }
}

/// Trains on `devices`, one thread per GPU, and returns the mean loss and the slowest GPU's
/// time of every step, and each GPU's peak live bytes.
fn run<A: AutodiffBackend + DistributedBackend>(
    args: &Args,
    devices: Vec<A::Device>,
) -> Result<Outcome, String> {
    let gpus = devices.len();
    let config = GptConfig::new(args.vocab, args.seq, args.d_model, args.heads, args.layers);
    let main = devices[0].clone();
    <A as Backend>::seed(&main, args.seed);
    // Parameters are initialised lazily, and each clone of a lazy parameter initialises on its
    // own, drawing other weights: forked once (initialised, and still parameters that take
    // gradients), every replica below starts from the same values.
    let model = config.init::<A>(&main).fork(&main);
    for (device, budget) in devices.iter().zip(budgets(args, &devices)?) {
        frugal::memory::set_budget(device, budget);
    }
    let sync = (gpus > 1 || args.always_sync) && !args.never_sync;
    if sync {
        <A as DistributedBackend>::start_communication_server(
            &devices,
            DistributedConfig {
                all_reduce_op: ReduceOperation::Mean,
            },
        );
    }
    let global_batch = args.batch * gpus;
    let barrier = Arc::new(Barrier::new(gpus));
    let (sender, receiver) = channel::<Result<StepOf, String>>();
    let replicas: Vec<_> = devices
        .iter()
        .map(|device| match sync {
            false => model.clone().fork(device),
            true => model.clone().fork(device).map(&mut MarkDistributed),
        })
        .collect();
    // The first GPU would hold the original beside its replica for the whole run.
    drop(model);
    std::thread::scope(|scope| {
        for ((rank, device), replica) in devices.iter().enumerate().zip(replicas) {
            let (barrier, sender) = (barrier.clone(), sender.clone());
            scope.spawn(move || {
                let caught = frugal::catch_quietly(
                    || {
                        let mut model = replica;
                        let mut optim = optimizer::<A>(args.optimizer);
                        for step in 0..args.steps {
                            let batch = random_tokens(
                                args.seed,
                                step as u64,
                                global_batch,
                                args.seq,
                                args.vocab,
                            );
                            let rows = batch
                                .split(gpus)
                                .expect("the global batch is a multiple of the GPUs")
                                .swap_remove(rank);
                            // Every GPU starts a step together: the step's time is the
                            // slowest GPU's.
                            barrier.wait();
                            let start = Instant::now();
                            let (next, loss, _) = step_full(
                                model,
                                &mut optim,
                                rows,
                                args.lr,
                                device,
                                false,
                                None,
                                |_| {},
                            );
                            model = next;
                            let step_of = StepOf {
                                rank,
                                step,
                                loss,
                                elapsed: start.elapsed(),
                            };
                            if sender.send(Ok(step_of)).is_err() {
                                return;
                            }
                        }
                    },
                    || (),
                );
                if let Err(caught) = caught {
                    let _ = sender.send(Err(format!(
                        "GPU {rank} ({device:?}) failed: {}",
                        caught.message()
                    )));
                }
            });
        }
        drop(sender);
        collect(args, gpus, &devices, receiver)
    })
    .inspect(|_| {
        if sync {
            <A as DistributedBackend>::close_communication_server(&main);
        }
    })
}

/// Each GPU's budget: as given, or `auto`'s smallest over the GPUs, for every GPU.
fn budgets<D: burn::tensor::backend::DeviceOps + 'static>(
    args: &Args,
    devices: &[D],
) -> Result<Vec<Option<u64>>, String> {
    Ok(match args.budget.as_slice() {
        [] => vec![None; devices.len()],
        [Budget::Auto] => {
            let mut smallest = u64::MAX;
            for device in devices {
                let auto = frugal::memory::auto_budget(device)
                    .map_err(|e| format!("--budget auto on {device:?}: {e}"))?;
                smallest = smallest.min(auto.bytes);
            }
            eprintln!(
                "budget auto: {} on every GPU (the smallest GPU's)",
                frugal::format_bytes(smallest)
            );
            vec![Some(smallest); devices.len()]
        }
        [Budget::Bytes(bytes)] => vec![Some(*bytes); devices.len()],
        each => each
            .iter()
            .map(|budget| match budget {
                Budget::Bytes(bytes) => Ok(Some(*bytes)),
                Budget::Auto => Err("--budget auto applies to every GPU".to_string()),
            })
            .collect::<Result<_, _>>()?,
    })
}

/// Gathers the GPUs' steps into the run's figures, printing each step as it completes.
fn collect<D: burn::tensor::backend::DeviceOps + 'static>(
    args: &Args,
    gpus: usize,
    devices: &[D],
    receiver: std::sync::mpsc::Receiver<Result<StepOf, String>>,
) -> Result<Outcome, String> {
    let mut losses = vec![Vec::new(); args.steps];
    let mut times = vec![Duration::ZERO; args.steps];
    for message in receiver {
        let step_of = match message {
            Ok(step_of) => step_of,
            Err(failure) => {
                // The other GPUs wait for this one at the next all-reduce or step: stop the
                // process here rather than wait for their threads.
                eprintln!("ddp: {failure}");
                std::process::exit(1);
            }
        };
        let step = step_of.step;
        losses[step].push((step_of.rank, step_of.loss));
        times[step] = times[step].max(step_of.elapsed);
        if losses[step].len() == gpus {
            // The GPUs' shards are equal: the mean of their mean losses is the batch's.
            let loss = losses[step].iter().map(|(_, l)| *l as f64).sum::<f64>() / gpus as f64;
            eprintln!(
                "step {:>3}  loss {loss:.6}  {:>9.2} ms",
                step + 1,
                times[step].as_secs_f64() * 1e3
            );
        }
    }
    let complete = losses.iter().filter(|l| l.len() == gpus).count();
    if complete < args.steps {
        return Err(format!(
            "only {complete} of {} steps completed on every GPU",
            args.steps
        ));
    }
    Ok(Outcome {
        budgets: devices.iter().map(frugal::memory::budget).collect(),
        losses: losses
            .iter()
            .map(|l| (l.iter().map(|(_, x)| *x as f64).sum::<f64>() / gpus as f64) as f32)
            .collect(),
        step_ms: times.iter().map(|t| t.as_secs_f64() * 1e3).collect(),
        peak_live: devices.iter().map(frugal::memory::peak_bytes).collect(),
    })
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn print_summary(args: &Args, outcome: &Outcome) {
    let timed = &outcome.step_ms[args.warmup.min(outcome.step_ms.len() - 1)..];
    let median_ms = median(timed);
    let global_batch = args.batch * args.devices.len();
    let summary = serde_json::json!({
        "runtime": format!("{:?}", args.runtime),
        "devices": args.devices,
        "batch_per_gpu": args.batch,
        "global_batch": global_batch,
        "budget": outcome.budgets,
        "synced": (args.devices.len() > 1 || args.always_sync) && !args.never_sync,
        "plain": args.plain,
        "steps": args.steps,
        "losses": outcome.losses,
        "step_ms": outcome.step_ms,
        "first_step_ms": outcome.step_ms[0],
        "median_ms": median_ms,
        "sequences_per_s": global_batch as f64 / (median_ms / 1e3),
        "peak_live": outcome.peak_live,
    });
    println!("{summary}");
}
