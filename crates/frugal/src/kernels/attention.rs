//! Flash attention on CubeCL tensors: the call's shapes and the launches of
//! `frugal_kernels::attention` (or, on frugal-cuda, attention as cuBLASLt products), run
//! through the generic custom operation of [`super::custom`]. Every check the kernels would
//! make is made before anything is registered with fusion, so a registered operation always
//! launches.

use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, tensor::CubeTensor};
use frugal_kernels::attention::{
    AttentionArgs, AttentionBias, AttentionConfig, AttentionSaved, AttentionShape,
};

use super::cube::kernel_dtype;
use super::custom::{CubeCall, contiguous, wrap};
use super::{ATTENTION_BACKWARDS, ATTENTION_FORWARDS, AttentionCall};

/// A call's sizes, its bias's strides (batch, head, row) and its dtype, as the kernels take them.
type Plan = (
    AttentionShape,
    Option<[usize; 3]>,
    frugal_kernels::FloatDtype,
);

/// The kernel arguments of a call on tensors of these shapes, if the kernels take them: q
/// `[b, h, sq, d]`, k and v `[b, h, sk, d]`, the bias `[b|1, h|1, sq|1, sk]`, one dtype.
fn plan(
    q: &Shape,
    k: &Shape,
    v: &Shape,
    bias: Option<&Shape>,
    dtypes: &[DType],
    call: &AttentionCall,
) -> Option<Plan> {
    let dtype = kernel_dtype(dtypes[0])?;
    if dtypes.iter().any(|d| *d != dtypes[0]) {
        return None;
    }
    let (q, k, v) = (q.as_slice(), k.as_slice(), v.as_slice());
    if q.len() != 4 || k.len() != 4 || k != v || q[0] != k[0] || q[1] != k[1] || q[3] != k[3] {
        return None;
    }
    let shape = AttentionShape {
        batch: q[0],
        heads: q[1],
        seq_q: q[2],
        seq_k: k[2],
        head_dim: q[3],
    };
    let strides = match bias {
        None => None,
        Some(b) => {
            let b = b.as_slice();
            let fits = |dim: usize, full: usize| b[dim] == full || b[dim] == 1;
            if b.len() != 4
                || !fits(0, shape.batch)
                || !fits(1, shape.heads)
                || !fits(2, shape.seq_q)
                || b[3] != shape.seq_k
            {
                return None;
            }
            // Contiguous strides, 0 where the bias broadcasts.
            let row = b[3];
            let head = b[2] * row;
            let batch = b[1] * head;
            let or_zero = |dim: usize, stride: usize| if b[dim] == 1 { 0 } else { stride };
            Some([or_zero(0, batch), or_zero(1, head), or_zero(2, row)])
        }
    };
    let _ = call;
    Some((shape, strides, dtype))
}

/// [`plan`] for CubeCL tensors: `q`, `k`, `v`, the bias and the `others` read beside them
/// (one dtype for all).
fn plan_cube<R: CubeRuntime>(
    [q, k, v]: [&CubeTensor<R>; 3],
    bias: Option<&CubeTensor<R>>,
    others: &[&CubeTensor<R>],
    call: &AttentionCall,
) -> Option<Plan> {
    let dtypes: Vec<DType> = [q, k, v]
        .into_iter()
        .chain(others.iter().copied())
        .chain(bias)
        .map(|t| t.dtype)
        .collect();
    plan(
        q.meta.shape(),
        k.meta.shape(),
        v.meta.shape(),
        bias.map(|b| b.meta.shape()),
        &dtypes,
        call,
    )
}

/// The kernels' arguments for contiguous q, k, v and bias, the bias laid out with `strides`
/// (see [`plan`]).
fn args<'a, R: CubeRuntime>(
    [q, k, v]: [&'a CubeTensor<R>; 3],
    bias: Option<&'a CubeTensor<R>>,
    strides: Option<[usize; 3]>,
    shape: AttentionShape,
    dtype: frugal_kernels::FloatDtype,
    call: &AttentionCall,
) -> AttentionArgs<'a> {
    AttentionArgs {
        q: &q.handle,
        k: &k.handle,
        v: &v.handle,
        bias: bias.zip(strides).map(|(b, s)| AttentionBias {
            handle: &b.handle,
            batch_stride: s[0],
            head_stride: s[1],
            row_stride: s[2],
        }),
        shape,
        dtype,
        config: config(call),
    }
}

fn config(call: &AttentionCall) -> AttentionConfig {
    AttentionConfig {
        causal: call.causal,
        scale: Some(call.scale),
    }
}

/// Whether the device takes a call of this shape and dtype (grid limits, dtype support).
fn device_takes<R: CubeRuntime>(
    device: &R::Device,
    shape: &AttentionShape,
    dtype: frugal_kernels::FloatDtype,
    call: &AttentionCall,
) -> bool {
    let client = R::client(device);
    frugal_kernels::attention::validate(&client, shape, dtype, &config(call)).is_ok()
}

/// The forward kernel on CubeCL tensors: `(out, lse)`, or `None` if it does not apply.
fn forward_cube<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    bias: Option<&CubeTensor<R>>,
    call: &AttentionCall,
) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
    let (shape, strides, dtype) = plan_cube([q, k, v], bias, &[], call)?;
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let bias = bias.map(contiguous);
    let args = args([&q, &k, &v], bias.as_ref(), strides, shape, dtype, call);
    #[cfg(feature = "frugal-cuda")]
    if let Some(gemm) = super::attention_products::applies::<R>(q.dtype) {
        let products = super::attention_products::forward(&q.client, &q.device, gemm, args);
        if let Some(out) = products {
            super::ATTENTION_PRODUCT_FORWARDS.fetch_add(1, Relaxed);
            return Some(forward_outputs(&q, out));
        }
    }
    let out = frugal_kernels::attention::attention_forward(&q.client, args).ok()?;
    ATTENTION_FORWARDS.fetch_add(1, Relaxed);
    Some(forward_outputs(&q, out))
}

/// The forward's output and logsumexp as tensors shaped after `q`.
fn forward_outputs<R: CubeRuntime>(
    q: &CubeTensor<R>,
    out: frugal_kernels::attention::AttentionForward,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let dims = q.meta.shape().as_slice().to_vec();
    let rows = dims[..3].to_vec();
    (
        wrap(q, out.out, Shape::from(dims), q.dtype),
        wrap(q, out.lse, Shape::from(rows), DType::F32),
    )
}

/// The backward kernels on CubeCL tensors: `(grad_q, grad_k, grad_v)`, or `None`.
#[allow(clippy::too_many_arguments)]
fn backward_cube<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    grad_out: &CubeTensor<R>,
    call: &AttentionCall,
) -> Option<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    let (shape, strides, dtype) = plan_cube([q, k, v], bias, &[out, grad_out], call)?;
    if lse.dtype != DType::F32 || out.meta.shape() != q.meta.shape() {
        return None;
    }
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let (out, lse, grad_out) = (contiguous(out), contiguous(lse), contiguous(grad_out));
    let bias = bias.map(contiguous);
    let args = args([&q, &k, &v], bias.as_ref(), strides, shape, dtype, call);
    let saved = AttentionSaved {
        out: &out.handle,
        lse: &lse.handle,
        grad_out: &grad_out.handle,
    };
    #[cfg(feature = "frugal-cuda")]
    if let Some(gemm) = super::attention_products::applies::<R>(q.dtype) {
        let products = super::attention_products::backward(&q.client, &q.device, gemm, args, saved);
        if let Some(grads) = products {
            super::ATTENTION_PRODUCT_BACKWARDS.fetch_add(1, Relaxed);
            return Some(backward_outputs(&q, &k, grads));
        }
    }
    let grads = frugal_kernels::attention::attention_backward(&q.client, args, saved).ok()?;
    ATTENTION_BACKWARDS.fetch_add(1, Relaxed);
    Some(backward_outputs(&q, &k, grads))
}

/// The three gradients as tensors shaped after `q` and `k`.
fn backward_outputs<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    grads: frugal_kernels::attention::AttentionGrads,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let q_dims = q.meta.shape().as_slice().to_vec();
    let kv_dims = k.meta.shape().as_slice().to_vec();
    (
        wrap(q, grads.grad_q, Shape::from(q_dims), q.dtype),
        wrap(q, grads.grad_k, Shape::from(kv_dims.clone()), q.dtype),
        wrap(q, grads.grad_v, Shape::from(kv_dims), q.dtype),
    )
}

fn run_cube<R: CubeRuntime>(
    inputs: &[CubeTensor<R>],
    has_bias: bool,
    call: &AttentionCall,
    backward: bool,
) -> Option<Vec<CubeTensor<R>>> {
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let bias = has_bias.then(|| &inputs[3]);
    let rest = &inputs[3 + has_bias as usize..];
    if backward {
        let (dq, dk, dv) = backward_cube(q, k, v, bias, &rest[0], &rest[1], &rest[2], call)?;
        Some(vec![dq, dk, dv])
    } else {
        let (out, lse) = forward_cube(q, k, v, bias, call)?;
        Some(vec![out, lse])
    }
}

/// One attention call as a kernel launch: the forward (inputs q, k, v, [bias]; outputs out,
/// lse) or the backward (inputs q, k, v, [bias], out, lse, grad_out; outputs the three
/// gradients).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionLaunch {
    pub(crate) call: AttentionCall,
    pub(crate) has_bias: bool,
    pub(crate) backward: bool,
}

impl AttentionLaunch {
    /// The kernels' shape and dtype for these inputs, if they take them.
    fn plan(
        &self,
        inputs: &[(&Shape, DType)],
    ) -> Option<(AttentionShape, frugal_kernels::FloatDtype)> {
        let expected = 3 + self.has_bias as usize + if self.backward { 3 } else { 0 };
        if inputs.len() != expected {
            return None;
        }
        let (q, k, v) = (inputs[0].0, inputs[1].0, inputs[2].0);
        let bias = self.has_bias.then(|| inputs[3].0);
        // The logsumexp is f32 whatever the inputs' dtype.
        let lse_at = 4 + self.has_bias as usize;
        let dtypes: Vec<DType> = inputs
            .iter()
            .enumerate()
            .filter(|(i, _)| !(self.backward && *i == lse_at))
            .map(|(_, t)| t.1)
            .collect();
        let (shape, _, dtype) = plan(q, k, v, bias, &dtypes, &self.call)?;
        if self.backward {
            let rest = &inputs[3 + self.has_bias as usize..];
            if rest[1].1 != DType::F32 || rest[0].0 != q || rest[2].0 != q {
                return None;
            }
        }
        Some((shape, dtype))
    }
}

impl CubeCall for AttentionLaunch {
    const NAME: &'static str = "frugal_attention";

    fn outputs(&self, inputs: &[(&Shape, DType)]) -> Option<Vec<(Shape, DType)>> {
        self.plan(inputs)?;
        let (q, k, v) = (inputs[0], inputs[1].0, inputs[2].0);
        Some(if self.backward {
            vec![(q.0.clone(), q.1), (k.clone(), q.1), (v.clone(), q.1)]
        } else {
            let rows = Shape::from(q.0.as_slice()[..3].to_vec());
            vec![(q.0.clone(), q.1), (rows, DType::F32)]
        })
    }

    fn device_takes<R: CubeRuntime>(&self, device: &R::Device, inputs: &[(&Shape, DType)]) -> bool {
        self.plan(inputs)
            .is_some_and(|(shape, dtype)| device_takes::<R>(device, &shape, dtype, &self.call))
    }

    fn launch<R: CubeRuntime>(&self, inputs: &[CubeTensor<R>]) -> Option<Vec<CubeTensor<R>>> {
        run_cube(inputs, self.has_bias, &self.call, self.backward)
    }
}
