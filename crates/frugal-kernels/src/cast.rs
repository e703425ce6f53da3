use cubecl::{calculate_cube_count_elemwise, prelude::*, server::Handle};

use crate::{FloatDtype, KernelError};

/// `output[i] = cast(input[i])`, one vector per unit. The hardware conversion rounds to
/// nearest even, as Burn's `cast_element` kernel does.
#[cube(launch_unchecked)]
fn cast_kernel<I: Float, O: Float, N: Size>(
    input: &Array<Vector<I, N>>,
    output: &mut Array<Vector<O, N>>,
    #[define(I, O)] _dtypes: [StorageType; 2],
) {
    if ABSOLUTE_POS >= output.len() {
        terminate!();
    }
    output[ABSOLUTE_POS] = Vector::cast_from(input[ABSOLUTE_POS]);
}

/// `output[i] = cast(f32(input[i]) * scale)`: the product is taken in f32, then rounded once to
/// the output dtype.
#[cube(launch_unchecked)]
fn cast_scaled_kernel<I: Float, O: Float, N: Size>(
    input: &Array<Vector<I, N>>,
    output: &mut Array<Vector<O, N>>,
    scale: f32,
    #[define(I, O)] _dtypes: [StorageType; 2],
) {
    if ABSOLUTE_POS >= output.len() {
        terminate!();
    }
    let x = Vector::<f32, N>::cast_from(input[ABSOLUTE_POS]);
    output[ABSOLUTE_POS] = Vector::cast_from(x * Vector::new(scale));
}

/// The largest element count a kernel accepts (32-bit addressing).
pub(crate) const MAX_LEN: usize = u32::MAX as usize;

pub(crate) fn check_len(what: &str, len: usize) -> Result<(), KernelError> {
    if len > MAX_LEN {
        return Err(KernelError::LengthTooLarge {
            what: what.to_string(),
            len,
            max: MAX_LEN,
        });
    }
    Ok(())
}

pub(crate) fn check_buffer(
    what: &str,
    handle: &Handle,
    len: usize,
    dtype: FloatDtype,
) -> Result<(), KernelError> {
    check_len(what, len)?;
    let needed_bytes = len as u64 * dtype.size_bytes() as u64;
    let actual_bytes = handle.size_in_used();
    if needed_bytes > actual_bytes {
        return Err(KernelError::BufferTooSmall {
            what: what.to_string(),
            len,
            needed_bytes,
            actual_bytes,
        });
    }
    Ok(())
}

/// Checks a call on `rows` rows of `width` values of `dtype`: the dtype on the device, at least
/// one value per row (`width_name` names the width in the error), and 32-bit addressing of
/// all of them (`input_name` names the input).
pub(crate) fn check_rows<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: FloatDtype,
    rows: usize,
    width: usize,
    width_name: &str,
    input_name: &str,
) -> Result<(), KernelError> {
    dtype.check_supported(client)?;
    if width == 0 {
        return Err(crate::attention::invalid(
            width_name,
            0,
            "at least 1 value per row",
        ));
    }
    let max = u32::MAX as usize;
    if rows.checked_mul(width).is_none_or(|len| len > max) {
        return Err(KernelError::LengthTooLarge {
            what: input_name.to_string(),
            len: rows.saturating_mul(width),
            max,
        });
    }
    Ok(())
}

/// The vector size the kernels use for `len` elements of `elem_bytes` bytes each on this
/// client: the widest size the runtime favours for loads of that element size that divides
/// `len`, else 1.
pub fn vector_size_for<R: Runtime>(
    client: &ComputeClient<R>,
    len: usize,
    elem_bytes: usize,
) -> usize {
    client
        .io_optimized_vector_sizes(elem_bytes)
        .find(|&v| v > 0 && len.is_multiple_of(v))
        .unwrap_or(1)
}

/// Cube dimension and count for one unit per vector.
fn elemwise_launch<R: Runtime>(client: &ComputeClient<R>, units: usize) -> (CubeDim, CubeCount) {
    let cube_dim = CubeDim::new(client, units);
    let cube_count = calculate_cube_count_elemwise(client, units, cube_dim);
    (cube_dim, cube_count)
}

/// Shared body of [`cast()`] and [`cast_scaled`].
fn launch_cast<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
    from: FloatDtype,
    to: FloatDtype,
    scale: Option<f32>,
) -> Result<Handle, KernelError> {
    from.check_supported(client)?;
    to.check_supported(client)?;
    check_buffer("input", input, len, from)?;
    if let Some(value) = scale
        && !(value.is_finite() && value > 0.0)
    {
        return Err(KernelError::InvalidScale {
            what: "scale",
            value,
        });
    }

    let output = client.empty(len * to.size_bytes());
    if len == 0 {
        return Ok(output);
    }

    let vector_size = vector_size_for(client, len, from.size_bytes().max(to.size_bytes()));
    let (cube_dim, cube_count) = elemwise_launch(client, len / vector_size);
    let dtypes = [from.storage_type(), to.storage_type()];
    // SAFETY: both buffers hold at least `len` elements of their dtype (checked above, and
    // `output` was just allocated at that size), `len` is a multiple of `vector_size`, and the
    // kernels touch index `ABSOLUTE_POS` only after checking it against the output length,
    // which equals the input length.
    unsafe {
        let input_arg = ArrayArg::from_raw_parts(input.clone(), len);
        let output_arg = ArrayArg::from_raw_parts(output.clone(), len);
        match scale {
            None => cast_kernel::launch_unchecked::<R>(
                client,
                cube_count,
                cube_dim,
                vector_size,
                input_arg,
                output_arg,
                dtypes,
            ),
            Some(scale) => cast_scaled_kernel::launch_unchecked::<R>(
                client,
                cube_count,
                cube_dim,
                vector_size,
                input_arg,
                output_arg,
                scale,
                dtypes,
            ),
        }
    }
    Ok(output)
}

/// Casts `len` contiguous elements of dtype `from` in `input` into a new buffer of dtype `to`,
/// rounding to nearest even (the same bits as `half`'s `from_f32` and Burn's cast).
///
/// When `from == to` the result is a device-side copy. Errors if either dtype is unsupported on
/// this device, if `input` is smaller than `len` elements, or if `len` exceeds `u32::MAX`.
pub fn cast<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
    from: FloatDtype,
    to: FloatDtype,
) -> Result<Handle, KernelError> {
    launch_cast(client, input, len, from, to, None)
}

/// Fused scale and cast: `out[i] = to(f32(input[i]) * scale)`.
///
/// The product is taken in f32 and rounded once to `to`. With `from = F32` and a low-precision
/// `to` this scales before narrowing (a loss-scaled cast); with a low-precision `from` and
/// `to = F32` it widens then scales. `scale` must be finite and > 0; other checks as
/// [`cast()`].
pub fn cast_scaled<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
    from: FloatDtype,
    to: FloatDtype,
    scale: f32,
) -> Result<Handle, KernelError> {
    launch_cast(client, input, len, from, to, Some(scale))
}

/// A device-to-device copy of `len` elements of `dtype` into a new buffer, through the same
/// vectorised kernel as the casts (the bandwidth baseline for the casts).
pub fn copy<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
    dtype: FloatDtype,
) -> Result<Handle, KernelError> {
    cast(client, input, len, dtype, dtype)
}

/// f32 → f16 (round to nearest even; overflow gives ±inf). See [`cast()`].
pub fn cast_f32_to_f16<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
) -> Result<Handle, KernelError> {
    cast(client, input, len, FloatDtype::F32, FloatDtype::F16)
}

/// f16 → f32 (exact). See [`cast()`].
pub fn cast_f16_to_f32<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
) -> Result<Handle, KernelError> {
    cast(client, input, len, FloatDtype::F16, FloatDtype::F32)
}

/// f32 → bf16 (round to nearest even). Errors with [`KernelError::UnsupportedDtype`] where the
/// device has no bf16. See [`cast()`].
pub fn cast_f32_to_bf16<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
) -> Result<Handle, KernelError> {
    cast(client, input, len, FloatDtype::F32, FloatDtype::BF16)
}

/// bf16 → f32 (exact). Errors with [`KernelError::UnsupportedDtype`] where the device has no
/// bf16. See [`cast()`].
pub fn cast_bf16_to_f32<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    len: usize,
) -> Result<Handle, KernelError> {
    cast(client, input, len, FloatDtype::BF16, FloatDtype::F32)
}
