//! Layer 10, optimizers: [`AdamW8bit`], AdamW with its two moments stored as 8-bit block-wise
//! quantised codes (bitsandbytes' scheme: Dettmers et al., ICLR 2022, arXiv 2110.02861), a
//! quarter of AdamW's state memory plus one f32 per block.
//!
//! Owns the optimizer, its configuration, state and records, the quantisation maps
//! ([`qmap`]), the portable step on Burn ops and the fused step's dispatch. Imports `kernels`
//! and `runtime` (the kernel mode, the runtime list), `tensor` and `device` (to reach the
//! CubeCL buffers behind Frugal's tensors and charge what the fused step allocates), `op`.
//!
//! A step, for a parameter of at least `min_8bit_size` f32 elements: dequantise both moments
//! (`map[code] * absmax` of the code's block), update them with the gradient as burn-optim's
//! `AdamW` does, update the parameter (bias correction, decoupled weight decay, same operation
//! order), then requantise each moment against its new per-block absmax: the nearest entry of
//! the signed map for the first moment, of the unsigned map for the second. The parameter is
//! updated from the f32 moments of this step, before they are requantised, as bitsandbytes
//! does. Smaller tensors (biases, norms) and non-f32 parameters keep f32 moments and follow
//! burn-optim's `AdamW` exactly.
//!
//! With every parameter in f32 ([`AdamW8bitConfig::full_precision`]) it is burn-optim's
//! `AdamW`, fused: PyTorch's `AdamW(fused=True)` in spirit, one launch per parameter instead
//! of the handful of element-wise kernels Burn's ops take.
//!
//! On CubeCL backends (features `cuda`, `wgpu`; Burn's fusion on or off, under Frugal or
//! not) the whole step is one kernel launch per parameter (`frugal_kernels::adamw8bit_update`
//! for 8-bit moments, `frugal_kernels::adamw_update` for f32 ones), in place; elsewhere (NdArray, Flex, a tensor under a Frugal budget, [`KernelMode::Never`])
//! the portable path runs the same arithmetic on Burn ops and gives the same codes.
//!
//! [`KernelMode::Never`]: crate::kernels::KernelMode::Never

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fused;
mod portable;
pub mod qmap;

use std::sync::Arc;

use burn_core as burn;

use burn::config::Config;
use burn::module::AutodiffModule;
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_optim::adaptor::OptimizerAdaptor;
use burn_optim::grad_clipping::GradientClippingConfig;
use burn_optim::{LearningRate, SimpleOptimizer};
use serde::{Deserialize, Serialize};

/// [`AdamW8bit`]'s configuration: burn-optim's `AdamWConfig` fields and defaults, plus the
/// 8-bit options (`block_size`, `min_8bit_size`, bitsandbytes' defaults).
#[derive(Config, Debug)]
pub struct AdamW8bitConfig {
    /// β₁, the first moment's decay.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// β₂, the second moment's decay.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// ε, for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay (<https://arxiv.org/abs/2510.12402>): decay only where the
    /// parameter and the first moment have the same sign.
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// Elements per quantisation block (one f32 absmax each): a multiple of 4 in
    /// `4..=65536`.
    #[config(default = 256)]
    pub block_size: usize,
    /// Parameters with fewer elements keep f32 moments.
    #[config(default = 4096)]
    pub min_8bit_size: usize,
    /// Gradient clipping, as burn-optim's optimizers apply it.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// An [`AdamW8bitConfig`] value outside its accepted range.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW8bitConfigError {
    field: &'static str,
    value: f64,
    accepted: &'static str,
}

impl std::fmt::Display for AdamW8bitConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid AdamW8bit {} {}: accepted {}",
            self.field, self.value, self.accepted
        )
    }
}

impl std::error::Error for AdamW8bitConfigError {}

impl AdamW8bitConfig {
    /// Every parameter keeps f32 moments (`min_8bit_size` at its maximum): burn-optim's
    /// `AdamW`, each parameter's step one fused launch on CubeCL backends.
    ///
    /// ```
    /// use frugal::optim::AdamW8bitConfig;
    ///
    /// let config = AdamW8bitConfig::full_precision().with_weight_decay(0.01);
    /// assert_eq!(config.min_8bit_size, usize::MAX);
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn full_precision() -> Self {
        Self::new().with_min_8bit_size(usize::MAX)
    }

    /// Checks every field against its accepted range.
    pub fn validate(&self) -> Result<(), AdamW8bitConfigError> {
        let error = |field, value: f64, accepted| {
            Err(AdamW8bitConfigError {
                field,
                value,
                accepted,
            })
        };
        if !(0.0..1.0).contains(&self.beta_1) {
            return error("beta_1", self.beta_1 as f64, "0 <= beta_1 < 1");
        }
        if !(0.0..1.0).contains(&self.beta_2) {
            return error("beta_2", self.beta_2 as f64, "0 <= beta_2 < 1");
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return error("epsilon", self.epsilon as f64, "finite and > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return error("weight_decay", self.weight_decay as f64, "finite and >= 0");
        }
        let block = self.block_size;
        if block < 4 || !block.is_multiple_of(4) || block > MAX_BLOCK_SIZE {
            return error(
                "block_size",
                block as f64,
                "a multiple of 4 in 4..=65536 (bitsandbytes uses 256)",
            );
        }
        Ok(())
    }

    /// The optimizer, or why the configuration is refused.
    pub fn try_build(&self) -> Result<AdamW8bit, AdamW8bitConfigError> {
        self.validate()?;
        Ok(AdamW8bit {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            cautious_weight_decay: self.cautious_weight_decay,
            block_size: self.block_size,
            min_8bit_size: self.min_8bit_size,
            tables: Arc::new(qmap::Tables::new()),
        })
    }

    /// As [`Self::init`], or why the configuration is refused.
    pub fn try_init<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
    ) -> Result<OptimizerAdaptor<AdamW8bit, M, B>, AdamW8bitConfigError> {
        let mut optim = OptimizerAdaptor::from(self.try_build()?);
        if let Some(config) = &self.grad_clipping {
            optim = optim.with_grad_clipping(config.init());
        }
        Ok(optim)
    }

    /// The optimizer for module `M`, used as burn-optim's `AdamWConfig::init` is
    /// (`optim.step(lr, module, grads)`).
    ///
    /// # Panics
    ///
    /// If the configuration is refused by [`Self::validate`] (the message names the field,
    /// its value and the accepted range); [`Self::try_init`] returns the error instead.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
    ) -> OptimizerAdaptor<AdamW8bit, M, B> {
        self.try_init().unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The largest block size (the fused kernel reduces a block within one cube).
const MAX_BLOCK_SIZE: usize = 1 << 16;

/// AdamW with 8-bit block-wise quantised moments (see the [module docs](self)). Built by
/// [`AdamW8bitConfig`].
#[derive(Clone, Debug)]
pub struct AdamW8bit {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
    cautious_weight_decay: bool,
    block_size: usize,
    min_8bit_size: usize,
    tables: Arc<qmap::Tables>,
}

/// The state of one parameter.
#[derive(Clone, Debug)]
pub struct AdamW8bitState<B: Backend, const D: usize> {
    /// Steps taken (the bias corrections' exponent).
    pub time: usize,
    /// The two moments.
    pub moments: Moments<B, D>,
}

/// A parameter's two moments.
#[derive(Clone, Debug)]
pub enum Moments<B: Backend, const D: usize> {
    /// In the parameter's dtype, as burn-optim's `AdamW` keeps them (small or non-f32
    /// parameters).
    Full {
        /// First moment.
        moment_1: Tensor<B, D>,
        /// Second moment.
        moment_2: Tensor<B, D>,
    },
    /// 8-bit codes and per-block absmax.
    Quantized(QuantizedMoments<B>),
}

/// Both moments of a parameter of `len` elements as 8-bit codes in blocks of `block_size`
/// (`blocks = ceil(len / block_size)`, the last block padded).
#[derive(Clone, Debug)]
pub struct QuantizedMoments<B: Backend> {
    /// `2 * blocks * block_size / 4` u32 words (dtype `U32`), four codes each, little-endian
    /// (element `i` in byte `i % 4` of word `i / 4`): the first moment's words, then the
    /// second's. One byte per code, as the memory ledger counts it.
    pub codes: Tensor<B, 1, Int>,
    /// `2 * blocks` f32: each block's absmax, the first moment's then the second's.
    pub absmax: Tensor<B, 1>,
    /// Elements per block.
    pub block_size: usize,
    /// Elements of the parameter.
    pub len: usize,
}

impl<B: Backend> QuantizedMoments<B> {
    /// Blocks per moment.
    pub fn blocks(&self) -> usize {
        self.len.div_ceil(self.block_size)
    }

    /// Code words per moment.
    pub fn words(&self) -> usize {
        self.blocks() * self.block_size / 4
    }

    /// Both moments' codes as bytes (the first moment's `blocks * block_size`, then the
    /// second's) and absmax, read back to the host.
    pub fn to_host(&self) -> (Vec<u8>, Vec<f32>) {
        let words = self.codes.clone().into_data();
        let codes = words
            .convert::<u32>()
            .iter::<u32>()
            .flat_map(u32::to_le_bytes)
            .collect();
        let absmax = self.absmax.clone().into_data().to_vec::<f32>();
        (codes, absmax.expect("absmax is f32"))
    }

    /// Moments from host codes and absmax (as [`Self::to_host`] returns them).
    ///
    /// # Panics
    ///
    /// If the lengths do not match `len` and `block_size`.
    pub fn from_host(
        codes: &[u8],
        absmax: &[f32],
        block_size: usize,
        len: usize,
        device: &B::Device,
    ) -> Self {
        let blocks = len.div_ceil(block_size);
        assert_eq!(
            codes.len(),
            2 * blocks * block_size,
            "codes for {len} elements"
        );
        assert_eq!(absmax.len(), 2 * blocks, "absmax for {len} elements");
        let words: Vec<u32> = codes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n = words.len();
        Self {
            codes: Tensor::from_data(TensorData::new(words, [n]), (device, DType::U32)),
            absmax: Tensor::from_data(
                TensorData::new(absmax.to_vec(), [2 * blocks]),
                (device, DType::F32),
            ),
            block_size,
            len,
        }
    }
}

/// The serialised form of an [`AdamW8bitState`]: f32 moments as Burn records them for
/// `AdamW` (converted to the recorder's float precision), 8-bit codes and absmax exactly
/// (codes as `U32` words, absmax in f32 whatever the precision settings, since the codes
/// mean nothing against a rounded absmax).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AdamW8bitStateItem {
    time: usize,
    moments: MomentsItem,
}

/// The serialised moments of an [`AdamW8bitStateItem`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MomentsItem {
    /// See [`Moments::Full`].
    Full {
        /// First moment.
        moment_1: TensorData,
        /// Second moment.
        moment_2: TensorData,
    },
    /// See [`Moments::Quantized`].
    Quantized {
        /// The code words.
        codes: TensorData,
        /// The absmax values.
        absmax: TensorData,
        /// Elements per block.
        block_size: usize,
        /// Elements of the parameter.
        len: usize,
    },
}

impl<B: Backend, const D: usize> Record<B> for AdamW8bitState<B, D> {
    type Item<S: PrecisionSettings> = AdamW8bitStateItem;

    fn into_item<S: PrecisionSettings>(self) -> Self::Item<S> {
        let moments = match self.moments {
            Moments::Full { moment_1, moment_2 } => MomentsItem::Full {
                moment_1: moment_1.into_data().convert::<S::FloatElem>(),
                moment_2: moment_2.into_data().convert::<S::FloatElem>(),
            },
            Moments::Quantized(q) => MomentsItem::Quantized {
                codes: q.codes.into_data(),
                absmax: q.absmax.into_data(),
                block_size: q.block_size,
                len: q.len,
            },
        };
        AdamW8bitStateItem {
            time: self.time,
            moments,
        }
    }

    fn from_item<S: PrecisionSettings>(item: Self::Item<S>, device: &B::Device) -> Self {
        let moments = match item.moments {
            MomentsItem::Full { moment_1, moment_2 } => Moments::Full {
                moment_1: Tensor::from_data(moment_1.convert::<B::FloatElem>(), device),
                moment_2: Tensor::from_data(moment_2.convert::<B::FloatElem>(), device),
            },
            MomentsItem::Quantized {
                codes,
                absmax,
                block_size,
                len,
            } => Moments::Quantized(QuantizedMoments {
                codes: Tensor::from_data(codes.convert::<u32>(), (device, DType::U32)),
                absmax: Tensor::from_data(absmax.convert::<f32>(), (device, DType::F32)),
                block_size,
                len,
            }),
        };
        AdamW8bitState {
            time: item.time,
            moments,
        }
    }
}

impl<B: Backend> SimpleOptimizer<B> for AdamW8bit {
    type State<const D: usize> = AdamW8bitState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(0, |s| s.time) + 1;
        let scalars = self.scalars(lr, time);
        let moments = match state.map(|s| s.moments) {
            Some(moments) => Some(moments),
            None if self.quantises(&tensor) => Some(Moments::Quantized(self.new_codes(&tensor))),
            // burn-optim's AdamW starts from the first gradient, without zero tensors.
            None => None,
        };
        let (tensor, moments) = match moments {
            Some(Moments::Quantized(q)) => {
                let (tensor, q) = step_quantized(&scalars, &self.tables, tensor, grad, q);
                (tensor, Moments::Quantized(q))
            }
            Some(Moments::Full { moment_1, moment_2 }) => {
                let (tensor, moment_1, moment_2) =
                    step_full(&scalars, tensor, grad, Some((moment_1, moment_2)));
                (tensor, Moments::Full { moment_1, moment_2 })
            }
            None => {
                let (tensor, moment_1, moment_2) = step_full(&scalars, tensor, grad, None);
                (tensor, Moments::Full { moment_1, moment_2 })
            }
        };
        (tensor, Some(AdamW8bitState { time, moments }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.moments = match state.moments {
            Moments::Full { moment_1, moment_2 } => Moments::Full {
                moment_1: moment_1.to_device(device),
                moment_2: moment_2.to_device(device),
            },
            Moments::Quantized(mut q) => {
                q.codes = q.codes.to_device(device);
                q.absmax = q.absmax.to_device(device);
                Moments::Quantized(q)
            }
        };
        state
    }
}

/// One step of f32 moments (`None` on the first step): the fused kernel when the tensors are
/// f32 CubeCL ones and the kernel mode allows, else the portable path.
fn step_full<B: Backend, const D: usize>(
    scalars: &Scalars,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let (tensor, grad, moments) = if crate::kernels::mode() == crate::kernels::KernelMode::Never
        || tensor.dtype() != DType::F32
        || grad.dtype() != DType::F32
    {
        (tensor, grad, moments)
    } else {
        let first_step = moments.is_none();
        // The first step's moments are written, not read: uninitialised buffers will do.
        let moments = moments.unwrap_or_else(|| {
            let empty = || Tensor::empty(tensor.shape(), (&tensor.device(), DType::F32));
            (empty(), empty())
        });
        match fused::step_full(scalars, tensor, grad, moments, first_step) {
            Ok(done) => return done,
            Err((tensor, grad, moments)) => (tensor, grad, (!first_step).then_some(moments)),
        }
    };
    portable::step_full(scalars, tensor, grad, moments)
}

/// One step of 8-bit moments: the fused kernel when the tensors are CubeCL ones and the
/// kernel mode allows, else the portable path.
fn step_quantized<B: Backend, const D: usize>(
    scalars: &Scalars,
    tables: &Arc<qmap::Tables>,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: QuantizedMoments<B>,
) -> (Tensor<B, D>, QuantizedMoments<B>) {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let (tensor, grad, moments) = if crate::kernels::mode() == crate::kernels::KernelMode::Never {
        (tensor, grad, moments)
    } else {
        match fused::step_quantized(scalars, tables, tensor, grad, moments) {
            Ok(done) => return done,
            Err(inputs) => inputs,
        }
    };
    portable::step_quantized(scalars, tables, tensor, grad, moments)
}

impl AdamW8bit {
    /// Whether a parameter's moments are kept in 8 bits: f32 with at least `min_8bit_size`
    /// elements.
    fn quantises<B: Backend, const D: usize>(&self, tensor: &Tensor<B, D>) -> bool {
        let len = tensor.shape().num_elements();
        tensor.dtype() == DType::F32 && len >= self.min_8bit_size.max(1)
    }

    /// The 8-bit moments of a parameter's first step: every code the value 0, absmax 0.
    fn new_codes<B: Backend, const D: usize>(&self, tensor: &Tensor<B, D>) -> QuantizedMoments<B> {
        let len = tensor.shape().num_elements();
        let device = tensor.device();
        let blocks = len.div_ceil(self.block_size);
        let padded = blocks * self.block_size;
        // Every code is the value 0: the signed map's zero for the first moment, code 0 for
        // the second; absmax 0.
        let zero_m = self.tables.signed_zero();
        let mut codes = vec![zero_m; padded];
        codes.extend(std::iter::repeat_n(0u8, padded));
        let absmax = vec![0f32; 2 * blocks];
        QuantizedMoments::from_host(&codes, &absmax, self.block_size, len, &device)
    }

    /// The step's scalars, computed as burn-optim's `AdamW` computes them.
    fn scalars(&self, lr: LearningRate, time: usize) -> Scalars {
        let time = time as i32;
        let decay_rate = lr * self.weight_decay as f64;
        Scalars {
            beta_1: self.beta_1,
            one_minus_beta_1: 1.0 - self.beta_1,
            beta_2: self.beta_2,
            one_minus_beta_2: 1.0 - self.beta_2,
            bias_correction_1: 1f32 - self.beta_1.powi(time),
            bias_correction_2: 1f32 - self.beta_2.powi(time),
            epsilon: self.epsilon,
            lr: lr as f32,
            decay: if decay_rate == 0.0 {
                Decay::None
            } else if self.cautious_weight_decay {
                Decay::Cautious {
                    rate: decay_rate as f32,
                }
            } else {
                Decay::Plain {
                    factor: (1.0 - decay_rate) as f32,
                }
            },
        }
    }
}

/// The scalars of one step, computed once on the host and used by the portable path and the
/// kernel's launch alike (the fields of `frugal_kernels::AdamWScalars`, which only CubeCL
/// builds have).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scalars {
    pub(crate) beta_1: f32,
    pub(crate) one_minus_beta_1: f32,
    pub(crate) beta_2: f32,
    pub(crate) one_minus_beta_2: f32,
    pub(crate) bias_correction_1: f32,
    pub(crate) bias_correction_2: f32,
    pub(crate) epsilon: f32,
    pub(crate) lr: f32,
    pub(crate) decay: Decay,
}

/// The decoupled weight decay of a step (`frugal_kernels::WeightDecay`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Decay {
    /// `lr * weight_decay == 0`.
    None,
    /// `p * factor`, `factor = 1 - lr * weight_decay`.
    Plain { factor: f32 },
    /// `p - p * rate` where `p` and the first moment have the same sign.
    Cautious { rate: f32 },
}
