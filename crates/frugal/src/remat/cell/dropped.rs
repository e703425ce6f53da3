//! A cell the program no longer holds: kept recomputable (evicted with its recipe) while
//! live tensors were computed from it, within a bounded chain of dropped tensors, or freed.

use std::sync::atomic::Ordering::Relaxed;

use burn_backend::Backend;

use super::{Cell, SlotOf, State};
use crate::engine::{CHAIN_DEPTH, Status};
use crate::remat::Kind;

/// The longest chain of dropped tensors kept only to recompute live ones.
const MAX_DEAD_CHAIN: u32 = 1;

/// The same in a forward pass under a selection (see `StepPlan::select`) for the tensors it
/// does not choose: its simulation frees every dropped tensor at its last read except the
/// inputs of the chosen tensors, which their recipes hold. A dropped `mean` that kept its
/// recipe held the residual stream's sum it was computed from on the device through the whole
/// step, and that sum, one dropped product away from live tensors, could keep no recipe of its
/// own to be evicted by. (A chosen tensor the program dropped, held by its views, keeps its
/// recipe as outside a scope.)
const SELECTION_DEAD_CHAIN: u32 = 0;

/// The same inside a checkpoint scope. A block's saved tensors are often a few ops and views
/// away from what the program still holds (`softmax`'s input is `mask_fill(div(q·kᵀ))`, each
/// consuming the last; `q` is a view of a view of a view of a dropped `qkv`), and a scope
/// exists to recompute them. Its history is bounded by the block, and goes when autodiff
/// drops the saved tensors in the backward pass; [`Policy::max_depth`](crate::engine::Policy::max_depth) still bounds a
/// recomputation's depth.
const MAX_SCOPED_DEAD_CHAIN: u32 = 32;

impl<B: Backend, K: Kind<B>> Cell<B, K> {
    /// Whether a cell the program no longer holds keeps its recipe (so that live tensors
    /// computed from it stay recomputable): only if it is at most [`MAX_DEAD_CHAIN`] dropped
    /// tensors away from tensors the program still holds. This bounds how much history a
    /// live tensor can pin (e.g. parameters updated step after step).
    pub(super) fn keeps_recipe_when_dead(
        &self,
        slot: &SlotOf<B, K>,
        max_depth: u32,
    ) -> Option<u32> {
        let depth = Self::can_recompute(slot, max_depth)?;
        let recipe = slot.recipe.as_ref()?;
        let inputs = recipe
            .inputs
            .iter()
            .filter(|input| input.core().info.is_dead())
            .map(|input| input.core().dead_chain.load(Relaxed))
            .max()
            .unwrap_or(0);
        // Under a selection a view does not lengthen the chain: it holds no memory of its own
        // and replays for nothing. Counted, it left attention's q, k and v (a slice of a swap
        // of a reshape of one product, which a selection may drop) with a dropped link and no
        // recipe, so they held their product's buffer.
        let chain = inputs + u32::from(recipe.view_of.is_none() || !self.core.under_selection);
        let limit = if self.core.under_selection && !self.core.chosen {
            SELECTION_DEAD_CHAIN
        } else if self.core.under_selection {
            // An input a selection recomputes with a chosen tensor (see
            // `StepRecord::select`): the plan bounds the chain.
            CHAIN_DEPTH as u32
        } else if self.core.info.scope != 0 {
            MAX_SCOPED_DEAD_CHAIN
        } else {
            MAX_DEAD_CHAIN
        };
        if chain > limit {
            return None;
        }
        self.core.dead_chain.store(chain, Relaxed);
        Some(depth)
    }

    /// A dropped tensor that evicted tensors still read (e.g. a saved activation the backward
    /// pass restored, read by a gradient that was consumed and kept its recipe): evicted now if
    /// it can keep its own recipe, rather than held on the device until they go. It stays
    /// resident otherwise.
    pub(super) fn evict_dropped(&self) {
        if self.core.pins.load(Relaxed) > 0 {
            return;
        }
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        let State::Resident(..) = &slot.state else {
            return;
        };
        let max_depth = self.core.state.budget.max_depth();
        let Some(depth) = self.keeps_recipe_when_dead(&slot, max_depth) else {
            return;
        };
        if slot.mark_evicted(depth) {
            self.core.state.budget.count_eviction(self.core.info.bytes);
        }
    }

    /// Frees the data of a dead cell nobody evicted depends on; keeps its recipe if it can
    /// still be replayed, so live cells computed from it stay recomputable.
    pub(super) fn settle(&self) {
        // A pinned cell is read by a restore chain still running; its last unpin settles it.
        if !self.core.info.is_dead() || self.core.pins.load(Relaxed) > 0 {
            return;
        }
        if self.core.dependents.load(Relaxed) > 0 {
            self.evict_dropped();
            return;
        }
        let mut slot = self.lock();
        if self.core.dependents.load(Relaxed) > 0 {
            drop(slot);
            self.evict_dropped();
            return;
        }
        match slot.state.status() {
            Status::Resident => {
                let max_depth = self.core.state.budget.max_depth();
                match self.keeps_recipe_when_dead(&slot, max_depth) {
                    Some(depth) if slot.mark_evicted(depth) => {}
                    _ => {
                        slot.state = State::Gone;
                        let recipe = slot.recipe.take();
                        drop(slot);
                        drop(recipe);
                    }
                }
            }
            Status::Compressed => {
                slot.state = State::Gone;
                let recipe = slot.recipe.take();
                drop(slot);
                drop(recipe);
            }
            Status::Offloaded => {
                if let State::Offloaded(data) = &slot.state {
                    self.core.state.budget.host_release(data.bytes.len() as u64);
                }
                slot.state = State::Gone;
                let recipe = slot.recipe.take();
                drop(slot);
                drop(recipe);
            }
            // A batch is reading it: `finish_offload` settles it.
            Status::Evicted | Status::Offloading | Status::Gone => {}
        }
    }
}
