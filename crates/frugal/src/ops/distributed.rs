//! Burn's `DistributedBackend` (feature `distributed`): gradients reduced across devices by
//! the inner backend's collective (NCCL on CUDA), while Frugal keeps their ledger and cells.
//!
//! As burn-fusion does, only the collective itself (`all_reduce`) and its wait
//! (`sync_collective`) go to the inner backend; the gradient sync server is Burn's own, keyed
//! by this backend's type, so the references it holds point at Frugal's tensors (the
//! gradients autodiff keeps) and the reduced tensor it writes back is one of Frugal's.
//!
//! Gradients are handed to the server when the device's backward pass ends, not one by one as
//! autodiff makes them. The server all-reduces on its own thread; on burn-fusion, each op
//! registered there that reads a tensor of the device's thread drains that thread's queue, so
//! gradients handed over during the backward pass cut it into small launches: the reference
//! GPT's step took 10x as long on one GPU (`docs/results.md`). Handed over at the end, the
//! backward pass runs whole and the all-reduces follow it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use burn_backend::distributed::{
    CollectiveTensor, DistributedBackend, DistributedParams, ReduceOperation, TensorRef,
    get_distributed_sync_client,
};
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::{Device, FloatTensor};
use burn_backend::{DeviceId, DeviceOps};

use crate::backend::Frugal;
use crate::engine::Reclaim;
use crate::remat::{FloatKind, Origin};
use crate::tensor::FrugalTensor;

/// Cells of gradients handed to the sync server and pinned until their all-reduce reads them.
static PINNED: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn pinned() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    PINNED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A gradient's hand-over to the sync server, waiting for its device's backward pass to end.
type HandOver = Box<dyn FnOnce() + Send>;

/// The hand-overs of every device, each with its device.
static WAITING: Mutex<Vec<(DeviceId, HandOver)>> = Mutex::new(Vec::new());

fn waiting() -> std::sync::MutexGuard<'static, Vec<(DeviceId, HandOver)>> {
    WAITING.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: DistributedBackend> DistributedBackend for Frugal<B> {
    fn submit_gradient_sync(tensor: TensorRef<Self>, params: DistributedParams) {
        // The server reads the gradient on its own thread, after later ops of this step: under
        // a budget it must not be evicted (and restored there) meanwhile.
        // SAFETY: autodiff hands over a reference to a gradient it no longer touches until
        // the sync (burn-backend's contract for `TensorRef`).
        let gradient = unsafe { &*tensor.0 };
        if gradient.pin()
            && let Some(address) = gradient.cell_address()
        {
            pinned().get_or_insert_with(HashSet::new).insert(address);
        }
        let device = Self::float_device(gradient).id();
        waiting().push((
            device,
            Box::new(move || {
                if let Some(client) = get_distributed_sync_client::<Self>() {
                    client.submit_gradient_sync(tensor, params);
                }
            }),
        ));
    }

    fn submit_sync_collective(device: &Device<Self>) {
        let id = device.id();
        let hand_overs: Vec<HandOver> = {
            let mut waiting = waiting();
            let (mine, others) = std::mem::take(&mut *waiting)
                .into_iter()
                .partition(|(device, _)| *device == id);
            *waiting = others;
            mine.into_iter().map(|(_, hand_over)| hand_over).collect()
        };
        for hand_over in hand_overs {
            hand_over();
        }
        if let Some(client) = get_distributed_sync_client::<Self>() {
            client.submit_sync_collective(device.clone());
        }
    }

    fn all_reduce(
        tensor: FloatTensor<Self>,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> CollectiveTensor<Self> {
        let state = tensor.state();
        let (made_by, role, bytes) = (tensor.made_by(), tensor.role(), tensor.storage_bytes());
        let inner = tensor.primitive();
        let was_pinned = tensor
            .cell_address()
            .is_some_and(|address| pinned().as_mut().is_some_and(|set| set.remove(&address)));
        if was_pinned {
            tensor.unpin();
        }
        drop(tensor);
        // The device's thread waits for the sync meanwhile (the gradients are handed over when
        // its backward pass ends), so evicting for the output here does not race its ops.
        state.reclaim(Reclaim::Room { bytes });
        // SAFETY: wrapped again at once; the caller resolves the collective before reading.
        let reduced = unsafe { B::all_reduce(inner, op, device_ids).assume_resolved() };
        // A new buffer charged with the gradient's op and role, without a recipe: replaying
        // the op would give the local gradient, not the reduced one. Under a budget it is a
        // managed cell like the gradient it replaces, so that the optimizer step may offload
        // it; made here, on the sync server's thread, while the device's thread waits for the
        // sync, so it enters the device's learned step at the same place every step.
        let storage = Arc::new(state.charge_as(&reduced, made_by, role));
        let reduced = if state.managing() {
            FrugalTensor::managed::<B, FloatKind>(reduced, storage, None, 0.0, Origin::OPAQUE)
        } else {
            FrugalTensor::plain(reduced, storage)
        };
        CollectiveTensor::new(reduced)
    }

    fn sync_collective(device: &Device<Self>) {
        B::sync_collective(device);
    }
}
