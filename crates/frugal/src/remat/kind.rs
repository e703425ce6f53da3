//! The four tensor kinds a cell can hold, and the batch that offloads them to host memory.

use std::any::Any;
use std::sync::Arc;

use burn_backend::ops::TransactionPrimitive;
use burn_backend::{Backend, BoolStore, DType, TensorData, TensorMetadata};

use super::CellDyn;
use crate::engine::HostBatch;

/// Which of the backend's four tensor kinds a cell holds, with the calls needed to move it to
/// the host and back.
pub(crate) trait Kind<B: Backend>: Send + Sync + 'static {
    type Prim: TensorMetadata + Clone + Send + Sync + 'static;
    fn device(tensor: &Self::Prim) -> B::Device;
    fn from_host(data: TensorData, device: &B::Device) -> Self::Prim;
    /// Adds `tensor` to a transaction's reads; the slot says where its data comes back.
    fn push_read(tensor: Self::Prim, transaction: &mut TransactionPrimitive<B>) -> ReadSlot;
    /// Whether tensors of this kind can be stored compressed (float kinds only).
    const COMPRESSIBLE: bool;
    /// `tensor` cast to the storage type `low` (only called when `COMPRESSIBLE`).
    fn compress(tensor: Self::Prim, low: DType) -> Self::Prim;
    /// A compressed tensor cast back to its type `dtype`.
    fn decompress(tensor: Self::Prim, dtype: DType) -> Self::Prim;
    /// The bytes `tensor` would hold packed by [`Self::pack`], if that is fewer than it holds
    /// now (float kinds only).
    fn packed_bytes(tensor: &Self::Prim) -> Option<u64>;
    /// A tensor that holds only 0 and 1 (a Bernoulli draw: a dropout mask) as the device's
    /// narrowest booleans: exact, a quarter of an f32 tensor's bytes.
    fn pack(tensor: Self::Prim) -> B::BoolTensorPrimitive;
    /// A packed tensor as the float type `dtype` again, bit for bit.
    fn unpack(packed: B::BoolTensorPrimitive, dtype: DType) -> Self::Prim;
}

/// The boolean type a packed tensor is stored in on `device`: one byte where the device has
/// it, else its default (four bytes on wgpu, where packing then frees nothing of an f32).
fn packed_store<B: Backend>(device: &B::Device) -> BoolStore {
    if B::supports_dtype(device, DType::Bool(BoolStore::U8)) {
        BoolStore::U8
    } else {
        burn_backend::get_device_settings::<B>(device).bool_dtype
    }
}

/// Where one tensor's data is in a transaction's result.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReadSlot {
    Float(usize),
    Int(usize),
    Bool(usize),
    Quantized(usize),
}

macro_rules! kinds {
    ($($kind:ident: $prim:ident, $device:ident, $from:ident, $reads:ident, $slot:ident, $cast:ident;)*) => {$(
        pub(crate) struct $kind;
        impl<B: Backend> Kind<B> for $kind {
            type Prim = B::$prim;
            fn device(tensor: &Self::Prim) -> B::Device {
                B::$device(tensor)
            }
            fn from_host(data: TensorData, device: &B::Device) -> Self::Prim {
                kinds!(@upload $slot, data, device, $from)
            }
            fn push_read(
                tensor: Self::Prim,
                transaction: &mut TransactionPrimitive<B>,
            ) -> ReadSlot {
                transaction.$reads.push(tensor);
                ReadSlot::$slot(transaction.$reads.len() - 1)
            }
            const COMPRESSIBLE: bool = kinds!(@compressible $cast);
            fn compress(tensor: Self::Prim, low: DType) -> Self::Prim {
                kinds!(@cast $cast, tensor, low)
            }
            fn decompress(tensor: Self::Prim, dtype: DType) -> Self::Prim {
                kinds!(@cast $cast, tensor, dtype)
            }
            fn packed_bytes(tensor: &Self::Prim) -> Option<u64> {
                kinds!(@packed_bytes $cast, tensor)
            }
            fn pack(tensor: Self::Prim) -> B::BoolTensorPrimitive {
                kinds!(@pack $cast, tensor)
            }
            fn unpack(packed: B::BoolTensorPrimitive, dtype: DType) -> Self::Prim {
                kinds!(@unpack $cast, packed, dtype)
            }
        }
    )*};
    (@upload Quantized, $data:ident, $device:ident, $from:ident) => {
        B::$from($data, $device)
    };
    (@upload $slot:ident, $data:ident, $device:ident, $from:ident) => {
        $crate::kernels::try_upload::<Self::Prim, B::Device>($data, $device)
            .unwrap_or_else(|data| B::$from(data, $device))
    };
    (@packed_bytes none, $t:ident) => {{
        let _ = $t;
        None
    }};
    (@packed_bytes $cast:ident, $t:ident) => {{
        let store = packed_store::<B>(&B::float_device($t));
        let elements = $t.shape().num_elements() as u64;
        let packed = elements * DType::Bool(store).size() as u64;
        (packed < elements * $t.dtype().size() as u64).then_some(packed)
    }};
    (@pack none, $t:ident) => {{
        let _ = $t;
        unreachable!("frugal: internal error: only float tensors are packed")
    }};
    (@pack $cast:ident, $t:ident) => {{
        let store = packed_store::<B>(&B::float_device(&$t));
        B::float_equal_elem($t, burn_backend::Scalar::Float(1.0), store)
    }};
    (@unpack none, $p:ident, $d:ident) => {{
        let _ = ($p, $d);
        unreachable!("frugal: internal error: only float tensors are packed")
    }};
    (@unpack $cast:ident, $p:ident, $d:ident) => {
        B::bool_into_float($p, burn_std::FloatDType::from($d))
    };
    (@compressible none) => { false };
    (@compressible $cast:ident) => { true };
    (@cast none, $t:ident, $d:ident) => {{
        let _ = $d;
        $t
    }};
    (@cast $cast:ident, $t:ident, $d:ident) => {
        $crate::kernels::cast_for::<B>(
            $t,
            burn_std::FloatDType::from($d),
            $crate::kernels::CastPurpose::Storage,
        )
    };
}

kinds! {
    FloatKind: FloatTensorPrimitive, float_device, float_from_data, read_floats, Float, float_cast;
    IntKind: IntTensorPrimitive, int_device, int_from_data, read_ints, Int, none;
    BoolKind: BoolTensorPrimitive, bool_device, bool_from_data, read_bools, Bool, none;
    QuantKind: QuantizedTensorPrimitive, q_device, q_from_data, read_qfloats, Quantized, none;
}

/// A [`HostBatch`] of backend `B`: one transaction reading every tensor added to it.
pub(crate) struct HostBatchOf<B: Backend> {
    pub(crate) transaction: TransactionPrimitive<B>,
    pub(crate) pending: Vec<(Arc<dyn CellDyn>, ReadSlot)>,
}

impl<B: Backend> HostBatchOf<B> {
    pub(crate) fn new() -> Self {
        Self {
            transaction: TransactionPrimitive::new(Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            pending: Vec::new(),
        }
    }
}

impl<B: Backend> Drop for HostBatchOf<B> {
    /// A batch dropped unread (a panic while it was being filled) puts its cells back.
    fn drop(&mut self) {
        for (cell, _) in self.pending.drain(..) {
            cell.abort_offload();
        }
    }
}

impl<B: Backend + 'static> HostBatch for HostBatchOf<B> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn finish(mut self: Box<Self>) -> usize {
        let pending = std::mem::take(&mut self.pending);
        let count = pending.len();
        if count == 0 {
            return 0;
        }
        let empty = TransactionPrimitive::new(Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let transaction = std::mem::replace(&mut self.transaction, empty);
        let data = match burn_std::future::block_on(B::tr_execute(transaction)) {
            Ok(data) => data,
            Err(err) => {
                // The cells keep their tensors: a step that retries after this panic (an
                // out-of-memory reported at this read) reads them again.
                for (cell, _) in &pending {
                    cell.abort_offload();
                }
                panic!("frugal: offloading tensors to host memory failed: {err:?}")
            }
        };
        let mut lists = [
            data.read_floats.into_iter().map(Some).collect::<Vec<_>>(),
            data.read_ints.into_iter().map(Some).collect(),
            data.read_bools.into_iter().map(Some).collect(),
            data.read_qfloats.into_iter().map(Some).collect(),
        ];
        for (cell, slot) in pending {
            let (list, index) = match slot {
                ReadSlot::Float(i) => (0, i),
                ReadSlot::Int(i) => (1, i),
                ReadSlot::Bool(i) => (2, i),
                ReadSlot::Quantized(i) => (3, i),
            };
            let data = lists[list][index]
                .take()
                .expect("frugal: internal error: a transaction read came back short");
            cell.finish_offload(data);
        }
        count
    }
}
