//! Layer norm over the last dimension as one autodiff node for `Autodiff<Frugal<B>, C>`, and
//! its registry entry, through which `crate::nn::layer_norm::<B>`, generic over any backend,
//! finds it.
//!
//! Burn 0.21's `ModuleOps::layer_norm` has no autodiff op of its own: under autodiff it is
//! written out as a dozen tensor ops (two means, centring, variance, root, division, scale and
//! shift), each an autodiff node with its own saved tensors and its own backward launches.
//! Here the node keeps the input, `gamma` and each row's mean and reciprocal standard
//! deviation, and forward and backward run Frugal's kernels when `B`'s float primitive is a
//! CubeCL tensor of a runtime this build knows (with or without fusion), else the same
//! arithmetic on `Frugal<B>`'s own ops (so every tensor it creates is charged, managed and
//! replayable like any other op's). Autocast follows the policy's entry for `layer_norm`.

use std::any::Any;
use std::marker::PhantomData;

use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn_backend::{
    Backend, DType, Shape, TensorMetadata, TensorPrimitive, ops::FloatTensorOps,
    tensor::FloatTensor,
};
use burn_tensor::Tensor;

use crate::autocast::{DtypeSet, plan};
use crate::backend::Frugal;
use crate::engine::Reclaim;
use crate::kernels;
use crate::ops::convert::cast_to;
use crate::ops::registry::{composite_op_registry, unbox};
use crate::remat::FloatKind;
use crate::tensor::FrugalTensor;
use crate::vocabulary::families::module::{Op, op};

/// One layer norm call handed through the registry: the primitives of the caller's backend,
/// boxed, and epsilon.
pub(crate) struct LayerNormArgs {
    pub(crate) x: Box<dyn Any>,
    pub(crate) gamma: Box<dyn Any>,
    pub(crate) beta: Option<Box<dyn Any>>,
    pub(crate) epsilon: f64,
}

composite_op_registry!(LayerNormArgs);

type Prim<B> = FloatTensor<Frugal<B>>;

/// The entry for `Frugal<B>` without autodiff: the forward only.
fn inference<B: Backend>(args: LayerNormArgs) -> Box<dyn Any> {
    let beta = args.beta.map(unbox::<Prim<B>>);
    let (_, output) = forward::<B>(unbox(args.x), unbox(args.gamma), beta, args.epsilon);
    Box::new(output)
}

/// The entry for `Autodiff<Frugal<B>, C>`: one autodiff node, its parents x, gamma and (when
/// given) beta.
fn autodiff<B: Backend, C: CheckpointStrategy>(args: LayerNormArgs) -> Box<dyn Any> {
    type Ad<B, C> = Autodiff<Frugal<B>, C>;
    let x: FloatTensor<Ad<B, C>> = unbox(args.x);
    let gamma: FloatTensor<Ad<B, C>> = unbox(args.gamma);
    let beta = args.beta.map(unbox::<FloatTensor<Ad<B, C>>>);
    let epsilon = args.epsilon;
    let out = match beta {
        Some(beta) => {
            let nodes = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
            let prep = LayerNormBackward::<B, 3>(PhantomData)
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful();
            match prep {
                OpsKind::Tracked(prep) => {
                    let (saved, output) =
                        forward::<B>(x.primitive, gamma.primitive, Some(beta.primitive), epsilon);
                    prep.finish(saved, output)
                }
                OpsKind::UnTracked(prep) => {
                    let out =
                        forward::<B>(x.primitive, gamma.primitive, Some(beta.primitive), epsilon);
                    prep.finish(out.1)
                }
            }
        }
        None => {
            let nodes = [x.node.clone(), gamma.node.clone()];
            let prep = LayerNormBackward::<B, 2>(PhantomData)
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful();
            match prep {
                OpsKind::Tracked(prep) => {
                    let (saved, output) = forward::<B>(x.primitive, gamma.primitive, None, epsilon);
                    prep.finish(saved, output)
                }
                OpsKind::UnTracked(prep) => {
                    let out = forward::<B>(x.primitive, gamma.primitive, None, epsilon);
                    prep.finish(out.1)
                }
            }
        }
    };
    Box::new(out)
}

/// What the forward keeps for the backward.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    /// The input in the compute dtype.
    x: Prim<B>,
    /// `gamma` in the compute dtype.
    gamma: Prim<B>,
    with_beta: bool,
    /// Each row's mean and `1 / sqrt(var + epsilon)`: f32 `[rows]` from the kernels,
    /// `[rows, 1]` in the compute dtype from the portable path.
    mean: Prim<B>,
    rstd: Prim<B>,
    by_kernel: bool,
    /// The dtypes of the caller's x, gamma and beta, which their gradients take.
    dtypes: [DType; 3],
}

/// Rows and width of an input: every dimension but the last, and the last.
fn rows_width(shape: &Shape) -> (usize, usize) {
    let width = shape.as_slice().last().copied().unwrap_or(1);
    (shape.num_elements() / width.max(1), width)
}

/// Wraps a kernel output as a Frugal tensor charged to `layer_norm`.
fn track<B: Backend>(inner: B::FloatTensorPrimitive, like: &Prim<B>) -> Prim<B> {
    FrugalTensor::track::<B, FloatKind>(inner, like.state(), op(Op::layer_norm))
}

/// The layer norm forward on `Frugal<B>` tensors, autocast applied: what the backward needs,
/// and the output for the caller (cast back under autocast).
fn forward<B: Backend>(
    x: Prim<B>,
    gamma: Prim<B>,
    beta: Option<Prim<B>>,
    epsilon: f64,
) -> (Saved<B>, Prim<B>) {
    let state = x.state();
    let id = op(Op::layer_norm);
    state.count_call(id);
    let dtypes = [
        x.dtype(),
        gamma.dtype(),
        beta.as_ref().map_or(gamma.dtype(), |b| b.dtype()),
    ];
    let mut set = DtypeSet::default();
    for dtype in dtypes {
        set.add(dtype);
    }
    let (x, gamma, beta, cast_back) = match plan(state.autocast.code(id), set) {
        Some(plan) => (
            cast_to::<B>(x, plan.input),
            cast_to::<B>(gamma, plan.input),
            beta.map(|b| cast_to::<B>(b, plan.input)),
            plan.output,
        ),
        None => (x, gamma, beta, None),
    };
    let with_beta = beta.is_some();
    let (out, mean, rstd, by_kernel) = match forward_kernel::<B>(&x, &gamma, beta.as_ref(), epsilon)
    {
        Some((out, mean, rstd)) => (out, mean, rstd, true),
        None => {
            let (out, mean, rstd) =
                portable::forward::<Frugal<B>>(x.clone(), gamma.clone(), beta, epsilon);
            (out, mean, rstd, false)
        }
    };
    let output = match cast_back {
        Some(dtype) => cast_to::<B>(out, dtype),
        None => out,
    };
    let saved = Saved {
        x,
        gamma,
        with_beta,
        mean,
        rstd,
        by_kernel,
        dtypes,
    };
    (saved, output)
}

fn forward_kernel<B: Backend>(
    x: &Prim<B>,
    gamma: &Prim<B>,
    beta: Option<&Prim<B>>,
    epsilon: f64,
) -> Option<(Prim<B>, Prim<B>, Prim<B>)> {
    if !kernels::may_launch::<B>() {
        return None;
    }
    let held = [x, gamma].map(|t| t.clone().split_view());
    let held_beta = beta.map(|b| b.clone().split_view());
    let (rows, _) = rows_width(&x.shape());
    let out_bytes = x.shape().num_elements() * x.dtype().size() + rows * 8;
    x.state().reclaim(Reclaim::Room {
        bytes: out_bytes as u64,
    });
    let (out, mean, rstd) = kernels::layer_norm_forward::<B>(
        &held[0].0,
        &held[1].0,
        held_beta.as_ref().map(|h| &h.0),
        epsilon,
    )?;
    drop((held, held_beta));
    let outputs = (track::<B>(out, x), track::<B>(mean, x), track::<B>(rstd, x));
    let bytes = outputs.0.storage_bytes() + outputs.1.storage_bytes() + outputs.2.storage_bytes();
    x.state().reclaim(Reclaim::AfterOp {
        op: Some(op(Op::layer_norm)),
        needed: bytes,
    });
    Some(outputs)
}

/// The backward node: its `N` parents are x, gamma and, when `N` is 3, beta.
#[derive(Debug)]
struct LayerNormBackward<B, const N: usize>(PhantomData<fn() -> B>);

impl<B: Backend, const N: usize> Backward<Frugal<B>, N> for LayerNormBackward<B, N> {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Frugal<B>>(&ops.node);
        let saved = ops.state;
        let dtypes = saved.dtypes;
        let (dx, dgamma, dbeta) = backward::<B>(saved, grad);
        let computed = [Some(dx), Some(dgamma), dbeta];
        for ((node, g), dtype) in ops.parents.into_iter().zip(computed).zip(dtypes) {
            if let (Some(node), Some(g)) = (node, g) {
                grads.register::<Frugal<B>>(node.id, cast_to::<B>(g, dtype));
            }
        }
    }
}

/// The gradients of x, gamma and (with a beta) beta, in the compute dtype.
fn backward<B: Backend>(saved: Saved<B>, grad: Prim<B>) -> (Prim<B>, Prim<B>, Option<Prim<B>>) {
    let grad = cast_to::<B>(grad, saved.x.dtype());
    let state = saved.x.state();
    state.count_call(op(Op::layer_norm));
    if saved.by_kernel {
        let held = [&grad, &saved.x, &saved.gamma, &saved.mean, &saved.rstd]
            .map(|t| t.clone().split_view());
        let (rows, width) = rows_width(&saved.x.shape());
        let elem = saved.x.dtype().size();
        let chunks = rows.div_ceil(32).max(1);
        let bytes = (rows * width + 2 * width) * elem + 2 * chunks * width * 4;
        state.reclaim(Reclaim::Room {
            bytes: bytes as u64,
        });
        let [g, x, gamma, mean, rstd] = held.each_ref().map(|h| &h.0);
        if let Some((dx, dgamma, dbeta)) =
            kernels::layer_norm_backward::<B>(g, x, gamma, mean, rstd, saved.with_beta)
        {
            drop(held);
            let dx = track::<B>(dx, &saved.x);
            let dgamma = track::<B>(dgamma, &saved.x);
            let dbeta = dbeta.map(|b| track::<B>(b, &saved.x));
            let bytes = dx.storage_bytes()
                + dgamma.storage_bytes()
                + dbeta.as_ref().map_or(0, |b| b.storage_bytes());
            state.reclaim(Reclaim::AfterOp {
                op: Some(op(Op::layer_norm)),
                needed: bytes,
            });
            return (dx, dgamma, dbeta);
        }
    }
    let (mean, rstd) = if saved.by_kernel {
        // The kernels' f32 `[rows]` statistics, as the portable path reads them.
        let column = |t: Prim<B>| {
            let rows = t.shape().num_elements();
            let t = Frugal::<B>::float_reshape(t, Shape::new([rows, 1]));
            cast_to::<B>(t, saved.x.dtype())
        };
        (column(saved.mean), column(saved.rstd))
    } else {
        (saved.mean, saved.rstd)
    };
    portable::backward::<Frugal<B>>(grad, saved.x, saved.gamma, mean, rstd, saved.with_beta)
}

/// The layer norm and its gradients on any backend's own ops, over `[rows, width]` views.
pub(crate) mod portable {
    use super::*;

    fn matrix<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 2> {
        let (rows, width) = rows_width(&p.shape());
        Tensor::from_primitive(TensorPrimitive::Float(B::float_reshape(
            p,
            Shape::new([rows, width]),
        )))
    }

    fn row<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 2> {
        let width = p.shape().num_elements();
        Tensor::from_primitive(TensorPrimitive::Float(B::float_reshape(
            p,
            Shape::new([1, width]),
        )))
    }

    fn prim<B: Backend>(t: Tensor<B, 2>, shape: Shape) -> FloatTensor<B> {
        B::float_reshape(t.into_primitive().tensor(), shape)
    }

    /// Output (x's shape), mean and rstd (`[rows, 1]`, x's dtype).
    pub(crate) fn forward<B: Backend>(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        beta: Option<FloatTensor<B>>,
        epsilon: f64,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        let shape = x.shape();
        let x = matrix::<B>(x);
        let mean = x.clone().mean_dim(1);
        let centred = x - mean.clone();
        let var = centred.clone().square().mean_dim(1);
        let rstd = var.add_scalar(epsilon).sqrt().recip();
        let mut y = centred * rstd.clone() * row::<B>(gamma);
        if let Some(beta) = beta {
            y = y + row::<B>(beta);
        }
        (
            prim(y, shape),
            mean.into_primitive().tensor(),
            rstd.into_primitive().tensor(),
        )
    }

    /// The gradients of x (its shape), gamma and (with a beta) beta (`[width]`).
    pub(crate) fn backward<B: Backend>(
        grad: FloatTensor<B>,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        mean: FloatTensor<B>,
        rstd: FloatTensor<B>,
        with_beta: bool,
    ) -> (FloatTensor<B>, FloatTensor<B>, Option<FloatTensor<B>>) {
        let shape = x.shape();
        let width = gamma.shape();
        let (x, dy) = (matrix::<B>(x), matrix::<B>(grad));
        let mean = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(mean));
        let rstd = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(rstd));
        let x_hat = (x - mean) * rstd.clone();
        let g = dy.clone() * row::<B>(gamma);
        let mean_g = g.clone().mean_dim(1);
        let mean_gx = (g.clone() * x_hat.clone()).mean_dim(1);
        let dx = rstd * (g - mean_g - x_hat.clone() * mean_gx);
        let dgamma = (dy.clone() * x_hat).sum_dim(0);
        let dbeta = with_beta.then(|| prim(dy.sum_dim(0), width.clone()));
        (prim(dx, shape), prim(dgamma, width), dbeta)
    }
}
