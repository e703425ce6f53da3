//! A linear layer followed by the mean cross-entropy of its logits, as one autodiff node for
//! `Autodiff<Frugal<B>, C>`, and its registry entry, through which
//! `crate::nn::linear_cross_entropy::<B>`, generic over any backend, finds it.
//!
//! Written out, a vocabulary head keeps its whole `[rows, vocabulary]` logits, their f32
//! log-softmax and, in the backward pass, gradients of the same size: on a GPT the largest
//! tensors of the step. Here the rows go through in chunks: each chunk's logits are made, their
//! softmax statistics taken in f32, and, when a gradient is wanted, the logits' gradient
//! (`softmax − one-hot`) multiplied straight away into the input's and the weight's gradients,
//! as Liger-Kernel's fused linear cross-entropy does. No chunk's logits outlive it. The node
//! keeps those gradients (the input's size and the weight's), and its backward only scales them
//! by the loss's gradient over the row count. The products run through `Frugal<B>`'s own
//! `linear` and `matmul`, so autocast and Frugal's product kernels apply as to any other layer.

use std::any::Any;
use std::marker::PhantomData;

use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn_backend::{Backend, DType, TensorMetadata, tensor::FloatTensor};
use burn_tensor::{Int, Tensor};

use crate::backend::Frugal;
use crate::engine::Reclaim;
use crate::kernels;
use crate::ops::convert::{cast_to, frugal_primitive, frugal_tensor};
use crate::ops::registry::{composite_op_registry, unbox};
use crate::remat::FloatKind;
use crate::tensor::FrugalTensor;
use crate::vocabulary::families::activation::{Op, op};

/// One call handed through the registry: the primitives of the caller's backend, boxed, and
/// the rows per chunk.
pub(crate) struct LinearCrossEntropyArgs {
    pub(crate) x: Box<dyn Any>,
    pub(crate) weight: Box<dyn Any>,
    pub(crate) bias: Option<Box<dyn Any>>,
    pub(crate) targets: Box<dyn Any>,
    pub(crate) chunk_rows: usize,
}

composite_op_registry!(LinearCrossEntropyArgs);

type Prim<B> = FloatTensor<Frugal<B>>;
type Targets<B> = burn_backend::tensor::IntTensor<Frugal<B>>;

/// The entry for `Frugal<B>` without autodiff: the loss only.
fn inference<B: Backend>(args: LinearCrossEntropyArgs) -> Box<dyn Any> {
    let bias = args.bias.map(|b| frugal_tensor::<B, 1>(unbox(b)));
    let (loss, _) = portable::forward(
        frugal_tensor::<B, 2>(unbox(args.x)),
        frugal_tensor::<B, 2>(unbox(args.weight)),
        bias,
        Tensor::<Frugal<B>, 1, Int>::from_primitive(unbox::<Targets<B>>(args.targets)),
        args.chunk_rows,
        false,
        Some(&rows_by_kernel::<B>),
    );
    Box::new(frugal_primitive(loss))
}

/// The entry for `Autodiff<Frugal<B>, C>`: one autodiff node, its parents x, the weight and
/// (when given) the bias.
fn autodiff<B: Backend, C: CheckpointStrategy>(args: LinearCrossEntropyArgs) -> Box<dyn Any> {
    type Ad<B, C> = Autodiff<Frugal<B>, C>;
    let x: FloatTensor<Ad<B, C>> = unbox(args.x);
    let weight: FloatTensor<Ad<B, C>> = unbox(args.weight);
    let bias = args.bias.map(unbox::<FloatTensor<Ad<B, C>>>);
    let targets: Targets<B> = unbox(args.targets);
    let call = Call::<B> {
        dtypes: [
            x.primitive.dtype(),
            weight.primitive.dtype(),
            bias.as_ref()
                .map_or(weight.primitive.dtype(), |b| b.primitive.dtype()),
        ],
        x: x.primitive.clone(),
        weight: weight.primitive.clone(),
        bias: bias.as_ref().map(|b| b.primitive.clone()),
        targets,
        chunk_rows: args.chunk_rows,
    };
    let out = match bias {
        Some(bias) => record::<B, C, 3>([x, weight, bias], call),
        None => record::<B, C, 2>([x, weight], call),
    };
    Box::new(out)
}

/// One call's inputs, on `Frugal<B>`.
struct Call<B: Backend> {
    x: Prim<B>,
    weight: Prim<B>,
    bias: Option<Prim<B>>,
    targets: Targets<B>,
    chunk_rows: usize,
    /// The dtypes of the caller's x, weight and bias, which their gradients take.
    dtypes: [DType; 3],
}

/// Records the node over its `N` parents and computes the loss (with the gradients when
/// tracked).
fn record<B: Backend, C: CheckpointStrategy, const N: usize>(
    parents: [FloatTensor<Autodiff<Frugal<B>, C>>; N],
    call: Call<B>,
) -> FloatTensor<Autodiff<Frugal<B>, C>> {
    let prep = LinearCrossEntropyBackward::<B, N>(PhantomData)
        .prepare::<C>(parents.map(|p| p.node))
        .compute_bound()
        .stateful();
    let rows = call.x.shape().dims::<2>()[0];
    let run = |grads: bool| {
        portable::forward(
            frugal_tensor::<B, 2>(call.x),
            frugal_tensor::<B, 2>(call.weight),
            call.bias.map(frugal_tensor::<B, 1>),
            Tensor::<Frugal<B>, 1, Int>::from_primitive(call.targets),
            call.chunk_rows,
            grads,
            Some(&rows_by_kernel::<B>),
        )
    };
    match prep {
        OpsKind::Tracked(prep) => {
            let (loss, grads) = run(true);
            let grads = grads.expect("frugal: internal error: the gradients were asked for");
            let saved = Saved {
                dx: frugal_primitive(grads.x),
                dweight: frugal_primitive(grads.weight),
                dbias: grads.bias.map(frugal_primitive),
                rows,
                dtypes: call.dtypes,
            };
            prep.finish(saved, frugal_primitive(loss))
        }
        OpsKind::UnTracked(prep) => prep.finish(frugal_primitive(run(false).0)),
    }
}

/// The gradients of the summed loss, made by the forward pass.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    dx: Prim<B>,
    dweight: Prim<B>,
    dbias: Option<Prim<B>>,
    rows: usize,
    dtypes: [DType; 3],
}

/// The backward node: its `N` parents are x, the weight and, when `N` is 3, the bias.
#[derive(Debug)]
struct LinearCrossEntropyBackward<B, const N: usize>(PhantomData<fn() -> B>);

impl<B: Backend, const N: usize> Backward<Frugal<B>, N> for LinearCrossEntropyBackward<B, N> {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Frugal<B>>(&ops.node);
        let saved = ops.state;
        // The loss is the mean over rows: its gradient over the row count scales the summed
        // loss's gradients, in f32 whatever their own type.
        let scale =
            frugal_tensor::<B, 1>(cast_to::<B>(grad, DType::F32)).div_scalar(saved.rows as f64);
        let [x, weight, bias] = saved.dtypes;
        let computed = [
            Some(scaled::<B, 2>(saved.dx, &scale, x)),
            Some(scaled::<B, 2>(saved.dweight, &scale, weight)),
            saved.dbias.map(|b| scaled::<B, 1>(b, &scale, bias)),
        ];
        for (node, g) in ops.parents.into_iter().zip(computed) {
            if let (Some(node), Some(g)) = (node, g) {
                grads.register::<Frugal<B>>(node.id, g);
            }
        }
    }
}

/// `g · scale` computed in f32 (`scale` is `[1]`), cast to `dtype`.
fn scaled<B: Backend, const D: usize>(
    g: Prim<B>,
    scale: &Tensor<Frugal<B>, 1>,
    dtype: DType,
) -> Prim<B> {
    let g = frugal_tensor::<B, D>(cast_to::<B>(g, DType::F32));
    cast_to::<B>(frugal_primitive(g * scale.clone().reshape([1; D])), dtype)
}

/// Each row's loss and, with `with_grad`, the logits' gradient, by Frugal's kernel when the
/// inner backend runs on a CubeCL runtime this build knows; `None` leaves the chunk to the
/// portable arithmetic.
fn rows_by_kernel<B: Backend>(
    logits: &Tensor<Frugal<B>, 2>,
    targets: &Tensor<Frugal<B>, 1, Int>,
    with_grad: bool,
) -> Option<portable::Rows<Frugal<B>>> {
    if !kernels::may_launch::<B>() {
        return None;
    }
    let logits = frugal_primitive(logits.clone());
    let state = logits.state();
    let id = op(Op::log_softmax);
    let [rows, classes] = logits.shape().dims::<2>();
    let grad_bytes = if with_grad {
        rows * classes * logits.dtype().size()
    } else {
        0
    };
    state.reclaim(Reclaim::Room {
        bytes: (rows * 4 + grad_bytes) as u64,
    });
    let (held_logits, _) = logits.clone().split_view();
    let (held_targets, _) = targets.clone().into_primitive().split_view();
    let (loss, grad) = kernels::cross_entropy_rows::<B>(&held_logits, &held_targets, with_grad)?;
    drop((held_logits, held_targets));
    state.count_call(id);
    let track = |inner| FrugalTensor::track::<B, FloatKind>(inner, state, id);
    let loss = track(loss);
    let grad = grad.map(track);
    let bytes = loss.storage_bytes() + grad.as_ref().map_or(0, |g| g.storage_bytes());
    state.reclaim(Reclaim::AfterOp {
        op: Some(id),
        needed: bytes,
    });
    Some(portable::Rows {
        loss: frugal_tensor(loss),
        grad: grad.map(frugal_tensor),
    })
}

/// The chunked arithmetic on any backend's own ops, with a hook for a kernel that takes a
/// chunk's logits to their row losses and gradient in one go.
pub(crate) mod portable {
    use burn_backend::Backend;
    use burn_backend::tensor::IndexingUpdateOp;
    use burn_tensor::{FloatDType, Int, Tensor, module::linear};

    /// The gradients of the summed loss: x's in the products' type, the weight's and the
    /// bias's accumulated in f32.
    pub(crate) struct Grads<B: Backend> {
        pub(crate) x: Tensor<B, 2>,
        pub(crate) weight: Tensor<B, 2>,
        pub(crate) bias: Option<Tensor<B, 1>>,
    }

    /// One chunk's row losses (f32 `[rows]`) and, when asked for, the logits' gradient
    /// `softmax − one-hot` in the logits' dtype.
    pub(crate) struct Rows<B: Backend> {
        pub(crate) loss: Tensor<B, 1>,
        pub(crate) grad: Option<Tensor<B, 2>>,
    }

    /// A kernel for a chunk's [`Rows`] (logits, targets, whether the gradient is wanted), or
    /// `None` where it does not apply.
    pub(crate) type RowsKernel<'a, B> =
        &'a dyn Fn(&Tensor<B, 2>, &Tensor<B, 1, Int>, bool) -> Option<Rows<B>>;

    /// [`Rows`] in f32 on the backend's own ops, and with the gradient its f32 column sums
    /// (the bias's gradient), summed before the gradient is narrowed.
    fn rows_written_out<B: Backend>(
        logits: Tensor<B, 2>,
        targets: Tensor<B, 1, Int>,
        with_grad: bool,
    ) -> (Rows<B>, Option<Tensor<B, 2>>) {
        let [len, _] = logits.dims();
        let low = logits.dtype();
        let targets = targets.reshape([len, 1]);
        let z = logits.cast(FloatDType::F32);
        let max = z.clone().max_dim(1);
        let exp = (z.clone() - max.clone()).exp();
        let sum = exp.clone().sum_dim(1);
        let picked = z.gather(1, targets.clone());
        let loss = (sum.clone().log() + max - picked).reshape([len]);
        if !with_grad {
            return (Rows { loss, grad: None }, None);
        }
        let minus_one = Tensor::<B, 2>::full([len, 1], -1.0, &targets.device());
        let dz = (exp / sum).scatter(1, targets, minus_one, IndexingUpdateOp::Add);
        let column_sums = dz.clone().sum_dim(0);
        let rows = Rows {
            loss,
            grad: Some(dz.cast(low)),
        };
        (rows, Some(column_sums))
    }

    /// The mean cross-entropy (f32, `[1]`) of `linear(x, weight, bias)` against `targets`, the
    /// rows `chunk_rows` at a time; with `grads`, also the gradients of the summed (not
    /// averaged) loss, so that 16-bit products never hold values divided by the row count.
    /// `kernel`, when given and it applies, makes each chunk's row losses and logits'
    /// gradient.
    pub(crate) fn forward<B: Backend>(
        x: Tensor<B, 2>,
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        targets: Tensor<B, 1, Int>,
        chunk_rows: usize,
        grads: bool,
        kernel: Option<RowsKernel<'_, B>>,
    ) -> (Tensor<B, 1>, Option<Grads<B>>) {
        let [rows, _] = x.dims();
        let device = x.device();
        let chunk_rows = chunk_rows.clamp(1, rows.max(1));
        let mut losses = Vec::new();
        let mut dx = Vec::new();
        let mut dweight: Option<Tensor<B, 2>> = None;
        let mut dbias: Option<Tensor<B, 2>> = None;
        for start in (0..rows).step_by(chunk_rows) {
            let len = chunk_rows.min(rows - start);
            let xc = x.clone().narrow(0, start, len);
            let tc = targets.clone().narrow(0, start, len);
            let logits = linear(xc.clone(), weight.clone(), bias.clone());
            let (chunk, column_sums) = match kernel.and_then(|k| k(&logits, &tc, grads)) {
                Some(rows) => (rows, None),
                None => rows_written_out(logits, tc, grads),
            };
            losses.push(chunk.loss);
            let Some(dlogits) = chunk.grad else {
                continue;
            };
            if bias.is_some() {
                let db =
                    column_sums.unwrap_or_else(|| dlogits.clone().cast(FloatDType::F32).sum_dim(0));
                dbias = Some(match dbias {
                    Some(acc) => acc + db,
                    None => db,
                });
            }
            dx.push(dlogits.clone().matmul(weight.clone().transpose()));
            let dw = xc.transpose().matmul(dlogits).cast(FloatDType::F32);
            dweight = Some(match dweight {
                Some(acc) => acc + dw,
                None => dw,
            });
        }
        let loss = if losses.is_empty() {
            Tensor::zeros([1], &device)
        } else {
            Tensor::cat(losses, 0).sum()
        }
        .div_scalar(rows.max(1) as f64);
        let grads = grads.then(|| Grads {
            x: Tensor::cat(dx, 0),
            weight: dweight.expect("at least one row"),
            bias: dbias.map(|b| b.reshape([-1])),
        });
        (loss, grads)
    }
}
