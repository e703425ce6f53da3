//! The fused step's dispatch: finds the CubeCL buffers behind the step's tensors (CubeCL or
//! fusion primitives, held by Frugal or not) and runs `frugal_kernels::adamw8bit_update` on
//! them, in place; under fusion as one custom operation.

// A step that cannot take the kernel returns its inputs in the `Err` variant, for the portable
// path: large, but moved once per parameter and step.
#![allow(clippy::result_large_err)]

use std::any::{Any, TypeId};
use std::marker::PhantomData;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use burn_backend::{DType, TensorMetadata, TensorPrimitive};
use burn_core::tensor::backend::Backend;
use burn_core::tensor::{Int, Tensor};
use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::{
    FusionRuntime, FusionTensor,
    stream::{Operation, OperationStreams},
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use cubecl::server::Handle;
use frugal_kernels::{AdamW8bitBuffers, AdamW8bitScalars, WeightDecay};

use super::qmap::Tables;
use super::{Decay, QuantizedMoments, Scalars};
use crate::device::{DeviceState, Storage};
use crate::kernels::{self, cube::Cube};
use crate::op::{
    OpId,
    families::{float, int},
};
use crate::runtime::each_runtime;
use crate::tensor::FrugalTensor;

/// A step's inputs as primitives.
struct Inputs<F, I> {
    param: F,
    grad: F,
    codes: I,
    absmax: F,
}

/// A step's outputs as primitives.
struct Outputs<F, I> {
    param: F,
    codes: I,
    absmax: F,
}

/// The inputs, or the outputs once the kernel ran (or was registered, under fusion).
type Slot<F, I> = Option<Result<Outputs<F, I>, Inputs<F, I>>>;

/// What a launch needs besides the buffers.
struct Launch {
    scalars: AdamW8bitScalars,
    block_size: usize,
    len: usize,
}

impl Launch {
    /// Whether tensors of these dtypes and element counts are the layout the kernel takes.
    fn fits(
        &self,
        param: (DType, usize),
        grad: (DType, usize),
        codes: (DType, usize),
        absmax: (DType, usize),
    ) -> bool {
        let (blocks, words) = frugal_kernels::adamw8bit_layout(self.len, self.block_size);
        param == (DType::F32, self.len)
            && grad == (DType::F32, self.len)
            && codes == (DType::U32, 2 * words)
            && absmax == (DType::F32, 2 * blocks)
            && self.len > 0
            && self.len <= (u32::MAX as usize / 4) / self.block_size * self.block_size
            && self.block_size.is_multiple_of(4)
            && (4..=frugal_kernels::MAX_BLOCK_SIZE).contains(&self.block_size)
    }
}

/// The step by the fused kernel: `Ok` with the new parameter and moments, or `Err` with the
/// inputs untouched when the tensors are not CubeCL ones of a runtime this build knows (or
/// not in the layout the kernel takes).
#[allow(clippy::type_complexity)]
pub(super) fn step<B: Backend, const D: usize>(
    s: &Scalars,
    tables: &Tables,
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
        block_size,
        len,
    };
    let mut slot: Slot<B::FloatTensorPrimitive, B::IntTensorPrimitive> = Some(Err(Inputs {
        param: tensor.into_primitive().tensor(),
        grad: grad.into_primitive().tensor(),
        codes: codes.into_primitive(),
        absmax: absmax.into_primitive().tensor(),
    }));
    {
        let any = &mut slot as &mut dyn Any;
        each_runtime!(step_on(any, &launch, tables));
    }
    let float = |p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p));
    match slot.expect("given back") {
        Ok(out) => Ok((
            Tensor::<B, D>::from_primitive(TensorPrimitive::Float(out.param)),
            QuantizedMoments {
                codes: Tensor::<B, 1, Int>::from_primitive(out.codes),
                absmax: float(out.absmax),
                block_size,
                len,
            },
        )),
        Err(input) => Err((
            Tensor::from_primitive(TensorPrimitive::Float(input.param)),
            Tensor::from_primitive(TensorPrimitive::Float(input.grad)),
            QuantizedMoments {
                codes: Tensor::<B, 1, Int>::from_primitive(input.codes),
                absmax: float(input.absmax),
                block_size,
                len,
            },
        )),
    }
}

fn kernel_scalars(s: &Scalars) -> AdamW8bitScalars {
    AdamW8bitScalars {
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
fn step_on<R: CubeRuntime>(any: &mut dyn Any, launch: &Launch, tables: &Tables) -> Option<()> {
    type Fused<R> = FusionTensor<FusionCubeRuntime<R>>;
    if let Some(slot) = any.downcast_mut::<Slot<CubeTensor<R>, CubeTensor<R>>>() {
        direct(slot, |inputs| step_cube(inputs, launch, tables));
        return Some(());
    }
    if let Some(slot) = any.downcast_mut::<Slot<Fused<R>, Fused<R>>>() {
        direct(slot, |inputs| step_fused(inputs, launch, tables));
        return Some(());
    }
    if let Some(slot) =
        any.downcast_mut::<Slot<FrugalTensor<CubeTensor<R>>, FrugalTensor<CubeTensor<R>>>>()
    {
        through_frugal(slot, |inputs| step_cube(inputs, launch, tables));
        return Some(());
    }
    if let Some(slot) = any.downcast_mut::<Slot<FrugalTensor<Fused<R>>, FrugalTensor<Fused<R>>>>() {
        through_frugal(slot, |inputs| step_fused(inputs, launch, tables));
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
    let (codes, codes_record) = inputs.codes.split();
    let (absmax, absmax_record) = inputs.absmax.split();
    let inner = Inputs {
        param,
        grad,
        codes,
        absmax,
    };
    let sub = float::op(float::Op::float_sub);
    let or = int::op(int::Op::bitwise_or);
    let max = float::op(float::Op::float_max_dim);
    *slot = Some(match run(inner) {
        Ok((out, copied)) => {
            let param = kept(state, param_record, copied[0], &out.param, sub);
            let codes = kept(state, codes_record, copied[1], &out.codes, or);
            let absmax = kept(state, absmax_record, copied[2], &out.absmax, max);
            Ok(Outputs {
                param: FrugalTensor::plain(out.param, param),
                codes: FrugalTensor::plain(out.codes, codes),
                absmax: FrugalTensor::plain(out.absmax, absmax),
            })
        }
        Err(inner) => {
            let param = kept(state, param_record, false, &inner.param, sub);
            let grad = kept(state, grad_record, false, &inner.grad, sub);
            let codes = kept(state, codes_record, false, &inner.codes, or);
            let absmax = kept(state, absmax_record, false, &inner.absmax, max);
            Err(Inputs {
                param: FrugalTensor::plain(inner.param, param),
                grad: FrugalTensor::plain(inner.grad, grad),
                codes: FrugalTensor::plain(inner.codes, codes),
                absmax: FrugalTensor::plain(inner.absmax, absmax),
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
    tables: &Tables,
) -> Stepped<CubeTensor<R>, CubeTensor<R>> {
    let info = |t: &CubeTensor<R>| (t.dtype, t.meta.shape().num_elements());
    if !launch.fits(
        info(&inputs.param),
        info(&inputs.grad),
        info(&inputs.codes),
        info(&inputs.absmax),
    ) {
        return Err(inputs);
    }
    Ok(run_kernel(inputs, launch, tables))
}

/// Makes the buffers writable and contiguous and launches the kernel (the layout already
/// checked by [`Launch::fits`]).
fn run_kernel<R: CubeRuntime>(
    inputs: Inputs<CubeTensor<R>, CubeTensor<R>>,
    launch: &Launch,
    tables: &Tables,
) -> (Outputs<CubeTensor<R>, CubeTensor<R>>, Copied) {
    let grad = burn_cubecl::kernel::into_contiguous(inputs.grad);
    let (param, param_copied) = writable(inputs.param);
    let (codes, codes_copied) = writable(inputs.codes);
    let (absmax, absmax_copied) = writable(inputs.absmax);
    let table = tables_on(&param, tables);
    let buffers = AdamW8bitBuffers {
        param: &param.handle,
        grad: &grad.handle,
        codes: &codes.handle,
        absmax: &absmax.handle,
        len: launch.len,
    };
    frugal_kernels::adamw8bit_update(
        &param.client,
        buffers,
        &table,
        launch.block_size,
        &launch.scalars,
    )
    .expect("dtypes, lengths and block size checked by Launch::fits");
    kernels::ADAMW8BIT_LAUNCHES.fetch_add(1, Relaxed);
    (
        Outputs {
            param,
            codes,
            absmax,
        },
        [param_copied, codes_copied, absmax_copied],
    )
}

/// Registers the step as one custom operation of the fusion stream (it runs when the stream
/// is flushed, on the CubeCL tensors fusion holds by then).
fn step_fused<R: CubeRuntime>(
    inputs: Inputs<FusionTensor<FusionCubeRuntime<R>>, FusionTensor<FusionCubeRuntime<R>>>,
    launch: &Launch,
    tables: &Tables,
) -> Stepped<FusionTensor<FusionCubeRuntime<R>>, FusionTensor<FusionCubeRuntime<R>>> {
    let info = |t: &FusionTensor<FusionCubeRuntime<R>>| (t.dtype, t.shape.num_elements());
    if !launch.fits(
        info(&inputs.param),
        info(&inputs.grad),
        info(&inputs.codes),
        info(&inputs.absmax),
    ) {
        return Err(inputs);
    }
    let client = inputs.param.client.clone();
    let streams =
        OperationStreams::with_inputs([&inputs.param, &inputs.grad, &inputs.codes, &inputs.absmax]);
    let out = |t: &FusionTensor<FusionCubeRuntime<R>>| {
        TensorIr::uninit(client.create_empty_handle(), t.shape.clone(), t.dtype)
    };
    let outputs = [out(&inputs.param), out(&inputs.codes), out(&inputs.absmax)];
    let ins = [
        inputs.param.into_ir(),
        inputs.grad.into_ir(),
        inputs.codes.into_ir(),
        inputs.absmax.into_ir(),
    ];
    let desc = CustomOpIr::new("frugal_adamw8bit", &ins, &outputs);
    kernels::FUSED_ADAMW8BIT.fetch_add(1, Relaxed);
    let mut out = client
        .register(
            streams,
            OperationIr::Custom(desc.clone()),
            FusedStep::<R> {
                desc,
                scalars: launch.scalars,
                block_size: launch.block_size,
                len: launch.len,
                tables: tables.clone(),
                _runtime: PhantomData,
            },
        )
        .into_iter();
    let (param, codes, absmax) = (out.next(), out.next(), out.next());
    Ok((
        Outputs {
            param: param.expect("three outputs"),
            codes: codes.expect("three outputs"),
            absmax: absmax.expect("three outputs"),
        },
        // Whether fusion reuses the buffers is decided when the operation runs; the
        // outputs are the inputs' successors either way.
        [false; 3],
    ))
}

/// The fusion custom operation of [`step_fused`].
#[derive(Debug)]
struct FusedStep<R> {
    desc: CustomOpIr,
    scalars: AdamW8bitScalars,
    block_size: usize,
    len: usize,
    tables: Tables,
    _runtime: PhantomData<fn() -> R>,
}

impl<R: CubeRuntime> Operation<FusionCubeRuntime<R>> for FusedStep<R> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>,
    ) {
        let ([param, grad, codes, absmax], [param_out, codes_out, absmax_out]) =
            self.desc.as_fixed();
        let inputs = Inputs {
            param: handles.get_float_tensor::<Cube<R>>(param),
            grad: handles.get_float_tensor::<Cube<R>>(grad),
            codes: handles.get_int_tensor::<Cube<R>>(codes),
            absmax: handles.get_float_tensor::<Cube<R>>(absmax),
        };
        let launch = Launch {
            scalars: self.scalars,
            block_size: self.block_size,
            len: self.len,
        };
        let (out, _) = run_kernel(inputs, &launch, &self.tables);
        handles.register_float_tensor::<Cube<R>>(&param_out.id, out.param);
        handles.register_int_tensor::<Cube<R>>(&codes_out.id, out.codes);
        handles.register_float_tensor::<Cube<R>>(&absmax_out.id, out.absmax);
    }
}
