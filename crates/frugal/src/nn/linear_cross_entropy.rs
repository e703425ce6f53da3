//! A vocabulary head and its loss in one call: [`linear_cross_entropy`], which never holds the
//! whole logits under `Autodiff<Frugal<_>>`.

use std::any::TypeId;

use burn_backend::Backend;
use burn_tensor::activation::log_softmax;
use burn_tensor::module::linear;
use burn_tensor::{Int, Tensor};

use crate::ops::linear_cross_entropy::{LinearCrossEntropyArgs, lookup};
use crate::ops::registry::{boxed, unboxed};

/// Rows per chunk when none is given: as many as keep one chunk's f32 logits within 32 MiB.
const CHUNK_LOGIT_BYTES: usize = 32 << 20;

/// The mean cross-entropy of `linear(x, weight, bias)` (logits `[rows, classes]`) against
/// `targets` (`[rows]`, class indices): `log_softmax(logits).gather(targets)`, averaged and
/// negated, as burn-nn's `CrossEntropyLoss` computes it with no weights, padding or smoothing.
/// `weight` is `[features, classes]` and `bias` `[classes]`, as burn-nn's `Linear` keeps them:
/// pass `head.weight.val()` and `head.bias.as_ref().map(|b| b.val())`.
///
/// Under `Autodiff<Frugal<_>>` the call is one autodiff node that takes the rows in chunks of
/// `chunk_rows` (default: a chunk's f32 logits within 32 MiB), computes each chunk's
/// log-sum-exp in f32 and, when a gradient is wanted, the input's, weight's and bias's
/// gradients straight away, so no chunk's logits outlive it: the `[rows, classes]` logits,
/// their log-softmax and their gradient never exist at once. The loss is f32. Under
/// `Frugal<_>` without autodiff it computes the loss the same way. On any other backend it is
/// [`linear_cross_entropy_written_out`].
///
/// Panics, naming the shapes, if `weight`, `bias` and `targets` do not fit `x`.
pub fn linear_cross_entropy<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
    chunk_rows: Option<usize>,
) -> Tensor<B, 1> {
    let [rows, features] = x.dims();
    let [in_features, classes] = weight.dims();
    assert!(
        in_features == features
            && bias.as_ref().is_none_or(|b| b.dims() == [classes])
            && targets.dims() == [rows],
        "frugal::nn::linear_cross_entropy: x is {:?}, weight {:?}, bias {:?}, targets {:?}; \
         the weight must be [{features}, classes], the bias [classes] and the targets [{rows}]",
        x.dims(),
        weight.dims(),
        bias.as_ref().map(|b| b.dims()),
        targets.dims(),
    );
    assert!(
        chunk_rows != Some(0),
        "frugal::nn::linear_cross_entropy: chunk_rows is 0; give at least one row, or None"
    );
    let Some(entry) = lookup(TypeId::of::<B>()) else {
        return linear_cross_entropy_written_out(x, weight, bias, targets);
    };
    let chunk_rows =
        chunk_rows.unwrap_or_else(|| (CHUNK_LOGIT_BYTES / (4 * classes.max(1))).max(1));
    let args = LinearCrossEntropyArgs {
        x: boxed(x),
        weight: boxed(weight),
        bias: bias.map(boxed),
        targets: Box::new(targets.into_primitive()),
        chunk_rows,
    };
    unboxed(entry(args))
}

/// The same loss written out: Burn's `linear`, then burn-nn's `CrossEntropyLoss` arithmetic
/// (log-softmax, gather, mean, negation), each op its own autodiff node.
pub fn linear_cross_entropy_written_out<B: Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let [rows] = targets.dims();
    let logits = linear(x, weight, bias);
    log_softmax(logits, 1)
        .gather(1, targets.reshape([rows, 1]))
        .reshape([rows])
        .mean()
        .neg()
}
