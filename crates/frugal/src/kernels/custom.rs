//! One fusion custom operation for any of Frugal's kernel calls on CubeCL tensors: a call
//! says which outputs it makes from which inputs and launches on `CubeTensor`s; this module
//! downcasts the inner backend's primitives (with or without fusion) and, under fusion,
//! registers the call as one custom operation of the stream after checking that it will
//! launch. Calls that do their own downcasts (the cast, the embedding backward, the products,
//! the optimizer step, the unscale) register through [`register_fused`] too.

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
    let call = call.clone();
    Some(register_fused(
        C::NAME,
        inputs.to_vec(),
        outputs,
        move |inputs: Vec<CubeTensor<R>>| {
            call.launch(&inputs).unwrap_or_else(|| {
                panic!(
                    "frugal: kernel `{}` refused a call that was checked when it was registered",
                    C::NAME
                )
            })
        },
    ))
}

/// Registers one custom operation named `name` on the fusion stream of `inputs`: its outputs
/// are new tensors of the given shapes and dtypes, and when fusion runs it, `run` gets the
/// inputs as the `CubeTensor`s fusion holds by then and returns the outputs in that order.
/// Every fused call goes through here, so that the streams, the descriptions and the handles
/// are done one way. The inputs are consumed: a caller that keeps its tensors passes clones,
/// so that fusion marks them read-only rather than writable in place.
pub(crate) fn register_fused<R, F>(
    name: &'static str,
    inputs: Vec<FusionTensor<FusionCubeRuntime<R>>>,
    outputs: Vec<(Shape, DType)>,
    run: F,
) -> Vec<FusionTensor<FusionCubeRuntime<R>>>
where
    R: CubeRuntime,
    F: Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync + 'static,
{
    let client = inputs
        .first()
        .expect("a fused call has inputs")
        .client
        .clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let outputs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let irs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &irs, &outputs);
    client.register(
        streams,
        OperationIr::Custom(desc.clone()),
        FusedOp::<R, F> {
            desc,
            run,
            _runtime: PhantomData,
        },
    )
}

/// The fusion custom operation of [`register_fused`].
struct FusedOp<R, F> {
    desc: CustomOpIr,
    run: F,
    _runtime: PhantomData<fn() -> R>,
}

// Fusion wants its operations `Debug`; a closure is not, and the description names the call.
impl<R, F> Debug for FusedOp<R, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedOp")
            .field("desc", &self.desc)
            .finish_non_exhaustive()
    }
}

impl<R, F> Operation<FusionCubeRuntime<R>> for FusedOp<R, F>
where
    R: CubeRuntime,
    F: Fn(Vec<CubeTensor<R>>) -> Vec<CubeTensor<R>> + Send + Sync + 'static,
{
    fn execute(
        &self,
        handles: &mut HandleContainer<<FusionCubeRuntime<R> as FusionRuntime>::FusionHandle>,
    ) {
        // `Cube<R>`'s float and int accessors are the same today (both hold a `CubeTensor`);
        // following the dtype keeps ids, 8-bit codes and flags on the int side if that changes.
        let inputs: Vec<CubeTensor<R>> = self
            .desc
            .inputs
            .iter()
            .map(|ir| {
                if ir.dtype.is_float() {
                    handles.get_float_tensor::<Cube<R>>(ir)
                } else {
                    handles.get_int_tensor::<Cube<R>>(ir)
                }
            })
            .collect();
        let outputs = (self.run)(inputs);
        debug_assert_eq!(outputs.len(), self.desc.outputs.len(), "{}", self.desc.id);
        for (tensor, ir) in outputs.into_iter().zip(&self.desc.outputs) {
            if ir.dtype.is_float() {
                handles.register_float_tensor::<Cube<R>>(&ir.id, tensor);
            } else {
                handles.register_int_tensor::<Cube<R>>(&ir.id, tensor);
            }
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
