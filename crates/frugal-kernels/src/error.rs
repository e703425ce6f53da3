use core::fmt;

use crate::FloatDtype;

/// Why a kernel could not be launched or its result could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelError {
    /// The runtime cannot store or convert this dtype (bf16 on many wgpu adapters, for example).
    UnsupportedDtype {
        /// The dtype that was asked for.
        dtype: FloatDtype,
        /// The runtime's name, as CubeCL reports it.
        runtime: &'static str,
        /// The dtypes this device does support.
        supported: Vec<FloatDtype>,
    },
    /// A device buffer holds fewer bytes than `len` elements of its dtype need.
    BufferTooSmall {
        /// Which argument (for example `"input"` or `"grads[3]"`).
        what: String,
        /// Elements the caller said the buffer holds.
        len: usize,
        /// Bytes those elements need.
        needed_bytes: u64,
        /// Bytes the handle actually spans.
        actual_bytes: u64,
    },
    /// A length is above what the kernels can index (32-bit addressing).
    LengthTooLarge {
        /// Which argument.
        what: String,
        /// The length given.
        len: usize,
        /// The largest accepted length.
        max: usize,
    },
    /// A scale factor is not a finite, strictly positive number.
    InvalidScale {
        /// Which argument (`"scale"` or `"inv_scale"`).
        what: &'static str,
        /// The value given.
        value: f32,
    },
    /// A quantisation block size the 8-bit optimizer kernel does not take.
    InvalidBlockSize {
        /// The block size given.
        block_size: usize,
        /// The largest accepted block size.
        max: usize,
    },
    /// An argument is outside what the kernel takes (a size, a head dimension, a scale).
    InvalidArgument {
        /// Which argument (for example `"head_dim"`).
        what: String,
        /// The value given.
        value: String,
        /// What is accepted, and what to change.
        accepted: String,
    },
    /// Reading a result back from the device failed.
    Read(String),
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::UnsupportedDtype {
                dtype,
                runtime,
                supported,
            } => {
                let list: Vec<String> = supported.iter().map(|d| d.to_string()).collect();
                write!(
                    f,
                    "dtype {dtype} is not supported on this {runtime} device (it cannot be \
                     stored in buffers or converted there); accepted here: {}",
                    list.join(", ")
                )
            }
            KernelError::BufferTooSmall {
                what,
                len,
                needed_bytes,
                actual_bytes,
            } => write!(
                f,
                "{what}: {len} elements need {needed_bytes} bytes but the buffer holds \
                 {actual_bytes} bytes (accepted: len * element size <= buffer size)"
            ),
            KernelError::LengthTooLarge { what, len, max } => write!(
                f,
                "{what}: length {len} is too large (accepted: 0..={max} elements)"
            ),
            KernelError::InvalidScale { what, value } => write!(
                f,
                "{what} = {value} is not accepted (accepted: finite and > 0)"
            ),
            KernelError::InvalidBlockSize { block_size, max } => write!(
                f,
                "block size {block_size} is not accepted (accepted: a multiple of 4 in 4..={max})"
            ),
            KernelError::InvalidArgument {
                what,
                value,
                accepted,
            } => write!(f, "{what} = {value} is not accepted (accepted: {accepted})"),
            KernelError::Read(msg) => write!(f, "reading from the device failed: {msg}"),
        }
    }
}

impl std::error::Error for KernelError {}
