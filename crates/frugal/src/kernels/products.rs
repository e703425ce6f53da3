//! Matrix products on cuBLASLt for inner backends on frugal-cuda's runtime (fused or not):
//! `float_matmul`, `linear` and the two products of its backward pass. The layout work is
//! here; the library call is `frugal_cuda::matmul`, on the server's stream.
//!
//! How each product becomes one strided-batched GEMM is `frugal_cuda::gemm::plan`'s (tested
//! without a GPU); an operand whose dimensions do not collapse into the strides it needs is
//! made contiguous first. Under fusion a product is one custom operation whose
//! output shape is known when it is registered; its strides are only known when it runs, so
//! that is where the layout is decided (and where CubeCL's own product runs if the library
//! refuses).

use std::sync::OnceLock;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::ops::{FloatTensorOps, ModuleOps};
use burn_backend::{DType, Shape};
use burn_cubecl::{fusion::FusionCubeRuntime, tensor::CubeTensor};
use burn_fusion::FusionTensor;
use frugal_cuda::FrugalCudaRuntime;
use frugal_cuda::gemm::{GemmDtype, Product, output_shape, plan};

use super::cube::Cube;
use super::custom::register_fused;
use super::{BLAS_PRODUCTS, FUSED_BLAS_PRODUCTS, ProductCall, ProductSlot, Products};

type R = FrugalCudaRuntime;
type Tensor = CubeTensor<R>;
type Fused = FusionTensor<FusionCubeRuntime<R>>;

/// Whether cuBLASLt loads here (asked once per process).
pub(crate) fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        let present = frugal_cuda::blas_available();
        if !present {
            log::warn!(
                "frugal: libcublasLt was not found; matrix products stay on CubeCL's kernels"
            );
        }
        present
    })
}

/// Whether every GPU has TF32 tensor cores (asked once per process; see [`super::Products`]).
pub(crate) fn tf32_cores() -> bool {
    frugal_cuda::tf32_cores()
}

/// Whether products of `P`'s primitives run on cuBLASLt: frugal-cuda's tensors, fused or
/// not, with the library present.
pub(crate) fn takes<P: 'static>() -> bool {
    use std::any::TypeId;
    let id = TypeId::of::<P>();
    (id == TypeId::of::<Tensor>() || id == TypeId::of::<Fused>()) && library_present()
}

fn product(call: ProductCall) -> Product {
    match call {
        ProductCall::Matmul => Product::Matmul,
        ProductCall::Linear => Product::Linear,
        ProductCall::LinearX => Product::LinearX,
        ProductCall::LinearWeight => Product::LinearWeight,
    }
}

/// Logs, once per distinct reason, a product that cuBLASLt did not take (it then runs on
/// CubeCL's kernels): a slower step should be explainable from the log.
fn refused(call: ProductCall, shapes: &[&[usize]], error: &frugal_cuda::gemm::GemmError) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let reason = error.to_string();
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&reason) {
        log::warn!("frugal: {call:?} of shapes {shapes:?} runs on CubeCL's kernels: {reason}");
        seen.push(reason);
    }
}

fn gemm_dtype(dtype: DType) -> Option<GemmDtype> {
    match dtype {
        DType::F32 => Some(GemmDtype::F32),
        DType::F16 => Some(GemmDtype::F16),
        DType::BF16 => Some(GemmDtype::BF16),
        _ => None,
    }
}

/// Runs `slot`'s product on cuBLASLt if its primitives are frugal-cuda's; `true` when the
/// output is in the slot.
pub(crate) fn run<P: 'static>(slot: &mut ProductSlot<P>, products: Products) -> bool {
    let any = slot as &mut dyn std::any::Any;
    if let Some(slot) = any.downcast_mut::<ProductSlot<Tensor>>() {
        if !library_present() {
            return false;
        }
        let inputs: Vec<&Tensor> = slot.inputs.iter().flatten().collect();
        slot.output = direct(slot.call, &inputs, products);
        return slot.output.is_some();
    }
    if let Some(slot) = any.downcast_mut::<ProductSlot<Fused>>() {
        if !library_present() {
            return false;
        }
        slot.output = fused(slot.call, &slot.inputs, products);
        return slot.output.is_some();
    }
    false
}

fn contiguous(tensor: &Tensor) -> Tensor {
    if tensor.is_contiguous() {
        tensor.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(tensor.clone())
    }
}

/// Runs `call` on cuBLASLt; `None` if it does not apply or the library refused (nothing was
/// queued then).
fn direct(call: ProductCall, inputs: &[&Tensor], products: Products) -> Option<Tensor> {
    let dtype = inputs[0].dtype;
    let gemm = gemm_dtype(dtype)?;
    let tf32 = products.blas_for(dtype, tf32_cores())?;
    if inputs
        .iter()
        .any(|t| t.dtype != dtype || t.qparams.is_some())
    {
        return None;
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.meta.shape().as_slice()).collect();
    let out_shape = output_shape(product(call), &shapes)?;
    let strides: Vec<&[usize]> = inputs.iter().map(|t| &**t.meta.strides()).collect();
    let (owned, shape) = match plan(product(call), &shapes, &strides, gemm, tf32) {
        Some(shape) => (None, shape),
        None => {
            let owned: Vec<Tensor> = inputs.iter().map(|t| contiguous(t)).collect();
            let strides: Vec<&[usize]> = owned.iter().map(|t| &**t.meta.strides()).collect();
            let shape = plan(product(call), &shapes, &strides, gemm, tf32)?;
            (Some(owned), shape)
        }
    };
    let operands: Vec<&Tensor> = match &owned {
        Some(owned) => owned.iter().collect(),
        None => inputs.to_vec(),
    };
    // The library's left operand is the product's left one: for `linear_x_backward` the
    // gradient (second input), for the others the first input.
    let (lhs, rhs) = match call {
        ProductCall::LinearX => (operands[1], operands[0]),
        _ => (operands[0], operands[1]),
    };
    let first = inputs[0];
    let elements: usize = out_shape.iter().product();
    if elements == 0 {
        return None;
    }
    let out = first.client.empty(elements * gemm.size());
    if let Err(e) = frugal_cuda::matmul(&first.device, &shape, &lhs.handle, &rhs.handle, &out) {
        refused(call, &shapes, &e);
        return None;
    }
    BLAS_PRODUCTS.fetch_add(1, Relaxed);
    Some(CubeTensor::new_contiguous(
        first.client.clone(),
        first.device,
        Shape::from(out_shape),
        out,
        dtype,
    ))
}

/// CubeCL's own product, for a registered operation the library then refused.
fn cube_fallback(call: ProductCall, inputs: Vec<Tensor>) -> Tensor {
    let mut inputs = inputs.into_iter();
    let (a, b) = (
        inputs.next().expect("two inputs"),
        inputs.next().expect("two inputs"),
    );
    match call {
        ProductCall::Matmul => Cube::<R>::float_matmul(a, b),
        ProductCall::Linear => Cube::<R>::linear(a, b, None),
        ProductCall::LinearX => Cube::<R>::linear_x_backward(a, b),
        ProductCall::LinearWeight => Cube::<R>::linear_weight_backward(a, b),
    }
}

/// Registers `call` as one fusion custom operation (after the checks that decide whether it
/// is ours, so a registered operation always produces its output).
fn fused(call: ProductCall, inputs: &[Option<Fused>], products: Products) -> Option<Fused> {
    let inputs: Vec<&Fused> = inputs.iter().flatten().collect();
    let dtype = inputs[0].dtype;
    gemm_dtype(dtype)?;
    products.blas_for(dtype, tf32_cores())?;
    if inputs.iter().any(|t| t.dtype != dtype) {
        return None;
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
    let out_shape = output_shape(product(call), &shapes)?;
    FUSED_BLAS_PRODUCTS.fetch_add(1, Relaxed);
    register_fused(
        "frugal_blas_product",
        inputs.into_iter().cloned().collect(),
        vec![(Shape::from(out_shape), dtype)],
        move |inputs: Vec<Tensor>| {
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let out = direct(call, &refs, products).unwrap_or_else(|| cube_fallback(call, inputs));
            vec![out]
        },
    )
    .into_iter()
    .next()
}
