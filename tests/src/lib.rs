//! Test harness for Frugal: differential cases that call one Backend method at a time on the
//! inner backend and on `Frugal<inner>` with the same inputs, and compare the results bit for
//! bit.
//!
//! A case is a function generic over the backend, written once with [`cases!`]; the harness
//! instantiates it for each backend pair it runs on.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn::tensor::{BoolStore, DType, Distribution, FloatDType, IntDType, Shape, TensorData};
use frugal::Frugal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub mod cases;
pub mod compare;

/// The CPU inner backend every case runs on.
pub type Inner = NdArray;
/// Frugal over [`Inner`].
pub type Wrapped = Frugal<Inner>;
/// Device of [`Inner`] (and of [`Wrapped`]).
pub type CpuDevice = <Inner as burn::tensor::backend::BackendTypes>::Device;

/// A value read back from a backend, compared between the two runs of a case.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// A tensor's dtype, shape and raw bytes.
    Data {
        /// Data type.
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// Raw little-endian bytes, compared exactly.
        bytes: Vec<u8>,
    },
    /// Any other value, by its `Debug` text.
    Value(String),
    /// The device a tensor reports, by its `Debug` text. Compared in full between NdArray and
    /// `Frugal<NdArray>`; across runtimes ([`run_side`]) only its presence counts, because a
    /// runtime of its own names its device type differently by design (burn-cuda's `Cuda(0)`,
    /// frugal-cuda's `FrugalCuda(0)`).
    Device(String),
}

impl Out {
    /// An `Out` from tensor data.
    pub fn data(data: TensorData) -> Self {
        Out::Data {
            dtype: data.dtype,
            shape: data.shape.to_vec(),
            bytes: data.as_bytes().to_vec(),
        }
    }

    /// An `Out` from any `Debug` value.
    pub fn value(value: impl std::fmt::Debug) -> Self {
        Out::Value(format!("{value:?}"))
    }

    /// An `Out` from a device (see [`Out::Device`]).
    pub fn device(device: impl std::fmt::Debug) -> Self {
        Out::Device(format!("{device:?}"))
    }
}

/// Reads a float tensor.
pub fn rf<B: Backend>(t: FloatTensor<B>) -> Out {
    Out::data(burn::tensor::read_sync(B::float_into_data(t)).expect("float read"))
}

/// Reads an int tensor.
pub fn ri<B: Backend>(t: IntTensor<B>) -> Out {
    Out::data(burn::tensor::read_sync(B::int_into_data(t)).expect("int read"))
}

/// Reads a bool tensor.
pub fn rb<B: Backend>(t: BoolTensor<B>) -> Out {
    Out::data(burn::tensor::read_sync(B::bool_into_data(t)).expect("bool read"))
}

/// Reads a quantized tensor (its packed values and parameters).
pub fn rq<B: Backend>(t: QuantizedTensor<B>) -> Out {
    Out::data(burn::tensor::read_sync(B::q_into_data(t)).expect("quantized read"))
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Random f32 data in [-2, 2).
pub fn float_data(shape: &[usize], seed: u64) -> TensorData {
    let mut rng = rng(seed);
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    TensorData::new(values, shape.to_vec())
}

/// A random float tensor in [-2, 2).
pub fn float<B: Backend>(shape: &[usize], seed: u64, device: &B::Device) -> FloatTensor<B> {
    B::float_from_data(float_data(shape, seed), device)
}

/// A random float tensor in [0.1, 2), for ops defined on positive numbers.
pub fn positive<B: Backend>(shape: &[usize], seed: u64, device: &B::Device) -> FloatTensor<B> {
    let mut rng = rng(seed);
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(0.1..2.0)).collect();
    B::float_from_data(TensorData::new(values, shape.to_vec()), device)
}

/// A random float tensor in (-0.9, 0.9), for ops defined on (-1, 1).
pub fn unit<B: Backend>(shape: &[usize], seed: u64, device: &B::Device) -> FloatTensor<B> {
    let mut rng = rng(seed);
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-0.9..0.9)).collect();
    B::float_from_data(TensorData::new(values, shape.to_vec()), device)
}

/// A random int tensor with values in `[low, high)`, in the backend's default int dtype.
pub fn int<B: Backend>(
    shape: &[usize],
    low: i64,
    high: i64,
    seed: u64,
    device: &B::Device,
) -> IntTensor<B> {
    let mut rng = rng(seed);
    let n: usize = shape.iter().product();
    let values: Vec<i64> = (0..n).map(|_| rng.random_range(low..high)).collect();
    ints::<B>(&values, shape, device)
}

/// An int tensor with the given values, in the device's default int dtype.
pub fn ints<B: Backend>(values: &[i64], dims: &[usize], device: &B::Device) -> IntTensor<B> {
    let tensor = B::int_from_data(TensorData::new(values.to_vec(), dims.to_vec()), device);
    B::int_cast(tensor, int_dtype::<B>(device))
}

/// A random bool tensor.
pub fn boolean<B: Backend>(shape: &[usize], seed: u64, device: &B::Device) -> BoolTensor<B> {
    let mut rng = rng(seed);
    let n: usize = shape.iter().product();
    let values: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
    B::bool_from_data(TensorData::new(values, shape.to_vec()), device)
}

/// A random tensor quantized with the backend's default scheme.
pub fn quantized<B: Backend>(shape: &[usize], seed: u64, device: &B::Device) -> QuantizedTensor<B> {
    let scheme = <B::QuantizedTensorPrimitive as burn::tensor::quantization::QTensorPrimitive>::default_scheme();
    B::quantize_dynamic(float::<B>(shape, seed, device), &scheme)
}

/// The device's default float dtype.
pub fn float_dtype<B: Backend>(device: &B::Device) -> FloatDType {
    burn::tensor::get_device_settings::<B>(device).float_dtype
}

/// The device's default int dtype.
pub fn int_dtype<B: Backend>(device: &B::Device) -> IntDType {
    burn::tensor::get_device_settings::<B>(device).int_dtype
}

/// The device's default bool dtype.
pub fn bool_dtype<B: Backend>(device: &B::Device) -> BoolStore {
    burn::tensor::get_device_settings::<B>(device).bool_dtype
}

/// A shape from dims.
pub fn shape(dims: &[usize]) -> Shape {
    Shape::from(dims.to_vec())
}

/// Every reduction of `scatter_nd`.
pub const UPDATE_OPS: [burn::tensor::IndexingUpdateOp; 5] = [
    burn::tensor::IndexingUpdateOp::Assign,
    burn::tensor::IndexingUpdateOp::Add,
    burn::tensor::IndexingUpdateOp::Mul,
    burn::tensor::IndexingUpdateOp::Min,
    burn::tensor::IndexingUpdateOp::Max,
];

/// The default distribution, re-exported for cases.
pub const UNIFORM: Distribution = Distribution::Default;

/// A case instantiated for wgpu (or Frugal over wgpu).
#[cfg(feature = "wgpu")]
pub type WgpuCase = fn(&burn::backend::wgpu::WgpuDevice) -> Vec<Out>;

/// A case instantiated for burn-cuda.
#[cfg(feature = "frugal-cuda")]
pub type CudaCase = fn(&burn::backend::cuda::CudaDevice) -> Vec<Out>;

/// A case instantiated for frugal-cuda's runtime.
#[cfg(feature = "frugal-cuda")]
pub type FrugalCudaCase = fn(&frugal_cuda::FrugalCudaDevice) -> Vec<Out>;

/// One differential case, instantiated for each backend it runs on.
pub struct Case {
    /// The case's name: the Backend method it is written for.
    pub name: &'static str,
    /// The case on the inner CPU backend.
    pub inner: fn(&CpuDevice) -> Vec<Out>,
    /// The case on Frugal over the inner CPU backend.
    pub wrapped: fn(&CpuDevice) -> Vec<Out>,
    /// The case on wgpu and Frugal over wgpu.
    #[cfg(feature = "wgpu")]
    pub wgpu: (WgpuCase, WgpuCase),
    /// The case on burn-cuda and on frugal-cuda's runtime.
    #[cfg(feature = "frugal-cuda")]
    pub cuda: (CudaCase, FrugalCudaCase),
}

/// Defines differential cases: `name(device) { body }`, where the body is generic over `B`
/// and returns the values to compare. Generates the functions and `pub fn cases()`.
#[macro_export]
macro_rules! cases {
    ($($name:ident($dev:ident) $body:block)*) => {
        $(
            #[allow(non_snake_case, unused_variables, clippy::redundant_clone)]
            pub fn $name<B: burn::tensor::backend::Backend>($dev: &B::Device) -> Vec<$crate::Out> $body
        )*

        /// The cases of this file, in order.
        pub fn cases() -> Vec<$crate::Case> {
            vec![$($crate::Case {
                name: stringify!($name),
                inner: $name::<$crate::Inner>,
                wrapped: $name::<$crate::Wrapped>,
                #[cfg(feature = "wgpu")]
                wgpu: (
                    $name::<burn::backend::wgpu::Wgpu>,
                    $name::<frugal::Frugal<burn::backend::wgpu::Wgpu>>,
                ),
                #[cfg(feature = "frugal-cuda")]
                cuda: (
                    $name::<burn::backend::Cuda>,
                    $name::<frugal_cuda::FrugalCuda>,
                ),
            }),*]
        }
    };
}

/// Cases touch the inner backend's global RNG; running them one at a time keeps seeded
/// results reproducible while the test harness runs tests on several threads.
static SERIAL: Mutex<()> = Mutex::new(());

/// The seed set on both backends before each run of a case.
pub const SEED: u64 = 0x5eed;

/// Runs `f` after seeding, catching a panic as `Err(message)`.
pub fn run_seeded<D, B: Backend<Device = D>>(
    f: fn(&D) -> Vec<Out>,
    device: &D,
) -> Result<Vec<Out>, String> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(device, SEED);
    catch_unwind(AssertUnwindSafe(|| f(device))).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

/// Runs each case on the inner backend and on Frugal; both must give the same outputs bit
/// for bit, or panic with the same message (a method the inner backend does not support).
/// Returns the names of cases where the inner backend panicked.
pub fn check_cases(cases: &[Case]) -> Vec<&'static str> {
    let device = CpuDevice::default();
    let mut failures = Vec::new();
    let mut unsupported = Vec::new();
    for case in cases {
        let inner = run_seeded::<_, Inner>(case.inner, &device);
        let wrapped = run_seeded::<_, Wrapped>(case.wrapped, &device);
        if inner.is_err() {
            unsupported.push(case.name);
        }
        if inner != wrapped {
            failures.push(format!(
                "{}: inner {:?}\n   frugal {:?}",
                case.name,
                short(&inner),
                short(&wrapped)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ between NdArray and Frugal<NdArray>:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    unsupported
}

/// Runs one side of the cases at `indices`, in order, printing one line per case: `CASE
/// <index> <name> ok <digest> <readings>` (see [`compare::encode`]) or `CASE <index> <name>
/// panic <message>`. Sides: `wgpu` (Wgpu), `frugal-wgpu` (`Frugal<Wgpu>`), `cuda` (burn-cuda),
/// `frugal-cuda` (frugal-cuda's runtime). Stops after the first panic: a panic inside a fusion
/// server leaves the device unusable for the rest of the process, so the caller starts a fresh
/// one.
#[cfg_attr(
    not(any(feature = "wgpu", feature = "frugal-cuda")),
    allow(unreachable_code, unused_variables, clippy::never_loop)
)]
pub fn run_side(cases: &[Case], side: &str, indices: &[usize]) {
    for &index in indices {
        let case = &cases[index];
        let result: Result<Vec<Out>, String> = match side {
            #[cfg(feature = "wgpu")]
            "wgpu" => run_seeded::<_, burn::backend::wgpu::Wgpu>(case.wgpu.0, &Default::default()),
            #[cfg(feature = "wgpu")]
            "frugal-wgpu" => {
                run_seeded::<_, Frugal<burn::backend::wgpu::Wgpu>>(case.wgpu.1, &Default::default())
            }
            #[cfg(feature = "frugal-cuda")]
            "cuda" => run_seeded::<_, burn::backend::Cuda>(case.cuda.0, &Default::default()),
            #[cfg(feature = "frugal-cuda")]
            "frugal-cuda" => {
                run_seeded::<_, frugal_cuda::FrugalCuda>(case.cuda.1, &Default::default())
            }
            other => panic!("unknown side {other:?} (or not built with its feature)"),
        };
        match result {
            Ok(outs) => {
                let readings: Vec<_> = outs.iter().map(compare::Reading::of).collect();
                let encoded = compare::encode(&readings);
                println!(
                    "CASE {index} {} ok {:016x} {encoded}",
                    case.name,
                    compare::digest(&encoded)
                );
            }
            Err(message) => {
                let message = message.lines().next().unwrap_or_default().to_string();
                println!("CASE {index} {} panic {message}", case.name);
                return;
            }
        }
    }
}

fn short(result: &Result<Vec<Out>, String>) -> String {
    let text = format!("{result:?}");
    if text.len() > 300 {
        format!("{}...", &text[..300])
    } else {
        text
    }
}
