//! Attention without `seq × seq` storage for `Frugal<B>`, and the registry through which
//! `crate::nn::attention::<B>`, generic over any backend, finds it.
//!
//! - **The autodiff op** (`Autodiff<Frugal<B>, C>`, for both of the checkpoint strategies
//!   Burn ships): one autodiff node whose state is q, k, v, the output and each query row's
//!   logsumexp. Forward and backward run Frugal's flash-attention kernels when `B`'s float
//!   primitive is a CubeCL tensor of a runtime this build knows (with or without fusion),
//!   else the portable path below.
//! - **The portable path**, on `Frugal<B>`'s own ops (so every tensor it creates is charged,
//!   managed and replayable like any other op's): the forward and the backward computed per
//!   block of query rows, the probabilities recomputed per block from the logsumexp.
//! - **Autocast**: the call follows the policy's entry for `attention` (q, k, v cast to the low
//!   type, the output cast back), and the state keeps the cast inputs.
//! - **The registry** (`crate::ops::registry`): `Frugal<B>` registers its implementations,
//!   keyed by the `TypeId` of `Frugal<B>` and `Autodiff<Frugal<B>, C>`.

use std::any::Any;
use std::marker::PhantomData;

use burn_autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn_backend::{Backend, DType, TensorMetadata, TensorPrimitive, tensor::FloatTensor};
use burn_tensor::{Bool, Int, Tensor};

use crate::autocast::{DtypeSet, plan};
use crate::backend::Frugal;
use crate::engine::Reclaim;
use crate::kernels::{self, AttentionCall};
use crate::ops::convert::cast_to;
use crate::ops::registry::{composite_op_registry, unbox};
use crate::remat::FloatKind;
use crate::tensor::FrugalTensor;
use crate::vocabulary::families::module::{Op, op};

/// One attention call handed through the registry: the primitives of the caller's backend,
/// boxed, and the options.
pub(crate) struct AttentionArgs {
    pub(crate) inputs: AttentionInputs,
    pub(crate) bias: Option<Box<dyn Any>>,
    pub(crate) causal: bool,
    pub(crate) scale: f64,
}

/// How q, k and v come.
pub(crate) enum AttentionInputs {
    /// Each `[batch, heads, seq, head_dim]`; the output is too.
    Separate {
        q: Box<dyn Any>,
        k: Box<dyn Any>,
        v: Box<dyn Any>,
    },
    /// Side by side along the last dimension of one `[batch, seq, 3 · heads · head_dim]`
    /// tensor, as one projection makes them; the output is `[batch, seq, heads · head_dim]`.
    Packed { qkv: Box<dyn Any>, heads: usize },
}

composite_op_registry!(AttentionArgs);

type Prim<B> = FloatTensor<Frugal<B>>;

/// The entry for `Frugal<B>` without autodiff: the forward only.
fn inference<B: Backend>(args: AttentionArgs) -> Box<dyn Any> {
    let call = AttentionCall {
        causal: args.causal,
        scale: args.scale as f32,
    };
    let bias = args.bias.map(unbox::<Prim<B>>);
    let output = match args.inputs {
        AttentionInputs::Separate { q, k, v } => {
            forward::<B>(unbox(q), unbox(k), unbox(v), bias, call).1
        }
        AttentionInputs::Packed { qkv, heads } => {
            let [q, k, v] = packed::unpack::<B>(unbox(qkv), heads);
            packed::merge_heads::<B>(forward::<B>(q, k, v, bias, call).1)
        }
    };
    Box::new(output)
}

/// The entry for `Autodiff<Frugal<B>, C>`: one autodiff node, its parents q, k and v, or the
/// packed tensor.
fn autodiff<B: Backend, C: CheckpointStrategy>(args: AttentionArgs) -> Box<dyn Any> {
    type Ad<B, C> = Autodiff<Frugal<B>, C>;
    // The bias is a constant here (`crate::nn::attention` takes the written-out path when
    // it needs a gradient).
    let bias = args
        .bias
        .map(|b| unbox::<FloatTensor<Ad<B, C>>>(b).primitive);
    let call = AttentionCall {
        causal: args.causal,
        scale: args.scale as f32,
    };
    let out = match args.inputs {
        AttentionInputs::Separate { q, k, v } => {
            let q: FloatTensor<Ad<B, C>> = unbox(q);
            let k: FloatTensor<Ad<B, C>> = unbox(k);
            let v: FloatTensor<Ad<B, C>> = unbox(v);
            let prep = AttentionBackward::<B>(PhantomData)
                .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
                .compute_bound()
                .stateful();
            match prep {
                OpsKind::Tracked(prep) => {
                    let (saved, output) =
                        forward::<B>(q.primitive, k.primitive, v.primitive, bias, call);
                    prep.finish(saved, output)
                }
                OpsKind::UnTracked(prep) => {
                    let (_, output) =
                        forward::<B>(q.primitive, k.primitive, v.primitive, bias, call);
                    prep.finish(output)
                }
            }
        }
        AttentionInputs::Packed { qkv, heads } => {
            let qkv: FloatTensor<Ad<B, C>> = unbox(qkv);
            let prep = packed::PackedAttentionBackward::<B>(PhantomData)
                .prepare::<C>([qkv.node.clone()])
                .compute_bound()
                .stateful();
            let [q, k, v] = packed::unpack::<B>(qkv.primitive, heads);
            let (saved, output) = forward::<B>(q, k, v, bias, call);
            let output = packed::merge_heads::<B>(output);
            match prep {
                OpsKind::Tracked(prep) => prep.finish(saved, output),
                OpsKind::UnTracked(prep) => prep.finish(output),
            }
        }
    };
    Box::new(out)
}

/// What the forward keeps for the backward: the (possibly autocast) inputs, the output before
/// any cast back, the logsumexp, and the dtypes the gradients are given back in.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    q: Prim<B>,
    k: Prim<B>,
    v: Prim<B>,
    bias: Option<Prim<B>>,
    /// The output as computed (in the compute dtype).
    out: Prim<B>,
    /// Each query row's logsumexp: f32 `[b, h, sq]` from the kernels, `[b, h, sq, 1]` in the
    /// compute dtype from the portable path.
    lse: Prim<B>,
    by_kernel: bool,
    /// The dtypes of the caller's q, k and v, which their gradients take.
    dtypes: [DType; 3],
    call: AttentionCall,
}

/// The attention forward on `Frugal<B>` tensors, autocast applied: what the backward needs,
/// and the output for the caller (cast back under autocast).
fn forward<B: Backend>(
    q: Prim<B>,
    k: Prim<B>,
    v: Prim<B>,
    bias: Option<Prim<B>>,
    call: AttentionCall,
) -> (Saved<B>, Prim<B>) {
    let state = q.state();
    let id = op(Op::attention);
    state.count_call(id);
    let dtypes = [q.dtype(), k.dtype(), v.dtype()];
    let mut set = DtypeSet::default();
    for dtype in dtypes {
        set.add(dtype);
    }
    let (q, k, v, bias, cast_back) = match plan(state.autocast.code(id), set) {
        Some(plan) => (
            cast_to::<B>(q, plan.input),
            cast_to::<B>(k, plan.input),
            cast_to::<B>(v, plan.input),
            bias.map(|b| cast_to::<B>(b, plan.input)),
            plan.output,
        ),
        None => (q, k, v, bias, None),
    };
    let (out, lse, by_kernel) = match forward_kernel::<B>(&q, &k, &v, bias.as_ref(), call) {
        Some((out, lse)) => (out, lse, true),
        None => {
            let (out, lse) =
                portable::forward::<Frugal<B>>(q.clone(), k.clone(), v.clone(), bias.clone(), call);
            (out, lse, false)
        }
    };
    let output = match cast_back {
        Some(dtype) => cast_to::<B>(out.clone(), dtype),
        None => out.clone(),
    };
    let saved = Saved {
        q,
        k,
        v,
        bias,
        out,
        lse,
        by_kernel,
        dtypes,
        call,
    };
    (saved, output)
}

/// Wraps a kernel output as a Frugal tensor charged to `attention`.
fn track<B: Backend>(inner: B::FloatTensorPrimitive, like: &Prim<B>) -> Prim<B> {
    FrugalTensor::track::<B, FloatKind>(inner, like.state(), op(Op::attention))
}

fn forward_kernel<B: Backend>(
    q: &Prim<B>,
    k: &Prim<B>,
    v: &Prim<B>,
    bias: Option<&Prim<B>>,
    call: AttentionCall,
) -> Option<(Prim<B>, Prim<B>)> {
    if !kernels::may_launch::<B>() {
        return None;
    }
    let held = hold::<B, _>([q, k, v]);
    let held_bias = bias.map(|b| b.clone().split_view());
    // The output ([.., sq, dv] in q's dtype) and the f32 logsumexp.
    let rows = query_rows::<B>(q);
    let v_shape = v.shape();
    let out_bytes = rows * (v_shape[v_shape.len() - 1] * q.dtype().size() + 4)
        + products_transient::<B>(q, k, 2);
    q.state().reclaim(Reclaim::Room {
        bytes: out_bytes as u64,
    });
    let [q_inner, k_inner, v_inner] = held.each_ref().map(|h| &h.0);
    let bias_inner = held_bias.as_ref().map(|h| &h.0);
    let (out, lse) = kernels::attention_forward::<B>(q_inner, k_inner, v_inner, bias_inner, call)?;
    drop((held, held_bias));
    let out = track::<B>(out, q);
    let lse = track::<B>(lse, q);
    let state = q.state();
    state.reclaim(Reclaim::AfterOp {
        op: Some(op(Op::attention)),
        needed: out.storage_bytes() + lse.storage_bytes(),
    });
    Some((out, lse))
}

/// The inner tensors of a kernel's inputs, restored if need be and held with their storage
/// records, so that making room for the kernel's outputs cannot evict them (a held record is
/// never evicted) while the kernel reads them.
fn hold<B: Backend, const N: usize>(
    tensors: [&Prim<B>; N],
) -> [(
    B::FloatTensorPrimitive,
    std::sync::Arc<crate::device::Storage>,
); N] {
    tensors.map(|tensor| tensor.clone().split_view())
}

/// Bytes of `matrices` score-sized transients (`[.., sq, sk]` in q's dtype) when the call runs
/// as matrix products (`kernels::AttentionPath::Products`), which hold them while they run;
/// 0 otherwise.
fn products_transient<B: Backend>(q: &Prim<B>, k: &Prim<B>, matrices: usize) -> usize {
    if !kernels::attention_by_products::<B>(q.dtype()) {
        return 0;
    }
    let k_shape = k.shape();
    let seq_k = k_shape[k_shape.len() - 2];
    matrices * query_rows::<B>(q) * seq_k * q.dtype().size()
}

/// Query rows of an attention input `[.., sq, d]`: the rows of the logsumexp.
fn query_rows<B: Backend>(q: &Prim<B>) -> usize {
    let shape = q.shape();
    shape.num_elements() / shape[shape.len() - 1].max(1)
}

/// The backward node: its parents are q, k and v.
#[derive(Debug)]
struct AttentionBackward<B>(PhantomData<fn() -> B>);

impl<B: Backend> Backward<Frugal<B>, 3> for AttentionBackward<B> {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Saved<B>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad = grads.consume::<Frugal<B>>(&ops.node);
        let saved = ops.state;
        let [dq, dk, dv] = backward::<B>(saved.clone(), grad);
        for ((node, g), dtype) in [node_q, node_k, node_v]
            .into_iter()
            .zip([dq, dk, dv])
            .zip(saved.dtypes)
        {
            if let Some(node) = node {
                grads.register::<Frugal<B>>(node.id, cast_to::<B>(g, dtype));
            }
        }
    }
}

/// The gradients of q, k and v (in the compute dtype) for the output gradient `grad`.
fn backward<B: Backend>(saved: Saved<B>, grad: Prim<B>) -> [Prim<B>; 3] {
    let grad = cast_to::<B>(grad, saved.out.dtype());
    let state = saved.q.state();
    state.count_call(op(Op::attention));
    if saved.by_kernel {
        let held = hold::<B, _>([&saved.q, &saved.k, &saved.v, &saved.out, &saved.lse, &grad]);
        let held_bias = saved.bias.as_ref().map(|b| b.clone().split_view());
        // dq, dk, dv in the compute dtype, and the kernels' own f32 rowsum(dO ∘ O).
        let elem = saved.q.dtype().size();
        let grad_bytes = [&saved.q, &saved.k, &saved.v]
            .iter()
            .map(|t| t.shape().num_elements() * elem)
            .sum::<usize>()
            + query_rows::<B>(&saved.q) * 4
            + products_transient::<B>(&saved.q, &saved.k, 4);
        state.reclaim(Reclaim::Room {
            bytes: grad_bytes as u64,
        });
        let [q, k, v, out, lse, grad_out] = held.each_ref().map(|h| &h.0);
        let bias = held_bias.as_ref().map(|h| &h.0);
        if let Some((dq, dk, dv)) =
            kernels::attention_backward::<B>(q, k, v, bias, out, lse, grad_out, saved.call)
        {
            drop((held, held_bias));
            let grads = [
                track::<B>(dq, &saved.q),
                track::<B>(dk, &saved.q),
                track::<B>(dv, &saved.q),
            ];
            let bytes = grads.iter().map(|g| g.storage_bytes()).sum();
            state.reclaim(Reclaim::AfterOp {
                op: Some(op(Op::attention)),
                needed: bytes,
            });
            return grads;
        }
    }
    let lse = if saved.by_kernel {
        // The kernels' f32 `[b, h, sq]` logsumexp, as the portable path reads it.
        Tensor::<Frugal<B>, 3>::from_primitive(TensorPrimitive::Float(saved.lse))
            .unsqueeze_dim::<4>(3)
            .cast(saved.out.dtype())
            .into_primitive()
            .tensor()
    } else {
        saved.lse
    };
    let inputs =
        portable::BackwardInputs::new(saved.q, saved.k, saved.v, saved.bias, saved.out, lse, grad);
    portable::backward::<Frugal<B>>(inputs, saved.call)
}

/// Packed q, k and v: the views that take them apart, the node over the packed tensor, and the
/// gradients put back side by side.
mod packed {
    use super::*;
    use crate::ops::convert::{frugal_primitive, frugal_tensor};

    /// q, k and v `[batch, heads, seq, head_dim]`, views of `qkv` `[batch, seq, 3 · d]`.
    pub(super) fn unpack<B: Backend>(qkv: Prim<B>, heads: usize) -> [Prim<B>; 3] {
        let qkv = frugal_tensor::<B, 3>(qkv);
        let [batch, seq, width] = qkv.dims();
        let d = width / 3;
        [0, 1, 2].map(|i| {
            frugal_primitive(
                qkv.clone()
                    .slice([0..batch, 0..seq, i * d..(i + 1) * d])
                    .reshape([batch, seq, heads, d / heads])
                    .swap_dims(1, 2),
            )
        })
    }

    /// `[batch, heads, seq, head_dim]` to `[batch, seq, heads · head_dim]`.
    pub(super) fn merge_heads<B: Backend>(out: Prim<B>) -> Prim<B> {
        let [batch, heads, seq, head_dim] = out.shape().dims::<4>();
        frugal_primitive(frugal_tensor::<B, 4>(out).swap_dims(1, 2).reshape([
            batch,
            seq,
            heads * head_dim,
        ]))
    }

    /// `[batch, seq, heads · head_dim]` to `[batch, heads, seq, head_dim]` (a view).
    fn split_heads<B: Backend>(grad: Prim<B>, heads: usize) -> Prim<B> {
        let [batch, seq, d] = grad.shape().dims::<3>();
        frugal_primitive(
            frugal_tensor::<B, 3>(grad)
                .reshape([batch, seq, heads, d / heads])
                .swap_dims(1, 2),
        )
    }

    /// The backward node over the packed tensor: one gradient, dq, dk and dv side by side, in
    /// one concatenation (three slices' backward would zero the packed shape three times and
    /// add the three).
    #[derive(Debug)]
    pub(super) struct PackedAttentionBackward<B>(pub(super) PhantomData<fn() -> B>);

    impl<B: Backend> Backward<Frugal<B>, 1> for PackedAttentionBackward<B> {
        type State = Saved<B>;

        fn backward(self, ops: Ops<Saved<B>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [node] = ops.parents;
            let grad = grads.consume::<Frugal<B>>(&ops.node);
            let Some(node) = node else {
                return;
            };
            let saved = ops.state;
            let [batch, heads, seq, head_dim] = saved.q.shape().dims::<4>();
            let dtype = saved.dtypes[0];
            // Each gradient as a `[batch, seq, heads, head_dim]` view, concatenated along the
            // heads: the copy into the packed tensor is the only one.
            let parts = backward::<B>(saved, split_heads::<B>(grad, heads))
                .map(|g| frugal_tensor::<B, 4>(cast_to::<B>(g, dtype)).swap_dims(1, 2));
            let packed = Tensor::cat(parts.into(), 2).reshape([batch, seq, 3 * heads * head_dim]);
            grads.register::<Frugal<B>>(node.id, frugal_primitive(packed));
        }
    }
}

/// Attention on any backend's own ops, per block of query rows: no tensor of more than
/// `block × seq_k` scores per `(batch, head)` at a time.
pub(crate) mod portable {
    use super::*;

    /// Query rows per block: at most 64, fewer when a block's scores would exceed 4 Mi
    /// elements.
    pub(crate) fn block_rows(batch_heads: usize, seq_q: usize, seq_k: usize) -> usize {
        let by_size = (4usize << 20) / (batch_heads * seq_k).max(1);
        by_size.clamp(1, 64).min(seq_q.max(1))
    }

    fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
        Tensor::from_primitive(TensorPrimitive::Float(p))
    }

    /// `true` where key `j > row0 + i` (masked), `[1, 1, rows, keys]`.
    fn causal_mask<B: Backend>(
        row0: usize,
        rows: usize,
        keys: usize,
        device: &B::Device,
    ) -> Tensor<B, 4, Bool> {
        let cols = Tensor::<B, 1, Int>::arange(0..keys as i64, device).reshape([1, keys]);
        let rows_idx = Tensor::<B, 1, Int>::arange(row0 as i64..(row0 + rows) as i64, device)
            .reshape([rows, 1]);
        cols.greater(rows_idx).reshape([1, 1, rows, keys])
    }

    /// The block's scaled, biased and masked scores: `[b, h, rows, keys]`.
    fn scores<B: Backend>(
        qb: Tensor<B, 4>,
        k: &Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
        row0: usize,
        keys: usize,
        call: AttentionCall,
    ) -> Tensor<B, 4> {
        let [_, _, rows, _] = qb.dims();
        let device = qb.device();
        let kb = k.clone().narrow(2, 0, keys);
        let mut s = qb.matmul(kb.swap_dims(2, 3)).mul_scalar(call.scale);
        if let Some(bias) = bias {
            let [_, _, bias_rows, _] = bias.dims();
            let b = if bias_rows == 1 {
                bias.clone()
            } else {
                bias.clone().narrow(2, row0, rows)
            };
            s = s + b.narrow(3, 0, keys);
        }
        if call.causal {
            s = s.mask_fill(
                causal_mask::<B>(row0, rows, keys, &device),
                f32::NEG_INFINITY,
            );
        }
        s
    }

    /// The keys block `row0..row0 + rows` can see: all, or up to its last row when causal.
    fn keys_for(row0: usize, rows: usize, seq_k: usize, causal: bool) -> usize {
        if causal {
            (row0 + rows).min(seq_k)
        } else {
            seq_k
        }
    }

    /// Output `[b, h, sq, d]` and logsumexp `[b, h, sq, 1]`.
    pub(crate) fn forward<B: Backend>(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        bias: Option<FloatTensor<B>>,
        call: AttentionCall,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let (q, k, v) = (tensor::<B, 4>(q), tensor::<B, 4>(k), tensor::<B, 4>(v));
        let bias = bias.map(tensor::<B, 4>);
        let [b, h, seq_q, _] = q.dims();
        let seq_k = k.dims()[2];
        let finfo = q.dtype().finfo().expect("a float tensor");
        let step = block_rows(b * h, seq_q, seq_k);
        let mut outs = Vec::new();
        let mut lses = Vec::new();
        let mut row0 = 0;
        while row0 < seq_q {
            let rows = step.min(seq_q - row0);
            let keys = keys_for(row0, rows, seq_k, call.causal);
            let qb = q.clone().narrow(2, row0, rows);
            let s = scores(qb, &k, bias.as_ref(), row0, keys, call);
            let max = s.clone().max_dim(3).clamp_min(finfo.min);
            let e = (s - max.clone()).exp();
            let sum = e.clone().sum_dim(3).clamp_min(finfo.min_positive);
            outs.push((e / sum.clone()).matmul(v.clone().narrow(2, 0, keys)));
            lses.push(max + sum.log());
            row0 += rows;
        }
        (
            Tensor::cat(outs, 2).into_primitive().tensor(),
            Tensor::cat(lses, 2).into_primitive().tensor(),
        )
    }

    /// What the backward pass reads: the forward's inputs, its output, each query row's
    /// logsumexp (`[b, h, sq, 1]`) and the output's gradient.
    pub(crate) struct BackwardInputs<B: Backend> {
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        bias: Option<Tensor<B, 4>>,
        out: Tensor<B, 4>,
        lse: Tensor<B, 4>,
        grad_out: Tensor<B, 4>,
    }

    impl<B: Backend> BackwardInputs<B> {
        /// The inputs from their primitives.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn new(
            q: FloatTensor<B>,
            k: FloatTensor<B>,
            v: FloatTensor<B>,
            bias: Option<FloatTensor<B>>,
            out: FloatTensor<B>,
            lse: FloatTensor<B>,
            grad_out: FloatTensor<B>,
        ) -> Self {
            Self {
                q: tensor(q),
                k: tensor(k),
                v: tensor(v),
                bias: bias.map(tensor),
                out: tensor(out),
                lse: tensor(lse),
                grad_out: tensor(grad_out),
            }
        }
    }

    /// The gradients of q, k and v.
    pub(crate) fn backward<B: Backend>(
        inputs: BackwardInputs<B>,
        call: AttentionCall,
    ) -> [FloatTensor<B>; 3] {
        let BackwardInputs {
            q,
            k,
            v,
            bias,
            out,
            lse,
            grad_out,
        } = inputs;
        let [b, h, seq_q, _] = q.dims();
        let seq_k = k.dims()[2];
        let step = block_rows(b * h, seq_q, seq_k);
        let mut dk = k.zeros_like();
        let mut dv = v.zeros_like();
        let mut dqs = Vec::new();
        let mut row0 = 0;
        while row0 < seq_q {
            let rows = step.min(seq_q - row0);
            let keys = keys_for(row0, rows, seq_k, call.causal);
            let qb = q.clone().narrow(2, row0, rows);
            let gb = grad_out.clone().narrow(2, row0, rows);
            let s = scores(qb.clone(), &k, bias.as_ref(), row0, keys, call);
            let p = (s - lse.clone().narrow(2, row0, rows)).exp();
            let kb = k.clone().narrow(2, 0, keys);
            let vb = v.clone().narrow(2, 0, keys);
            let dv_part = p.clone().swap_dims(2, 3).matmul(gb.clone());
            let dp = gb.clone().matmul(vb.swap_dims(2, 3));
            let delta = (gb * out.clone().narrow(2, row0, rows)).sum_dim(3);
            let ds = p * (dp - delta);
            dqs.push(ds.clone().matmul(kb).mul_scalar(call.scale));
            let dk_part = ds.swap_dims(2, 3).matmul(qb).mul_scalar(call.scale);
            if keys == seq_k {
                dk = dk + dk_part;
                dv = dv + dv_part;
            } else {
                let range = [0..b, 0..h, 0..keys];
                dk = dk
                    .clone()
                    .slice_assign(range.clone(), dk.slice(range.clone()) + dk_part);
                dv = dv
                    .clone()
                    .slice_assign(range.clone(), dv.slice(range) + dv_part);
            }
            row0 += rows;
        }
        [
            Tensor::cat(dqs, 2).into_primitive().tensor(),
            dk.into_primitive().tensor(),
            dv.into_primitive().tensor(),
        ]
    }
}
