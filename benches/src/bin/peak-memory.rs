//! `peak-memory`: the reference GPT training step (the twin of `shared/anchors/torch_gpt.py`)
//! under named configurations, one child process each so that no configuration inherits
//! another's device pool. Prints one JSON line per configuration with torch_gpt.py's fields,
//! then a table.
//!
//! Figures:
//! - `peak_allocated_bytes`: Frugal's peak live tensor bytes over the timed steps (absent for
//!   plain Burn, which has no ledger).
//! - `peak_reserved_bytes`: the highest reserved bytes of the CubeCL pool seen at the phase
//!   boundaries of each step (start, after forward, after backward, after the optimizer),
//!   after a sync; a lower bound of the true peak, since CubeCL keeps no peak counter.
//! - `step_ms_median`, `tokens_per_s`: over the steps after warm-up (the last step, whose
//!   phases are probed with syncs, left out); `step_ms`: every step, warm-up included.
//! - `ledger_vs_pool`: for Frugal, the ledger's live bytes beside the pool's `bytes_in_use` at
//!   each phase boundary of the last step.
//! - `budget_bytes`, `checkpoint_blocks`: the configuration's memory budget and scopes.
//! - `evictions`, `recomputes`, `offloads`, `offload_batches`, `search_nanos`, `offload_nanos`,
//!   ... (the fields of `frugal::RematStats`): what Frugal's budget and scopes did over the
//!   measured steps (absent without Frugal).
//!
//! The budgets (`budget-1/3` etc.) are fractions of the `frugal` configuration's
//! `peak_allocated_bytes` in the same invocation, which is run first (added if not asked for).
//! A configuration that fails (e.g. a budget too small for one op) gives a line with `error`,
//! the first line of its panic message, and a failed row in the table; the others still run.

// The flags' doc comments are their `--help` text, read in a terminal: types like
// `Autodiff<B>` and URLs stay plain there rather than marked up for rustdoc.
#![allow(rustdoc::invalid_html_tags, rustdoc::bare_urls)]

use std::process::Command;
use std::time::Instant;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::tensor::backend::{AutodiffBackend, Backend};
use clap::{ArgAction, Parser};
use frugal::memory;
use frugal::{Frugal, RematStats};
use frugal_benches::configs::{Config, System};
use frugal_benches::median;
use gpt::GptConfig;
use gpt::cli::{AttentionKind, DeviceKind, ModelPreset, ModelShape, NormKind};
use gpt::data::random_tokens;
// The devices this build runs on: gpt's, whose features this package's turn on.
use gpt::run::BUILT;
use gpt::train::{self, Phase};
use serde::Serialize;

/// Peak memory and speed of the reference GPT step under named configurations.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Where to run (`cuda` and `wgpu` need the matching build feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceKind,
    /// Comma-separated configurations: plain (Autodiff<B>); frugal (Autodiff<Frugal<B>>,
    /// watching only); frugal-scopes (frugal, each block in a checkpoint scope);
    /// budget-1/2, budget-1/3, budget-1/4 (frugal under a budget of that fraction of frugal's
    /// peak, which is run first as the reference); budget-1/2-scopes, budget-1/3-scopes,
    /// budget-1/4-scopes (both); burn-balanced
    /// (Burn's own Autodiff<B, BalancedCheckpointing>); bf16, bf16-scopes (frugal with bf16
    /// autocast); bf16-budget-1/3, bf16-store-budget-1/3 (autocast under the budget, the
    /// latter also storing evicted tensors in bf16); store-budget-1/3 (f32 with bf16 storage);
    /// bf16-lowout, bf16-lowout-scopes, bf16-lowout-store-budget-1/3 (autocast leaving products
    /// in bf16, as PyTorch's does); store-budget-1/6-scopes (f32, scopes, and a budget below
    /// what the scopes leave, met by bf16 storage and eviction).
    #[arg(long, default_value = "plain,frugal")]
    configs: String,
    /// Run only this configuration in this process (used for the child processes).
    #[arg(long, hide = true)]
    only: Option<String>,
    /// The budget of a budget configuration in this process (used for the child processes).
    #[arg(long, hide = true)]
    budget_bytes: Option<u64>,
    /// Run the configurations one after another in this process instead of one child process
    /// each, so that later ones reuse the kernels earlier ones compiled (a fresh GPU machine
    /// spends minutes compiling per process). Device memory is cleaned up between
    /// configurations, but a pool may keep pages: reserved figures are only exact per process.
    #[arg(long)]
    in_process: bool,
    /// The peak live bytes the budget fractions are of, instead of running the frugal
    /// configuration first to measure it.
    #[arg(long, value_name = "BYTES")]
    reference_peak: Option<u64>,
    /// The model's size, as `gpt --model` takes it; --layers, --d-model, --heads, --seq and
    /// --batch override single values.
    #[arg(long, value_enum, default_value_t = ModelPreset::Reference)]
    model: ModelPreset,
    /// Transformer blocks [default: the --model's].
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
    /// Model width [default: the --model's].
    #[arg(long, value_name = "N", alias = "d")]
    d_model: Option<usize>,
    /// Attention heads, dividing --d-model [default: the --model's].
    #[arg(long, value_name = "N")]
    heads: Option<usize>,
    /// Context length in tokens [default: the --model's].
    #[arg(long, value_name = "N")]
    seq: Option<usize>,
    /// Sequences per step [default: the --model's].
    #[arg(long, value_name = "N")]
    batch: Option<usize>,
    /// Vocabulary of the random tokens and the model (torch_gpt.py's default).
    #[arg(long, value_name = "N", default_value_t = 8192)]
    vocab: usize,
    /// Steps per configuration, warm-up included.
    #[arg(long, default_value_t = 6)]
    steps: usize,
    /// Steps left out of the timing.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Run the configurations in this order this many times, alternating, to spread drift.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// JSON lines from `torch_gpt.py` run in the same session, shown beside Burn's figures.
    #[arg(long)]
    torch: Option<std::path::PathBuf>,
    /// Write a bar chart of peak memory per configuration to this PNG.
    #[arg(long)]
    chart: Option<std::path::PathBuf>,
    /// For Frugal configurations: write every tensor allocation and free the ledger saw, from
    /// before the model is built to the last step, to this file (`a <id> <bytes>` / `f <id>`
    /// lines: an allocation trace for `frugal-cuda`'s allocator tests).
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
    /// With `--device frugal-cuda`: write what its allocator was asked (every block allocated
    /// and freed, from before the model is built to the last step) to this file, in the same
    /// format as `--trace`.
    #[arg(long)]
    allocator_trace: Option<std::path::PathBuf>,
    /// For Frugal configurations: record the timed steps' timeline and report which ops'
    /// outputs held the live bytes at their peak (`peak_holders` in the JSON, top ones on
    /// stderr). Recording takes a lock per allocation and free.
    #[arg(long)]
    peak_holders: bool,
    /// On frugal-cuda: time every kernel, product and copy of the timed steps with CUDA events
    /// (`kernel_profile` in the JSON: device time per step by kind of work and by kernel, and
    /// the device's idle time between them). The probed last step is left out.
    #[arg(long)]
    profile_kernels: bool,
    /// For Frugal configurations: record the timed steps and write them as a PyTorch
    /// memory_viz pickle (https://pytorch.org/memory_viz) to FILE with the configuration's
    /// name before the extension (`--memory-viz m.pickle`: `m.budget-1_3.pickle`). On
    /// frugal-cuda: its allocator's real segments and blocks, and its trace of the timed steps.
    #[arg(long, value_name = "FILE")]
    memory_viz: Option<std::path::PathBuf>,
    /// Run on Burn's fusion. With `--device cuda` or `frugal-cuda`, false runs on CubeCL's
    /// CUDA backend without it, whose fused kernels are compiled (and fused matmuls
    /// autotuned) for every new sequence of ops.
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set)]
    fusion: bool,
    /// The older spelling of --fusion false.
    #[arg(long, hide = true, conflicts_with = "fusion")]
    no_fusion: bool,
    /// Under a budget, let a checkpoint scope's end leave its costly products on the device
    /// for the budget to evict by score (`frugal::Policy::scope_keeps_products`).
    #[arg(long)]
    scopes_keep_products: bool,
    /// Under autocast, cast weights and saved activations again in backward instead of
    /// keeping forward's casts (`frugal::AutocastPolicy::with_kept_casts` off).
    #[arg(long)]
    recast: bool,
    /// Under a budget, never score tensors by the learned step's predicted reads (`frugal::Policy::planned`
    /// off): the budget evicts by staleness alone, as before plans existed.
    #[arg(long)]
    no_plan: bool,
    /// Under a budget, let it cut the learned step's forward pass into segments
    /// (`frugal::Policy::forward_segments`).
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set)]
    segments: bool,
    /// The older spelling of --segments false.
    #[arg(long, hide = true, conflicts_with = "segments")]
    no_segments: bool,
    /// Under a budget on frugal-cuda: the allocator's growth limit (e.g. 20GiB or bytes)
    /// instead of the budget plus `frugal::memory::RESERVE_HEADROOM` (a large value turns it
    /// off).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    growth_limit: Option<u64>,
    /// How every configuration computes attention: fused is `frugal::nn::attention` (flash
    /// attention under `Autodiff<Frugal<_>>`, the written-out attention on plain Burn);
    /// written-out is scores, mask, softmax and product as separate ops (torch_gpt.py's
    /// fp32_math).
    #[arg(long, value_enum, default_value_t = AttentionKind::WrittenOut)]
    attention: AttentionKind,
    /// How every configuration computes layer norms: fused is `frugal::nn::layer_norm` (one
    /// autodiff node under `Autodiff<Frugal<_>>`, Burn's own layer norm on plain Burn);
    /// written-out is Burn's layer norm (a dozen autodiff nodes) everywhere.
    #[arg(long, value_enum, default_value_t = NormKind::Fused)]
    norm: NormKind,
    /// The older spelling of --attention fused.
    #[arg(long, hide = true, conflicts_with = "attention")]
    fused_attention: bool,
    /// When Frugal runs its own CubeCL kernels (casts, compressed storage) instead of the inner
    /// backend's ops: auto (not for casts under fusion), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    kernels: KernelsArg,
    /// The optimizer of every configuration: burn-optim's AdamW, Frugal's AdamW with
    /// block-wise 8-bit moments, or burn-optim's AdamW fused into one launch per parameter.
    #[arg(long, value_enum, default_value = "adamw")]
    optimizer: train::OptimizerKind,
    /// Under a budget, the longest chain of evicted tensors one read may recompute
    /// (`frugal::Policy::max_depth`; default the policy's).
    #[arg(long)]
    max_depth: Option<u32>,
    /// Where Frugal configurations on `--device frugal-cuda` run matrix products: auto
    /// (f16/bf16 on cuBLASLt, f32 on CubeCL's kernels), blas (all on cuBLASLt, f32 strict),
    /// blas-tf32 (all on cuBLASLt, f32 on TF32) or cube (CubeCL's kernels, Burn's own). Plain
    /// Burn configurations always run CubeCL's.
    #[arg(long, value_enum, default_value = "auto")]
    products: ProductsArg,
    /// How Frugal's attention runs (`--attention fused`): auto (products for f16 and bf16 on
    /// frugal-cuda, else the flash kernels), flash (the flash-attention kernels) or products
    /// (matrix products on cuBLASLt with the softmax and its gradient between them, where the
    /// attention's dtype's products run there); see `frugal::kernels::AttentionPath`.
    #[arg(long, value_enum, default_value = "auto")]
    attention_path: AttentionPathArg,
}

/// Parses a byte size (`2GiB`, `1.5GB`, `800MB`, `123456`).
fn parse_size(value: &str) -> Result<u64, String> {
    frugal::parse_bytes(value).map_err(|e| e.to_string())
}

impl Args {
    /// The model and batch: `--model`'s, with the single flags given instead of its values.
    fn shape(&self) -> ModelShape {
        let preset = self.model.shape();
        ModelShape {
            layers: self.layers.unwrap_or(preset.layers),
            d_model: self.d_model.unwrap_or(preset.d_model),
            heads: self.heads.unwrap_or(preset.heads),
            seq: self.seq.unwrap_or(preset.seq),
            batch: self.batch.unwrap_or(preset.batch),
        }
    }

    /// Whether attention goes through `frugal::nn::attention`.
    fn fused_attention(&self) -> bool {
        self.attention == AttentionKind::Fused || self.fused_attention
    }

    /// Whether a budget may cut the forward pass into segments.
    fn cuts_segments(&self) -> bool {
        self.segments && !self.no_segments
    }

    /// Whether the CUDA devices run on Burn's fusion.
    fn fuses(&self) -> bool {
        self.fusion && !self.no_fusion
    }
}

/// `--attention-path`, mapped onto [`frugal::kernels::AttentionPath`].
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum AttentionPathArg {
    Auto,
    Flash,
    Products,
}

impl AttentionPathArg {
    fn choice(self) -> frugal::kernels::AttentionPath {
        match self {
            AttentionPathArg::Auto => frugal::kernels::AttentionPath::Auto,
            AttentionPathArg::Flash => frugal::kernels::AttentionPath::Flash,
            AttentionPathArg::Products => frugal::kernels::AttentionPath::Products,
        }
    }
}

/// `--products`, mapped onto [`frugal::kernels::Products`].
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ProductsArg {
    Auto,
    Blas,
    BlasTf32,
    Cube,
}

impl ProductsArg {
    fn products(self) -> frugal::kernels::Products {
        match self {
            ProductsArg::Auto => frugal::kernels::Products::Auto,
            ProductsArg::Blas => frugal::kernels::Products::Blas,
            ProductsArg::BlasTf32 => frugal::kernels::Products::BlasTf32,
            ProductsArg::Cube => frugal::kernels::Products::Cube,
        }
    }
}

/// `--kernels`, mapped onto [`frugal::kernels::KernelMode`].
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum KernelsArg {
    Auto,
    Always,
    Never,
}

impl KernelsArg {
    fn mode(self) -> frugal::kernels::KernelMode {
        match self {
            KernelsArg::Auto => frugal::kernels::KernelMode::Auto,
            KernelsArg::Always => frugal::kernels::KernelMode::Always,
            KernelsArg::Never => frugal::kernels::KernelMode::Never,
        }
    }
}

#[derive(Serialize, Clone, Debug)]
struct PhasePoint {
    step: usize,
    phase: String,
    ledger_live_bytes: Option<u64>,
    pool_in_use_bytes: Option<u64>,
    pool_reserved_bytes: Option<u64>,
}

#[derive(Serialize, Debug)]
struct Line {
    system: &'static str,
    device: String,
    config: String,
    batch: usize,
    seq: usize,
    layers: usize,
    d: usize,
    heads: usize,
    vocab: usize,
    parameters: usize,
    peak_allocated_bytes: Option<u64>,
    peak_reserved_bytes: Option<u64>,
    step_ms_median: f64,
    step_ms: Vec<f64>,
    tokens_per_s: f64,
    losses: Vec<f32>,
    /// `--kernels` and how many casts Frugal's own kernel ran (all steps; 0 for plain Burn).
    kernels: String,
    kernel_casts: u64,
    /// Autocast's casts found kept rather than made again (`--recast` off), all steps.
    kept_casts_reused: u64,
    /// Whether attention went through `frugal::nn::attention` (`--attention fused`).
    fused_attention: bool,
    /// Forward and backward passes of Frugal's flash-attention kernels in this run.
    attention_kernel_passes: u64,
    /// Whether layer norms went through `frugal::nn::layer_norm` (`--norm fused`), and the
    /// forward and backward passes of Frugal's layer norm kernels in this run.
    fused_norm: bool,
    layer_norm_kernel_passes: u64,
    /// `--attention-path`, and the attention passes (forward and backward) run as products.
    attention_path: String,
    attention_product_passes: u64,
    /// `--products`, and the products run on cuBLASLt in this run (all steps).
    products: String,
    blas_products: u64,
    /// `--optimizer`, and how many 8-bit AdamW updates Frugal's fused kernel made (all steps).
    optimizer: String,
    adamw8bit_kernel_updates: u64,
    /// How many f32 AdamW updates Frugal's fused kernel made (all steps).
    adamw_kernel_updates: u64,
    /// For Frugal: live bytes after the last step, when only the parameters and the
    /// optimizer state are left.
    model_state_bytes: Option<u64>,
    ledger_vs_pool: Vec<PhasePoint>,
    budget_bytes: Option<u64>,
    /// With `--peak-holders`: who held the live bytes at the timed steps' peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_holders: Option<frugal::memory::PeakHolders>,
    /// With `--profile-kernels` on frugal-cuda: the device time of the timed steps by kind of
    /// work.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_profile: Option<gpt::kernel_profile::KernelProfile>,
    checkpoint_blocks: bool,
    #[serde(flatten)]
    remat: Option<RematStats>,
    /// On frugal-cuda: its allocator's exact peaks over the timed steps (reset when they
    /// start), and how often a reservation found no cached block.
    #[serde(skip_serializing_if = "Option::is_none")]
    allocator: Option<AllocatorFigures>,
    /// On frugal-cuda: kernels made ready in each step, warm-up included (compiled with NVRTC
    /// or loaded from its disk cache): a step after the first few that still makes kernels is
    /// still compiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels_per_step: Option<Vec<KernelsInStep>>,
    /// On frugal-cuda: what the allocator asked of the driver in each step, warm-up included.
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_per_step: Option<Vec<DriverInStep>>,
}

/// Kernels frugal-cuda made ready during one step.
#[derive(Serialize, Debug, Clone, Copy)]
struct KernelsInStep {
    compiled: u64,
    from_disk: u64,
    /// Time spent generating code and running NVRTC, and loading kernels into the context.
    compile_ms: f64,
    load_ms: f64,
}

/// frugal-cuda's kernels made ready so far in this process (`None` on other runtimes).
fn kernel_loads(frugal_cuda: bool) -> Option<KernelsInStep> {
    #[cfg(feature = "frugal-cuda")]
    if frugal_cuda {
        let loads = frugal_cuda::kernel_loads();
        return Some(KernelsInStep {
            compiled: loads.compiled,
            from_disk: loads.from_disk,
            compile_ms: loads.compile_nanos as f64 / 1e6,
            load_ms: loads.load_nanos as f64 / 1e6,
        });
    }
    let _ = frugal_cuda;
    None
}

/// What frugal-cuda's allocator did during one step: a step that maps or waits more than the
/// others spends its extra time in the driver, not in kernels.
#[derive(Serialize, Debug, Clone, Copy, Default)]
struct DriverInStep {
    /// Reservations that found no cached block (CubeCL's free slots handed back first).
    misses: u64,
    /// Mappings of physical memory into expandable segments, and the time in them.
    maps: u64,
    maps_ms: f64,
    /// Unmappings of retired granules, and the time in them.
    unmaps: u64,
    unmaps_ms: f64,
    /// Waits for the device before giving memory back, and the time in them.
    waits: u64,
    waits_ms: f64,
    /// Bytes mapped into and unmapped from expandable segments (memory moved between
    /// addresses to keep reserved bytes within the growth limit).
    mapped_bytes: u64,
    unmapped_bytes: u64,
}

impl DriverInStep {
    /// The calls made between `before` and `self` (two readings of one allocator).
    fn since(&self, before: &Self) -> Self {
        Self {
            misses: self.misses - before.misses,
            maps: self.maps - before.maps,
            maps_ms: self.maps_ms - before.maps_ms,
            unmaps: self.unmaps - before.unmaps,
            unmaps_ms: self.unmaps_ms - before.unmaps_ms,
            waits: self.waits - before.waits,
            waits_ms: self.waits_ms - before.waits_ms,
            mapped_bytes: self.mapped_bytes - before.mapped_bytes,
            unmapped_bytes: self.unmapped_bytes - before.unmapped_bytes,
        }
    }
}

/// frugal-cuda's allocator calls so far on `device` (`None` on other runtimes).
#[allow(unused_variables)]
fn driver_calls<D: 'static>(device: &D) -> Option<DriverInStep> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let report = frugal_cuda::memory_report(device);
        let times = report.stats.device_times;
        let ms = |nanos: u64| nanos as f64 / 1e6;
        return Some(DriverInStep {
            misses: report.registry.misses,
            maps: times.maps.count,
            maps_ms: ms(times.maps.nanos),
            unmaps: times.unmaps.count,
            unmaps_ms: ms(times.unmaps.nanos),
            waits: times.waits.count,
            waits_ms: ms(times.waits.nanos),
            mapped_bytes: report.stats.mapped_bytes,
            unmapped_bytes: report.stats.unmapped_bytes,
        });
    }
    None
}

/// frugal-cuda's allocator figures for a run.
#[derive(Serialize, Debug, Clone, Copy)]
struct AllocatorFigures {
    peak_reserved_bytes: u64,
    peak_allocated_bytes: u64,
    reserved_bytes: u64,
    segments: u64,
    device_allocs: u64,
    reservations: u64,
    misses: u64,
    peak_live_at_miss_bytes: u64,
}

/// frugal-cuda's report for `device`, if it is a frugal-cuda device.
#[allow(unused_variables)]
fn allocator_figures<D: 'static>(device: &D) -> Option<AllocatorFigures> {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        let report = frugal_cuda::memory_report(device);
        return Some(AllocatorFigures {
            peak_reserved_bytes: report.stats.peak_reserved_bytes,
            peak_allocated_bytes: report.stats.peak_allocated_bytes,
            reserved_bytes: report.stats.reserved_bytes,
            segments: report.stats.segments,
            device_allocs: report.stats.device_allocs,
            reservations: report.registry.reservations,
            misses: report.registry.misses,
            peak_live_at_miss_bytes: report.registry.peak_live_at_miss_bytes,
        });
    }
    None
}

/// Starts recording frugal-cuda's allocator input (`start`) or writes it to `path`, if `device`
/// is a frugal-cuda device.
#[allow(unused_variables)]
fn allocator_trace<D: 'static>(device: &D, path: &std::path::Path, start: bool) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        if start {
            frugal_cuda::record_allocation_trace(device, true);
        } else {
            let events = frugal_cuda::write_allocation_trace(device, path)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            eprintln!("wrote {events} allocator events to {}", path.display());
        }
    }
}

/// Starts or stops recording frugal-cuda's allocator trace, if `device` is a frugal-cuda
/// device, so that the memory_viz file has the allocator's own events with its segments.
#[allow(unused_variables)]
fn record_allocator_history<D: 'static>(device: &D, on: bool) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::record_allocation_trace(device, on);
    }
}

/// Resets frugal-cuda's peaks, if `device` is a frugal-cuda device.
#[allow(unused_variables)]
fn reset_allocator_peaks<D: 'static>(device: &D) {
    #[cfg(feature = "frugal-cuda")]
    if let Some(device) =
        (device as &dyn std::any::Any).downcast_ref::<frugal_cuda::FrugalCudaDevice>()
    {
        frugal_cuda::reset_peak_memory(device);
    }
}

/// The line of a configuration that failed.
#[derive(Serialize, Debug)]
struct Failure<'a> {
    system: &'static str,
    device: DeviceKind,
    config: &'a str,
    budget_bytes: Option<u64>,
    checkpoint_blocks: bool,
    error: String,
}

/// The first line of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Runs one configuration in this (child) process and prints its JSON line; a panic, on this
/// thread or a backend's, is printed as a failure line and ends the process with status 1.
fn child(only: &Config, args: &Args) {
    match run_caught(only, args) {
        Ok(line) => println!("{}", serde_json::to_string(&line).unwrap()),
        Err(failure) => {
            println!("{}", serde_json::to_string(&failure).unwrap());
            std::process::exit(1);
        }
    }
}

/// Runs `only` on `args.device`, catching a panic (this thread's or a backend's: the first
/// one's message) as a failure line.
fn run_caught(only: &Config, args: &Args) -> Result<Line, Failure<'static>> {
    use std::sync::{Arc, Mutex};
    let first_panic = Arc::new(Mutex::new(None::<String>));
    let sink = first_panic.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        sink.lock()
            .unwrap()
            .get_or_insert_with(|| panic_text(info.payload()));
        default_hook(info);
    }));
    let outcome = std::panic::catch_unwind(|| match args.device {
        DeviceKind::Cpu => Ok(run_named::<burn::backend::NdArray>(only, args)),
        DeviceKind::Flex => Ok(run_named::<burn::backend::Flex>(only, args)),
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => Ok(run_named::<burn::backend::Wgpu>(only, args)),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda if !args.fuses() => Ok(run_named::<
            burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
        >(only, args)),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Ok(run_named::<burn::backend::Cuda>(only, args)),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => frugal_cuda::check_device(&Default::default())
            .map_err(|e| e.to_string())
            .map(|()| {
                if !args.fuses() {
                    run_named::<frugal_cuda::FrugalCudaUnfused>(only, args)
                } else {
                    run_named::<frugal_cuda::FrugalCuda>(only, args)
                }
            }),
        #[allow(unreachable_patterns)]
        other => Err(other.refused("peak-memory", BUILT)),
    });
    // Restore the default hook (the one `take_hook` gave back) for what follows.
    drop(std::panic::take_hook());
    let error = match outcome {
        Ok(Ok(line)) => return Ok(line),
        Ok(Err(message)) => message,
        Err(payload) => first_panic
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| panic_text(payload.as_ref())),
    };
    Err(Failure {
        system: "burn",
        device: args.device,
        config: only.name,
        budget_bytes: args.budget_bytes,
        checkpoint_blocks: only.scopes,
        error,
    })
}

/// Hands the device's free memory back between in-process configurations (CubeCL's
/// `memory_cleanup`, through Burn's backend).
fn clean_up(device: DeviceKind) {
    // Unused in a CPU-only build, where no device has a pool.
    #[allow(dead_code)]
    fn on<B: Backend>() {
        let device = B::Device::default();
        let _ = B::sync(&device);
        B::memory_cleanup(&device);
    }
    match device {
        DeviceKind::Cpu | DeviceKind::Flex => {}
        #[cfg(feature = "wgpu")]
        DeviceKind::Wgpu => on::<burn::backend::Wgpu>(),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => on::<burn::backend::Cuda>(),
        #[cfg(feature = "frugal-cuda")]
        DeviceKind::FrugalCuda => on::<frugal_cuda::FrugalCuda>(),
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

/// The failure line for a child that printed none (killed, aborted): the first line of its
/// panic message from stderr, else its exit status.
fn failure_from_stderr(
    args: &Args,
    config: &Config,
    budget: Option<u64>,
    status: std::process::ExitStatus,
    stderr: &str,
) -> serde_json::Value {
    let mut lines = stderr.lines();
    let panic = lines
        .by_ref()
        .find(|l| l.starts_with("thread '") && l.contains("panicked at"))
        .map(|l| {
            // `thread 'main' panicked at src/x.rs:1:2:` then the message on the next line
            // (older toolchains: `... panicked at 'message', src/x.rs:1:2`).
            match l.split_once("panicked at '") {
                Some((_, rest)) => rest.rsplit_once("', ").map_or(rest, |(m, _)| m).to_string(),
                None => lines.next().unwrap_or_default().to_string(),
            }
        });
    let failure = Failure {
        system: "burn",
        device: args.device,
        config: config.name,
        budget_bytes: budget,
        checkpoint_blocks: config.scopes,
        error: panic.unwrap_or_else(|| format!("the child process ended with {status}")),
    };
    serde_json::to_value(&failure).unwrap()
}

fn main() {
    // Frugal's decisions (the budget's plan, evictions) through `log`, e.g.
    // `RUST_LOG=frugal::engine::plan=debug`; a dependency's warnings only when RUST_LOG asks.
    gpt::logging::init();
    let args = Args::parse();
    if args.steps < args.warmup + 2 {
        eprintln!(
            "error: --steps {} must be at least --warmup {} + 2 (timed steps, then one probed step)",
            args.steps, args.warmup
        );
        std::process::exit(2);
    }
    let configs: Vec<&'static Config> = args
        .configs
        .split(',')
        .map(|s| {
            Config::named(s.trim()).unwrap_or_else(|e| {
                eprintln!("error: {e}");
                std::process::exit(2);
            })
        })
        .collect();
    if let Some(only) = &args.only {
        let config = Config::named(only).unwrap_or_else(|e| {
            eprintln!("error: --only: {e}");
            std::process::exit(2);
        });
        child(config, &args);
        return;
    }
    if !BUILT.contains(&args.device) {
        eprintln!("error: {}", args.device.refused("peak-memory", BUILT));
        std::process::exit(2);
    }
    if !args.fuses() && !matches!(args.device, DeviceKind::Cuda | DeviceKind::FrugalCuda) {
        eprintln!(
            "error: --fusion false applies to --device cuda and frugal-cuda only, not {}",
            args.device.name()
        );
        std::process::exit(2);
    }
    if args.budget_bytes.is_some() {
        eprintln!(
            "error: --budget-bytes is set by the bench for its child processes; \
             the budgets are fractions of the frugal configuration's peak (see --configs)"
        );
        std::process::exit(2);
    }

    // Parent: one child process per configuration and repeat. The budgets need frugal's peak
    // first: run frugal before the first budget configuration, adding it if not asked for.
    let mut configs = configs;
    if let Some(first_budget) = configs
        .iter()
        .position(|c| c.budget.is_some())
        .filter(|_| args.reference_peak.is_none())
    {
        match configs.iter().position(|c| c.name == "frugal") {
            Some(at) if at < first_budget => {}
            Some(at) => {
                let frugal = configs.remove(at);
                configs.insert(first_budget, frugal);
            }
            None => {
                eprintln!("note: running frugal too, as the reference peak for the budgets");
                configs.insert(first_budget, Config::named("frugal").expect("known"));
            }
        }
    }
    let exe = std::env::current_exe().expect("own path");
    let mut lines: Vec<serde_json::Value> = Vec::new();
    let mut reference_peak: Option<u64> = args.reference_peak;
    for repeat in 0..args.repeats {
        let order: Vec<&Config> = if repeat % 2 == 0 {
            configs.to_vec()
        } else {
            configs.iter().rev().copied().collect()
        };
        for config in order {
            let name = config.name;
            let budget = config.budget.map(|(num, den)| {
                reference_peak.map(|peak| (peak as u128 * num as u128 / den as u128) as u64)
            });
            let line = match budget {
                Some(None) => serde_json::to_value(Failure {
                    system: "burn",
                    device: args.device,
                    config: name,
                    budget_bytes: None,
                    checkpoint_blocks: config.scopes,
                    error: "no reference peak: the frugal configuration failed".into(),
                })
                .unwrap(),
                _ if args.in_process => {
                    let mut this = args.clone();
                    this.budget_bytes = budget.flatten();
                    let line = match run_caught(config, &this) {
                        Ok(line) => serde_json::to_value(line).unwrap(),
                        Err(failure) => serde_json::to_value(failure).unwrap(),
                    };
                    clean_up(args.device);
                    line
                }
                _ => {
                    let budget = budget.flatten();
                    let mut cmd = Command::new(&exe);
                    cmd.args(std::env::args().skip(1)).args(["--only", name]);
                    if let Some(bytes) = budget {
                        cmd.args(["--budget-bytes", &bytes.to_string()]);
                    }
                    let out = cmd.output().expect("child runs");
                    let stdout = String::from_utf8_lossy(&out.stdout);
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let parsed = stdout
                        .lines()
                        .rev()
                        .find(|l| l.starts_with('{'))
                        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
                    match parsed {
                        Some(line) => line,
                        None => failure_from_stderr(&args, config, budget, out.status, &stderr),
                    }
                }
            };
            if let Some(error) = line["error"].as_str() {
                eprintln!("configuration {name} failed: {error}");
            } else if name == "frugal" && reference_peak.is_none() {
                reference_peak = line["peak_allocated_bytes"].as_u64();
            }
            println!("{}", serde_json::to_string(&line).unwrap());
            lines.push(line);
        }
    }
    if let Some(path) = &args.torch {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("error: cannot read --torch {}: {e}", path.display());
            std::process::exit(2);
        });
        lines.extend(
            text.lines()
                .filter(|l| l.trim_start().starts_with('{'))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    print_table(&lines);
    if let Some(path) = &args.chart {
        let mut seen = std::collections::BTreeSet::new();
        let bars: Vec<frugal_benches::chart::Bars> = lines
            .iter()
            .filter(|l| l["error"].is_null() && seen.insert(label(l)))
            .map(|l| frugal_benches::chart::Bars {
                label: label(l),
                allocated: l["peak_allocated_bytes"].as_u64(),
                reserved: lines
                    .iter()
                    .filter(|m| label(m) == label(l))
                    .filter_map(|m| m["peak_reserved_bytes"].as_u64())
                    .max(),
            })
            .collect();
        let shape = args.shape();
        let title = format!(
            "Peak memory, GPT {} layers d{} batch {}x{}",
            shape.layers, shape.d_model, shape.batch, shape.seq
        );
        match frugal_benches::chart::peak_memory(&title, &bars, path) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    // Every configuration has run and is in the table; the status still says if any failed.
    let failed = lines.iter().filter(|l| !l["error"].is_null()).count();
    if failed > 0 {
        eprintln!("{failed} of {} runs failed", lines.len());
        std::process::exit(1);
    }
}

fn label(line: &serde_json::Value) -> String {
    let optimizer = match line["optimizer"].as_str() {
        Some("adamw8bit") => " 8bit",
        Some("adamwfused") => " fused-adamw",
        _ => "",
    };
    format!(
        "{} {}{optimizer}",
        line["system"].as_str().unwrap_or("?"),
        line["config"].as_str().unwrap_or("?")
    )
}

fn run_named<B: Backend>(config: &Config, args: &Args) -> Line {
    let budget = config.budget.map(|_| {
        args.budget_bytes
            .expect("the parent passes --budget-bytes to budget configurations")
    });
    match config.system {
        System::Plain => run::<Autodiff<B>>(config, args, false, None),
        System::BurnBalanced => {
            run::<Autodiff<B, BalancedCheckpointing>>(config, args, false, None)
        }
        System::Frugal => run::<Autodiff<Frugal<B>>>(config, args, true, budget),
    }
}

/// Runs `config` on `A`; `ledger` when `A` is Frugal's, under `budget` if given.
fn run<A: AutodiffBackend>(
    config: &Config,
    args: &Args,
    ledger: bool,
    budget: Option<u64>,
) -> Line {
    let name = config.name;
    let device = A::Device::default();
    frugal::kernels::set_mode(args.kernels.mode());
    frugal::kernels::set_products(args.products.products());
    frugal::kernels::set_attention_path(args.attention_path.choice());
    if ledger && args.trace.is_some() {
        memory::record_timeline(&device, 1 << 22);
    }
    if let Some(path) = &args.allocator_trace {
        allocator_trace(&device, path, true);
    }
    let kernels_before = frugal::kernels::stats();
    let kept_casts_before = frugal::precision::kept_casts_reused(&device);
    let shape = args.shape();
    let gpt = GptConfig::new(
        args.vocab,
        shape.seq,
        shape.d_model,
        shape.heads,
        shape.layers,
    )
    .with_fused_attention(args.fused_attention())
    .with_fused_norm(args.norm == NormKind::Fused);
    let mut settings = config.memory_settings(budget, args.scopes_keep_products);
    settings.no_plan = args.no_plan;
    settings.recast = args.recast;
    settings.no_segments = !args.cuts_segments();
    let checkpoint_blocks = settings.checkpoint_blocks;
    let _settings = settings
        .apply::<A>(&device)
        .unwrap_or_else(|e| panic!("{}", e.precision_error()));
    if let (Some(limit), true) = (args.growth_limit, budget.is_some())
        && !memory::set_growth_limit(&device, Some(limit))
    {
        eprintln!("note: --growth-limit applies to frugal-cuda only; ignored on {name}");
    }
    if let Some(max_depth) = args.max_depth {
        memory::set_policy(
            &device,
            frugal::Policy {
                max_depth,
                ..memory::policy(&device)
            },
        );
    }
    A::seed(&device, 0);
    let mut model = gpt.init::<A>(&device);
    let mut optim = train::optimizer::<A>(args.optimizer);
    let mut times = Vec::new();
    let mut every_step_ms = Vec::new();
    let mut losses = Vec::new();
    let mut peak_reserved: Option<u64> = None;
    let mut points = Vec::new();
    let mut remat_start = RematStats::default();
    let on_frugal_cuda = allocator_figures(&device).is_some();
    let mut kernels_per_step = on_frugal_cuda.then(Vec::new);
    let mut driver_per_step = on_frugal_cuda.then(Vec::new);
    let mut kernel_profile = None;
    for step in 0..args.steps {
        let data = random_tokens(0, step as u64, shape.batch, shape.seq, args.vocab);
        if args.profile_kernels && step == args.warmup {
            gpt::kernel_profile::start(&device);
        }
        // The last step is probed (a sync at each phase): left out of the profile.
        if args.profile_kernels && step + 1 == args.steps {
            kernel_profile = gpt::kernel_profile::finish(&device, &every_step_ms[args.warmup..]);
            if let Some(profile) = &kernel_profile {
                eprint!("{name}: {profile}");
            }
        }
        if step == args.warmup {
            if ledger && (args.peak_holders || args.memory_viz.is_some()) && args.trace.is_none() {
                memory::record_timeline(&device, 1 << 24);
            }
            // An --allocator-trace recording runs from the start: restarting it would cut it.
            if ledger && args.memory_viz.is_some() && args.allocator_trace.is_none() {
                record_allocator_history(&device, true);
            }
            memory::reset_peak(&device);
            reset_allocator_peaks(&device);
            remat_start = memory::remat_stats(&device);
        }
        A::sync(&device).expect("sync");
        let timed = step >= args.warmup;
        let loads_before = kernel_loads(on_frugal_cuda);
        let driver_before = driver_calls(&device);
        let remat_before = memory::remat_stats(&device);
        let started = Instant::now();
        let on_phase = |phase: Phase| {
            // The update begins right where the backward pass ended: nothing to read there.
            if phase == Phase::Update {
                return;
            }
            if ledger && (args.peak_holders || args.memory_viz.is_some()) {
                memory::mark(&device, phase.label());
            }
            // Only the last step is probed: a sync at each phase would slow the others.
            if step + 1 == args.steps {
                A::sync(&device).expect("sync");
                let pool = memory::pool_usage(&device);
                if let Some(pool) = pool {
                    peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
                }
                points.push(PhasePoint {
                    step,
                    phase: format!("{phase:?}"),
                    ledger_live_bytes: ledger.then(|| memory::live_bytes(&device)),
                    pool_in_use_bytes: pool.map(|p| p.bytes_in_use),
                    pool_reserved_bytes: pool.map(|p| p.bytes_reserved),
                });
            }
        };
        let (next, loss) = train::step_with(
            model,
            &mut optim,
            data,
            1e-4,
            &device,
            checkpoint_blocks,
            on_phase,
        );
        A::sync(&device).expect("sync");
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        model = next;
        losses.push(loss);
        every_step_ms.push(elapsed);
        let kernels = kernel_loads(on_frugal_cuda)
            .zip(loads_before)
            .map(|(after, before)| KernelsInStep {
                compiled: after.compiled - before.compiled,
                from_disk: after.from_disk - before.from_disk,
                compile_ms: after.compile_ms - before.compile_ms,
                load_ms: after.load_ms - before.load_ms,
            });
        let driver = driver_calls(&device)
            .zip(driver_before)
            .map(|(after, before)| after.since(&before));
        let budget = memory::remat_stats(&device).since(&remat_before);
        // On stderr as it happens, so a run cut short by a time limit still shows its pace.
        let mut line = format!("{name}: step {step} took {elapsed:.1} ms");
        if let Some(k) = kernels {
            line += &format!(
                " ({} kernels compiled in {:.1} ms, {} loaded from disk; {:.1} ms loading)",
                k.compiled, k.compile_ms, k.from_disk, k.load_ms
            );
        }
        if budget.evictions + budget.offloads > 0 {
            line += &format!(
                "; budget: {} evicted, {} recomputed, {} offloaded, {} room rounds",
                budget.evictions, budget.recomputes, budget.offloads, budget.room_rounds
            );
        }
        if let Some(d) = driver {
            line += &format!(
                "; allocator: {} misses, {} maps of {} MiB in {:.1} ms, {} unmaps of {} MiB in \
                 {:.1} ms, {} waits in {:.1} ms",
                d.misses,
                d.maps,
                d.mapped_bytes >> 20,
                d.maps_ms,
                d.unmaps,
                d.unmapped_bytes >> 20,
                d.unmaps_ms,
                d.waits,
                d.waits_ms
            );
        }
        eprintln!("{line}");
        if let (Some(all), Some(d)) = (driver_per_step.as_mut(), driver) {
            all.push(d);
        }
        if let (Some(all), Some(k)) = (kernels_per_step.as_mut(), kernels) {
            all.push(k);
        }
        if timed && step + 1 != args.steps {
            times.push(elapsed);
        }
        if let Some(pool) = memory::pool_usage(&device) {
            peak_reserved = Some(peak_reserved.unwrap_or(0).max(pool.bytes_reserved));
        }
    }
    if let (true, Some(path)) = (ledger, &args.trace) {
        write_trace(&memory::snapshot(&device), path);
    }
    if let (true, Some(path)) = (ledger, &args.memory_viz) {
        let path = path.with_extension(format!(
            "{}.{}",
            name.replace('/', "_"),
            path.extension()
                .and_then(|e| e.to_str())
                .unwrap_or("pickle")
        ));
        memory::snapshot(&device)
            .write_memory_viz(&path)
            .unwrap_or_else(|e| panic!("cannot write --memory-viz {}: {e}", path.display()));
        eprintln!("{name}: wrote {}", path.display());
        if args.allocator_trace.is_none() {
            record_allocator_history(&device, false);
        }
    }
    // After the memory_viz snapshot, which copies the allocator trace this takes.
    if let Some(path) = &args.allocator_trace {
        allocator_trace(&device, path, false);
    }
    let peak_holders = (ledger && args.peak_holders)
        .then(|| memory::snapshot(&device).holders_at_peak())
        .flatten();
    if let Some(peak) = &peak_holders {
        eprintln!(
            "{name}: at the peak of {} B (after {:?}; {} B allocated before recording):",
            peak.live_bytes, peak.after_mark, peak.before_recording_bytes
        );
        for holder in peak.holders.iter().take(16) {
            eprintln!(
                "  {:>14} B in {:>5}  {}",
                holder.bytes, holder.tensors, holder.op
            );
        }
    }
    let step_ms = median(&mut times);
    let remat = ledger.then(|| memory::remat_stats(&device).since(&remat_start));
    Line {
        system: "burn",
        device: A::name(&device),
        config: name.to_string(),
        batch: shape.batch,
        seq: shape.seq,
        layers: shape.layers,
        d: shape.d_model,
        heads: shape.heads,
        vocab: args.vocab,
        parameters: gpt.parameters(),
        peak_allocated_bytes: ledger.then(|| memory::peak_bytes(&device)),
        peak_reserved_bytes: peak_reserved,
        step_ms_median: step_ms,
        step_ms: every_step_ms,
        tokens_per_s: (shape.batch * shape.seq) as f64 / (step_ms / 1e3),
        losses,
        kernels: format!("{:?}", args.kernels).to_lowercase(),
        kernel_casts: frugal::kernels::stats().casts - kernels_before.casts,
        kept_casts_reused: frugal::precision::kept_casts_reused(&device) - kept_casts_before,
        fused_attention: args.fused_attention(),
        attention_kernel_passes: frugal::kernels::stats().attention_forwards
            + frugal::kernels::stats().attention_backwards
            - kernels_before.attention_forwards
            - kernels_before.attention_backwards,
        fused_norm: args.norm == NormKind::Fused,
        layer_norm_kernel_passes: frugal::kernels::stats().layer_norm_forwards
            + frugal::kernels::stats().layer_norm_backwards
            - kernels_before.layer_norm_forwards
            - kernels_before.layer_norm_backwards,
        attention_path: format!("{:?}", args.attention_path).to_lowercase(),
        attention_product_passes: frugal::kernels::stats().attention_product_forwards
            + frugal::kernels::stats().attention_product_backwards
            - kernels_before.attention_product_forwards
            - kernels_before.attention_product_backwards,
        products: format!("{:?}", args.products).to_lowercase(),
        blas_products: frugal::kernels::stats().blas_products - kernels_before.blas_products,
        optimizer: format!("{:?}", args.optimizer).to_lowercase(),
        adamw8bit_kernel_updates: frugal::kernels::stats().adamw8bit_launches
            - kernels_before.adamw8bit_launches,
        adamw_kernel_updates: frugal::kernels::stats().adamw_launches
            - kernels_before.adamw_launches,
        model_state_bytes: ledger.then(|| memory::live_bytes(&device)),
        ledger_vs_pool: points,
        budget_bytes: budget,
        peak_holders,
        kernel_profile,
        checkpoint_blocks,
        remat,
        allocator: allocator_figures(&device),
        kernels_per_step,
        driver_per_step,
    }
}

/// Writes the allocations and frees of `snapshot`'s timeline as `a <id> <bytes>` and
/// `f <id>` lines (ids are the ledger's allocation numbers).
fn write_trace(snapshot: &frugal::memory::Snapshot, path: &std::path::Path) {
    use std::fmt::Write as _;
    assert_eq!(
        snapshot.dropped_events, 0,
        "the timeline was too short for the whole run"
    );
    let mut text = String::new();
    for event in &snapshot.events {
        match event.kind {
            frugal::memory::EventKind::Alloc => {
                writeln!(text, "a {} {}", event.alloc_seq, event.bytes).unwrap()
            }
            frugal::memory::EventKind::Free => writeln!(text, "f {}", event.alloc_seq).unwrap(),
            frugal::memory::EventKind::Mark => {}
        }
    }
    std::fs::write(path, text)
        .unwrap_or_else(|e| panic!("cannot write the trace to {}: {e}", path.display()));
}

fn print_table(lines: &[serde_json::Value]) {
    let gib = |v: &serde_json::Value| {
        v.as_u64()
            .map(|b| format!("{:.3}", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "-".into())
    };
    // Plain Burn's mean over its runs is the baseline of every ratio.
    let plain: Vec<f64> = lines
        .iter()
        .filter(|l| l["system"] == "burn" && l["config"] == "plain")
        .filter_map(|l| l["tokens_per_s"].as_f64())
        .collect();
    let base = (!plain.is_empty()).then(|| plain.iter().sum::<f64>() / plain.len() as f64);
    println!();
    println!(
        "{:<29} {:>10} {:>9} {:>14} {:>14} {:>10} {:>10} {:>8} {:>8}",
        "system config",
        "budget GiB",
        "state GiB",
        "peak alloc GiB",
        "peak resv GiB",
        "step ms",
        "tokens/s",
        "vs plain",
        "recomp"
    );
    for l in lines {
        if let Some(error) = l["error"].as_str() {
            let error: String = error.chars().take(100).collect();
            println!(
                "{:<29} {:>10} FAILED: {error}",
                label(l),
                gib(&l["budget_bytes"])
            );
            continue;
        }
        let tps = l["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<29} {:>10} {:>9} {:>14} {:>14} {:>10.1} {:>10.0} {:>8} {:>8}",
            label(l),
            gib(&l["budget_bytes"]),
            gib(&l["model_state_bytes"]),
            gib(&l["peak_allocated_bytes"]),
            gib(&l["peak_reserved_bytes"]),
            l["step_ms_median"].as_f64().unwrap_or(f64::NAN),
            tps,
            base.map(|b| format!("{:.3}", tps / b))
                .unwrap_or_else(|| "-".into()),
            l["recomputes"]
                .as_u64()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    for l in lines
        .iter()
        .filter(|l| l["system"] == "burn" && l["config"] == "frugal" && l["error"].is_null())
    {
        println!("\nledger vs pool ({}), last step:", l["config"]);
        println!(
            "{:<10} {:>16} {:>16} {:>16} {:>10}",
            "phase", "ledger live", "pool in use", "pool reserved", "diff %"
        );
        for p in l["ledger_vs_pool"].as_array().into_iter().flatten() {
            let (ledger, pool) = (
                p["ledger_live_bytes"].as_u64(),
                p["pool_in_use_bytes"].as_u64(),
            );
            let diff = match (ledger, pool) {
                (Some(a), Some(b)) if b > 0 => {
                    format!("{:+.2}", 100.0 * (a as f64 - b as f64) / b as f64)
                }
                _ => "-".into(),
            };
            println!(
                "{:<10} {:>16} {:>16} {:>16} {:>10}",
                p["phase"].as_str().unwrap_or("?"),
                ledger.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                pool.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                p["pool_reserved_bytes"]
                    .as_u64()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "-".into()),
                diff
            );
        }
    }
}
