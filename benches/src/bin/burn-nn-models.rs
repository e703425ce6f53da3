//! Budgets and first steps on models the project did not design, written from burn-nn's
//! modules as a Burn user writes them: a `TransformerEncoder` as it comes (written-out
//! attention, dropout, post-norm), a ResNet with `BatchNorm`, and a two-layer `Lstm` language
//! model. Each trains with AdamW on `Autodiff<Frugal<B>>`; the only Frugal call is
//! `frugal::memory::set_budget`, and with `--micro-batching` the loop is one built on
//! `frugal::GradientAccumulation` that asks `frugal::MicroBatching` for its split each step.
//!
//! One process runs one configuration and prints one JSON line: the first step's time (and,
//! on frugal-cuda, what it compiled), the median of the steps from the fourth on, the ledger's
//! peak over the run and over those steps, the allocator's peaks and what the budget moved.
//! Budgets are given in bytes or as a fraction of a plain run's peak (`--budget-of`), so a
//! script runs the plain configuration first and the budgets after it, each in its own process.
//!
//! `burn-nn-models --model encoder --device frugal-cuda --steps 12 [--budget-of PEAK --fraction 0.5]`

use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, Embedding, EmbeddingConfig, Linear, LinearConfig, Lstm, LstmConfig,
    PaddingConfig2d,
    conv::{Conv2d, Conv2dConfig},
};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};
use clap::{Parser, ValueEnum};
use frugal::{GradientAccumulation, MicroBatching, memory};
use frugal_benches::peak_memory::probes::{
    AllocatorFigures, CompileWaitsFor, DriverInStep, allocator_figures, compile_waits,
    compile_waits_since, driver_calls,
};
use gpt::Ad;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum ModelKind {
    /// burn-nn's TransformerEncoder (6 layers, d_model 512, 8 heads, seq 256, batch 32) with an
    /// embedding and a vocabulary head, causal mask, next-token loss.
    Encoder,
    /// A ResNet of basic blocks with BatchNorm (64-128-256 channels, two blocks a stage) on
    /// 64 × 64 images, batch 64, 100 classes.
    Resnet,
    /// Two stacked burn-nn Lstm layers (hidden 1024) over seq 128, batch 32, with an embedding
    /// and a vocabulary head.
    Lstm,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Device {
    /// Flex on the CPU (a smoke run: the models are sized for a GPU).
    Flex,
    /// Burn's CUDA backend (CubeCL, fused).
    Cuda,
    /// frugal-cuda's runtime, fused.
    FrugalCuda,
}

#[derive(Parser, Debug)]
#[command(about = "Budgets and first steps on burn-nn models (one configuration per process)")]
struct Args {
    #[arg(long, value_enum)]
    model: ModelKind,
    #[arg(long, value_enum, default_value = "frugal-cuda")]
    device: Device,
    /// Steps to run; the median is over the steps from the fourth on.
    #[arg(long, default_value_t = 12)]
    steps: usize,
    /// A budget in bytes.
    #[arg(long, conflicts_with = "budget_of")]
    budget: Option<u64>,
    /// A plain run's peak, in bytes: the budget is `--fraction` of it.
    #[arg(long, requires = "fraction")]
    budget_of: Option<u64>,
    /// The share of `--budget-of` to budget (0.5: half of the plain peak).
    #[arg(long)]
    fraction: Option<f64>,
    /// Divides the batch (to try the models on the CPU).
    #[arg(long, default_value_t = 1)]
    shrink: usize,
    /// How convolutions choose their kernels: the inner backend's autotune (the default) or
    /// one kernel a pass.
    #[arg(long, value_enum, default_value = "autotune")]
    conv: ConvChoice,
    /// Run each step as micro-batches, their gradients summed by
    /// `frugal::GradientAccumulation`: this many (which must divide the batch), or with
    /// `--micro-batching` this many to start with.
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Let `frugal::MicroBatching` choose the micro-batches of each step under the budget.
    #[arg(long)]
    micro_batching: bool,
    /// frugal-cuda: the device time of the second half of the steps (from the fourth on) by
    /// kind of work, with CUDA events around every launch, product and copy (printed, and in
    /// the JSON line as `kernel_profile`).
    #[arg(long)]
    profile_kernels: bool,
    /// frugal-cuda under a budget: the allocator's growth limit as a multiple of the budget
    /// (`1.25`), or `none`; by default the one `frugal::memory::set_budget` sets.
    #[arg(long, value_parser = parse_growth_limit)]
    growth_limit: Option<GrowthLimit>,
    /// frugal-cuda: the share of a settled step the allocator's misses may take before it
    /// raises the growth limit by an eighth (`frugal_cuda::set_miss_time_share`), or `off`
    /// (never raised); by default frugal-cuda's own.
    #[arg(long, value_parser = parse_miss_time_share)]
    miss_time_share: Option<MissTimeShare>,
}

/// `--miss-time-share`: off, or a share of the step.
#[derive(Clone, Copy, Debug)]
struct MissTimeShare(Option<f64>);

fn parse_miss_time_share(text: &str) -> Result<MissTimeShare, String> {
    match text {
        "off" => Ok(MissTimeShare(None)),
        _ => match text.parse::<f64>() {
            Ok(share) if share > 0.0 && share < 1.0 => Ok(MissTimeShare(Some(share))),
            _ => Err(format!(
                "`{text}` is neither `off` nor a share of the step between 0 and 1 (as `0.05`)"
            )),
        },
    }
}

/// `--growth-limit`: none, or a multiple of the budget.
#[derive(Clone, Copy, Debug)]
enum GrowthLimit {
    None,
    OfBudget(f64),
}

fn parse_growth_limit(text: &str) -> Result<GrowthLimit, String> {
    match text {
        "none" => Ok(GrowthLimit::None),
        _ => match text.parse::<f64>() {
            Ok(ratio) if ratio >= 1.0 => Ok(GrowthLimit::OfBudget(ratio)),
            _ => Err(format!(
                "`{text}` is neither `none` nor a multiple of the budget of at least 1 (as `1.25`)"
            )),
        },
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum ConvChoice {
    /// `frugal::kernels::ConvAlgorithm::OneKernel`.
    OneKernel,
    /// `frugal::kernels::ConvAlgorithm::Autotune`: burn-cubecl's autotune.
    Autotune,
}

const VOCAB: usize = 8192;

#[derive(Module, Debug)]
struct EncoderLm<B: Backend> {
    embed: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

#[derive(Module, Debug)]
struct BasicBlock<B: Backend> {
    conv1: Conv2d<B>,
    norm1: BatchNorm<B>,
    conv2: Conv2d<B>,
    norm2: BatchNorm<B>,
    /// A strided 1 × 1 projection where the block changes width or resolution.
    project: Option<Conv2d<B>>,
}

#[derive(Module, Debug)]
struct ResNet<B: Backend> {
    stem: Conv2d<B>,
    stem_norm: BatchNorm<B>,
    blocks: Vec<BasicBlock<B>>,
    head: Linear<B>,
}

#[derive(Module, Debug)]
struct LstmLm<B: Backend> {
    embed: Embedding<B>,
    lower: Lstm<B>,
    upper: Lstm<B>,
    head: Linear<B>,
}

fn conv3(channels: [usize; 2], stride: usize) -> Conv2dConfig {
    Conv2dConfig::new(channels, [3, 3])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
}

impl<B: Backend> BasicBlock<B> {
    fn new(input: usize, output: usize, stride: usize, device: &B::Device) -> Self {
        BasicBlock {
            conv1: conv3([input, output], stride).init(device),
            norm1: BatchNormConfig::new(output).init(device),
            conv2: conv3([output, output], 1).init(device),
            norm2: BatchNormConfig::new(output).init(device),
            project: (input != output || stride != 1).then(|| {
                Conv2dConfig::new([input, output], [1, 1])
                    .with_stride([stride, stride])
                    .with_bias(false)
                    .init(device)
            }),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let shortcut = match &self.project {
            Some(project) => project.forward(x.clone()),
            None => x.clone(),
        };
        let y = relu(self.norm1.forward(self.conv1.forward(x)));
        let y = self.norm2.forward(self.conv2.forward(y));
        relu(y + shortcut)
    }
}

/// One model with its batch: the loss of a forward pass.
trait Trainable<B: AutodiffBackend>: AutodiffModule<B> {
    /// Items in a whole batch.
    const BATCH: usize;
    /// The mean loss over a batch of `BATCH / shrink` items.
    fn loss(&self, step: usize, shrink: usize, device: &B::Device) -> Tensor<B, 1>;
}

/// Random tokens of a language model's batch: the input and, shifted by one, its targets.
fn tokens<B: Backend>(
    batch: usize,
    seq: usize,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let data = Tensor::<B, 2>::random(
        [batch, seq + 1],
        Distribution::Uniform(0.0, VOCAB as f64),
        device,
    )
    .int()
    .clamp(0, VOCAB as i64 - 1);
    let input = data.clone().slice([0..batch, 0..seq]);
    (input, data.slice([0..batch, 1..seq + 1]))
}

fn next_token_loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(
            logits.reshape([batch * seq, vocab]),
            targets.reshape([batch * seq]),
        )
}

impl<B: AutodiffBackend> Trainable<B> for EncoderLm<B> {
    const BATCH: usize = 32;
    fn loss(&self, _step: usize, shrink: usize, device: &B::Device) -> Tensor<B, 1> {
        let (batch, seq) = (Self::BATCH / shrink, 256);
        let (input, targets) = tokens::<B>(batch, seq, device);
        let mask = burn::nn::attention::generate_autoregressive_mask::<B>(batch, seq, device);
        let x = self.embed.forward(input);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        next_token_loss(self.head.forward(x), targets)
    }
}

impl<B: AutodiffBackend> Trainable<B> for ResNet<B> {
    const BATCH: usize = 64;
    fn loss(&self, _step: usize, shrink: usize, device: &B::Device) -> Tensor<B, 1> {
        let batch = Self::BATCH / shrink;
        let images =
            Tensor::<B, 4>::random([batch, 3, 64, 64], Distribution::Normal(0.0, 1.0), device);
        let labels = Tensor::<B, 1>::random([batch], Distribution::Uniform(0.0, 100.0), device)
            .int()
            .clamp(0, 99);
        let mut x = relu(self.stem_norm.forward(self.stem.forward(images)));
        for block in &self.blocks {
            x = block.forward(x);
        }
        let [b, c, _, _] = x.dims();
        let pooled = x.mean_dim(3).mean_dim(2).reshape([b, c]);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(self.head.forward(pooled), labels)
    }
}

impl<B: AutodiffBackend> Trainable<B> for LstmLm<B> {
    const BATCH: usize = 32;
    fn loss(&self, _step: usize, shrink: usize, device: &B::Device) -> Tensor<B, 1> {
        let (batch, seq) = (Self::BATCH / shrink, 128);
        let (input, targets) = tokens::<B>(batch, seq, device);
        let x = self.embed.forward(input);
        let (x, _) = self.lower.forward(x, None);
        let (x, _) = self.upper.forward(x, None);
        next_token_loss(self.head.forward(x), targets)
    }
}

fn encoder<B: Backend>(device: &B::Device) -> EncoderLm<B> {
    EncoderLm {
        embed: EmbeddingConfig::new(VOCAB, 512).init(device),
        encoder: TransformerEncoderConfig::new(512, 2048, 8, 6).init(device),
        head: LinearConfig::new(512, VOCAB).init(device),
    }
}

fn resnet<B: Backend>(device: &B::Device) -> ResNet<B> {
    let mut blocks = Vec::new();
    let mut width = 64;
    for (stage, out) in [64, 128, 256].into_iter().enumerate() {
        for i in 0..2 {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            blocks.push(BasicBlock::new(width, out, stride, device));
            width = out;
        }
    }
    ResNet {
        stem: conv3([3, 64], 1).init(device),
        stem_norm: BatchNormConfig::new(64).init(device),
        blocks,
        head: LinearConfig::new(256, 100).init(device),
    }
}

fn lstm<B: Backend>(device: &B::Device) -> LstmLm<B> {
    LstmLm {
        embed: EmbeddingConfig::new(VOCAB, 512).init(device),
        lower: LstmConfig::new(512, 1024, true).init(device),
        upper: LstmConfig::new(1024, 1024, true).init(device),
        head: LinearConfig::new(1024, VOCAB).init(device),
    }
}

/// What one run printed.
#[derive(Serialize)]
struct RunLine {
    model: ModelKind,
    device: Device,
    budget: Option<u64>,
    fraction: Option<f64>,
    steps: usize,
    parameters: usize,
    losses: Vec<f32>,
    step_ms: Vec<f64>,
    first_step_ms: f64,
    /// Median of the steps from the fourth on.
    median_ms: f64,
    /// Median of the second half of the steps (after the budget's plan has settled).
    late_median_ms: f64,
    /// The ledger's peak over the whole run and over the steps from the fourth on.
    peak_live: u64,
    steady_peak_live: u64,
    /// frugal-cuda's allocator: peak allocated and reserved bytes.
    allocator_peak_allocated: Option<u64>,
    allocator_peak_reserved: Option<u64>,
    /// What the budget recomputed, offloaded and compressed over the run.
    recomputed_bytes: u64,
    offloaded_bytes: u64,
    compressed_bytes: u64,
    /// The plan's simulated peak under its last cuts, and the peak measured on the first step
    /// made under them (0: none).
    plan_estimated_peak: u64,
    plan_measured_peak: u64,
    /// The most bytes one op of the learned step holds at once (0: its peak fit the budget):
    /// where the budget is below it, live bytes go over the budget while that op runs.
    plan_op_floor: u64,
    /// frugal-cuda: what the first step compiled and how long that took.
    first_step_compiled: Option<u64>,
    first_step_compile_s: Option<f64>,
    /// frugal-cuda: the part of the first step's compilation spent in NVRTC.
    first_step_nvrtc_s: Option<f64>,
    /// frugal-cuda: how long the first step waited for its kernels to compile (less than
    /// `first_step_compile_s` where they compiled side by side), and what made it wait.
    first_step_wait_s: Option<f64>,
    first_step_waits: Option<Vec<CompileWaitsFor>>,
    /// frugal-cuda: kernels compiled in each step after the first.
    later_compiled: Option<Vec<u64>>,
    /// How convolutions chose their kernels, and the passes run with one kernel (of them,
    /// those the implicit GEMM refused).
    conv: ConvChoice,
    conv_passes: u64,
    conv_fallbacks: u64,
    /// With `--micro-batches` or `--micro-batching`: each step's micro-batch count, and the
    /// changes of split with their reasons.
    micro_batches: Vec<usize>,
    split_changes: Vec<String>,
    /// With `--profile-kernels` on frugal-cuda: the profiled steps' device time by kind.
    kernel_profile: Option<gpt::kernel_profile::KernelProfile>,
    /// frugal-cuda: what the allocator asked of the driver in each step (maps, unmaps, waits).
    driver_per_step: Option<Vec<DriverInStep>>,
    /// frugal-cuda: the allocator's figures at the end (its growth limit and its raises).
    allocator: Option<AllocatorFigures>,
    /// Steps begun under a settled plan (marked for the allocator on frugal-cuda).
    settled_steps: u64,
}

fn train<B: Backend, M>(args: &Args, model: M, device: &B::Device) -> RunLine
where
    M: Trainable<Ad<B>>,
{
    let parameters = model.num_params();
    let mut model = model;
    let mut optim = AdamWConfig::new().init::<Ad<B>, M>();
    let budget = memory::budget(device);
    let counts = gpt::compile_progress::reader(device);
    // Compilation shows on stderr while a step waits for it, as in `gpt`.
    let bar = indicatif::ProgressBar::hidden();
    let _watch = counts.map(|read| gpt::compile_progress::CompileWatch::start(&bar, read, true));
    let mut last_counts = counts.map(|read| read());
    let (mut losses, mut step_ms, mut compiled) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_compile = None;
    let on_frugal_cuda = counts.is_some();
    let waits_before = compile_waits(on_frugal_cuda);
    let mut first_waits = None;
    let (mut early_peak, mut steady_peak) = (0, 0);
    let batch = M::BATCH / args.shrink;
    let mut split = match MicroBatching::new(batch, args.micro_batches) {
        Ok(split) => split,
        Err(e) => {
            eprintln!("--micro-batches {}: {e}", args.micro_batches);
            std::process::exit(2);
        }
    };
    let accumulate = args.micro_batching || args.micro_batches > 1;
    let (mut micro_batches, mut split_changes) = (Vec::new(), Vec::new());
    let profiled = gpt::kernel_profile::first_profiled_step(3, args.steps as u64) as usize;
    let mut kernel_profile = None;
    let mut driver_per_step = on_frugal_cuda.then(Vec::new);
    for step in 0..args.steps {
        let driver_before = driver_calls(device);
        if args.profile_kernels && step == profiled {
            gpt::kernel_profile::start(device);
        }
        if step == 3 {
            early_peak = memory::peak_bytes(device);
            memory::reset_peak(device);
        }
        let started = Instant::now();
        let loss = match accumulate {
            false => {
                let loss = model.loss(step, args.shrink, device);
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optim.step(1e-4, model, grads);
                loss.into_scalar().elem::<f32>()
            }
            true => {
                split.begin_step(device);
                let parts = split.micro_batches();
                let mut accumulation =
                    GradientAccumulation::new(parts).expect("MicroBatching splits into >= 1");
                let mut part_losses = Vec::with_capacity(parts);
                for _ in 0..parts {
                    let loss = model.loss(step, args.shrink * parts, device);
                    part_losses.push(loss.clone().detach());
                    accumulation
                        .backward(&model, loss)
                        .expect("one backward pass per micro-batch");
                }
                let grads = accumulation.finish().expect("every micro-batch added");
                model = optim.step(1e-4, model, grads);
                let loss = Tensor::cat(part_losses, 0)
                    .mean()
                    .into_scalar()
                    .elem::<f32>();
                micro_batches.push(parts);
                if args.micro_batching
                    && let Some(change) = split.end_step(device, started.elapsed())
                {
                    eprintln!("step {step}: {change}");
                    split_changes.push(format!("step {step}: {change}"));
                }
                loss
            }
        };
        losses.push(loss);
        step_ms.push(started.elapsed().as_secs_f64() * 1e3);
        if let (Some(all), Some(now), Some(before)) = (
            driver_per_step.as_mut(),
            driver_calls(device),
            driver_before,
        ) {
            all.push(now.since(&before));
        }
        if let Some(read) = counts {
            let now = read();
            let during = now.since(&last_counts.unwrap_or_default());
            last_counts = Some(now);
            if step == 0 {
                first_compile = Some(during);
                first_waits = compile_waits(on_frugal_cuda)
                    .zip(waits_before.as_ref())
                    .map(|(now, before)| compile_waits_since(&now, before));
                if let Some(waits) = &first_waits {
                    let causes: Vec<String> = waits
                        .iter()
                        .map(|w| format!("{} {:.1} s ({} waits)", w.cause, w.ms / 1e3, w.waits))
                        .collect();
                    eprintln!(
                        "first step: {} kernels compiled ({:.1} s of compile threads' time), \
                         {:.1} s waited for them: {}",
                        during.compiled,
                        during.compiling.as_secs_f64(),
                        during.waited.as_secs_f64(),
                        causes.join(", ")
                    );
                }
            } else {
                compiled.push(during.compiled);
            }
        }
        if step >= 3 {
            steady_peak = memory::peak_bytes(device);
        }
        eprintln!(
            "step {step}: loss {:.4}, {:.1} ms",
            losses[step], step_ms[step]
        );
        if args.profile_kernels && step + 1 == args.steps {
            kernel_profile = gpt::kernel_profile::finish(device, &step_ms[profiled..]);
            if let Some(profile) = &kernel_profile {
                eprint!("{profile}");
            }
        }
    }
    let remat = memory::remat_stats(device);
    let allocator = gpt::diagnostics::allocator_peaks(device);
    let mut steady: Vec<f64> = step_ms.iter().skip(3).copied().collect();
    RunLine {
        model: args.model,
        device: args.device,
        budget,
        fraction: args.fraction,
        steps: args.steps,
        parameters,
        first_step_ms: step_ms[0],
        median_ms: if steady.is_empty() {
            f64::NAN
        } else {
            frugal_benches::median(&mut steady)
        },
        late_median_ms: {
            let mut late: Vec<f64> = step_ms[step_ms.len() / 2..].to_vec();
            frugal_benches::median(&mut late)
        },
        losses,
        step_ms,
        peak_live: early_peak.max(memory::peak_bytes(device)),
        steady_peak_live: steady_peak,
        allocator_peak_allocated: allocator.as_ref().map(|a| a.allocated),
        allocator_peak_reserved: allocator.as_ref().map(|a| a.reserved),
        recomputed_bytes: remat.recomputed_bytes,
        offloaded_bytes: remat.offloaded_bytes,
        compressed_bytes: remat.compressed_bytes,
        plan_estimated_peak: remat.plan_estimated_peak,
        plan_measured_peak: remat.plan_measured_peak,
        plan_op_floor: remat.plan_op_floor,
        first_step_compiled: first_compile.map(|c| c.compiled),
        first_step_compile_s: first_compile.map(|c| c.compiling.as_secs_f64()),
        first_step_nvrtc_s: first_compile.map(|c| c.nvrtc.as_secs_f64()),
        first_step_wait_s: first_compile.map(|c| c.waited.as_secs_f64()),
        first_step_waits: first_waits,
        later_compiled: counts.map(|_| compiled),
        conv: args.conv,
        conv_passes: frugal::kernels::stats().conv_passes,
        conv_fallbacks: frugal::kernels::stats().conv_fallbacks,
        micro_batches,
        split_changes,
        kernel_profile,
        driver_per_step,
        allocator: allocator_figures(device),
        settled_steps: remat.settled_steps,
    }
}

/// `--miss-time-share` on a frugal-cuda device.
fn set_miss_time_share<D: 'static>(device: &D, share: Option<f64>) {
    match (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>() {
        Some(device) => frugal_cuda::set_miss_time_share(device, share),
        None => eprintln!("--miss-time-share: not a frugal-cuda device, ignored"),
    }
}

fn run<B: Backend>(args: &Args, device: B::Device) -> RunLine {
    <Ad<B> as Backend>::seed(&device, 42);
    // Before the model is built: parameters made before a budget is set are not managed, and
    // could not be evicted until the first optimizer step replaces them.
    let budget = args
        .budget
        .or_else(|| Some((args.budget_of? as f64 * args.fraction?) as u64));
    memory::set_budget(&device, budget);
    if let (Some(limit), Some(budget)) = (args.growth_limit, budget) {
        let bytes = match limit {
            GrowthLimit::None => None,
            GrowthLimit::OfBudget(ratio) => Some((budget as f64 * ratio) as u64),
        };
        memory::set_growth_limit(&device, bytes);
    }
    if let Some(MissTimeShare(share)) = args.miss_time_share {
        set_miss_time_share(&device, share);
    }
    frugal::kernels::set_conv_algorithm(match args.conv {
        ConvChoice::OneKernel => frugal::kernels::ConvAlgorithm::OneKernel,
        ConvChoice::Autotune => frugal::kernels::ConvAlgorithm::Autotune,
    });
    match args.model {
        ModelKind::Encoder => train::<B, _>(args, encoder::<Ad<B>>(&device), &device),
        ModelKind::Resnet => train::<B, _>(args, resnet::<Ad<B>>(&device), &device),
        ModelKind::Lstm => train::<B, _>(args, lstm::<Ad<B>>(&device), &device),
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    if let Some(fraction) = args.fraction
        && !(fraction > 0.0 && fraction <= 1.0)
    {
        eprintln!("--fraction {fraction}: give a share of the plain peak in (0, 1], e.g. 0.5");
        std::process::exit(2);
    }
    if args.steps == 0 || args.shrink == 0 || args.shrink > 32 {
        eprintln!(
            "--steps {} --shrink {}: give at least one step and a shrink between 1 and 32",
            args.steps, args.shrink
        );
        std::process::exit(2);
    }
    let line = match args.device {
        Device::Flex => run::<burn::backend::Flex>(&args, Default::default()),
        Device::Cuda => run::<burn::backend::Cuda>(&args, Default::default()),
        Device::FrugalCuda => {
            if let Err(e) = frugal_cuda::check_device(&Default::default()) {
                eprintln!("--device frugal-cuda: {e}");
                std::process::exit(2);
            }
            run::<frugal_cuda::FrugalCuda>(&args, Default::default())
        }
    };
    println!(
        "{}",
        serde_json::to_string(&line).expect("a run line always serialises")
    );
}
