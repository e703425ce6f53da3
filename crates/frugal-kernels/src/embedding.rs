use cubecl::{
    calculate_cube_count_elemwise,
    ir::{ElemType, IntKind, StorageType, features::AtomicUsage},
    prelude::*,
    server::Handle,
};

use crate::{FloatDtype, KernelError, cast::check_buffer};

/// The integer type of an embedding's token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdDtype {
    /// Signed 32-bit ids (negative ones are skipped).
    I32,
    /// Signed 64-bit ids (negative ones are skipped).
    I64,
}

impl IdDtype {
    pub(crate) fn size_bytes(self) -> usize {
        match self {
            IdDtype::I32 => 4,
            IdDtype::I64 => 8,
        }
    }

    pub(crate) fn storage_type(self) -> StorageType {
        let kind = match self {
            IdDtype::I32 => IntKind::I32,
            IdDtype::I64 => IntKind::I64,
        };
        StorageType::Scalar(ElemType::Int(kind))
    }
}

/// Where element `pos` of the output gradient is added in the table's gradient: row
/// `ids[pos / width]`, column `pos % width`; `None` (as `rows * width`) for an id outside
/// `0..rows`, which is skipped, as Burn's checked launch keeps such writes in bounds.
#[cube]
fn target<I: Int>(ids: &Array<I>, pos: usize, width: usize, rows: usize) -> usize {
    let id = ids[pos / width];
    let mut index = rows * width;
    if id >= I::new(0) && usize::cast_from(id) < rows {
        index = usize::cast_from(id) * width + pos % width;
    }
    index
}

/// `grad[ids[t], d] += out_grad[t, d]` with the device's f32 atomic add, one element of
/// `out_grad` per unit.
#[cube(launch_unchecked)]
fn embedding_grad_kernel<F: Float, I: Int>(
    out_grad: &Array<F>,
    ids: &Array<I>,
    grad: &mut Array<Atomic<f32>>,
    width: usize,
    rows: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    if ABSOLUTE_POS >= out_grad.len() {
        terminate!();
    }
    let index = target::<I>(ids, ABSOLUTE_POS, width, rows);
    if index < rows * width {
        grad[index].fetch_add(f32::cast_from(out_grad[ABSOLUTE_POS]));
    }
}

/// As [`embedding_grad_kernel()`], for devices without an f32 atomic add: a compare-and-swap
/// loop on the value's bits.
#[cube(launch_unchecked)]
fn embedding_grad_cas_kernel<F: Float, I: Int>(
    out_grad: &Array<F>,
    ids: &Array<I>,
    grad: &mut Array<Atomic<u32>>,
    width: usize,
    rows: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    if ABSOLUTE_POS >= out_grad.len() {
        terminate!();
    }
    let index = target::<I>(ids, ABSOLUTE_POS, width, rows);
    let value = f32::cast_from(out_grad[ABSOLUTE_POS]);
    if index < rows * width && value != 0.0 {
        let mut bits = grad[index].load();
        loop {
            let seen = bits;
            let sum = f32::from_bits(seen) + value;
            bits = grad[index].compare_exchange_weak(seen, sum.to_bits());
            if bits == seen {
                break;
            }
        }
    }
}

/// The buffers of one embedding gradient for [`embedding_grad_add`], all contiguous.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingGradBuffers<'a> {
    /// The gradient of the lookup's output, `tokens × width` values of `out_grad_dtype`.
    pub out_grad: &'a Handle,
    /// Its dtype (widened to f32 before it is added).
    pub out_grad_dtype: FloatDtype,
    /// The looked-up ids, `tokens` of them.
    pub ids: &'a Handle,
    /// Their dtype.
    pub ids_dtype: IdDtype,
    /// The table's gradient, `rows × width` f32 values, added to in place.
    pub grad: &'a Handle,
    /// Tokens looked up.
    pub tokens: usize,
    /// Values per row.
    pub width: usize,
    /// Rows of the table.
    pub rows: usize,
}

/// The backward of an embedding lookup: adds row `t` of `out_grad` to row `ids[t]` of `grad`
/// (f32, in place; usually zeros), for every token `t`, in one launch with one unit per value
/// of `out_grad`. Ids outside `0..rows` are skipped.
///
/// The additions into one row come in no fixed order (atomic adds: the device's own f32
/// atomic add where it has one, else a compare-and-swap loop), so the bits of a row that
/// several tokens share may differ between runs by a rounding; Burn's `select_assign`, which
/// this replaces, walks the tokens in order on one unit per column, with a thousandth of the
/// parallelism.
///
/// Errors (before anything is launched) if a buffer is smaller than its length, a dtype is
/// not supported on the device, or an index exceeds 32-bit addressing.
pub fn embedding_grad_add<R: Runtime>(
    client: &ComputeClient<R>,
    buffers: EmbeddingGradBuffers<'_>,
) -> Result<(), KernelError> {
    let EmbeddingGradBuffers {
        tokens,
        width,
        rows,
        ..
    } = buffers;
    buffers.out_grad_dtype.check_supported(client)?;
    let values = tokens.saturating_mul(width);
    let table = rows.saturating_mul(width);
    check_buffer("out_grad", buffers.out_grad, values, buffers.out_grad_dtype)?;
    check_buffer("grad", buffers.grad, table, FloatDtype::F32)?;
    let id_bytes = tokens as u64 * buffers.ids_dtype.size_bytes() as u64;
    if id_bytes > buffers.ids.size_in_used() {
        return Err(KernelError::BufferTooSmall {
            what: "ids".to_string(),
            len: tokens,
            needed_bytes: id_bytes,
            actual_bytes: buffers.ids.size_in_used(),
        });
    }
    if values == 0 || width == 0 {
        return Ok(());
    }
    let intrinsic = client
        .properties()
        .atomic_type_usage(Type::new(StorageType::Atomic(ElemType::Float(
            cubecl::ir::FloatKind::F32,
        ))))
        .contains(AtomicUsage::Add);
    let cube_dim = CubeDim::new(client, values);
    let cube_count = calculate_cube_count_elemwise(client, values, cube_dim);
    let dtypes = [
        buffers.out_grad_dtype.storage_type(),
        buffers.ids_dtype.storage_type(),
    ];
    // SAFETY: `out_grad` holds `tokens * width` values and the kernel reads it only below its
    // length; `ids` holds `tokens` ids (checked above) and is read at `pos / width < tokens`;
    // `grad` holds `rows * width` f32 values and is written only at `id * width + column`
    // with `0 <= id < rows` and `column < width`.
    unsafe {
        let out_grad = ArrayArg::from_raw_parts(buffers.out_grad.clone(), values);
        let ids = ArrayArg::from_raw_parts(buffers.ids.clone(), tokens);
        let grad = ArrayArg::from_raw_parts(buffers.grad.clone(), table);
        if intrinsic {
            embedding_grad_kernel::launch_unchecked::<R>(
                client, cube_count, cube_dim, out_grad, ids, grad, width, rows, dtypes,
            );
        } else {
            embedding_grad_cas_kernel::launch_unchecked::<R>(
                client, cube_count, cube_dim, out_grad, ids, grad, width, rows, dtypes,
            );
        }
    }
    Ok(())
}
