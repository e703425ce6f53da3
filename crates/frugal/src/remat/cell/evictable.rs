//! What the budget sees of a cell ([`Evictable`]): its candidate score, and the transitions
//! it asks for (evict, compress, offload in a batch, forget the recipe).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::ops::TransactionPrimitive;
use burn_backend::{Backend, DType};

use super::{Cell, State};
use crate::engine::{Candidate, CellInfo, Evictable, HostBatch, Policy, Shrink, Status};
use crate::remat::kind::{HostBatchOf, ReadSlot};
use crate::remat::{CellDyn, Kind};
use crate::units::LowPrecision;

impl<B: Backend, K: Kind<B>> Cell<B, K> {
    /// Moves the data of a resident, unpinned, unshared cell into `transaction` and marks it
    /// offloading.
    pub(super) fn begin_offload(
        &self,
        transaction: &mut TransactionPrimitive<B>,
    ) -> Option<ReadSlot> {
        if self.core.pins.load(Relaxed) > 0 || self.core.info.strided {
            return None;
        }
        let mut slot = self.slot.try_lock().ok()?;
        let (State::Resident(_, storage) | State::Compressed(_, storage)) = &slot.state else {
            return None;
        };
        if Arc::strong_count(storage) != 1 {
            return None;
        }
        let compressed = matches!(slot.state, State::Compressed(..));
        let (State::Resident(tensor, storage) | State::Compressed(tensor, storage)) =
            std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("checked above")
        };
        drop(storage);
        slot.state = State::Offloading(tensor.clone(), compressed);
        Some(K::push_read(tensor, transaction))
    }

    /// Replaces a resident, unpinned, unshared cell's tensor by what `into` makes of it (kept
    /// in fewer bytes), freeing its buffer; whether it did.
    fn shrink(&self, into: impl FnOnce(K::Prim) -> State<K::Prim, B::BoolTensorPrimitive>) -> bool {
        if self.core.pins.load(Relaxed) > 0 {
            return false;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return false;
        };
        let State::Resident(_, storage) = &slot.state else {
            return false;
        };
        if Arc::strong_count(storage) != 1 {
            return false;
        }
        let State::Resident(tensor, storage) = std::mem::replace(&mut slot.state, State::Gone)
        else {
            unreachable!("checked above")
        };
        let shrunk = into(tensor);
        drop(storage);
        slot.state = shrunk;
        true
    }

    /// A buffer's charge for `tensor`, which stands for this cell.
    fn charge<P: burn_backend::TensorMetadata>(&self, tensor: &P) -> Arc<crate::device::Storage> {
        Arc::new(
            self.core
                .state
                .charge_as(tensor, self.core.info.op, self.core.role()),
        )
    }
}

impl<B: Backend, K: Kind<B>> Evictable for Cell<B, K> {
    fn info(&self) -> &CellInfo {
        &self.core.info
    }

    fn status(&self) -> Status {
        self.lock().state.status()
    }

    fn storage_holders(&self) -> Option<(usize, usize)> {
        let slot = self.slot.try_lock().ok()?;
        match &slot.state {
            State::Resident(_, storage) => {
                Some((Arc::as_ptr(storage) as usize, Arc::strong_count(storage)))
            }
            _ => None,
        }
    }

    fn candidate(&self, now: u64, policy: &Policy, shared: bool) -> Option<Candidate> {
        if self.core.pins.load(Relaxed) > 0 {
            return None;
        }
        let slot = self.slot.try_lock().ok()?;
        // A compressed tensor can still be dropped to be recomputed, or offloaded.
        let (storage, compressed) = match &slot.state {
            State::Resident(_, storage) => (storage, false),
            State::Compressed(_, storage) if !shared => (storage, true),
            _ => return None,
        };
        // Alone, only a buffer no other tensor points into is freed by evicting this cell.
        if (!shared && Arc::strong_count(storage) != 1) || storage.bytes == 0 {
            return None;
        }
        let freed = storage.bytes;
        let recompute = (!self.core.info.is_checkpoint())
            .then(|| self.recompute_depth(&slot, policy.max_depth))
            .flatten()
            .filter(|_| !Self::restore_outweighs(&slot, freed))
            .map(|_| {
                let recipe = slot.recipe.as_ref().expect("checked");
                // DTR's evicted neighbourhood: restoring this cell also re-runs its evicted inputs.
                self.core.info.cost
                    + recipe
                        .inputs
                        .iter()
                        .filter(|input| input.try_status() == Some(Status::Evicted))
                        .map(|input| input.core().info.cost)
                        .sum::<f64>()
            });
        // Packing a tensor of only 0 and 1 is exact, so it needs no storage type chosen.
        let shrink = match self.core.info.packed {
            Some(packed) if !shared && !compressed => Some(Shrink::Pack { packed }),
            _ => (K::COMPRESSIBLE && !shared && !compressed && self.dtype == DType::F32)
                .then(|| self.core.state.budget.storage())
                .flatten()
                .map(|_| Shrink::Compress),
        };
        Candidate::new(
            &self.core.info,
            freed,
            now,
            recompute,
            !self.core.info.strided && !shared,
            shrink,
            policy,
        )
    }

    fn evict(&self) -> bool {
        if self.core.pins.load(Relaxed) > 0 {
            return false;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return false;
        };
        let (State::Resident(..) | State::Compressed(..)) = &slot.state else {
            return false;
        };
        let max_depth = self.core.state.budget.max_depth();
        let Some(depth) = self.recompute_depth(&slot, max_depth) else {
            return false;
        };
        if !slot.mark_evicted(depth) {
            return false;
        }
        self.core.state.budget.count_eviction(self.core.info.bytes);
        true
    }

    fn restore(&self) {
        self.ensure_resident();
    }

    fn compress(&self) -> bool {
        let Some(low) = self.core.state.budget.storage().map(LowPrecision::dtype) else {
            return false;
        };
        if !K::COMPRESSIBLE || self.dtype != DType::F32 {
            return false;
        }
        self.shrink(|tensor| {
            let low = K::compress(tensor, low);
            let storage = self.charge(&low);
            self.core.state.budget.count_compress(self.core.info.bytes);
            State::Compressed(low, storage)
        })
    }

    fn pack(&self) -> bool {
        if self.core.info.packed.is_none() {
            return false;
        }
        self.shrink(|tensor| {
            let packed = K::pack(tensor);
            let storage = self.charge(&packed);
            self.core.state.budget.count_pack(self.core.info.bytes);
            State::Packed(packed, storage)
        })
    }

    fn host_batch(&self) -> Box<dyn HostBatch> {
        Box::new(HostBatchOf::<B>::new())
    }

    fn offload_into(self: Arc<Self>, batch: &mut dyn HostBatch) -> bool {
        let Some(batch) = batch.as_any().downcast_mut::<HostBatchOf<B>>() else {
            return false;
        };
        match self.begin_offload(&mut batch.transaction) {
            Some(slot) => {
                batch.pending.push((self as Arc<dyn CellDyn>, slot));
                true
            }
            None => false,
        }
    }

    fn drop_frees_at_once(&self) -> bool {
        crate::runtime::drop_frees_at_once::<K::Prim>()
    }

    fn forget_recipe(&self) {
        let recipe = {
            let mut slot = self.lock();
            match slot.state {
                State::Resident(..) => slot.recipe.take(),
                _ => None,
            }
        };
        drop(recipe);
    }
}
