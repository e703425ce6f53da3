//! Flash attention on the inner backend's primitives: the downcast to a CubeCL tensor of a
//! known runtime (with or without fusion), the launches of `frugal_kernels::attention`, and
//! the fusion custom operations. Every check the kernels would make is made before anything
//! is registered with fusion, so a registered operation always launches.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::{
    FusionRuntime, FusionTensor,
    stream::{Operation, OperationStreams},
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use frugal_kernels::attention::{AttentionBias, AttentionConfig, AttentionShape};

use super::cube::{Cube, kernel_dtype};
use super::{ATTENTION_BACKWARDS, ATTENTION_FORWARDS, AttentionCall};
use crate::runtime::each_runtime;

/// The kernel arguments of a call on tensors of these shapes, if the kernels take them: q
/// `[b, h, sq, d]`, k and v `[b, h, sk, d]`, the bias `[b|1, h|1, sq|1, sk]`, one dtype.
fn plan(
    q: &Shape,
    k: &Shape,
    v: &Shape,
    bias: Option<&Shape>,
    dtypes: &[DType],
    call: &AttentionCall,
) -> Option<(
    AttentionShape,
    Option<[usize; 3]>,
    frugal_kernels::FloatDtype,
)> {
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

fn contiguous<R: CubeRuntime>(tensor: &CubeTensor<R>) -> CubeTensor<R> {
    if tensor.is_contiguous() {
        tensor.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(tensor.clone())
    }
}

fn wrap<R: CubeRuntime>(
    like: &CubeTensor<R>,
    handle: cubecl::server::Handle,
    shape: Vec<usize>,
    dtype: DType,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        handle,
        dtype,
    )
}

/// The forward kernel on CubeCL tensors: `(out, lse)`, or `None` if it does not apply.
fn forward_cube<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    bias: Option<&CubeTensor<R>>,
    call: &AttentionCall,
) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
    let mut dtypes = vec![q.dtype, k.dtype, v.dtype];
    dtypes.extend(bias.map(|b| b.dtype));
    let (shape, strides, dtype) = plan(
        q.meta.shape(),
        k.meta.shape(),
        v.meta.shape(),
        bias.map(|b| b.meta.shape()),
        &dtypes,
        call,
    )?;
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let bias = bias.map(contiguous);
    let bias_arg = bias.as_ref().zip(strides).map(|(b, s)| AttentionBias {
        handle: &b.handle,
        batch_stride: s[0],
        head_stride: s[1],
        row_stride: s[2],
    });
    #[cfg(feature = "frugal-cuda")]
    if let Some(gemm) = super::attention_products::applies::<R>(q.dtype) {
        let products = super::attention_products::forward(
            &q.client,
            &q.device,
            gemm,
            &q.handle,
            &k.handle,
            &v.handle,
            bias_arg,
            shape,
            dtype,
            config(call),
        );
        if let Some(out) = products {
            super::ATTENTION_PRODUCT_FORWARDS.fetch_add(1, Relaxed);
            return Some(forward_outputs(&q, out));
        }
    }
    let out = frugal_kernels::attention::attention_forward(
        &q.client,
        &q.handle,
        &k.handle,
        &v.handle,
        bias_arg,
        shape,
        dtype,
        config(call),
    )
    .ok()?;
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
        wrap(q, out.out, dims, q.dtype),
        wrap(q, out.lse, rows, DType::F32),
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
    let mut dtypes = vec![q.dtype, k.dtype, v.dtype, out.dtype, grad_out.dtype];
    dtypes.extend(bias.map(|b| b.dtype));
    let (shape, strides, dtype) = plan(
        q.meta.shape(),
        k.meta.shape(),
        v.meta.shape(),
        bias.map(|b| b.meta.shape()),
        &dtypes,
        call,
    )?;
    if lse.dtype != DType::F32 || out.meta.shape() != q.meta.shape() {
        return None;
    }
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let (out, lse, grad_out) = (contiguous(out), contiguous(lse), contiguous(grad_out));
    let bias = bias.map(contiguous);
    let bias_arg = bias.as_ref().zip(strides).map(|(b, s)| AttentionBias {
        handle: &b.handle,
        batch_stride: s[0],
        head_stride: s[1],
        row_stride: s[2],
    });
    #[cfg(feature = "frugal-cuda")]
    if let Some(gemm) = super::attention_products::applies::<R>(q.dtype) {
        let products = super::attention_products::backward(
            &q.client,
            &q.device,
            gemm,
            &q.handle,
            &k.handle,
            &v.handle,
            bias_arg,
            &out.handle,
            &lse.handle,
            &grad_out.handle,
            shape,
            dtype,
            config(call),
        );
        if let Some(grads) = products {
            super::ATTENTION_PRODUCT_BACKWARDS.fetch_add(1, Relaxed);
            return Some(backward_outputs(&q, &k, grads));
        }
    }
    let grads = frugal_kernels::attention::attention_backward(
        &q.client,
        &q.handle,
        &k.handle,
        &v.handle,
        bias_arg,
        &out.handle,
        &lse.handle,
        &grad_out.handle,
        shape,
        dtype,
        config(call),
    )
    .ok()?;
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
        wrap(q, grads.grad_q, q_dims, q.dtype),
        wrap(q, grads.grad_k, kv_dims.clone(), q.dtype),
        wrap(q, grads.grad_v, kv_dims, q.dtype),
    )
}

/// The inputs and outputs of one call, as a `dyn Any` slot the runtimes downcast.
pub(crate) struct Slot<P> {
    pub(crate) inputs: Vec<P>,
    pub(crate) has_bias: bool,
    pub(crate) outputs: Option<Vec<P>>,
}

/// Runs the forward (`backward == false`: inputs q, k, v, [bias]; outputs out, lse) or the
/// backward (inputs q, k, v, [bias], out, lse, grad_out; outputs the three gradients) on
/// `slot`; `true` when the kernels ran.
/// Whether `P` is the float primitive of a CubeCL runtime this build knows, with or without
/// fusion: the only primitives [`run`] may launch the kernels on.
pub(crate) fn knows<P: Any>() -> bool {
    each_runtime!(knows_on(std::any::TypeId::of::<P>())).unwrap_or(false)
}

fn knows_on<R: CubeRuntime>(primitive: std::any::TypeId) -> Option<bool> {
    use std::any::TypeId;
    (primitive == TypeId::of::<CubeTensor<R>>()
        || primitive == TypeId::of::<FusionTensor<FusionCubeRuntime<R>>>())
    .then_some(true)
}

pub(crate) fn run<P: Any>(slot: &mut Slot<P>, call: &AttentionCall, backward: bool) -> bool {
    let any = slot as &mut dyn Any;
    each_runtime!(run_on(any, call, backward)).unwrap_or(false)
}

fn run_on<R: CubeRuntime>(any: &mut dyn Any, call: &AttentionCall, backward: bool) -> Option<bool> {
    if let Some(slot) = any.downcast_mut::<Slot<CubeTensor<R>>>() {
        slot.outputs = run_cube(&slot.inputs, slot.has_bias, call, backward);
        return Some(slot.outputs.is_some());
    }
    let slot = any.downcast_mut::<Slot<FusionTensor<FusionCubeRuntime<R>>>>()?;
    slot.outputs = run_fused::<R>(&slot.inputs, slot.has_bias, call, backward);
    Some(slot.outputs.is_some())
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

/// Registers the call as one fusion custom operation, after checking that it will launch.
fn run_fused<R: CubeRuntime>(
    inputs: &[FusionTensor<FusionCubeRuntime<R>>],
    has_bias: bool,
    call: &AttentionCall,
    backward: bool,
) -> Option<Vec<FusionTensor<FusionCubeRuntime<R>>>> {
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let bias = has_bias.then(|| &inputs[3]);
    let dtypes: Vec<DType> = inputs
        .iter()
        .enumerate()
        .filter(|(i, _)| !(backward && *i == 4 + has_bias as usize))
        .map(|(_, t)| t.dtype)
        .collect();
    let (shape, _, dtype) = plan(
        &q.shape,
        &k.shape,
        &v.shape,
        bias.map(|b| &b.shape),
        &dtypes,
        call,
    )?;
    if backward {
        let rest = &inputs[3 + has_bias as usize..];
        if rest[1].dtype != DType::F32 || rest[0].shape != q.shape || rest[2].shape != q.shape {
            return None;
        }
    }
    let client = q.client.clone();
    if !device_takes::<R>(client.device(), &shape, dtype, call) {
        return None;
    }
    let streams = OperationStreams::with_inputs(inputs);
    let outputs: Vec<TensorIr> = if backward {
        vec![
            TensorIr::uninit(client.create_empty_handle(), q.shape.clone(), q.dtype),
            TensorIr::uninit(client.create_empty_handle(), k.shape.clone(), q.dtype),
            TensorIr::uninit(client.create_empty_handle(), v.shape.clone(), q.dtype),
        ]
    } else {
        let rows = Shape::from(q.shape.as_slice()[..3].to_vec());
        vec![
            TensorIr::uninit(client.create_empty_handle(), q.shape.clone(), q.dtype),
            TensorIr::uninit(client.create_empty_handle(), rows, DType::F32),
        ]
    };
    let irs: Vec<TensorIr> = inputs.iter().map(|t| t.clone().into_ir()).collect();
    let name = if backward {
        "frugal_attention_backward"
    } else {
        "frugal_attention_forward"
    };
    let desc = CustomOpIr::new(name, &irs, &outputs);
    Some(client.register(
        streams,
        OperationIr::Custom(desc.clone()),
        FusedAttention::<R> {
            desc,
            call: *call,
            has_bias,
            backward,
            _runtime: PhantomData,
        },
    ))
}

/// The fusion custom operation of [`run_fused`].
#[derive(Debug)]
struct FusedAttention<R> {
    desc: CustomOpIr,
    call: AttentionCall,
    has_bias: bool,
    backward: bool,
    _runtime: PhantomData<fn() -> R>,
}

impl<R: CubeRuntime> Operation<FusionCubeRuntime<R>> for FusedAttention<R> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>,
    ) {
        let inputs: Vec<CubeTensor<R>> = self
            .desc
            .inputs
            .iter()
            .map(|ir| handles.get_float_tensor::<Cube<R>>(ir))
            .collect();
        let outputs = run_cube(&inputs, self.has_bias, &self.call, self.backward).expect(
            "frugal: the attention kernels refused a call that was checked when it was registered",
        );
        for (tensor, ir) in outputs.into_iter().zip(&self.desc.outputs) {
            handles.register_float_tensor::<Cube<R>>(&ir.id, tensor);
        }
    }
}
