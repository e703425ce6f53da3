//! The step plan's cuts carried out: the automatic scope (segment) the forward pass's tensors
//! are made in, what a cut evicts through [`Evictable`], and the tensors a selection drops.
//!
//! The plan ([`super::plan`]) decides where the forward pass is cut; [`Budget::on_create`]
//! hands each [`SegmentEvent`] to [`SegmentCuts::apply`] here. Segments share their ids with
//! the program's own checkpoint scopes ([`Budget::new_scope_id`]), so a tensor's scope id
//! says which of them made it, and ids grow in the order scopes open.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use super::{Budget, Evictable, SegmentEvent, Status};

/// Tensors evicted together at a selection's cut, keyed by their buffer's ordinal.
type Group = (u64, Vec<Weak<dyn Evictable>>);

/// The forward pass's segments on one device, as the plan cuts them.
#[derive(Default)]
pub(crate) struct SegmentCuts {
    /// The open segment's scope id (0: none).
    segment: AtomicU64,
    /// The scope id of the forward pass's first segment.
    forward: AtomicU64,
    /// The tensors a selection drops at its next cuts, by ordinal (see
    /// [`super::StepPlan::is_chosen`]): a selection's cut looks at these only, not at every
    /// cell.
    chosen: Mutex<Vec<(u64, Weak<dyn Evictable>)>>,
    /// Chosen tensors evicted at a selection's cut together with views of their buffer, by
    /// the buffer's ordinal: the first of them the backward pass reads brings the others
    /// back with it (see [`SegmentCuts::take_group`]).
    groups: Mutex<Vec<Group>>,
}

impl SegmentCuts {
    /// The open segment's scope id (0: none): new tensors outside the program's own scopes
    /// belong to it.
    #[inline]
    pub(crate) fn segment(&self) -> u64 {
        self.segment.load(Relaxed)
    }

    /// Notes a tensor a selection drops at a later cut.
    pub(crate) fn hold_chosen(&self, ordinal: u64, cell: Weak<dyn Evictable>) {
        self.chosen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((ordinal, cell));
    }

    /// Takes the tensors evicted at a selection's cut together with the tensor keyed `owner`
    /// (its buffer's ordinal), for whoever restores one of them to bring the others back from
    /// the same recomputation: restored one by one, each view would recompute the buffer
    /// anew, and hold a copy of its own.
    pub(crate) fn take_group(&self, owner: u64) -> Vec<Weak<dyn Evictable>> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        match groups.iter().position(|(key, _)| *key == owner) {
            Some(at) => groups.swap_remove(at).1,
            None => Vec::new(),
        }
    }

    /// Carries out `event`: opens, cuts or closes the segment the forward pass's tensors are
    /// made in. At a cut, the closing segment's resident tensors that the forward pass does
    /// not read again are evicted, to be recomputed from the kept ones when the backward pass
    /// reads them; the kept ones are marked as checkpoints (see
    /// [`super::CellInfo::mark_checkpoint`]) and forget their recipes: never recomputed, they
    /// would otherwise hold the dropped tensors they were computed from (a block's output
    /// product and its input) until the backward pass dropped them, memory the plan's
    /// simulation counts as free. A selection's cut evicts only the chosen tensors (see
    /// [`Self::hold_chosen`]) the forward pass does not read again. A random draw of only 0
    /// and 1 (dropout's mask), which no cut can recompute, is packed into booleans instead
    /// (see [`Evictable::pack`]).
    pub(crate) fn apply(&self, event: SegmentEvent, budget: &Budget) {
        match event {
            SegmentEvent::Open { .. } => {
                self.chosen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                self.groups
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                self.end_segment();
                let id = self.begin_segment(budget);
                self.forward.store(id, Relaxed);
            }
            SegmentEvent::Cut {
                first,
                position,
                last_read,
                selective: true,
            } => {
                // A read stamped `position` came before this cut.
                let mut chosen = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
                let mut evicted: Vec<(u64, Weak<dyn Evictable>)> = Vec::new();
                chosen.retain(|(ordinal, cell)| {
                    let last = ordinal
                        .checked_sub(first)
                        .and_then(|at| last_read.get(at as usize));
                    let Some(cell) = cell.upgrade().filter(|_| last.is_some()) else {
                        return false;
                    };
                    if last.is_some_and(|&last| last > position) {
                        return true;
                    }
                    // A random draw of only 0 and 1 is packed: it cannot be recomputed.
                    if cell.status() == Status::Resident && cell.evict() {
                        evicted.push((*ordinal, Arc::downgrade(&cell)));
                    } else if cell.info().packed.is_some() {
                        cell.pack();
                    }
                    false
                });
                drop(chosen);
                let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                let from = groups.len();
                for (key, cell) in evicted {
                    match groups[from..].iter_mut().find(|(k, _)| *k == key) {
                        Some((_, group)) => group.push(cell),
                        None => groups.push((key, vec![cell])),
                    }
                }
                groups.retain(|(_, group)| group.len() > 1);
            }
            SegmentEvent::Cut {
                first,
                position,
                last_read,
                selective: false,
            } => {
                let id = self.end_segment();
                let forward = self.forward.load(Relaxed);
                if id != 0 {
                    for cell in budget.cells() {
                        let info = cell.info();
                        // A read stamped `position` came before this cut.
                        let read_later = info
                            .ordinal
                            .checked_sub(first)
                            .and_then(|at| last_read.get(at as usize))
                            .is_none_or(|&last| last > position);
                        if !(forward..=id).contains(&info.scope) {
                            continue;
                        }
                        if read_later {
                            info.mark_checkpoint();
                            cell.forget_recipe();
                        } else if cell.status() == Status::Resident && !cell.evict() {
                            // What cannot be recomputed stays, packed if it holds only 0
                            // and 1 (dropout's mask).
                            cell.pack();
                        }
                    }
                }
                self.begin_segment(budget);
            }
            SegmentEvent::Close => {
                self.end_segment();
            }
        }
    }

    fn begin_segment(&self, budget: &Budget) -> u64 {
        let id = budget.new_scope_id();
        self.segment.store(id, Relaxed);
        id
    }

    /// Ends the open segment, if any (the program opening a scope of its own ends it too);
    /// returns its id (0: none).
    pub(crate) fn end_segment(&self) -> u64 {
        self.segment.swap(0, Relaxed)
    }
}
