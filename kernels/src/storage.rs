use cubecl::{prelude::*, server::Handle};

use crate::{FloatDtype, KernelError, cast::cast};

/// The low-precision dtype a tensor is kept in at rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageDtype {
    /// IEEE binary16: 10-bit significand, finite range ±65504 (larger values become ±inf).
    F16,
    /// bfloat16: f32's range with an 8-bit significand.
    BF16,
}

impl StorageDtype {
    /// The matching [`FloatDtype`].
    pub fn float_dtype(self) -> FloatDtype {
        match self {
            StorageDtype::F16 => FloatDtype::F16,
            StorageDtype::BF16 => FloatDtype::BF16,
        }
    }
}

/// An f32 buffer kept at rest in a low-precision dtype; [`decompress`] restores an f32 buffer.
#[derive(Debug, Clone)]
pub struct Compressed {
    handle: Handle,
    len: usize,
    dtype: StorageDtype,
}

impl Compressed {
    /// The device buffer holding the compressed elements.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The dtype the elements are stored in.
    pub fn dtype(&self) -> StorageDtype {
        self.dtype
    }

    /// Bytes the compressed elements take (half of the f32 original).
    pub fn size_bytes(&self) -> usize {
        self.len * self.dtype.float_dtype().size_bytes()
    }
}

/// Compresses `len` f32 elements of `input` into a new `dtype` buffer (round to nearest even,
/// as [`cast`]). Errors if `dtype` is unsupported on this device or `input` is too small.
pub fn compress<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
    dtype: StorageDtype,
) -> Result<Compressed, KernelError> {
    let handle = cast(client, input, len, FloatDtype::F32, dtype.float_dtype())?;
    Ok(Compressed { handle, len, dtype })
}

/// Restores a new f32 buffer of `compressed.len()` elements (exact widening of the stored
/// values).
pub fn decompress<R: Runtime>(
    client: &ComputeClient<R>,
    compressed: &Compressed,
) -> Result<Handle, KernelError> {
    cast(
        client,
        &compressed.handle,
        compressed.len,
        compressed.dtype.float_dtype(),
        FloatDtype::F32,
    )
}
