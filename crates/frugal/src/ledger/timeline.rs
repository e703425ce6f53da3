//! The bounded event timeline of one device: allocations, frees and marks, kept while
//! recording is on.

use std::collections::VecDeque;

use serde::Serialize;

use super::role::{Role, RoleBytes};

/// What happened in one timeline event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A new buffer was charged.
    Alloc,
    /// The last tensor pointing into a buffer was dropped.
    Free,
    /// A label set with [`crate::memory::mark`] (e.g. "backward").
    Mark,
}

/// One timeline event.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    /// Position of the event in the device's timeline since recording started.
    pub seq: u64,
    /// Alloc, free or mark.
    pub kind: EventKind,
    /// The Backend method that produced the buffer (the label, for a mark).
    pub op: String,
    /// Bytes of the buffer (0 for a mark).
    pub bytes: u64,
    /// Shape at allocation (empty for frees and marks).
    pub shape: Vec<usize>,
    /// Data type at allocation (empty for frees and marks).
    pub dtype: String,
    /// The allocation's number on the device (the n-th buffer charged since the process
    /// started): on an alloc, its own; on a free, the one it releases; 0 on a mark.
    pub alloc_seq: u64,
    /// Live bytes on the device right after the event.
    pub live_bytes: u64,
    /// The buffer's role (of an alloc or free; `Other` for a mark).
    pub role: Role,
    /// Live bytes per role right after the event.
    pub live_by_role: RoleBytes,
}

/// The last events recorded on a device, oldest first.
pub(crate) struct Timeline {
    pub(crate) capacity: usize,
    pub(crate) events: VecDeque<Event>,
    pub(crate) dropped: u64,
    next_seq: u64,
}

impl Timeline {
    pub(crate) fn new() -> Self {
        Self {
            capacity: 0,
            events: VecDeque::new(),
            dropped: 0,
            next_seq: 0,
        }
    }

    /// Appends `event`, numbering it; the oldest falls off when full.
    pub(crate) fn push(&mut self, mut event: Event) {
        if self.capacity == 0 {
            return;
        }
        event.seq = self.next_seq;
        self.next_seq += 1;
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }

    /// Starts over with room for `capacity` events (0: not recording).
    pub(crate) fn restart(&mut self, capacity: usize) {
        self.capacity = capacity;
        self.events = VecDeque::with_capacity(capacity.min(1 << 16));
        self.dropped = 0;
        self.next_seq = 0;
    }
}
