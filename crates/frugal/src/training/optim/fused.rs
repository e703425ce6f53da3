//! The fused step's dispatch: finds the CubeCL buffers behind the step's tensors (CubeCL or
//! fusion primitives, held by Frugal or not) and runs one of the AdamW kernels on them, in
//! place: `frugal_kernels::adamw_update` for f32 moments, `frugal_kernels::adamw8bit_update`
//! for 8-bit ones; under fusion as one custom operation.

// A step that cannot take the kernel returns its inputs in the `Err` variant, for the portable
// path: large, but moved once per parameter and step.
#![allow(clippy::result_large_err)]

use std::any::{Any, TypeId};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use burn_backend::{DType, TensorMetadata, TensorPrimitive};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Int, Tensor};
use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::FusionTensor;
use cubecl::server::Handle;
use frugal_kernels::{AdamW8bitBuffers, AdamWBuffers, AdamWScalars, WeightDecay};

use super::qmap::Tables;
use super::{Decay, QuantizedMoments, Scalars};
use crate::device::{DeviceState, Storage};
use crate::kernels::{self, custom::register_fused};
use crate::runtime::each_runtime;
use crate::tensor::FrugalTensor;
use crate::vocabulary::{
    OpId,
    families::{float, int},
};

/// A step's inputs as primitives. The state is the moments: for 8-bit ones the code words
/// (an int primitive) and the absmax; for f32 ones the first and the second moment.
struct Inputs<F, I> {
    param: F,
    grad: F,
    state_1: I,
    state_2: F,
}

/// A step's outputs as primitives (the state as in [`Inputs`]).
struct Outputs<F, I> {
    param: F,
    state_1: I,
    state_2: F,
}

/// The inputs, or the outputs once the kernel ran (or was registered, under fusion).
type Slot<F, I> = Option<Result<Outputs<F, I>, Inputs<F, I>>>;

/// Which kernel a step runs, with what only that kernel needs.
#[derive(Clone, Debug)]
enum Kind {
    /// f32 moments (`frugal_kernels::adamw_update`); on the first step their buffers are
    /// written, not read.
    Full { first_step: bool },
    /// 8-bit moments (`frugal_kernels::adamw8bit_update`).
    Quantized {
        block_size: usize,
        tables: Arc<Tables>,
    },
}

impl Kind {
    /// The ops a new buffer of each output is charged to: the portable path's last op for
    /// that output (parameter, state 1, state 2).
    fn charged_ops(&self) -> [OpId; 3] {
        let sub = float::op(float::Op::float_sub);
        match self {
            Kind::Full { .. } => {
                let add = float::op(float::Op::float_add);
                [sub, add, add]
            }
            Kind::Quantized { .. } => [
                sub,
                int::op(int::Op::bitwise_or),
                float::op(float::Op::float_max_dim),
            ],
        }
    }

    /// The fusion custom operation's name.
    fn op_name(&self) -> &'static str {
        match self {
            Kind::Full { .. } => "frugal_adamw",
            Kind::Quantized { .. } => "frugal_adamw8bit",
        }
    }
}

/// What a launch needs besides the buffers.
#[derive(Clone, Debug)]
struct Launch {
    scalars: AdamWScalars,
    len: usize,
    kind: Kind,
}

impl<T> Inputs<T, T> {
    /// Whether the inputs, each read by `info` as its dtype and element count, are the layout
    /// `launch` takes.
    fn fit(&self, launch: &Launch, info: impl Fn(&T) -> (DType, usize)) -> bool {
        launch.fits(
            info(&self.param),
            info(&self.grad),
            info(&self.state_1),
            info(&self.state_2),
        )
    }
}

impl Launch {
    /// Whether tensors of these dtypes and element counts are the layout the kernel takes.
    fn fits(
        &self,
        param: (DType, usize),
        grad: (DType, usize),
        state_1: (DType, usize),
        state_2: (DType, usize),
    ) -> bool {
        let len = self.len;
        let common = param == (DType::F32, len) && grad == (DType::F32, len) && len > 0;
        match &self.kind {
            Kind::Full { .. } => {
                common
                    && state_1 == (DType::F32, len)
                    && state_2 == (DType::F32, len)
                    && len <= u32::MAX as usize
            }
            Kind::Quantized { block_size, .. } => {
                let block_size = *block_size;
                let (blocks, words) = frugal_kernels::adamw8bit_layout(len, block_size);
                common
                    && state_1 == (DType::U32, 2 * words)
                    && state_2 == (DType::F32, 2 * blocks)
                    && block_size.is_multiple_of(4)
                    && (4..=frugal_kernels::MAX_BLOCK_SIZE).contains(&block_size)
                    && len <= (u32::MAX as usize / 4) / block_size * block_size
            }
        }
    }
}

/// The 8-bit step by the fused kernel: `Ok` with the new parameter and moments, or `Err` with
/// the inputs untouched when the tensors are not CubeCL ones of a runtime this build knows (or
/// not in the layout the kernel takes).
#[allow(clippy::type_complexity)]
pub(super) fn step_quantized<B: Backend, const D: usize>(
    s: &Scalars,
    tables: &Arc<Tables>,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    q: QuantizedMoments<B>,
) -> Result<(Tensor<B, D>, QuantizedMoments<B>), (Tensor<B, D>, Tensor<B, D>, QuantizedMoments<B>)>
{
    let QuantizedMoments {
        codes,
        absmax,
        block_size,
        len,
    } = q;
    let launch = Launch {
        scalars: kernel_scalars(s),
        len,
        kind: Kind::Quantized {
            block_size,
            tables: tables.clone(),
        },
    };
    let inputs = Inputs {
        param: tensor.into_primitive().tensor(),
        grad: grad.into_primitive().tensor(),
        state_1: codes.into_primitive(),
        state_2: absmax.into_primitive().tensor(),
    };
    let float = |p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p));
    match run::<B::FloatTensorPrimitive, B::IntTensorPrimitive>(inputs, &launch) {
        Ok(out) => Ok((
            Tensor::<B, D>::from_primitive(TensorPrimitive::Float(out.param)),
            QuantizedMoments {
                codes: Tensor::<B, 1, Int>::from_primitive(out.state_1),
                absmax: float(out.state_2),
                block_size,
                len,
            },
        )),
        Err(input) => Err((
            Tensor::from_primitive(TensorPrimitive::Float(input.param)),
            Tensor::from_primitive(TensorPrimitive::Float(input.grad)),
            QuantizedMoments {
                codes: Tensor::<B, 1, Int>::from_primitive(input.state_1),
                absmax: float(input.state_2),
                block_size,
                len,
            },
        )),
    }
}

/// A parameter and its two f32 moments.
pub(super) type FullState<B, const D: usize> = (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>);

/// The f32 step by the fused kernel: `Ok` with the new parameter and moments, or `Err` with
/// the inputs (parameter, gradient, moments) untouched, as [`step_quantized`]. On the first
/// step (`first_step`) the moments' contents are not read.
#[allow(clippy::type_complexity)]
pub(super) fn step_full<B: Backend, const D: usize>(
    s: &Scalars,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: (Tensor<B, D>, Tensor<B, D>),
    first_step: bool,
) -> Result<FullState<B, D>, (Tensor<B, D>, Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>))> {
    let launch = Launch {
        scalars: kernel_scalars(s),
        len: tensor.shape().num_elements(),
        kind: Kind::Full { first_step },
    };
    let inputs = Inputs {
        param: tensor.into_primitive().tensor(),
        grad: grad.into_primitive().tensor(),
        state_1: moments.0.into_primitive().tensor(),
        state_2: moments.1.into_primitive().tensor(),
    };
    let float = |p| Tensor::<B, D>::from_primitive(TensorPrimitive::Float(p));
    match run::<B::FloatTensorPrimitive, B::FloatTensorPrimitive>(inputs, &launch) {
        Ok(out) => Ok((float(out.param), float(out.state_1), float(out.state_2))),
        Err(input) => Err((
            float(input.param),
            float(input.grad),
            (float(input.state_1), float(input.state_2)),
        )),
    }
}

/// Runs `launch` on primitives of any backend: the outputs, or the inputs back when they are
/// not CubeCL ones of a runtime this build knows (or not in the kernel's layout).
fn run<F: 'static, I: 'static>(
    inputs: Inputs<F, I>,
    launch: &Launch,
) -> Result<Outputs<F, I>, Inputs<F, I>> {
    let mut slot: Slot<F, I> = Some(Err(inputs));
    {
        let any = &mut slot as &mut dyn Any;
        each_runtime!(step_on(any, launch));
    }
    slot.expect("given back")
}

fn kernel_scalars(s: &Scalars) -> AdamWScalars {
    AdamWScalars {
        beta_1: s.beta_1,
        one_minus_beta_1: s.one_minus_beta_1,
        beta_2: s.beta_2,
        one_minus_beta_2: s.one_minus_beta_2,
        bias_correction_1: s.bias_correction_1,
        bias_correction_2: s.bias_correction_2,
        epsilon: s.epsilon,
        lr: s.lr,
        decay: match s.decay {
            Decay::None => WeightDecay::None,
            Decay::Plain { factor } => WeightDecay::Plain { factor },
            Decay::Cautious { rate } => WeightDecay::Cautious { rate },
        },
    }
}

/// `None` if the primitives are not `R`'s; `Some(())` once tried (the slot then holds the
/// outputs, or the inputs if the kernel did not apply).
fn step_on<R: CubeRuntime>(any: &mut dyn Any, launch: &Launch) -> Option<()> {
    type Fused<R> = FusionTensor<FusionCubeRuntime<R>>;
    if let Some(slot) = any.downcast_mut::<Slot<CubeTensor<R>, CubeTensor<R>>>() {
        direct(slot, |inputs| step_cube(inputs, launch));
        return Some(());
    }
    if let Some(slot) = any.downcast_mut::<Slot<Fused<R>, Fused<R>>>() {
        direct(slot, |inputs| step_fused(inputs, launch));
        return Some(());
    }
    if let Some(slot) =
        any.downcast_mut::<Slot<FrugalTensor<CubeTensor<R>>, FrugalTensor<CubeTensor<R>>>>()
    {
        through_frugal(slot, launch.kind.charged_ops(), |inputs| {
            step_cube(inputs, launch)
        });
        return Some(());
    }
    if let Some(slot) = any.downcast_mut::<Slot<FrugalTensor<Fused<R>>, FrugalTensor<Fused<R>>>>() {
        through_frugal(slot, launch.kind.charged_ops(), |inputs| {
            step_fused(inputs, launch)
        });
        return Some(());
    }
    None
}

/// Which outputs are new buffers rather than their input's, updated in place.
type Copied = [bool; 3];

/// The result of a step on primitives: the outputs and which were copied, or the inputs
/// untouched.
type Stepped<F, I> = Result<(Outputs<F, I>, Copied), Inputs<F, I>>;

/// Runs `run` on primitives held by the plain backend.
fn direct<F, I>(slot: &mut Slot<F, I>, run: impl FnOnce(Inputs<F, I>) -> Stepped<F, I>) {
    let Some(Err(inputs)) = slot.take() else {
        unreachable!("a slot holds inputs until it is stepped");
    };
    *slot = Some(run(inputs).map(|(out, _)| out));
}

/// Runs `run` on the inner primitives of Frugal tensors, held directly or managed by a budget
/// or scope (restored first if evicted). The kernel writes a buffer in place only where
/// nothing else holds it (`writable`, fusion's handle status), so a cell whose recipe still
/// reads the old value keeps it. The outputs are held directly: the parameters and moments
/// outlive the step and a budget keeps them resident, and a recipe of the kernel would need
/// the step's scalars. Outputs updated in place keep their input's ledger record (same
/// bytes); a new buffer, or one whose record another tensor shares, is charged as new.
fn through_frugal<F, I>(
    slot: &mut Slot<FrugalTensor<F>, FrugalTensor<I>>,
    ops: [OpId; 3],
    run: impl FnOnce(Inputs<F, I>) -> Stepped<F, I>,
) where
    F: Clone + TensorMetadata,
    I: Clone + TensorMetadata,
{
    let Some(Err(inputs)) = slot.take() else {
        unreachable!("a slot holds inputs until it is stepped");
    };
    let state = inputs.param.state();
    let (param, param_record) = inputs.param.split();
    let (grad, grad_record) = inputs.grad.split();
    let (state_1, state_1_record) = inputs.state_1.split();
    let (state_2, state_2_record) = inputs.state_2.split();
    let inner = Inputs {
        param,
        grad,
        state_1,
        state_2,
    };
    let [param_op, state_1_op, state_2_op] = ops;
    *slot = Some(match run(inner) {
        Ok((out, copied)) => {
            let param = kept(state, param_record, copied[0], &out.param, param_op);
            let state_1 = kept(state, state_1_record, copied[1], &out.state_1, state_1_op);
            let state_2 = kept(state, state_2_record, copied[2], &out.state_2, state_2_op);
            Ok(Outputs {
                param: FrugalTensor::plain(out.param, param),
                state_1: FrugalTensor::plain(out.state_1, state_1),
                state_2: FrugalTensor::plain(out.state_2, state_2),
            })
        }
        Err(inner) => {
            let param = kept(state, param_record, false, &inner.param, param_op);
            let grad = kept(state, grad_record, false, &inner.grad, param_op);
            let state_1 = kept(state, state_1_record, false, &inner.state_1, state_1_op);
            let state_2 = kept(state, state_2_record, false, &inner.state_2, state_2_op);
            Err(Inputs {
                param: FrugalTensor::plain(inner.param, param),
                grad: FrugalTensor::plain(inner.grad, grad),
                state_1: FrugalTensor::plain(inner.state_1, state_1),
                state_2: FrugalTensor::plain(inner.state_2, state_2),
            })
        }
    });
}

/// The ledger record of an output: its input's if the buffer was updated in place and no
/// other tensor shares the record, else a new charge (attributed to `op`, the portable path's
/// last op for that output). A managed input whose cell was consumed may bring no record.
fn kept<P: TensorMetadata>(
    state: &'static DeviceState,
    record: Option<Arc<Storage>>,
    copied: bool,
    tensor: &P,
    op: OpId,
) -> Arc<Storage> {
    if let (Some(record), false) = (&record, copied) {
        // The buffer changed under its record: a cast autocast kept of it is stale.
        record.forget_cast();
    }
    match record {
        Some(record) if !copied && Arc::strong_count(&record) == 1 => record,
        _ => Arc::new(state.charge(tensor, op)),
    }
}

/// The kernel's tables on `client`'s device, uploaded once per device and kept (4 KiB).
/// Every optimizer uses the same tables (bitsandbytes' maps), so the device is the key.
fn tables_on<R: CubeRuntime>(tensor: &CubeTensor<R>, tables: &Tables) -> Handle {
    static CACHE: Mutex<Vec<(TypeId, String, Handle)>> = Mutex::new(Vec::new());
    let key = (TypeId::of::<R>(), format!("{:?}", tensor.device));
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, handle)) = cache.iter().find(|(t, d, _)| (*t, d) == (key.0, &key.1)) {
        return handle.clone();
    }
    let bytes: Vec<u8> = tables
        .concatenated()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let handle = tensor.client.create_from_slice(&bytes);
    cache.push((key.0, key.1, handle.clone()));
    handle
}

/// A tensor the kernel may write in place: contiguous and held by no one else (a copy
/// otherwise; `true` if copied).
fn writable<R: CubeRuntime>(tensor: CubeTensor<R>) -> (CubeTensor<R>, bool) {
    if tensor.is_contiguous() && tensor.can_mut() {
        return (tensor, false);
    }
    let tensor = burn_cubecl::kernel::into_contiguous(tensor);
    if tensor.can_mut() {
        return (tensor, true);
    }
    (tensor.copy(), true)
}

/// Launches the kernel on CubeCL tensors; the inputs back if their layout does not fit.
fn step_cube<R: CubeRuntime>(
    inputs: Inputs<CubeTensor<R>, CubeTensor<R>>,
    launch: &Launch,
) -> Stepped<CubeTensor<R>, CubeTensor<R>> {
    if !inputs.fit(launch, |t| (t.dtype, t.meta.shape().num_elements())) {
        return Err(inputs);
    }
    Ok(run_kernel(inputs, launch))
}

/// Makes the buffers writable and contiguous and launches the kernel (the layout already
/// checked by [`Launch::fits`]).
fn run_kernel<R: CubeRuntime>(
    inputs: Inputs<CubeTensor<R>, CubeTensor<R>>,
    launch: &Launch,
) -> (Outputs<CubeTensor<R>, CubeTensor<R>>, Copied) {
    let grad = burn_cubecl::kernel::into_contiguous(inputs.grad);
    let (param, param_copied) = writable(inputs.param);
    let (state_1, state_1_copied) = writable(inputs.state_1);
    let (state_2, state_2_copied) = writable(inputs.state_2);
    let checked = "dtypes, lengths and block size checked by Launch::fits";
    match &launch.kind {
        Kind::Full { first_step } => {
            let buffers = AdamWBuffers {
                param: &param.handle,
                grad: &grad.handle,
                moment_1: &state_1.handle,
                moment_2: &state_2.handle,
                len: launch.len,
            };
            frugal_kernels::adamw_update(&param.client, buffers, &launch.scalars, *first_step)
                .expect(checked);
            kernels::ADAMW_LAUNCHES.fetch_add(1, Relaxed);
        }
        Kind::Quantized { block_size, tables } => {
            let table = tables_on(&param, tables);
            let buffers = AdamW8bitBuffers {
                param: &param.handle,
                grad: &grad.handle,
                codes: &state_1.handle,
                absmax: &state_2.handle,
                len: launch.len,
            };
            frugal_kernels::adamw8bit_update(
                &param.client,
                buffers,
                &table,
                *block_size,
                &launch.scalars,
            )
            .expect(checked);
            kernels::ADAMW8BIT_LAUNCHES.fetch_add(1, Relaxed);
        }
    }
    (
        Outputs {
            param,
            state_1,
            state_2,
        },
        [param_copied, state_1_copied, state_2_copied],
    )
}

/// Registers the step as one custom operation of the fusion stream (it runs when the stream
/// is flushed, on the CubeCL tensors fusion holds by then).
fn step_fused<R: CubeRuntime>(
    inputs: Inputs<FusionTensor<FusionCubeRuntime<R>>, FusionTensor<FusionCubeRuntime<R>>>,
    launch: &Launch,
) -> Stepped<FusionTensor<FusionCubeRuntime<R>>, FusionTensor<FusionCubeRuntime<R>>> {
    if !inputs.fit(launch, |t| (t.dtype, t.shape.num_elements())) {
        return Err(inputs);
    }
    let outputs = [&inputs.param, &inputs.state_1, &inputs.state_2]
        .map(|t| (t.shape.clone(), t.dtype))
        .to_vec();
    match launch.kind {
        Kind::Full { .. } => kernels::FUSED_ADAMW.fetch_add(1, Relaxed),
        Kind::Quantized { .. } => kernels::FUSED_ADAMW8BIT.fetch_add(1, Relaxed),
    };
    let launch = launch.clone();
    let mut out = register_fused(
        launch.kind.op_name(),
        vec![inputs.param, inputs.grad, inputs.state_1, inputs.state_2],
        outputs,
        move |inputs| {
            let [param, grad, state_1, state_2]: [CubeTensor<R>; 4] =
                inputs.try_into().expect("four inputs");
            let inputs = Inputs {
                param,
                grad,
                state_1,
                state_2,
            };
            let (out, _) = run_kernel(inputs, &launch);
            vec![out.param, out.state_1, out.state_2]
        },
    )
    .into_iter();
    let (param, state_1, state_2) = (out.next(), out.next(), out.next());
    Ok((
        Outputs {
            param: param.expect("three outputs"),
            state_1: state_1.expect("three outputs"),
            state_2: state_2.expect("three outputs"),
        },
        // Whether fusion reuses the buffers is decided when the operation runs; the
        // outputs are the inputs' successors either way.
        [false; 3],
    ))
}
