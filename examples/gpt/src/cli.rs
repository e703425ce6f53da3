//! The `gpt` binary's command line: its flags, their parsing and the checks that refuse bad
//! combinations before anything runs.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{ArgAction, Parser, ValueEnum};

use crate::train::OptimizerKind;
use frugal::EvictionMode;
use serde::{Deserialize, Serialize};

use crate::memory_settings::MemorySettings;

/// Where to run: one list for `gpt` and the benches (`peak-memory`, the throughput benches),
/// each of which refuses the devices it cannot use with [`DeviceKind::refused`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// NdArray on the CPU (f32 only).
    Cpu,
    /// Flex on the CPU: f32, and bf16/f16 for `--precision` and `--store`.
    Flex,
    /// wgpu (Vulkan, Metal, DX12); build with `--features wgpu`.
    Wgpu,
    /// CUDA through Burn's CubeCL backend; build with `--features cuda`.
    Cuda,
    /// CUDA through frugal-cuda's runtime (CubeCL's kernels on Frugal's caching allocator);
    /// build with `--features frugal-cuda`.
    FrugalCuda,
}

impl DeviceKind {
    /// The flag's value, as typed (`frugal-cuda`).
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Flex => "flex",
            DeviceKind::Wgpu => "wgpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::FrugalCuda => "frugal-cuda",
        }
    }

    /// The cargo feature a build needs to run on this device (`None`: every build has it).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            DeviceKind::Cpu | DeviceKind::Flex => None,
            other => Some(other.name()),
        }
    }

    /// The error for `--device self` in `program`, which runs on `supported` (in the build
    /// at hand): names the value, what the program can use, and the build that would run it.
    pub fn refused(self, program: &str, supported: &[DeviceKind]) -> String {
        let names: Vec<&str> = supported.iter().map(|d| d.name()).collect();
        let runs_on = if names.is_empty() {
            "no device".to_string()
        } else {
            names.join(", ")
        };
        match self.feature() {
            Some(feature) => format!(
                "--device {}: this build of {program} runs on {runs_on}; build it with \
                 `--features {feature}` for {}",
                self.name(),
                self.name()
            ),
            None => format!("--device {}: {program} runs on {runs_on}", self.name()),
        }
    }
}

/// A model size for `--model`: layers, width, heads, context and batch at once; single flags
/// (`--layers`, `--d-model`, ...) override its values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ModelPreset {
    /// 2 layers, d-model 64, 4 heads, seq 64, batch 16: the CPU's main job, a few minutes.
    #[default]
    Tiny,
    /// 4 layers, d-model 128, 4 heads, seq 128, batch 8: a larger CPU run.
    Small,
    /// 12 layers, d-model 768, 12 heads, seq 512, batch 8: the reference step
    /// (`torch_gpt.py`'s size), for a GPU.
    Reference,
    /// 24 layers, d-model 2048, 16 heads, seq 1024, batch 64: 1.2 B parameters, whose whole
    /// batch does not fit on an 80 GB GPU at once.
    #[value(name = "1b")]
    OneBillion,
}

impl ModelPreset {
    /// The preset's model and batch.
    pub fn shape(self) -> ModelShape {
        let (layers, d_model, heads, seq, batch) = match self {
            ModelPreset::Tiny => (2, 64, 4, 64, 16),
            ModelPreset::Small => (4, 128, 4, 128, 8),
            ModelPreset::Reference => (12, 768, 12, 512, 8),
            ModelPreset::OneBillion => (24, 2048, 16, 1024, 64),
        };
        ModelShape {
            layers,
            d_model,
            heads,
            seq,
            batch,
        }
    }
}

/// A model's size and its batch, as `--model` and the single flags give them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Context length in tokens.
    pub seq: usize,
    /// Sequences per step.
    pub batch: usize,
}

impl ModelShape {
    /// This shape with each value given (the single flags `--layers`, `--d-model`, `--heads`,
    /// `--seq`, `--batch`) in place of its own.
    pub fn overridden(
        self,
        layers: Option<usize>,
        d_model: Option<usize>,
        heads: Option<usize>,
        seq: Option<usize>,
        batch: Option<usize>,
    ) -> Self {
        Self {
            layers: layers.unwrap_or(self.layers),
            d_model: d_model.unwrap_or(self.d_model),
            heads: heads.unwrap_or(self.heads),
            seq: seq.unwrap_or(self.seq),
            batch: batch.unwrap_or(self.batch),
        }
    }
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

/// `--take-memory`: at which step to take the GPU's free memory, and how much to leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeMemory {
    /// The step before which the memory is taken.
    pub step: u64,
    /// Bytes of the GPU's free memory left free.
    pub leave: u64,
}

/// Parses `--take-memory STEP:SIZE`.
fn parse_take_memory(value: &str) -> Result<TakeMemory, String> {
    let (step, leave) = value
        .split_once(':')
        .ok_or_else(|| format!("expected STEP:SIZE (e.g. 3:2GiB), got {value:?}"))?;
    Ok(TakeMemory {
        step: step
            .trim()
            .parse()
            .map_err(|e| format!("step {step:?}: {e}"))?,
        leave: parse_size(leave)?,
    })
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

/// How each layer norm is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum NormKind {
    /// `frugal::nn::layer_norm`: one autodiff node (one kernel forward, three backward on
    /// CUDA and wgpu) under `Autodiff<Frugal<_>>`; Burn's own layer norm without Frugal.
    #[default]
    Fused,
    /// Burn's layer norm as burn-nn computes it: under autodiff a dozen ops, each its own node.
    WrittenOut,
}

/// How the head's logits and the loss are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LossKind {
    /// `frugal::nn::linear_cross_entropy`: the head and the cross-entropy as one autodiff node
    /// under `Autodiff<Frugal<_>>`, the rows in chunks, so the `[tokens, vocabulary]` logits
    /// never exist at once; the written-out loss without Frugal.
    #[default]
    Fused,
    /// The head's logits, then burn-nn's `CrossEntropyLoss`: the logits, their log-softmax and
    /// their gradient each whole.
    WrittenOut,
}

/// Parses `--store`: `none`, `bf16` or `f16` (f32 means "not stored compressed").
fn store_precision(value: String) -> Precision {
    match value.as_str() {
        "bf16" => Precision::Bf16,
        "f16" => Precision::F16,
        _ => Precision::F32,
    }
}

/// The help headings of `gpt --help`, in the order they print.
pub const HELP_HEADINGS: [&str; 6] = [MODEL, TRAINING, MEMORY, PRECISION, OUTPUT, DEVICE];

const MODEL: &str = "Model";
const TRAINING: &str = "Training";
const MEMORY: &str = "Memory";
const PRECISION: &str = "Precision";
const OUTPUT: &str = "Output";
const DEVICE: &str = "Device and allocator";

/// Train a GPT-style model on `Autodiff<Frugal<B>>` and report exactly where its memory goes.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "gpt",
    version,
    about = "Train a GPT-style model on Autodiff<Frugal<B>> and report exactly where its memory goes.",
    long_about = "Train a GPT-style model on Burn's Autodiff<Frugal<B>> and report exactly where \
its memory goes: a progress bar (loss, tokens/s, live and peak bytes), a closing memory report, \
and in --out the per-step log (steps.json), the last step's memory (memory.json, step-memory.png, \
memory_viz.pickle) and checkpoints. Tokens are bytes; the default corpus is generated, so \
nothing is downloaded.",
    after_long_help = "Examples:
  gpt                                            the tiny model on the CPU (a few minutes)
  gpt --model small --steps 100                  a larger model on the CPU
  gpt --device cuda --model reference --budget 2GiB
  gpt --device frugal-cuda --model 1b            runs out of memory, then splits the batch itself

Logging: this program's and Frugal's warnings are shown, its dependencies' errors only;
RUST_LOG overrides that (e.g. RUST_LOG=frugal=debug shows the budget's decisions)."
)]
pub struct TrainArgs {
    /// The model's size: layers, width, heads, context and batch at once. --layers, --d-model,
    /// --heads, --seq and --batch override single values.
    #[arg(long, value_enum, default_value_t = ModelPreset::Tiny, help_heading = MODEL)]
    pub model: ModelPreset,
    /// Transformer blocks [default: the --model's].
    #[arg(long, value_name = "N", help_heading = MODEL)]
    pub layers: Option<usize>,
    /// Model width [default: the --model's].
    #[arg(long, value_name = "N", help_heading = MODEL)]
    pub d_model: Option<usize>,
    /// Attention heads, dividing --d-model [default: the --model's].
    #[arg(long, value_name = "N", help_heading = MODEL)]
    pub heads: Option<usize>,
    /// Context length in tokens [default: the --model's].
    #[arg(long, value_name = "N", help_heading = MODEL)]
    pub seq: Option<usize>,
    /// Sequences per step [default: the --model's].
    #[arg(long, value_name = "N", help_heading = MODEL)]
    pub batch: Option<usize>,
    /// How attention is computed.
    #[arg(long, value_enum, default_value_t = AttentionKind::Fused, help_heading = MODEL)]
    pub attention: AttentionKind,
    /// How layer norms are computed.
    #[arg(long, value_enum, default_value_t = NormKind::Fused, help_heading = MODEL)]
    pub norm: NormKind,
    /// How the head and the loss are computed.
    #[arg(long, value_enum, default_value_t = LossKind::Fused, help_heading = MODEL)]
    pub loss: LossKind,

    /// Total optimizer steps (a resumed run continues up to this number).
    #[arg(long, default_value_t = 300, help_heading = TRAINING)]
    pub steps: u64,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 2e-3, help_heading = TRAINING)]
    pub lr: f64,
    /// The optimizer: burn-optim's AdamW; AdamW with block-wise 8-bit moments (a quarter of the
    /// state memory); or burn-optim's AdamW arithmetic fused into one launch per parameter
    /// (CubeCL backends; elsewhere Burn's ops).
    #[arg(long, value_enum, default_value_t = OptimizerKind::AdamW, help_heading = TRAINING)]
    pub optimizer: OptimizerKind,
    /// A UTF-8 text file to train on (default: a corpus generated from a small grammar).
    #[arg(long, value_name = "FILE", help_heading = TRAINING)]
    pub data: Option<PathBuf>,
    /// Seed for the model, the corpus and the batches.
    #[arg(long, default_value_t = 0, help_heading = TRAINING)]
    pub seed: u64,
    /// Split each step's --batch into N equal micro-batches, each run forward and backward on
    /// its own, their gradients summed before one update: the same gradient (up to f32
    /// summation order) with the activation memory of one micro-batch.
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = TRAINING)]
    pub accumulate: usize,
    /// Save a checkpoint every N steps (0: only by time and at the end).
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = TRAINING)]
    pub save_every: u64,
    /// Save a checkpoint every M minutes (0: off), written beside the next steps; each replaces
    /// the one before. A run the GPU cannot continue goes on from the newest.
    #[arg(long, value_name = "M", default_value_t = 5.0, help_heading = TRAINING)]
    pub save_minutes: f64,
    /// Continue from the latest checkpoint in the checkpoint folder.
    #[arg(long, help_heading = TRAINING)]
    pub resume: bool,

    /// Keep live tensor memory under SIZE (e.g. 2GiB, 1.5GB, 800MB, auto, or none) by evicting
    /// tensors and recomputing or offloading them when read. `auto`: the GPU's free memory
    /// less what its pool needs beside tensors (CUDA devices).
    // The fully qualified `Option` keeps clap from treating the flag as optional-valued: the
    // parser gives `None` for `none`, and the default is no budget.
    #[arg(long = "budget", value_name = "SIZE", default_value = "none", value_parser = parse_budget,
          help_heading = MEMORY)]
    pub budget_size: ::std::option::Option<BudgetSize>,
    /// The budget in bytes: `--budget` as given, or as `auto` chose it once the run started.
    #[arg(skip)]
    pub budget: Option<u64>,
    /// How the budget frees memory: recompute, offload to host memory, or auto (the cheaper).
    #[arg(long, value_enum, default_value = "auto", help_heading = MEMORY)]
    pub evict: Evict,
    /// Before training, choose the micro-batch (--accumulate), checkpoint scopes and budget
    /// that keep the peak under --budget with the best measured speed, from probe steps on
    /// copies of the model; prints the measurements behind the choice.
    #[arg(long, help_heading = MEMORY)]
    pub fit: bool,
    /// Under --budget, keep --accumulate as given. By default a step under the budget's
    /// learned plan that recomputes more than its forward pass's work (the tensors it keeps do
    /// not fit; before the plan, more than 3x) splits the batch into twice the micro-batches
    /// for the next step, and goes back if the split's steps turn out slower.
    #[arg(long, help_heading = MEMORY)]
    pub keep_micro_batch: bool,
    /// Go back to a step's start when it runs out of memory and retry it with half the
    /// micro-batch and twice the accumulation (on CUDA, in a new process). The start is held
    /// through the forward and backward passes and let go when the update begins, so AdamW
    /// still updates in place; false holds nothing and ends the run at the first failure.
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set,
          help_heading = MEMORY)]
    pub recover: bool,
    /// The older spelling of --recover false.
    #[arg(long, hide = true, conflicts_with = "recover", help_heading = MEMORY)]
    pub no_recover: bool,
    /// Run each transformer block in a checkpoint scope: its activations are dropped after the
    /// forward pass and recomputed in the backward pass.
    #[arg(long, help_heading = MEMORY)]
    pub checkpoint_blocks: bool,
    /// Under a budget, let it cut the learned step's forward pass into segments, as
    /// --checkpoint-blocks would but chosen by itself (`frugal::Policy::forward_segments`).
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set,
          help_heading = MEMORY)]
    pub segments: bool,
    /// The older spelling of --segments false.
    #[arg(long, hide = true, conflicts_with = "segments", help_heading = MEMORY)]
    pub no_segments: bool,
    /// Let the budget keep f32 tensors it evicts compressed on the device in bf16 or f16, as
    /// a third action beside recompute and offload (lossy; needs --budget).
    #[arg(long, value_name = "TYPE", default_value = "none", help_heading = MEMORY,
          value_parser = PossibleValuesParser::new(["none", "bf16", "f16"]).map(store_precision))]
    pub store: Precision,

    /// Autocast: matrix products, convolutions and attention in bf16 or f16 with f32
    /// accumulation; exponentials, logs and reductions in f32; parameters, gradients and
    /// optimizer state stay f32 (frugal::precision). Needs a device with the type (flex,
    /// wgpu for f16, cuda); f16 wants --loss-scale.
    #[arg(long, value_enum, default_value = "f32", help_heading = PRECISION)]
    pub precision: Precision,
    /// With --precision bf16|f16: products stay in that type, as in PyTorch's autocast (less
    /// activation memory and traffic), instead of coming back as f32. Parameter gradients
    /// are still cast to f32 before AdamW.
    #[arg(long, help_heading = PRECISION)]
    pub low_outputs: bool,
    /// With --precision bf16|f16: cast weights and saved activations again in backward
    /// instead of keeping forward's casts (frugal's AutocastPolicy::with_kept_casts off): less
    /// memory, more casts.
    #[arg(long, help_heading = PRECISION)]
    pub recast: bool,
    /// Dynamic loss scaling (`frugal::GradScaler`, PyTorch's defaults: scale 65536, doubled
    /// after 2,000 clean steps, halved and the step skipped when a gradient is inf or NaN).
    /// Meant for f16 training; in f32 the power-of-two scale gives the same losses. Its state
    /// is saved in the checkpoints.
    #[arg(long, help_heading = PRECISION)]
    pub loss_scale: bool,

    /// Folder for the per-step log (steps.json), the memory snapshot and plot.
    #[arg(long, value_name = "DIR", default_value = "runs/gpt", help_heading = OUTPUT)]
    pub out: PathBuf,
    /// Folder for training checkpoints (default: OUT/checkpoints).
    #[arg(long, value_name = "DIR", help_heading = OUTPUT)]
    pub checkpoint_dir: Option<PathBuf>,
    /// No progress bar (for logs and tests).
    #[arg(long, help_heading = OUTPUT)]
    pub quiet: bool,
    /// With --device frugal-cuda: time every kernel, product and copy of the run's second half
    /// (from the fourth step on) with CUDA events; prints the device time per step by kind of
    /// work and writes OUT/kernel-profile.json.
    #[arg(long, help_heading = OUTPUT)]
    pub profile_kernels: bool,

    /// Where to run.
    #[arg(long, value_enum, default_value = "cpu", help_heading = DEVICE)]
    pub device: DeviceKind,
    /// With --device frugal-cuda: cap the bytes its allocator may reserve from the GPU at SIZE,
    /// as if the GPU had that much memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = DEVICE)]
    pub memory_cap: Option<u64>,
    /// With --device frugal-cuda: reserve memory beyond SIZE only when reusing what the
    /// allocator holds (giving back and mapping again the holes between live tensors) is not
    /// enough. Default under --budget: the budget plus 1/8.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = DEVICE)]
    pub growth_limit: Option<u64>,
    /// At step STEP, hold all of the GPU's free memory but SIZE until the run ends, as another
    /// process would (e.g. 3:2GiB): a way to see a run recover from memory taken mid-run.
    #[arg(long, value_name = "STEP:SIZE", value_parser = parse_take_memory,
          help_heading = DEVICE)]
    pub take_memory: Option<TakeMemory>,
    /// Run on Burn's fusion. With --device frugal-cuda, false runs without it
    /// (`frugal_cuda::FrugalCudaUnfused`): then, when the allocator cannot grow, the budget
    /// drops tensors it can recompute from inside the allocation and the allocation is
    /// retried, instead of failing the step.
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set,
          help_heading = DEVICE)]
    pub fusion: bool,
    /// The older spelling of --fusion false.
    #[arg(long, hide = true, conflicts_with = "fusion", help_heading = DEVICE)]
    pub no_fusion: bool,
}

impl TrainArgs {
    /// The model and batch: `--model`'s, with the single flags given instead of its values.
    pub fn shape(&self) -> ModelShape {
        self.model
            .shape()
            .overridden(self.layers, self.d_model, self.heads, self.seq, self.batch)
    }

    /// Transformer blocks (see [`Self::shape`]).
    pub fn layers(&self) -> usize {
        self.shape().layers
    }

    /// Model width (see [`Self::shape`]).
    pub fn d_model(&self) -> usize {
        self.shape().d_model
    }

    /// Attention heads (see [`Self::shape`]).
    pub fn heads(&self) -> usize {
        self.shape().heads
    }

    /// Context length in tokens (see [`Self::shape`]).
    pub fn seq(&self) -> usize {
        self.shape().seq
    }

    /// Sequences per step (see [`Self::shape`]).
    pub fn batch(&self) -> usize {
        self.shape().batch
    }

    /// Whether a step that runs out of memory is retried (`--recover`, `--no-recover`).
    pub fn recovers(&self) -> bool {
        self.recover && !self.no_recover
    }

    /// Whether a budget may cut the forward pass into segments (`--segments`,
    /// `--no-segments`).
    pub fn cuts_segments(&self) -> bool {
        self.segments && !self.no_segments
    }

    /// Whether the run uses Burn's fusion (`--fusion`, `--no-fusion`).
    pub fn fuses(&self) -> bool {
        self.fusion && !self.no_fusion
    }

    /// The checkpoint folder: `--checkpoint-dir`, or `OUT/checkpoints`.
    pub fn checkpoints(&self) -> PathBuf {
        self.checkpoint_dir
            .clone()
            .unwrap_or_else(|| self.out.join("checkpoints"))
    }

    /// Refuses flag values and combinations that cannot run, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        let shape = self.shape();
        if shape.heads == 0 || !shape.d_model.is_multiple_of(shape.heads) {
            return Err(format!(
                "--heads {} must be at least 1 and divide --d-model {}",
                shape.heads, shape.d_model
            ));
        }
        for (name, value) in [
            ("layers", shape.layers as u64),
            ("seq", shape.seq as u64),
            ("batch", shape.batch as u64),
            ("steps", self.steps),
        ] {
            if value == 0 {
                return Err(format!("--{name} must be at least 1, got 0"));
            }
        }
        if !(self.save_minutes.is_finite() && self.save_minutes >= 0.0) {
            return Err(format!(
                "--save-minutes must be a number of minutes, 0 or more (0: off), got {}",
                self.save_minutes
            ));
        }
        frugal::micro_batch_size(shape.batch, self.accumulate).map_err(|e| {
            format!(
                "--accumulate {} with --batch {}: {e}",
                self.accumulate, shape.batch
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
        let device = || self.device.name();
        if self.take_memory.is_some()
            && !matches!(self.device, DeviceKind::Cuda | DeviceKind::FrugalCuda)
        {
            return Err(format!(
                "--take-memory takes a GPU's memory; --device {} has none to take",
                device()
            ));
        }
        if self.profile_kernels && self.device != DeviceKind::FrugalCuda {
            return Err(format!(
                "--profile-kernels times launches on frugal-cuda's stream: it needs --device \
                 frugal-cuda, not {}",
                device()
            ));
        }
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
        if !self.fuses() && self.device != DeviceKind::FrugalCuda {
            return Err(format!(
                "--fusion false selects frugal-cuda's unfused backend: it needs --device \
                 frugal-cuda, not {}",
                device()
            ));
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
            recast: self.recast,
            storage: self.store.low(),
            scope_keeps_products: false,
            no_plan: false,
            no_segments: !self.cuts_segments(),
            growth_limit: self.growth_limit,
            fail_past_recompute_limit: self.splits_batch() && self.recovers(),
        }
    }

    /// Whether the run's micro-batch split follows the budget's recomputation
    /// ([`frugal::MicroBatching`]): under a budget, without `--fit` (whose probes chose the
    /// split) or `--keep-micro-batch`.
    pub fn splits_batch(&self) -> bool {
        self.budget.is_some() && !self.fit && !self.keep_micro_batch
    }
}
