//! Tensors brought back from host memory onto frugal-cuda's runtime (fused or not) without
//! the host copy `ComputeClient::create` makes: the buffer is allocated as CubeCL's
//! `from_data` allocates it, and the host bytes (pinned, when they were read back from this
//! runtime) go to `frugal_cuda::upload`, one DMA on the server's stream, the caller not
//! waiting. Under fusion the buffer is registered as `Fusion::float_from_data` registers it.

use std::any::Any;

use burn_backend::{Shape, TensorData};
use burn_cubecl::{fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::{FusionTensor, NoOp, stream::OperationStreams};
use burn_ir::{BackendIr, InitOperationIr, OperationIr};
use burn_std::Metadata;
use cubecl::Runtime;
use cubecl::server::CopyDescriptor;
use frugal_cuda::{FrugalCudaDevice, FrugalCudaRuntime};

use super::cube::Cube;

type R = FrugalCudaRuntime;

/// `data` on `device` as primitive `P` if `P` is frugal-cuda's tensor (fused or not); else
/// `data` back, for the backend's own `from_data`.
pub(crate) fn try_upload<P: Any, D: Any>(data: TensorData, device: &D) -> Result<P, TensorData> {
    let Some(device) = (device as &dyn Any).downcast_ref::<FrugalCudaDevice>() else {
        return Err(data);
    };
    let mut slot: Option<P> = None;
    let any = &mut slot as &mut dyn Any;
    if let Some(slot) = any.downcast_mut::<Option<CubeTensor<R>>>() {
        *slot = Some(upload(data, device));
    } else if let Some(slot) = any.downcast_mut::<Option<FusionTensor<FusionCubeRuntime<R>>>>() {
        *slot = Some(register_fused(upload(data, device)));
    } else {
        return Err(data);
    }
    Ok(slot.expect("filled above"))
}

/// What burn-cubecl's `from_data` does, with the bytes handed over instead of copied.
fn upload(data: TensorData, device: &FrugalCudaDevice) -> CubeTensor<R> {
    let client = R::client(device);
    let elem_size = data.dtype.size();
    let layout = client.empty_tensor(data.shape.clone(), elem_size);
    let descriptor = CopyDescriptor::new(
        layout.memory.clone().binding(),
        data.shape.clone(),
        layout.strides.clone(),
        elem_size,
    );
    frugal_cuda::upload(device, descriptor, data.bytes);
    let shape: Shape = (&data.shape).into();
    CubeTensor::new(
        client,
        layout.memory,
        Metadata::new(shape, layout.strides),
        *device,
        data.dtype,
    )
}

/// Hands an allocated tensor to fusion as `Fusion::float_from_data` does (an init
/// operation; the handle is the same for every tensor kind).
fn register_fused(tensor: CubeTensor<R>) -> FusionTensor<FusionCubeRuntime<R>> {
    let client = burn_fusion::get_client::<Cube<R>>(&tensor.device);
    let shape = burn_backend::TensorMetadata::shape(&tensor);
    let dtype = tensor.dtype;
    let handle = Cube::<R>::float_tensor_handle(tensor);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            OperationStreams::default(),
            OperationIr::Init(desc),
            NoOp::<Cube<R>>::new(),
        )
        .into_iter()
        .next()
        .expect("an init operation has one output")
}
