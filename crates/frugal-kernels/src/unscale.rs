use cubecl::{prelude::*, server::Handle};

use crate::{
    FloatDtype, KernelError,
    cast::{check_buffer, vector_size_for},
};

/// Multiplies every buffer of `grads` in place by `inv_scale` and raises `found_inf[0]` (sets it
/// to 1) if any product is NaN or ±inf.
///
/// The sequence is unrolled at compile time; each unit walks every buffer with a grid stride, so
/// one launch covers buffers of any sizes. Non-finite is tested on the bits (exponent all ones),
/// which no compiler float optimisation can fold away.
#[cube(launch_unchecked)]
fn unscale_check_kernel<N: Size>(
    grads: &mut Sequence<Array<Vector<f32, N>>>,
    found_inf: &mut Array<u32>,
    inv_scale: f32,
) {
    let stride = (CUBE_COUNT_X * CUBE_DIM_X) as usize;
    let factor = Vector::<f32, N>::new(inv_scale);
    let exponent_mask = Vector::<u32, N>::new(0x7f80_0000u32);
    let carry = Vector::<u32, N>::new(0x0080_0000u32);
    let shift = Vector::<u32, N>::new(31u32);
    // Lane-wise 1 once a non-finite value was seen: (exponent + 1 ulp of exponent) overflows
    // into bit 31 exactly when the exponent field is all ones.
    let mut seen = Vector::<u32, N>::new(0u32);

    #[unroll]
    for b in 0..grads.len() {
        let grad = grads.index_mut(b);
        let len = grad.len();
        let mut pos = ABSOLUTE_POS;
        while pos < len {
            let value = grad[pos] * factor;
            grad[pos] = value;
            let bits = Vector::<u32, N>::reinterpret(value);
            seen |= ((bits & exponent_mask) + carry) >> shift;
            pos += stride;
        }
    }

    let mut any = 0u32;
    #[unroll]
    for lane in 0..seen.size() {
        any |= seen[lane];
    }
    if any != 0u32 {
        found_inf[0] = 1u32;
    }
}

/// A device-side found-inf flag: one `u32`, 0 while every checked value was finite, 1 after a
/// NaN or ±inf was seen. It stays on the device until [`read`](FoundInf::read) is called.
#[derive(Debug, Clone)]
pub struct FoundInf {
    handle: Handle,
}

impl FoundInf {
    /// A new flag, cleared (0).
    pub fn new<R: Runtime>(client: &ComputeClient<R>) -> Self {
        Self {
            handle: client.create_from_slice(&0u32.to_le_bytes()),
        }
    }

    /// The flag's device buffer (one `u32`), e.g. to feed a later kernel without a read-back.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Reads the flag back (waits for the kernels that write it): `true` if a NaN or ±inf was
    /// found.
    pub fn read<R: Runtime>(&self, client: &ComputeClient<R>) -> Result<bool, KernelError> {
        let bytes = client
            .read_one(self.handle.clone())
            .map_err(|e| KernelError::Read(format!("{e:?}")))?;
        let word: [u8; 4] = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| KernelError::Read(format!("flag has {} bytes, not 4", bytes.len())))?;
        Ok(u32::from_le_bytes(word) != 0)
    }
}

/// How many buffers one unscale launch takes on this client: the device's binding limit less
/// the flag and a metadata buffer, at most 16 (each group size compiles its own kernel).
pub fn unscale_group_size<R: Runtime>(client: &ComputeClient<R>) -> usize {
    let bindings = client.properties().hardware.max_bindings as usize;
    bindings.saturating_sub(2).clamp(1, 16)
}

/// Multiplies each f32 buffer `(handle, len)` of `grads` in place by `inv_scale` and returns a
/// new device-side [`FoundInf`] flag, raised if any result is NaN or ±inf (with a finite,
/// positive `inv_scale` that is exactly when an input was non-finite or the product
/// overflowed). Nothing is read back.
///
/// Buffers are grouped by vector size and launched [`unscale_group_size`] at a time, so a model
/// with a few hundred parameters takes a few dozen launches at most. Errors (before anything is
/// launched) if `inv_scale` is not finite and > 0, or a buffer is smaller than its `len`. The
/// buffers must not overlap (a buffer listed twice would be scaled twice, racily).
pub fn unscale_and_check<R: Runtime>(
    client: &ComputeClient<R>,
    grads: &[(&Handle, usize)],
    inv_scale: f32,
) -> Result<FoundInf, KernelError> {
    let found_inf = FoundInf::new(client);
    unscale_and_check_into(client, grads, inv_scale, &found_inf)?;
    Ok(found_inf)
}

/// As [`unscale_and_check`], raising an existing flag (it is never cleared here, so several
/// calls can share one). Returns the number of kernel launches made.
pub fn unscale_and_check_into<R: Runtime>(
    client: &ComputeClient<R>,
    grads: &[(&Handle, usize)],
    inv_scale: f32,
    found_inf: &FoundInf,
) -> Result<usize, KernelError> {
    if !(inv_scale.is_finite() && inv_scale > 0.0) {
        return Err(KernelError::InvalidScale {
            what: "inv_scale",
            value: inv_scale,
        });
    }
    for (i, (handle, len)) in grads.iter().enumerate() {
        check_buffer(&format!("grads[{i}]"), handle, *len, FloatDtype::F32)?;
    }

    // Group the non-empty buffers by vector size, keeping their order within a group.
    let mut groups: Vec<(usize, Vec<(&Handle, usize)>)> = Vec::new();
    for &(handle, len) in grads.iter().filter(|(_, len)| *len > 0) {
        let vector_size = vector_size_for(client, len, FloatDtype::F32.size_bytes());
        match groups.iter_mut().find(|(v, _)| *v == vector_size) {
            Some((_, members)) => members.push((handle, len)),
            None => groups.push((vector_size, vec![(handle, len)])),
        }
    }

    let group_size = unscale_group_size(client);
    let hardware = &client.properties().hardware;
    let units_per_cube = hardware.max_units_per_cube.clamp(1, 256);
    // Enough units to fill a large GPU; bigger buffers are walked with a grid stride.
    let max_cubes = hardware.max_cube_count.0.clamp(1, 4096);
    let mut launches = 0;
    for (vector_size, members) in &groups {
        for chunk in members.chunks(group_size) {
            let most_vectors = chunk.iter().map(|(_, len)| len / vector_size).max();
            let most_vectors = most_vectors.unwrap_or(1) as u64;
            let cubes = most_vectors
                .div_ceil(units_per_cube as u64)
                .clamp(1, max_cubes as u64) as u32;
            let grads_arg = chunk
                .iter()
                // SAFETY: each buffer holds at least `len` f32 (checked above).
                .map(|(handle, len)| unsafe { ArrayArg::from_raw_parts((*handle).clone(), *len) })
                .collect();
            // SAFETY: every access is at an index below its own array's length (the loop bound)
            // or at index 0 of the one-element flag buffer.
            unsafe {
                unscale_check_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(cubes, 1, 1),
                    CubeDim::new_1d(units_per_cube),
                    *vector_size,
                    grads_arg,
                    ArrayArg::from_raw_parts(found_inf.handle.clone(), 1),
                    inv_scale,
                );
            }
            launches += 1;
        }
    }
    Ok(launches)
}
