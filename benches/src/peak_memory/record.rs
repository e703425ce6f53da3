//! The JSON lines `peak-memory` prints, one per configuration and run: torch_gpt.py's fields
//! and Burn's own, or the `error` of a configuration that failed. Docs and scripts parse
//! them: a field's name is its meaning there.

use frugal::RematStats;
use gpt::cli::DeviceKind;
use serde::Serialize;

use super::probes::{AllocatorFigures, DriverInStep, KernelsInStep};

/// The pool and the ledger at one phase boundary of the probed step.
#[derive(Serialize, Clone, Debug)]
pub struct PhasePoint {
    /// The step (the last one).
    pub step: usize,
    /// The phase that just ended (`Phase`'s name).
    pub phase: String,
    /// Frugal's ledger's live bytes (`None` without Frugal).
    pub ledger_live_bytes: Option<u64>,
    /// The CubeCL pool's bytes in use (`None` without a pool).
    pub pool_in_use_bytes: Option<u64>,
    /// The CubeCL pool's reserved bytes.
    pub pool_reserved_bytes: Option<u64>,
}

/// The line of a configuration that ran: its shape, figures and what Frugal did.
#[derive(Serialize, Debug)]
pub struct Line {
    /// `burn` (torch_gpt.py's lines say `torch`).
    pub system: &'static str,
    /// The backend's name for the device.
    pub device: String,
    /// The configuration's name in `--configs`.
    pub config: String,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub d: usize,
    /// Attention heads.
    pub heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The model's parameter count.
    pub parameters: usize,
    /// Frugal's peak live tensor bytes over the timed steps (`None` on plain Burn).
    pub peak_allocated_bytes: Option<u64>,
    /// The highest reserved bytes of the pool seen at the phase boundaries.
    pub peak_reserved_bytes: Option<u64>,
    /// The median step time over the timed steps, probed step left out.
    pub step_ms_median: f64,
    /// Every step's time, warm-up included.
    pub step_ms: Vec<f64>,
    /// Tokens per second at the median step time.
    pub tokens_per_s: f64,
    /// Every step's loss.
    pub losses: Vec<f32>,
    /// `--kernels` and how many casts Frugal's own kernel ran (all steps; 0 for plain Burn).
    pub kernels: String,
    /// Casts run by Frugal's own kernel (see `kernels`).
    pub kernel_casts: u64,
    /// Autocast's casts found kept rather than made again (`--recast` off), all steps.
    pub kept_casts_reused: u64,
    /// Whether attention went through `frugal::nn::attention` (`--attention fused`).
    pub fused_attention: bool,
    /// Forward and backward passes of Frugal's flash-attention kernels in this run.
    pub attention_kernel_passes: u64,
    /// Whether layer norms went through `frugal::nn::layer_norm` (`--norm fused`), and the
    /// forward and backward passes of Frugal's layer norm kernels in this run.
    pub fused_norm: bool,
    /// Passes of Frugal's layer norm kernels (see `fused_norm`).
    pub layer_norm_kernel_passes: u64,
    /// Whether the head and the loss went through `frugal::nn::linear_cross_entropy`
    /// (`--loss fused`).
    pub fused_loss: bool,
    /// `--attention-path`, and the attention passes (forward and backward) run as products.
    pub attention_path: String,
    /// Attention passes run as products (see `attention_path`).
    pub attention_product_passes: u64,
    /// `--products`, and the products run on cuBLASLt in this run (all steps).
    pub products: String,
    /// Products run on cuBLASLt (see `products`).
    pub blas_products: u64,
    /// `--optimizer`, and how many 8-bit AdamW updates Frugal's fused kernel made (all steps).
    pub optimizer: String,
    /// 8-bit AdamW updates of Frugal's fused kernel (see `optimizer`).
    pub adamw8bit_kernel_updates: u64,
    /// How many f32 AdamW updates Frugal's fused kernel made (all steps).
    pub adamw_kernel_updates: u64,
    /// For Frugal: live bytes after the last step, when only the parameters and the
    /// optimizer state are left.
    pub model_state_bytes: Option<u64>,
    /// The ledger beside the pool at each phase boundary of the probed step.
    pub ledger_vs_pool: Vec<PhasePoint>,
    /// The configuration's budget in bytes, if it has one.
    pub budget_bytes: Option<u64>,
    /// With `--peak-holders`: who held the live bytes at the timed steps' peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_holders: Option<frugal::memory::PeakHolders>,
    /// With `--profile-kernels` on frugal-cuda: the device time of the timed steps by kind of
    /// work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_profile: Option<gpt::kernel_profile::KernelProfile>,
    /// Whether each block ran in a checkpoint scope.
    pub checkpoint_blocks: bool,
    /// What Frugal's budget and scopes did over the timed steps (flattened).
    #[serde(flatten)]
    pub remat: Option<RematStats>,
    /// On frugal-cuda: its allocator's exact peaks over the timed steps (reset when they
    /// start), and how often a reservation found no cached block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorFigures>,
    /// On frugal-cuda: kernels made ready in each step, warm-up included (compiled with NVRTC
    /// or loaded from its disk cache): a step after the first few that still makes kernels is
    /// still compiling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels_per_step: Option<Vec<KernelsInStep>>,
    /// On frugal-cuda: what the allocator asked of the driver in each step, warm-up included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_per_step: Option<Vec<DriverInStep>>,
}

/// The line of a configuration that failed.
#[derive(Serialize, Debug)]
pub struct Failure<'a> {
    /// `burn`.
    pub system: &'static str,
    /// The `--device` it was to run on.
    pub device: DeviceKind,
    /// The configuration's name.
    pub config: &'a str,
    /// Its budget in bytes, if known.
    pub budget_bytes: Option<u64>,
    /// Whether its blocks were in checkpoint scopes.
    pub checkpoint_blocks: bool,
    /// The first line of its panic message, or why it did not run.
    pub error: String,
}
