//! One fusion custom operation for any of Frugal's kernel calls on CubeCL tensors: a call
//! says which outputs it makes from which inputs and launches on `CubeTensor`s; this module
//! downcasts the inner backend's primitives (with or without fusion) and, under fusion,
//! registers the call as one custom operation of the stream after checking that it will
//! launch.

use std::any::{Any, TypeId};
use std::fmt::Debug;
use std::marker::PhantomData;

use burn_backend::{DType, Shape};
use burn_cubecl::{CubeRuntime, fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::{
    FusionRuntime, FusionTensor,
    stream::{Operation, OperationStreams},
};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::cube::Cube;
use crate::runtime::each_runtime;

/// A kernel call on float tensors of one CubeCL runtime.
pub(crate) trait CubeCall: Clone + Debug + Send + Sync + 'static {
    /// The custom operation's name in fusion's stream.
    const NAME: &'static str;

    /// The outputs' shapes and dtypes for inputs of these shapes and dtypes, or `None` when
    /// the kernels do not take them.
    fn outputs(&self, inputs: &[(&Shape, DType)]) -> Option<Vec<(Shape, DType)>>;

    /// Whether `device` takes the call (dtype support, grid limits), checked before a fused
    /// call is registered, so that a registered operation always launches.
    fn device_takes<R: CubeRuntime>(&self, device: &R::Device, inputs: &[(&Shape, DType)]) -> bool;

    /// Launches the kernels; the outputs as [`Self::outputs`] describes them, or `None` if
    /// they do not apply.
    fn launch<R: CubeRuntime>(&self, inputs: &[CubeTensor<R>]) -> Option<Vec<CubeTensor<R>>>;
}

/// The inputs of one call and, once run, its outputs, as a `dyn Any` slot the runtimes
/// downcast.
pub(crate) struct Slot<P> {
    pub(crate) inputs: Vec<P>,
    pub(crate) outputs: Option<Vec<P>>,
}

/// Whether `P` is the float primitive of a CubeCL runtime this build knows, with or without
/// fusion.
pub(crate) fn knows<P: Any>() -> bool {
    each_runtime!(knows_on(TypeId::of::<P>())).unwrap_or(false)
}

fn knows_on<R: CubeRuntime>(primitive: TypeId) -> Option<bool> {
    (primitive == TypeId::of::<CubeTensor<R>>()
        || primitive == TypeId::of::<FusionTensor<FusionCubeRuntime<R>>>())
    .then_some(true)
}

/// Runs `call` on the slot's inputs if they are primitives of a known runtime and the
/// kernels take them; `true` when the outputs are in the slot.
pub(crate) fn run<P: Any>(slot: &mut Slot<P>, call: &impl CubeCall) -> bool {
    let any = slot as &mut dyn Any;
    each_runtime!(run_on(any, call)).unwrap_or(false)
}

fn run_on<R: CubeRuntime>(any: &mut dyn Any, call: &impl CubeCall) -> Option<bool> {
    if let Some(slot) = any.downcast_mut::<Slot<CubeTensor<R>>>() {
        slot.outputs = call.launch(&slot.inputs);
        return Some(slot.outputs.is_some());
    }
    let slot = any.downcast_mut::<Slot<FusionTensor<FusionCubeRuntime<R>>>>()?;
    slot.outputs = register::<R, _>(&slot.inputs, call);
    Some(slot.outputs.is_some())
}

/// Registers `call` as one custom operation of the fusion stream, if it will launch.
fn register<R: CubeRuntime, C: CubeCall>(
    inputs: &[FusionTensor<FusionCubeRuntime<R>>],
    call: &C,
) -> Option<Vec<FusionTensor<FusionCubeRuntime<R>>>> {
    let described: Vec<(&Shape, DType)> = inputs.iter().map(|t| (&t.shape, t.dtype)).collect();
    let outputs = call.outputs(&described)?;
    let client = inputs.first()?.client.clone();
    if !call.device_takes::<R>(client.device(), &described) {
        return None;
    }
    let streams = OperationStreams::with_inputs(inputs);
    let outputs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let irs: Vec<TensorIr> = inputs.iter().map(|t| t.clone().into_ir()).collect();
    let desc = CustomOpIr::new(C::NAME, &irs, &outputs);
    Some(client.register(
        streams,
        OperationIr::Custom(desc.clone()),
        FusedCall::<R, C> {
            desc,
            call: call.clone(),
            _runtime: PhantomData,
        },
    ))
}

/// The fusion custom operation of [`register`].
#[derive(Debug)]
struct FusedCall<R, C> {
    desc: CustomOpIr,
    call: C,
    _runtime: PhantomData<fn() -> R>,
}

impl<R: CubeRuntime, C: CubeCall> Operation<FusionCubeRuntime<R>> for FusedCall<R, C> {
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
        let outputs = self.call.launch(&inputs).unwrap_or_else(|| {
            panic!(
                "frugal: kernel `{}` refused a call that was checked when it was registered",
                C::NAME
            )
        });
        for (tensor, ir) in outputs.into_iter().zip(&self.desc.outputs) {
            handles.register_float_tensor::<Cube<R>>(&ir.id, tensor);
        }
    }
}

/// `tensor` itself if contiguous, else a contiguous copy.
pub(crate) fn contiguous<R: CubeRuntime>(tensor: &CubeTensor<R>) -> CubeTensor<R> {
    if tensor.is_contiguous() {
        tensor.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(tensor.clone())
    }
}

/// A contiguous tensor over `handle`, on `like`'s client and device.
pub(crate) fn wrap<R: CubeRuntime>(
    like: &CubeTensor<R>,
    handle: cubecl::server::Handle,
    shape: Shape,
    dtype: DType,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        handle,
        dtype,
    )
}
