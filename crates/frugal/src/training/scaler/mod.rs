//! Dynamic loss scaling for f16 training, with PyTorch's `GradScaler` defaults.
//!
//! f16 gradients underflow to zero below about 6e-8. The loss is multiplied by a large scale
//! before the backward pass so that small gradients survive, and the gradients are divided by
//! the same scale before the optimizer step. When a scaled gradient overflows (inf or NaN), the
//! step is skipped and the scale is halved; after `growth_interval` clean steps in a row it is
//! doubled. With a power-of-two scale, scaling and unscaling are exact for every gradient that
//! neither overflows nor underflows, so a clean step gives the optimizer the same bits as an
//! unscaled backward pass would have.
//!
//! On CubeCL inner backends (features `cuda`, `wgpu`) the gradients are unscaled in place by
//! Frugal's fused unscale-and-check kernel (see [`crate::kernels`]); elsewhere by the portable
//! path: plain Burn ops, the non-finite checks of all gradients folded into one device-side
//! flag. Either way the flag is read once per step.

mod unscale;

use burn_core::module::{AutodiffModule, ModuleVisitor, Param};
use burn_core::tensor::backend::{AutodiffBackend, Backend};
use burn_core::tensor::{Bool, ElementConversion, Int, Tensor};
use burn_optim::{GradientsParams, LearningRate, Optimizer};
use serde::{Deserialize, Serialize};

/// Settings of a [`GradScaler`]; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradScalerConfig {
    /// The scale of the first step (PyTorch: 65536 = 2^16).
    pub init_scale: f32,
    /// Factor applied after `growth_interval` clean steps in a row (PyTorch: 2).
    pub growth_factor: f32,
    /// Factor applied after a step with an inf or NaN gradient (PyTorch: 0.5).
    pub backoff_factor: f32,
    /// Clean steps in a row before the scale grows (PyTorch: 2000).
    pub growth_interval: u32,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// A [`GradScalerConfig`] value outside its accepted range.
#[derive(Clone, Debug, PartialEq)]
pub struct GradScalerError {
    field: &'static str,
    value: f64,
    accepted: &'static str,
}

impl std::fmt::Display for GradScalerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid GradScaler {} {}: accepted {}",
            self.field, self.value, self.accepted
        )
    }
}

impl std::error::Error for GradScalerError {}

/// What [`GradScaler::step`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaledStep {
    /// The optimizer step was skipped: a gradient was inf or NaN.
    pub skipped: bool,
    /// The scale the step's loss was multiplied by.
    pub scale: f32,
    /// The scale for the next step.
    pub next_scale: f32,
}

/// The state of a [`GradScaler`], for saving with training checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradScalerState {
    /// The settings.
    pub config: GradScalerConfig,
    /// The current scale.
    pub scale: f32,
    /// Clean steps in a row since the scale last changed.
    pub clean_steps: u32,
}

/// Dynamic loss scaling: scale the loss, unscale the gradients, skip steps that overflow.
///
/// ```
/// # use burn::backend::{Autodiff, NdArray};
/// # use burn::nn::{Linear, LinearConfig};
/// # use burn::optim::{AdamConfig, GradientsParams};
/// # use burn::tensor::Tensor;
/// # type B = Autodiff<NdArray>;
/// let device = Default::default();
/// let mut model: Linear<B> = LinearConfig::new(4, 1).init(&device);
/// let mut optim = AdamConfig::new().init::<B, Linear<B>>();
/// let mut scaler = frugal::GradScaler::new(Default::default())?;
/// let loss = model.forward(Tensor::<B, 2>::ones([2, 4], &device)).mean();
/// let grads = scaler.scale_loss(loss).backward();
/// let grads = GradientsParams::from_grads(grads, &model);
/// let (next, outcome) = scaler.step(1e-3, model, &mut optim, grads);
/// model = next;
/// assert!(!outcome.skipped);
/// # Ok::<(), frugal::GradScalerError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct GradScaler {
    config: GradScalerConfig,
    scale: f32,
    clean_steps: u32,
}

impl GradScaler {
    /// A scaler with `config`, checked: `init_scale` finite and > 0, `growth_factor` finite
    /// and > 1, `backoff_factor` in (0, 1), `growth_interval` ≥ 1.
    pub fn new(config: GradScalerConfig) -> Result<Self, GradScalerError> {
        let error = |field, value: f64, accepted| {
            Err(GradScalerError {
                field,
                value,
                accepted,
            })
        };
        let c = config;
        if !(c.init_scale.is_finite() && c.init_scale > 0.0) {
            return error("init_scale", c.init_scale as f64, "a finite number > 0");
        }
        if !(c.growth_factor.is_finite() && c.growth_factor > 1.0) {
            return error(
                "growth_factor",
                c.growth_factor as f64,
                "a finite number > 1",
            );
        }
        if !(c.backoff_factor > 0.0 && c.backoff_factor < 1.0) {
            return error(
                "backoff_factor",
                c.backoff_factor as f64,
                "a number in (0, 1)",
            );
        }
        if c.growth_interval == 0 {
            return error("growth_interval", 0.0, "at least 1 step");
        }
        Ok(Self {
            config,
            scale: config.init_scale,
            clean_steps: 0,
        })
    }

    /// A scaler continuing from a saved state (checked as in [`Self::new`], and the scale
    /// must be finite and > 0).
    pub fn from_state(state: GradScalerState) -> Result<Self, GradScalerError> {
        let mut scaler = Self::new(state.config)?;
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(GradScalerError {
                field: "scale",
                value: state.scale as f64,
                accepted: "a finite number > 0",
            });
        }
        scaler.scale = state.scale;
        scaler.clean_steps = state.clean_steps;
        Ok(scaler)
    }

    /// The state to save with a checkpoint.
    pub fn state(&self) -> GradScalerState {
        GradScalerState {
            config: self.config,
            scale: self.scale,
            clean_steps: self.clean_steps,
        }
    }

    /// The current scale.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `loss × scale`, to call `backward` on.
    pub fn scale_loss<B: Backend, const D: usize>(&self, loss: Tensor<B, D>) -> Tensor<B, D> {
        loss.mul_scalar(self.scale)
    }

    /// Divides every gradient of `module`'s parameters in `grads` by the scale (cast to the
    /// parameter's type first, see [`crate::precision::match_param_dtypes`]), and says
    /// whether any of them holds an inf or NaN (one read from the device for all of them).
    pub fn unscale<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: &mut GradientsParams,
    ) -> bool {
        let inv_scale = 1.0 / self.scale;
        // CubeCL inner backends: one fused launch per group of gradients (crate::kernels).
        if let Some(found) = unscale::unscale::<B, M>(module, grads, inv_scale) {
            return found;
        }
        let mut visitor = Unscale::<B> {
            grads,
            inv_scale,
            non_finite: None,
        };
        module.visit(&mut visitor);
        visitor
            .non_finite
            .is_some_and(|flag| flag.into_scalar().elem::<i64>() != 0)
    }

    /// Moves the scale on after a step: back off when `found_non_finite`, grow after
    /// `growth_interval` clean steps in a row.
    pub fn update(&mut self, found_non_finite: bool) {
        if found_non_finite {
            self.scale *= self.config.backoff_factor;
            self.clean_steps = 0;
            return;
        }
        self.clean_steps += 1;
        if self.clean_steps >= self.config.growth_interval {
            let grown = self.scale * self.config.growth_factor;
            // Never grow into infinity: every later loss would overflow.
            if grown.is_finite() {
                self.scale = grown;
            }
            self.clean_steps = 0;
        }
    }

    /// Unscales `grads` (computed from a [`Self::scale_loss`]d loss), runs the optimizer step
    /// unless a gradient is inf or NaN, and updates the scale.
    pub fn step<B, M, O>(
        &mut self,
        lr: LearningRate,
        module: M,
        optim: &mut O,
        mut grads: GradientsParams,
    ) -> (M, ScaledStep)
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let scale = self.scale;
        let skipped = self.unscale(&module, &mut grads);
        let module = if skipped {
            module
        } else {
            optim.step(lr, module, grads)
        };
        self.update(skipped);
        (
            module,
            ScaledStep {
                skipped,
                scale,
                next_scale: self.scale,
            },
        )
    }
}

/// Unscales each parameter's gradient in place and folds its non-finite check into one flag.
struct Unscale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    inv_scale: f32,
    /// 1 when some gradient so far held an inf or NaN.
    non_finite: Option<Tensor<B::InnerBackend, 1, Int>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unscale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // In the parameter's type: under autocast with 16-bit outputs a gradient may be 16-bit.
        let Some(grad) = crate::precision::take_grad_as_param::<B, D>(self.grads, param) else {
            return;
        };
        let grad = grad.mul_scalar(self.inv_scale);
        let bad: Tensor<B::InnerBackend, D, Bool> =
            grad.clone().is_nan().bool_or(grad.clone().is_inf());
        let bad = bad.any().int();
        self.non_finite = Some(match self.non_finite.take() {
            Some(flag) => flag.max_pair(bad),
            None => bad,
        });
        self.grads.register(param.id, grad);
    }
}
