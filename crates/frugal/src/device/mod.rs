//! Layer 4, the per-device state: everything Frugal keeps for one device, in one place, and
//! the record of a charged buffer.
//!
//! Owns: [`DeviceState`] (the ledger, the budget, the scopes, the autocast table and the
//! "managing" flag that decides an op's path) and its registry, and [`Storage`]. Imports:
//! `ledger`, `engine`, `scope`, `autocast`, `runtime`, `vocabulary`. States live for the whole
//! process (leaked once per device), so tensors point at theirs with a plain `&'static` and no
//! reference count.

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

use burn_backend::{DType, DeviceId, DeviceOps, TensorMetadata};

use crate::autocast::PrecisionTable;
use crate::engine::{Budget, Reclaim};
use crate::ledger::{Charge, Ledger, Role};
use crate::runtime::available_host_memory;
use crate::scope::{OpenScope, Scopes};
use crate::vocabulary::OpId;

/// Everything Frugal keeps for one device.
pub(crate) struct DeviceState {
    key: (TypeId, DeviceId),
    /// Live, peak and total bytes, per op, and the timeline.
    pub(crate) ledger: Ledger,
    /// The memory budget, its policy and the cells it may evict.
    pub(crate) budget: Budget,
    /// Checkpoint scopes.
    pub(crate) scopes: Scopes,
    /// The autocast table (all `Keep` while autocast is off).
    pub(crate) autocast: PrecisionTable,
    /// Whether new tensors are managed: a budget is set or a scope is open.
    managing: AtomicBool,
}

/// The share of the host's available memory a budget's offloads may use unless the user
/// chose a limit: the rest is left to the program and the system, so that offloading never
/// gets the process killed for memory.
pub(crate) const HOST_SHARE: f64 = 0.75;

static STATES: RwLock<Vec<&'static DeviceState>> = RwLock::new(Vec::new());

impl DeviceState {
    fn new(key: (TypeId, DeviceId), label: String) -> Self {
        Self {
            key,
            ledger: Ledger::new(label),
            budget: Budget::default(),
            scopes: Scopes::default(),
            autocast: PrecisionTable::default(),
            managing: AtomicBool::new(false),
        }
    }

    /// The state of `device`, created on first use.
    pub(crate) fn of_device<D: DeviceOps + 'static>(device: &D) -> &'static DeviceState {
        let key = (TypeId::of::<D>(), device.id());
        if let Some(found) = STATES.read().unwrap().iter().find(|s| s.key == key) {
            return found;
        }
        let mut all = STATES.write().unwrap();
        if let Some(found) = all.iter().find(|s| s.key == key) {
            return found;
        }
        let state: &'static DeviceState =
            Box::leak(Box::new(DeviceState::new(key, format!("{device:?}"))));
        all.push(state);
        state
    }

    /// The state for calls that name no tensor and no device (e.g. capability queries): they
    /// are counted, never charged.
    pub(crate) fn unattributed() -> &'static DeviceState {
        static UNATTRIBUTED: std::sync::OnceLock<&'static DeviceState> = std::sync::OnceLock::new();
        UNATTRIBUTED.get_or_init(|| {
            Box::leak(Box::new(DeviceState::new(
                (TypeId::of::<()>(), DeviceId::new(u16::MAX, u16::MAX)),
                "unattributed".into(),
            )))
        })
    }

    /// Every device state created so far, in creation order.
    pub(crate) fn all() -> Vec<&'static DeviceState> {
        STATES.read().unwrap().clone()
    }

    /// Whether new tensors on this device are managed (a budget is set or a scope is open).
    #[inline]
    pub(crate) fn managing(&self) -> bool {
        self.managing.load(Relaxed)
    }

    fn update_managing(&self) {
        let on = self.budget.limit().is_some() || self.scopes.any_open();
        self.managing.store(on, Relaxed);
    }

    /// Counts a call of `op`.
    #[inline]
    pub(crate) fn count_call(&self, op: OpId) {
        self.ledger.count_call(op);
    }

    /// Records a new buffer for `tensor`, produced by `op`, with the current phase's role.
    #[inline]
    pub(crate) fn charge<P: TensorMetadata>(&'static self, tensor: &P, op: OpId) -> Storage {
        Self::storage(
            self,
            self.ledger.charge(&tensor.shape(), tensor.dtype(), op),
        )
    }

    /// Records a new buffer for `tensor`, produced by `op`, for `role`.
    pub(crate) fn charge_as<P: TensorMetadata>(
        &'static self,
        tensor: &P,
        op: OpId,
        role: Role,
    ) -> Storage {
        let charge = self
            .ledger
            .charge_as(&tensor.shape(), tensor.dtype(), op, role);
        Self::storage(self, charge)
    }

    #[inline]
    fn storage(&'static self, charge: Charge) -> Storage {
        Storage {
            state: self,
            bytes: charge.bytes,
            op: charge.op,
            seq: charge.seq,
            role: AtomicU8::new(charge.role as u8),
            plan_owner: AtomicU64::new(NO_OWNER),
            narrow_cast: Mutex::new(None),
        }
    }

    /// Sets the budget (`None`: none) and keeps it at once. Unless the user chose one, the
    /// host memory offloads may use is set to [`HOST_SHARE`] of what the host has available
    /// now.
    pub(crate) fn set_budget(&self, limit: Option<u64>) {
        if limit.is_some() && !self.budget.host_limit_chosen() {
            let host = available_host_memory().map(|bytes| (bytes as f64 * HOST_SHARE) as u64);
            self.budget.set_host_limit(host, false);
        }
        self.budget.set_limit(limit);
        self.update_managing();
        self.reclaim(Reclaim::AfterOp {
            op: None,
            needed: 0,
        });
    }

    /// Frees memory under the budget for `request` (see [`Reclaim`]); the bytes freed. Runs
    /// before and after every op, and from the allocator when an allocation fails.
    #[inline]
    pub(crate) fn reclaim(&self, request: Reclaim) -> u64 {
        self.budget.reclaim(&self.ledger, request)
    }

    /// Opens a checkpoint scope.
    pub(crate) fn open_scope(&self) -> OpenScope {
        let scope = self.scopes.open(self.budget.next_ordinal(), &self.budget);
        self.update_managing();
        scope
    }

    /// Closes `scope`, evicting what it created except `keep` (see [`Scopes::close`]).
    pub(crate) fn close_scope(&self, scope: OpenScope, keep: &[usize]) {
        self.scopes.close(scope, keep, &self.budget);
        self.update_managing();
    }
}

/// One device buffer as the ledger sees it. Views of a tensor share its record through an
/// `Arc`, so a buffer is counted once however many tensors point into it; the bytes leave the
/// ledger when the last of them is dropped.
pub(crate) struct Storage {
    /// The device it is charged to.
    pub(crate) state: &'static DeviceState,
    /// Its bytes.
    pub(crate) bytes: u64,
    /// The op that produced it.
    pub(crate) op: OpId,
    seq: u64,
    /// Its [`Role`], as an index: it changes when the buffer is tagged.
    role: AtomicU8,
    /// The budget's ordinal of the first managed tensor made on it ([`NO_OWNER`]: none yet):
    /// views and same-device moves made later share it, and the step plan counts its bytes
    /// once, held until the last read of any of them.
    pub(crate) plan_owner: AtomicU64,
    /// Autocast's cast of the whole buffer to a narrower float type, kept while the buffer
    /// lives so that backward does not cast a saved weight or activation again (PyTorch's
    /// autocast keeps its weight casts for the same reason). Dropped with the buffer, and by
    /// [`Storage::forget_cast`] when a kernel writes the buffer in place.
    narrow_cast: Mutex<Option<(DType, Box<dyn Any + Send + Sync>)>>,
}

/// [`Storage::plan_owner`] before a managed tensor is made on it.
pub(crate) const NO_OWNER: u64 = u64::MAX;

impl Storage {
    /// What the buffer is for.
    pub(crate) fn role(&self) -> Role {
        Role::from_index(self.role.load(Relaxed))
    }

    /// Tags the buffer as `role`, moving its bytes there in the ledger.
    pub(crate) fn set_role(&self, role: Role) {
        let before = Role::from_index(self.role.swap(role as u8, Relaxed));
        self.state.ledger.move_role(self.bytes, before, role);
    }

    /// The kept cast of the buffer to `dtype`, if autocast made one.
    pub(crate) fn kept_cast<T: Clone + 'static>(&self, dtype: DType) -> Option<T> {
        let kept = self.narrow_cast.lock().unwrap_or_else(|e| e.into_inner());
        match &*kept {
            Some((kept_dtype, cast)) if *kept_dtype == dtype => cast.downcast_ref::<T>().cloned(),
            _ => None,
        }
    }

    /// Keeps `cast`, the buffer cast to `dtype` (replacing a cast to another type).
    pub(crate) fn keep_cast<T: Send + Sync + 'static>(&self, dtype: DType, cast: T) {
        let previous = self
            .narrow_cast
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace((dtype, Box::new(cast)));
        // Dropping a tensor credits the ledger: not under the lock.
        drop(previous);
    }

    /// Drops the kept cast: the buffer's contents changed in place. Only Frugal's own
    /// kernels write in place, and they exist only with a CubeCL runtime.
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    pub(crate) fn forget_cast(&self) {
        let previous = self
            .narrow_cast
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(previous);
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.state.ledger.release(&Charge {
            bytes: self.bytes,
            op: self.op,
            seq: self.seq,
            role: Role::from_index(*self.role.get_mut()),
        });
    }
}
