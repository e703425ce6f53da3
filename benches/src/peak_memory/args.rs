//! The command line of `peak-memory` (clap), and the checks a run makes of it before any
//! configuration starts.

// The flags' doc comments are their `--help` text, read in a terminal: types like
// `Autodiff<B>` and URLs stay plain there rather than marked up for rustdoc.
#![allow(rustdoc::invalid_html_tags, rustdoc::bare_urls)]

use clap::{ArgAction, Parser};
use gpt::cli::{AttentionKind, DeviceKind, LossKind, ModelPreset, ModelShape, NormKind};
use gpt::train;

/// Peak memory and speed of the reference GPT step under named configurations.
#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// Where to run (`cuda` and `wgpu` need the matching build feature).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceKind,
    /// Comma-separated configurations: plain (Autodiff<B>); frugal (Autodiff<Frugal<B>>,
    /// watching only); frugal-scopes (frugal, each block in a checkpoint scope);
    /// budget-1/2, budget-1/3, budget-1/4 (frugal under a budget of that fraction of frugal's
    /// peak, which is run first as the reference); budget-1/2-scopes, budget-1/3-scopes,
    /// budget-1/4-scopes (both); burn-balanced
    /// (Burn's own Autodiff<B, BalancedCheckpointing>); bf16, bf16-scopes (frugal with bf16
    /// autocast); bf16-budget-1/3, bf16-store-budget-1/3 (autocast under the budget, the
    /// latter also storing evicted tensors in bf16); store-budget-1/3 (f32 with bf16 storage);
    /// bf16-lowout, bf16-lowout-scopes, bf16-lowout-budget-1/3, bf16-lowout-store-budget-1/3
    /// (autocast leaving products in bf16, as PyTorch's does); store-budget-1/6-scopes (f32,
    /// scopes, and a budget below what the scopes leave, met by bf16 storage and eviction).
    #[arg(long, default_value = "plain,frugal")]
    pub configs: String,
    /// Run only this configuration in this process (used for the child processes).
    #[arg(long, hide = true)]
    pub only: Option<String>,
    /// The budget of a budget configuration in this process (used for the child processes).
    #[arg(long, hide = true)]
    pub budget_bytes: Option<u64>,
    /// Run the configurations one after another in this process instead of one child process
    /// each, so that later ones reuse the kernels earlier ones compiled (a fresh GPU machine
    /// spends minutes compiling per process). Device memory is cleaned up between
    /// configurations, but a pool may keep pages: reserved figures are only exact per process.
    #[arg(long)]
    pub in_process: bool,
    /// The peak live bytes the budget fractions are of, instead of running the frugal
    /// configuration first to measure it.
    #[arg(long, value_name = "BYTES")]
    pub reference_peak: Option<u64>,
    /// The model's size, as `gpt --model` takes it; --layers, --d-model, --heads, --seq and
    /// --batch override single values.
    #[arg(long, value_enum, default_value_t = ModelPreset::Reference)]
    pub model: ModelPreset,
    /// Transformer blocks [default: the --model's].
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,
    /// Model width [default: the --model's].
    #[arg(long, value_name = "N", alias = "d")]
    pub d_model: Option<usize>,
    /// Attention heads, dividing --d-model [default: the --model's].
    #[arg(long, value_name = "N")]
    pub heads: Option<usize>,
    /// Context length in tokens [default: the --model's].
    #[arg(long, value_name = "N")]
    pub seq: Option<usize>,
    /// Sequences per step [default: the --model's].
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Vocabulary of the random tokens and the model (torch_gpt.py's default).
    #[arg(long, value_name = "N", default_value_t = 8192)]
    pub vocab: usize,
    /// Steps per configuration, warm-up included.
    #[arg(long, default_value_t = 6)]
    pub steps: usize,
    /// Steps left out of the timing.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Run the configurations in this order this many times, alternating, to spread drift.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// JSON lines from `torch_gpt.py` run in the same session, shown beside Burn's figures.
    #[arg(long)]
    pub torch: Option<std::path::PathBuf>,
    /// Write a bar chart of peak memory per configuration to this PNG.
    #[arg(long)]
    pub chart: Option<std::path::PathBuf>,
    /// For Frugal configurations: write every tensor allocation and free the ledger saw, from
    /// before the model is built to the last step, to this file (`a <id> <bytes>` / `f <id>`
    /// lines: an allocation trace for `frugal-cuda`'s allocator tests).
    #[arg(long)]
    pub trace: Option<std::path::PathBuf>,
    /// With `--device frugal-cuda`: write what its allocator was asked (every block allocated
    /// and freed, from before the model is built to the last step) to this file, in the same
    /// format as `--trace`.
    #[arg(long)]
    pub allocator_trace: Option<std::path::PathBuf>,
    /// For Frugal configurations: record the timed steps' timeline and report which ops'
    /// outputs held the live bytes at their peak (`peak_holders` in the JSON, top ones on
    /// stderr). Recording takes a lock per allocation and free.
    #[arg(long)]
    pub peak_holders: bool,
    /// On frugal-cuda: time every kernel, product and copy of the timed steps with CUDA events
    /// (`kernel_profile` in the JSON: device time per step by kind of work and by kernel, and
    /// the device's idle time between them). The probed last step is left out.
    #[arg(long)]
    pub profile_kernels: bool,
    /// For Frugal configurations: record the timed steps and write them as a PyTorch
    /// memory_viz pickle (https://pytorch.org/memory_viz) to FILE with the configuration's
    /// name before the extension (`--memory-viz m.pickle`: `m.budget-1_3.pickle`). On
    /// frugal-cuda: its allocator's real segments and blocks, and its trace of the timed steps.
    #[arg(long, value_name = "FILE")]
    pub memory_viz: Option<std::path::PathBuf>,
    /// Run on Burn's fusion. With `--device cuda` or `frugal-cuda`, false runs on CubeCL's
    /// CUDA backend without it, whose fused kernels are compiled (and fused matmuls
    /// autotuned) for every new sequence of ops.
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set)]
    pub fusion: bool,
    /// The older spelling of --fusion false.
    #[arg(long, hide = true, conflicts_with = "fusion")]
    pub no_fusion: bool,
    /// Under a budget, let a checkpoint scope's end leave its costly products on the device
    /// for the budget to evict by score (`frugal::Policy::scope_keeps_products`).
    #[arg(long)]
    pub scopes_keep_products: bool,
    /// Under autocast, cast weights and saved activations again in backward instead of
    /// keeping forward's casts (`frugal::AutocastPolicy::with_kept_casts` off).
    #[arg(long)]
    pub recast: bool,
    /// Under a budget, never score tensors by the learned step's predicted reads (`frugal::Policy::planned`
    /// off): the budget evicts by staleness alone, as before plans existed.
    #[arg(long)]
    pub no_plan: bool,
    /// Under a budget, let it cut the learned step's forward pass into segments
    /// (`frugal::Policy::forward_segments`).
    #[arg(long, value_name = "true|false", default_value_t = true, action = ArgAction::Set)]
    pub segments: bool,
    /// The older spelling of --segments false.
    #[arg(long, hide = true, conflicts_with = "segments")]
    pub no_segments: bool,
    /// Under a budget on frugal-cuda: the allocator's growth limit (e.g. 20GiB or bytes)
    /// instead of the budget plus `frugal::memory::RESERVE_HEADROOM` (a large value turns it
    /// off).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub growth_limit: Option<u64>,
    /// How every configuration computes attention: fused is `frugal::nn::attention` (flash
    /// attention under `Autodiff<Frugal<_>>`, the written-out attention on plain Burn);
    /// written-out is scores, mask, softmax and product as separate ops (torch_gpt.py's
    /// fp32_math).
    #[arg(long, value_enum, default_value_t = AttentionKind::WrittenOut)]
    pub attention: AttentionKind,
    /// How every configuration computes layer norms: fused is `frugal::nn::layer_norm` (one
    /// autodiff node under `Autodiff<Frugal<_>>`, Burn's own layer norm on plain Burn);
    /// written-out is Burn's layer norm (a dozen autodiff nodes) everywhere.
    #[arg(long, value_enum, default_value_t = NormKind::Fused)]
    pub norm: NormKind,
    /// How every configuration computes the head and the loss: fused is
    /// `frugal::nn::linear_cross_entropy` (one autodiff node, the rows in chunks, under
    /// `Autodiff<Frugal<_>>`; written out on plain Burn); written-out is the logits and
    /// burn-nn's `CrossEntropyLoss` everywhere.
    #[arg(long, value_enum, default_value_t = LossKind::Fused)]
    pub loss: LossKind,
    /// The older spelling of --attention fused.
    #[arg(long, hide = true, conflicts_with = "attention")]
    pub fused_attention: bool,
    /// When Frugal runs its own CubeCL kernels (casts, compressed storage) instead of the inner
    /// backend's ops: auto (not for casts under fusion), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    pub kernels: KernelsArg,
    /// The optimizer of every configuration: burn-optim's AdamW, Frugal's AdamW with
    /// block-wise 8-bit moments, or burn-optim's AdamW fused into one launch per parameter.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: train::OptimizerKind,
    /// Under a budget, the longest chain of evicted tensors one read may recompute
    /// (`frugal::Policy::max_depth`; default the policy's).
    #[arg(long)]
    pub max_depth: Option<u32>,
    /// Where Frugal configurations on `--device frugal-cuda` run matrix products: auto
    /// (f16/bf16 on cuBLASLt, f32 on CubeCL's kernels), blas (all on cuBLASLt, f32 strict),
    /// blas-tf32 (all on cuBLASLt, f32 on TF32) or cube (CubeCL's kernels, Burn's own). Plain
    /// Burn configurations always run CubeCL's.
    #[arg(long, value_enum, default_value = "auto")]
    pub products: ProductsArg,
    /// How Frugal's attention runs (`--attention fused`): auto (products for f16 and bf16 on
    /// frugal-cuda, else the flash kernels), flash (the flash-attention kernels) or products
    /// (matrix products on cuBLASLt with the softmax and its gradient between them, where the
    /// attention's dtype's products run there); see `frugal::kernels::AttentionPath`.
    #[arg(long, value_enum, default_value = "auto")]
    pub attention_path: AttentionPathArg,
}

/// Parses a byte size (`2GiB`, `1.5GB`, `800MB`, `123456`).
pub fn parse_size(value: &str) -> Result<u64, String> {
    frugal::parse_bytes(value).map_err(|e| e.to_string())
}

impl Args {
    /// The model and batch: `--model`'s, with the single flags given instead of its values.
    pub fn shape(&self) -> ModelShape {
        self.model
            .shape()
            .overridden(self.layers, self.d_model, self.heads, self.seq, self.batch)
    }

    /// Whether attention goes through `frugal::nn::attention`.
    pub fn fused_attention(&self) -> bool {
        self.attention == AttentionKind::Fused || self.fused_attention
    }

    /// Whether a budget may cut the forward pass into segments.
    pub fn cuts_segments(&self) -> bool {
        self.segments && !self.no_segments
    }

    /// Whether the CUDA devices run on Burn's fusion.
    pub fn fuses(&self) -> bool {
        self.fusion && !self.no_fusion
    }

    /// Refuses too few `--steps`: the warm-up, at least one timed step, then the probed one.
    pub fn check_steps(&self) -> Result<(), String> {
        if self.steps < self.warmup + 2 {
            return Err(format!(
                "--steps {} must be at least --warmup {} + 2 (timed steps, then one probed step)",
                self.steps, self.warmup
            ));
        }
        Ok(())
    }

    /// Refuses what only the parent checks (a child inherits its checked flags): a device
    /// outside `built`, `--fusion false` off CUDA, and a `--budget-bytes` given by hand.
    pub fn check_parent(&self, built: &[DeviceKind]) -> Result<(), String> {
        if !built.contains(&self.device) {
            return Err(self.device.refused("peak-memory", built));
        }
        if !self.fuses() && !matches!(self.device, DeviceKind::Cuda | DeviceKind::FrugalCuda) {
            return Err(format!(
                "--fusion false applies to --device cuda and frugal-cuda only, not {}",
                self.device.name()
            ));
        }
        if self.budget_bytes.is_some() {
            return Err(
                "--budget-bytes is set by the bench for its child processes; \
                 the budgets are fractions of the frugal configuration's peak (see --configs)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// `--attention-path`, mapped onto [`frugal::kernels::AttentionPath`].
// The variants have no doc comments: clap would show them in `--help`, changing its text.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum AttentionPathArg {
    Auto,
    Flash,
    Products,
}

impl AttentionPathArg {
    pub fn choice(self) -> frugal::kernels::AttentionPath {
        match self {
            AttentionPathArg::Auto => frugal::kernels::AttentionPath::Auto,
            AttentionPathArg::Flash => frugal::kernels::AttentionPath::Flash,
            AttentionPathArg::Products => frugal::kernels::AttentionPath::Products,
        }
    }
}

/// `--products`, mapped onto [`frugal::kernels::Products`].
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ProductsArg {
    Auto,
    Blas,
    BlasTf32,
    Cube,
}

impl ProductsArg {
    pub fn products(self) -> frugal::kernels::Products {
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
pub enum KernelsArg {
    Auto,
    Always,
    Never,
}

impl KernelsArg {
    pub fn mode(self) -> frugal::kernels::KernelMode {
        match self {
            KernelsArg::Auto => frugal::kernels::KernelMode::Auto,
            KernelsArg::Always => frugal::kernels::KernelMode::Always,
            KernelsArg::Never => frugal::kernels::KernelMode::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("peak-memory").chain(flags.iter().copied()))
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    #[test]
    fn the_single_shape_flags_override_the_preset() {
        let preset = ModelPreset::Reference.shape();
        let shape = parse(&["--layers", "3", "--d", "64"]).shape();
        assert_eq!(shape.layers, 3);
        assert_eq!(shape.d_model, 64);
        assert_eq!(shape.heads, preset.heads);
        assert_eq!(shape.seq, preset.seq);
        assert_eq!(shape.batch, preset.batch);
    }

    #[test]
    fn the_older_spellings_mean_what_the_new_flags_do() {
        let args = parse(&[]);
        assert!(args.fuses() && args.cuts_segments() && !args.fused_attention());
        assert!(!parse(&["--no-fusion"]).fuses());
        assert!(!parse(&["--fusion", "false"]).fuses());
        assert!(!parse(&["--no-segments"]).cuts_segments());
        assert!(parse(&["--fused-attention"]).fused_attention());
        assert!(parse(&["--attention", "fused"]).fused_attention());
        // The two spellings of one flag conflict rather than one silently winning.
        let both = ["peak-memory", "--fusion", "true", "--no-fusion"];
        assert!(Args::try_parse_from(both).is_err());
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse(&["--growth-limit", "2KiB"]).growth_limit, Some(2048));
        assert_eq!(parse(&["--growth-limit", "123"]).growth_limit, Some(123));
        assert!(Args::try_parse_from(["peak-memory", "--growth-limit", "lots"]).is_err());
    }

    #[test]
    fn too_few_steps_are_refused() {
        assert!(
            parse(&["--steps", "4", "--warmup", "2"])
                .check_steps()
                .is_ok()
        );
        let error = parse(&["--steps", "3", "--warmup", "2"])
            .check_steps()
            .unwrap_err();
        assert!(
            error.contains("--steps 3") && error.contains("--warmup 2"),
            "{error}"
        );
    }

    #[test]
    fn the_parent_refuses_what_this_build_cannot_run() {
        let cpu = [DeviceKind::Cpu, DeviceKind::Flex];
        assert_eq!(parse(&[]).check_parent(&cpu), Ok(()));
        let error = parse(&["--device", "cuda"]).check_parent(&cpu).unwrap_err();
        assert!(error.contains("--features cuda"), "{error}");
        let error = parse(&["--fusion", "false"])
            .check_parent(&cpu)
            .unwrap_err();
        assert!(error.contains("not cpu"), "{error}");
        let cuda = [DeviceKind::Cpu, DeviceKind::Cuda];
        let unfused = parse(&["--device", "cuda", "--fusion", "false"]);
        assert_eq!(unfused.check_parent(&cuda), Ok(()));
        let error = parse(&["--budget-bytes", "5"])
            .check_parent(&cpu)
            .unwrap_err();
        assert!(
            error.starts_with("--budget-bytes is set by the bench"),
            "{error}"
        );
    }

    #[test]
    fn the_mapped_choices_follow_the_flags() {
        let args = parse(&["--kernels", "never", "--products", "blas-tf32"]);
        assert_eq!(args.kernels.mode(), frugal::kernels::KernelMode::Never);
        assert_eq!(
            args.products.products(),
            frugal::kernels::Products::BlasTf32
        );
        let args = parse(&["--attention-path", "products"]);
        assert_eq!(
            args.attention_path.choice(),
            frugal::kernels::AttentionPath::Products
        );
    }
}
