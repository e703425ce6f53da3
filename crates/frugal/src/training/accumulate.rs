//! Gradient accumulation: the gradient of one large batch from several micro-batches, each
//! run forward and backward on its own, so that peak memory is that of one micro-batch.
//!
//! Each micro-batch's loss is scaled by `1 / micro_batches` before its backward pass and the
//! parameter gradients are summed (Burn's [`GradientsAccumulator`]), so that for a loss that
//! is a mean over equally sized micro-batches the result is the full batch's gradient, up to
//! the order of f32 summation.

use burn_core::module::AutodiffModule;
use burn_core::tensor::Tensor;
use burn_core::tensor::backend::AutodiffBackend;
use burn_optim::{GradientsAccumulator, GradientsParams};

/// A micro-batch count or a call order [`GradientAccumulation`] refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccumulationError {
    /// Zero micro-batches were asked for.
    NoMicroBatches,
    /// A batch of `batch` items cannot be split into `micro_batches` equal micro-batches.
    Uneven {
        /// Items in the whole batch.
        batch: usize,
        /// Micro-batches asked for.
        micro_batches: usize,
    },
    /// [`GradientAccumulation::finish`] was called after `seen` of `micro_batches`
    /// micro-batches, or a micro-batch was added after the last.
    Count {
        /// Micro-batches added so far.
        seen: usize,
        /// Micro-batches the accumulation was made for.
        micro_batches: usize,
    },
}

impl std::fmt::Display for AccumulationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccumulationError::NoMicroBatches => {
                write!(
                    f,
                    "gradient accumulation needs at least 1 micro-batch, got 0"
                )
            }
            AccumulationError::Uneven {
                batch,
                micro_batches,
            } => write!(
                f,
                "a batch of {batch} cannot be split into {micro_batches} equal micro-batches: \
                 use a number of micro-batches that divides {batch}"
            ),
            AccumulationError::Count {
                seen,
                micro_batches,
            } => write!(
                f,
                "gradient accumulation over {micro_batches} micro-batches was given {seen}: \
                 add exactly {micro_batches} before finishing"
            ),
        }
    }
}

impl std::error::Error for AccumulationError {}

/// The size of each of `micro_batches` equal parts of a batch of `batch` items.
pub fn micro_batch_size(batch: usize, micro_batches: usize) -> Result<usize, AccumulationError> {
    if micro_batches == 0 {
        return Err(AccumulationError::NoMicroBatches);
    }
    if batch == 0 || !batch.is_multiple_of(micro_batches) {
        return Err(AccumulationError::Uneven {
            batch,
            micro_batches,
        });
    }
    Ok(batch / micro_batches)
}

/// Sums the gradients of a fixed number of micro-batches into those of their union.
///
/// ```
/// use burn::backend::{Autodiff, NdArray};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
/// use frugal::GradientAccumulation;
///
/// type B = Autodiff<NdArray>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
/// let batch = Tensor::<B, 2>::ones([8, 4], &device);
/// let mut accumulation = GradientAccumulation::new(2).unwrap();
/// for micro in batch.chunk(2, 0) {
///     let loss = model.forward(micro).powi_scalar(2).mean();
///     accumulation.backward(&model, loss).unwrap();
/// }
/// let grads = accumulation.finish().unwrap();
/// // `grads` is the gradient of the mean loss over all 8 rows: give it to the optimizer.
/// # drop(grads);
/// ```
pub struct GradientAccumulation<M> {
    sum: GradientsAccumulator<M>,
    micro_batches: usize,
    seen: usize,
}

impl<M> GradientAccumulation<M> {
    /// An accumulation over `micro_batches` micro-batches (at least 1).
    pub fn new(micro_batches: usize) -> Result<Self, AccumulationError> {
        if micro_batches == 0 {
            return Err(AccumulationError::NoMicroBatches);
        }
        Ok(Self {
            sum: GradientsAccumulator::new(),
            micro_batches,
            seen: 0,
        })
    }

    /// The micro-batches this accumulation sums.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Micro-batches added so far.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// The factor each micro-batch's loss is multiplied by before its backward pass:
    /// `1 / micro_batches`. Callers that run the backward pass themselves (e.g. through a
    /// loss scaler) multiply by it and then call [`GradientAccumulation::add`].
    pub fn loss_factor(&self) -> f64 {
        1.0 / self.micro_batches as f64
    }

    /// Runs the backward pass of one micro-batch's `loss` (a mean over the micro-batch, scaled
    /// here by [`GradientAccumulation::loss_factor`]) and adds its parameter gradients. The
    /// micro-batch's graph and activations are freed before this returns.
    pub fn backward<B: AutodiffBackend>(
        &mut self,
        module: &M,
        loss: Tensor<B, 1>,
    ) -> Result<(), AccumulationError>
    where
        M: AutodiffModule<B>,
    {
        self.check_room()?;
        // One micro-batch: no extra op, so the graph and bits are those of no accumulation.
        let loss = if self.micro_batches == 1 {
            loss
        } else {
            loss.mul_scalar(self.loss_factor())
        };
        let grads = loss.backward();
        self.add(module, GradientsParams::from_grads(grads, module))
    }

    /// Adds one micro-batch's parameter gradients, computed from its loss multiplied by
    /// [`GradientAccumulation::loss_factor`].
    pub fn add<B: AutodiffBackend>(
        &mut self,
        module: &M,
        grads: GradientsParams,
    ) -> Result<(), AccumulationError>
    where
        M: AutodiffModule<B>,
    {
        self.check_room()?;
        self.sum.accumulate(module, grads);
        self.seen += 1;
        Ok(())
    }

    /// The summed gradients, once every micro-batch has been added.
    pub fn finish(mut self) -> Result<GradientsParams, AccumulationError> {
        if self.seen != self.micro_batches {
            return Err(self.count_error());
        }
        Ok(self.sum.grads())
    }

    fn check_room(&self) -> Result<(), AccumulationError> {
        if self.seen >= self.micro_batches {
            return Err(self.count_error());
        }
        Ok(())
    }

    fn count_error(&self) -> AccumulationError {
        AccumulationError::Count {
            seen: self.seen + usize::from(self.seen >= self.micro_batches),
            micro_batches: self.micro_batches,
        }
    }
}
