//! Burn's `DistributedBackend` (feature `distributed`): gradients reduced across devices by
//! the inner backend's collective (NCCL on CUDA), while Frugal keeps their ledger and cells.
//!
//! As burn-fusion does, only the collective itself (`all_reduce`) and its wait
//! (`sync_collective`) go to the inner backend; the gradient sync server is Burn's own, keyed
//! by this backend's type, so the references it holds point at Frugal's tensors (the
//! gradients autodiff keeps) and the reduced tensor it writes back is one of Frugal's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use burn_backend::DeviceId;
use burn_backend::distributed::{
    CollectiveTensor, DistributedBackend, DistributedParams, ReduceOperation, TensorRef,
    get_distributed_sync_client,
};
use burn_backend::tensor::{Device, FloatTensor};

use crate::backend::Frugal;
use crate::tensor::FrugalTensor;

/// Cells of gradients handed to the sync server and pinned until their all-reduce reads them.
static PINNED: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn pinned() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    PINNED.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: DistributedBackend> DistributedBackend for Frugal<B> {
    fn submit_gradient_sync(tensor: TensorRef<Self>, params: DistributedParams) {
        // The server reads the gradient on its own thread, possibly after later ops of this
        // step: under a budget it must not be evicted (and restored there) meanwhile.
        // SAFETY: autodiff hands over a reference to a gradient it no longer touches until
        // the sync (burn-backend's contract for `TensorRef`).
        let gradient = unsafe { &*tensor.0 };
        if gradient.pin()
            && let Some(address) = gradient.cell_address()
        {
            pinned().get_or_insert_with(HashSet::new).insert(address);
        }
        if let Some(client) = get_distributed_sync_client::<Self>() {
            client.submit_gradient_sync(tensor, params);
        }
    }

    fn all_reduce(
        tensor: FloatTensor<Self>,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> CollectiveTensor<Self> {
        let state = tensor.state();
        let (made_by, role) = (tensor.made_by(), tensor.role());
        let inner = tensor.primitive();
        let was_pinned = tensor
            .cell_address()
            .is_some_and(|address| pinned().as_mut().is_some_and(|set| set.remove(&address)));
        if was_pinned {
            tensor.unpin();
        }
        drop(tensor);
        // SAFETY: wrapped again at once; the caller resolves the collective before reading.
        let reduced = unsafe { B::all_reduce(inner, op, device_ids).assume_resolved() };
        // A new buffer charged with the gradient's role and op. Held directly, never as a
        // managed cell: it has no recipe (replaying the op would give the local gradient, not
        // the reduced one), and this runs on the sync server's thread, where a new cell would
        // enter the device's learned step out of the program's order. Nothing is evicted for
        // it here: the gradient it replaces is freed when the server writes it back.
        let storage = Arc::new(state.charge_as(&reduced, made_by, role));
        CollectiveTensor::new(FrugalTensor::plain(reduced, storage))
    }

    fn sync_collective(device: &Device<Self>) {
        B::sync_collective(device);
    }
}
