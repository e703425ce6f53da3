//! The restore chain: a read of an evicted or offloaded cell brings back every cell its recipe
//! needs, deepest first, within the budget; and whether a cell can be recomputed at all.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use burn_backend::Backend;

use super::{Cell, CellCore, Restoring, SlotOf};
use crate::engine::{Evictable, Reclaim, Status};
use crate::remat::{CellDyn, Kind};

/// A cell whose recomputation must first restore inputs of more than this many times its own
/// bytes is not evicted to be recomputed (see `Cell::restore_outweighs`).
const RESTORE_OUTWEIGHS: u64 = 4;

impl<B: Backend, K: Kind<B>> Cell<B, K> {
    /// Restores this cell and every evicted or offloaded cell its recipe needs, deepest first.
    /// A cell of the chain, and every resident input a restore reads, is pinned from the start
    /// until the last cell of the chain that reads it is restored (room made for a cell must
    /// not come from evicting its own inputs, which it would then restore over the budget); between restores the budget evicts other tensors (and the cells no
    /// longer needed), so a long chain does not pile up above the budget.
    pub(super) fn ensure_resident(&self) {
        if self.status() == Status::Resident {
            return;
        }
        type Key = *const CellCore;
        let key = |cell: &Arc<dyn CellDyn>| cell.core() as Key;
        // Post-order walk with an explicit stack: inputs are restored before their users. Each
        // cell comes with the inputs it reads.
        let root_inputs = self.restore_inputs();
        let mut order: Vec<(Arc<dyn CellDyn>, Vec<Key>)> = Vec::new();
        /// A cell to visit, with its recipe's inputs once expanded.
        type Visit = (Arc<dyn CellDyn>, Option<Vec<Key>>);
        let mut stack: Vec<Visit> = root_inputs
            .iter()
            .map(|input| (input.clone(), None))
            .collect();
        let mut seen: Vec<Key> = Vec::new();
        while let Some((cell, expanded)) = stack.pop() {
            if let Some(inputs) = expanded {
                order.push((cell, inputs));
                continue;
            }
            if seen.contains(&key(&cell)) {
                continue;
            }
            seen.push(key(&cell));
            let inputs = cell.restore_inputs();
            let keys = inputs.iter().map(key).collect();
            stack.push((cell, Some(keys)));
            stack.extend(inputs.into_iter().map(|input| (input, None)));
        }
        /// The chain's cells, each pinned while `readers` (cells of the chain still to be
        /// restored that read it) is non-zero; whatever is left is unpinned on drop. The root
        /// is unpinned without being settled: its caller reads it next (or, consuming it,
        /// settles it).
        struct Pins<'a> {
            chain: Vec<(&'a dyn CellDyn, u32)>,
            root: &'a CellCore,
        }
        impl Pins<'_> {
            fn done_reading(&mut self, inputs: &[Key]) {
                for &input in inputs {
                    if let Some(pin) = self
                        .chain
                        .iter_mut()
                        .find(|(c, n)| std::ptr::eq(c.core(), input) && *n > 0)
                    {
                        pin.1 -= 1;
                        if pin.1 == 0 {
                            pin.0.unpin();
                        }
                    }
                }
            }
        }
        impl Drop for Pins<'_> {
            fn drop(&mut self) {
                for (cell, readers) in &self.chain {
                    if *readers > 0 {
                        cell.unpin();
                    }
                }
                self.root.pins.fetch_sub(1, Relaxed);
            }
        }
        let root_keys: Vec<Key> = root_inputs.iter().map(key).collect();
        let readers = |cell: Key| {
            order
                .iter()
                .map(|(_, inputs)| inputs)
                .chain([&root_keys])
                .map(|inputs| inputs.iter().filter(|&&k| k == cell).count() as u32)
                .sum::<u32>()
        };
        let mut pins = Pins {
            chain: Vec::with_capacity(order.len()),
            root: &self.core,
        };
        for (cell, _) in &order {
            cell.core().pins.fetch_add(1, Relaxed);
            // A selection's chosen buffer stays pinned until the chain ends: the views evicted
            // with it are brought back from it then (see below).
            let core = cell.core();
            let group_owner = core.chosen && core.info.owner == core.info.ordinal;
            pins.chain.push((
                &**cell,
                readers(core as Key).max(1) + u32::from(group_owner),
            ));
        }
        self.core.pins.fetch_add(1, Relaxed);
        let _restoring = Restoring::start();
        // Room is made before each restore, so a chain never goes over the budget by the
        // tensor it brings back.
        for (cell, inputs) in &order {
            if cell.status() != Status::Resident {
                self.core.state.reclaim(Reclaim::Room {
                    bytes: cell.core().info.bytes,
                });
                cell.restore_one();
            }
            pins.done_reading(inputs);
            self.core.state.reclaim(Reclaim::Relieve);
        }
        self.core.state.reclaim(Reclaim::Room {
            bytes: self.core.info.bytes,
        });
        self.restore_one();
        // A selection evicted a product with its views: the views come back now, from this
        // recomputation, while the chain still pins it.
        let chosen = order
            .iter()
            .map(|(cell, _)| cell.core())
            .chain([&self.core])
            .filter(|core| core.chosen)
            .map(|core| core.info.owner);
        for owner in chosen {
            for sibling in self.core.state.budget.take_group(owner) {
                if let Some(sibling) = sibling.upgrade() {
                    sibling.restore();
                }
            }
        }
        drop(pins);
    }

    /// Whether recomputing this cell would first bring back inputs far larger than the `freed`
    /// bytes its eviction frees (a weight's gradient, read by the optimizer, recomputed from a
    /// layer's evicted activations): such a cell is offloaded rather than recomputed, since
    /// the restore chain would need that room, pinned, at once.
    pub(super) fn restore_outweighs(slot: &SlotOf<B, K>, freed: u64) -> bool {
        let Some(recipe) = slot.recipe.as_ref() else {
            return false;
        };
        let missing: u64 = recipe
            .inputs
            .iter()
            .filter(|input| {
                matches!(
                    input.try_status(),
                    Some(Status::Evicted | Status::Offloaded | Status::Compressed)
                )
            })
            .map(|input| input.core().info.bytes)
            .sum();
        missing > RESTORE_OUTWEIGHS * freed
    }

    pub(super) fn can_recompute(slot: &SlotOf<B, K>, max_depth: u32) -> Option<u32> {
        let recipe = slot.recipe.as_ref()?;
        let mut depth = 0;
        for input in &recipe.inputs {
            // An input in use right now (its lock is held, possibly further up this thread's
            // stack) is not waited for: the cell is simply not evictable this time.
            match input.try_status()? {
                Status::Gone => return None,
                Status::Evicted => depth = depth.max(input.depth()),
                Status::Resident | Status::Offloaded | Status::Offloading | Status::Compressed => {}
            }
        }
        (depth < max_depth).then_some(depth + 1)
    }

    /// As [`Self::can_recompute`] within `max_depth`; but a strided cell, which cannot be
    /// offloaded (a host copy would not keep its layout), may go deeper: recomputing a longer
    /// chain beats failing the budget.
    pub(super) fn recompute_depth(&self, slot: &SlotOf<B, K>, max_depth: u32) -> Option<u32> {
        Self::can_recompute(slot, max_depth).or_else(|| {
            self.core
                .info
                .strided
                .then(|| Self::can_recompute(slot, u32::MAX))
                .flatten()
        })
    }
}
