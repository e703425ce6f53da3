//! The `gpt` binary's command line: its flags, their parsing and the checks that refuse bad
//! combinations before anything runs.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::train::OptimizerKind;
use frugal::EvictionMode;
use serde::{Deserialize, Serialize};

use crate::memory_settings::MemorySettings;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    /// NdArray on the CPU (f32 only).
    Cpu,
    /// Flex on the CPU: f32, and bf16/f16 for `--precision` and `--store`.
    Flex,
    /// wgpu (Vulkan, Metal, DX12); build with `--features wgpu`.
    Wgpu,
    /// CUDA; build with `--features cuda`.
    Cuda,
    /// CUDA through frugal-cuda's runtime (CubeCL's kernels on Frugal's caching allocator);
    /// build with `--features frugal-cuda`.
    FrugalCuda,
}

/// The precision of matrix products and convolutions (autocast), or of tensors the budget
/// stores compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32 (no autocast, no compression).
    #[default]
    #[value(alias = "none")]
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half (train with --loss-scale).
    F16,
}

impl Precision {
    /// The low type, or `None` for f32.
    pub fn low(self) -> Option<frugal::LowPrecision> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(frugal::LowPrecision::BF16),
            Precision::F16 => Some(frugal::LowPrecision::F16),
        }
    }

    /// The flag's value, as typed.
    pub fn label(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

/// How a memory budget frees device memory (see [`frugal::EvictionMode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Evict {
    /// Recompute or copy to host memory, whichever is estimated cheaper.
    #[default]
    Auto,
    /// Only recompute evicted tensors (those that cannot be recomputed stay).
    Recompute,
    /// Only copy evicted tensors to host memory and back.
    Offload,
}

impl Evict {
    /// The Frugal eviction mode.
    pub fn mode(self) -> EvictionMode {
        match self {
            Evict::Auto => EvictionMode::Auto,
            Evict::Recompute => EvictionMode::RecomputeOnly,
            Evict::Offload => EvictionMode::OffloadOnly,
        }
    }

    /// The flag's value, as typed.
    pub fn label(self) -> &'static str {
        match self {
            Evict::Auto => "auto",
            Evict::Recompute => "recompute",
            Evict::Offload => "offload",
        }
    }
}

/// A `--budget` as given: bytes, or `auto` (chosen from the GPU's free memory at the start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetSize {
    /// This many bytes of live tensors.
    Bytes(u64),
    /// `frugal::memory::set_budget_auto` on the run's device.
    Auto,
}

/// Parses a byte size (`2GiB`, `1.5GB`, `800MB`, `123456`).
fn parse_size(value: &str) -> Result<u64, String> {
    frugal::parse_bytes(value).map_err(|e| e.to_string())
}

/// Parses `--budget`: a byte size (`2GiB`, `1.5GB`, `800MB`, `123456`), `auto` or `none`.
fn parse_budget(value: &str) -> Result<Option<BudgetSize>, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    if value.eq_ignore_ascii_case("auto") {
        return Ok(Some(BudgetSize::Auto));
    }
    frugal::parse_bytes(value)
        .map(|bytes| Some(BudgetSize::Bytes(bytes)))
        .map_err(|e| format!("{e}; or auto (from the GPU's free memory), or none for no budget"))
}

/// Train a GPT-style model on Autodiff<Frugal<B>> and report exactly where its memory goes.
/// How each block computes attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AttentionKind {
    /// `frugal::nn::attention`: flash attention (CubeCL kernels on CUDA and wgpu, a block-wise
    /// path on the CPU) that keeps q, k, v, the output and a logsumexp per row for the
    /// backward pass, not the `seq × seq` scores and probabilities.
    #[default]
    Fused,
    /// Scores, mask, softmax and product as separate ops (what PyTorch's `fp32_math` does):
    /// the scores and probabilities stay on the device until the backward pass.
    WrittenOut,
}

#[derive(Parser, Debug, Clone)]
#[command(name = "gpt", version)]
pub struct TrainArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceKind,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub d_model: usize,
    /// Attention heads (must divide --d-model).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Context length in tokens.
    #[arg(long, default_value_t = 64)]
    pub seq: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Total optimizer steps (a resumed run continues up to this number).
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// The optimizer: burn-optim's AdamW, or AdamW with block-wise 8-bit moments (a quarter
    /// of the state memory).
    #[arg(long, value_enum, default_value_t = OptimizerKind::AdamW)]
    pub optimizer: OptimizerKind,
    /// A UTF-8 text file to train on (default: a corpus generated from a small grammar).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Seed for the model, the corpus and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for the per-step log (steps.json), the memory snapshot and plot.
    #[arg(long, default_value = "runs/gpt")]
    pub out: PathBuf,
    /// Folder for training checkpoints (default: OUT/checkpoints).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Continue from the latest checkpoint in the checkpoint folder.
    #[arg(long)]
    pub resume: bool,
    /// Keep live tensor memory under SIZE (e.g. 2GiB, 1.5GB, 800MB, auto, or none) by evicting
    /// tensors and recomputing or offloading them when read. `auto`: the GPU's free memory
    /// less what its pool needs beside tensors (CUDA devices).
    // The fully qualified `Option` keeps clap from treating the flag as optional-valued: the
    // parser gives `None` for `none`, and the default is no budget.
    #[arg(long = "budget", value_name = "SIZE", default_value = "none", value_parser = parse_budget)]
    pub budget_size: ::std::option::Option<BudgetSize>,
    /// The budget in bytes: `--budget` as given, or as `auto` chose it once the run started.
    #[arg(skip)]
    pub budget: Option<u64>,
    /// Split each step's --batch into N equal micro-batches, each run forward and backward on
    /// its own, their gradients summed before one update: the same gradient (up to f32
    /// summation order) with the activation memory of one micro-batch.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub accumulate: usize,
    /// Before training, choose the micro-batch (--accumulate), checkpoint scopes and budget
    /// that keep the peak under --budget with the best measured speed, from probe steps on
    /// copies of the model; prints the measurements behind the choice.
    #[arg(long)]
    pub fit: bool,
    /// Do not go back to a step's start when it runs out of memory (by default the step is
    /// retried with half the micro-batch and twice the accumulation). The start is held
    /// through the forward and backward passes (let go when the update begins, so AdamW
    /// still updates in place); this flag holds nothing and ends the run at the first failure.
    #[arg(long)]
    pub no_recover: bool,
    /// Run each transformer block in a checkpoint scope: its activations are dropped after the
    /// forward pass and recomputed in the backward pass.
    #[arg(long)]
    pub checkpoint_blocks: bool,
    /// Under a budget, never cut the learned step's forward pass into segments (by default the
    /// budget does, as `--checkpoint-blocks` would but chosen by itself:
    /// `frugal::Policy::forward_segments`).
    #[arg(long)]
    pub no_segments: bool,
    /// How attention is computed.
    #[arg(long, value_enum, default_value_t = AttentionKind::Fused)]
    pub attention: AttentionKind,
    /// Dynamic loss scaling (`frugal::GradScaler`, PyTorch's defaults: scale 65536, doubled
    /// after 2,000 clean steps, halved and the step skipped when a gradient is inf or NaN).
    /// Meant for f16 training; in f32 the power-of-two scale gives the same losses. Its state
    /// is saved in the checkpoints.
    #[arg(long)]
    pub loss_scale: bool,
    /// How the budget frees memory: recompute, offload to host memory, or auto (the cheaper).
    #[arg(long, value_enum, default_value = "auto")]
    pub evict: Evict,
    /// Autocast: matrix products, convolutions and attention in bf16 or f16 with f32
    /// accumulation; exponentials, logs and reductions in f32; parameters, gradients and
    /// optimizer state stay f32 (frugal::precision). Needs a device with the type (flex,
    /// wgpu for f16, cuda); f16 wants --loss-scale.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: Precision,
    /// With --precision bf16|f16: products stay in that type, as in PyTorch's autocast (less
    /// activation memory and traffic), instead of coming back as f32. Parameter gradients
    /// are still cast to f32 before AdamW.
    #[arg(long)]
    pub low_outputs: bool,
    /// Let the budget keep f32 tensors it evicts compressed on the device in bf16 or f16, as
    /// a third action beside recompute and offload (lossy; needs --budget).
    #[arg(long, value_enum, default_value = "f32", value_name = "bf16|f16|none")]
    pub store: Precision,
    /// No progress bar (for logs and tests).
    #[arg(long)]
    pub quiet: bool,
    /// With --device frugal-cuda: cap the bytes its allocator may reserve from the GPU at SIZE,
    /// as if the GPU had that much memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_cap: Option<u64>,
    /// With --device frugal-cuda: reserve memory beyond SIZE only when reusing what the
    /// allocator holds (giving back and mapping again the holes between live tensors) is not
    /// enough. Default under --budget: the budget plus 1/8.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub growth_limit: Option<u64>,
    /// With --device frugal-cuda: run without Burn's fusion (`frugal_cuda::FrugalCudaUnfused`).
    /// Then, when the allocator cannot grow, the budget drops tensors it can recompute from
    /// inside the allocation and the allocation is retried, instead of failing the step.
    #[arg(long)]
    pub no_fusion: bool,
}

impl TrainArgs {
    /// The checkpoint folder: `--checkpoint-dir`, or `OUT/checkpoints`.
    pub fn checkpoints(&self) -> PathBuf {
        self.checkpoint_dir
            .clone()
            .unwrap_or_else(|| self.out.join("checkpoints"))
    }

    /// Refuses flag values and combinations that cannot run, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            return Err(format!(
                "--heads {} must be at least 1 and divide --d-model {}",
                self.heads, self.d_model
            ));
        }
        for (name, value) in [
            ("layers", self.layers as u64),
            ("seq", self.seq as u64),
            ("batch", self.batch as u64),
            ("steps", self.steps),
        ] {
            if value == 0 {
                return Err(format!("--{name} must be at least 1, got 0"));
            }
        }
        frugal::micro_batch_size(self.batch, self.accumulate).map_err(|e| {
            format!(
                "--accumulate {} with --batch {}: {e}",
                self.accumulate, self.batch
            )
        })?;
        if self.fit {
            if self.budget_size.is_none() {
                return Err(
                    "--fit chooses what fits under a limit: give it as --budget SIZE or auto"
                        .to_string(),
                );
            }
            if self.accumulate != 1 || self.checkpoint_blocks || self.store != Precision::F32 {
                return Err(
                    "--fit chooses --accumulate, --checkpoint-blocks and --store itself: drop them"
                        .to_string(),
                );
            }
        }
        let device = || {
            self.device
                .to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_string())
        };
        if self.memory_cap.is_some() && self.device != DeviceKind::FrugalCuda {
            return Err(format!(
                "--memory-cap caps frugal-cuda's allocator: it needs --device frugal-cuda, not {}",
                device()
            ));
        }
        if self.growth_limit.is_some() && self.device != DeviceKind::FrugalCuda {
            return Err(format!(
                "--growth-limit steers frugal-cuda's allocator: it needs --device frugal-cuda, \
                 not {}",
                device()
            ));
        }
        if self.no_fusion && self.device != DeviceKind::FrugalCuda {
            return Err(
                "--no-fusion selects frugal-cuda's unfused backend: it needs --device frugal-cuda"
                    .to_string(),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("--lr must be a positive number, got {}", self.lr));
        }
        if self.low_outputs && self.precision == Precision::F32 {
            return Err("--low-outputs needs --precision bf16 or f16".to_string());
        }
        if self.store != Precision::F32 && self.budget_size.is_none() {
            return Err(format!(
                "--store {} compresses tensors the budget evicts: give a --budget too",
                self.store.label()
            ));
        }
        Ok(())
    }

    /// The memory settings these flags ask for.
    pub fn memory_settings(&self) -> MemorySettings {
        MemorySettings {
            budget: self.budget,
            evict: self.evict.mode(),
            checkpoint_blocks: self.checkpoint_blocks,
            autocast: self.precision.low(),
            low_outputs: self.low_outputs,
            storage: self.store.low(),
            scope_keeps_products: false,
            no_plan: false,
            no_segments: self.no_segments,
            growth_limit: self.growth_limit,
        }
    }
}
