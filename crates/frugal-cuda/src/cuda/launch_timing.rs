//! Device time of every launch, product and copy on the server's stream, measured with CUDA
//! events, for a profile of a training step by kernel ([`super::set_launch_timing`],
//! [`super::take_launch_timings`]).
//!
//! Off by default, when it costs the server one branch per launch. On, each piece of work is
//! bracketed by two events on the stream; the times are read when the server synchronises
//! anyway (or when many are pending), so the host never waits for them between two syncs. The
//! gap between one piece's end and the next one's start is the time the device sat idle
//! waiting for the host to queue work.

use std::collections::HashMap;

use cudarc::driver::sys::{CUevent_flags, CUevent_st, CUstream};
use serde::Serialize;

/// Pieces of work timed before the server reads the events without being asked to sync.
const MAX_PENDING: usize = 1 << 14;

/// The device time one kind of work took while timing was on.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LaunchTotal {
    /// CubeCL's name of the kernel (its type), or `cuBLASLt product`, `copy to device`,
    /// `copy to host`.
    pub name: String,
    /// Launches timed.
    pub launches: u64,
    /// Device time between the launches' start and end events, in nanoseconds.
    pub device_nanos: u64,
}

/// What the device did while timing was on.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LaunchTimings {
    /// One entry per kind of work, longest first.
    pub kernels: Vec<LaunchTotal>,
    /// Device time between the end of one piece of work and the start of the next, in
    /// nanoseconds: the device idle, waiting for the host (launch overhead, host code, syncs).
    pub idle_nanos: u64,
}

impl LaunchTimings {
    /// Device time of every piece of work, in nanoseconds.
    pub fn busy_nanos(&self) -> u64 {
        self.kernels.iter().map(|k| k.device_nanos).sum()
    }

    /// Launches of every kind.
    pub fn launches(&self) -> u64 {
        self.kernels.iter().map(|k| k.launches).sum()
    }
}

type Event = *mut CUevent_st;

struct Timed {
    name: &'static str,
    start: Event,
    end: Event,
}

/// The server's side: events recorded around each piece of work, read in batches.
#[derive(Default)]
pub(crate) struct LaunchTimer {
    on: bool,
    spare: Vec<Event>,
    pending: Vec<Timed>,
    /// The end event of the last piece read, kept to measure the gap to the next start.
    last_end: Option<Event>,
    totals: HashMap<&'static str, (u64, u64)>,
    idle_nanos: u64,
}

impl std::fmt::Debug for LaunchTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchTimer")
            .field("on", &self.on)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// Token for one bracketed piece of work; `None` when timing is off.
pub(crate) type Started = Option<Event>;

impl LaunchTimer {
    /// Turns timing on (clearing what was measured) or off (keeping it for [`Self::take`]).
    pub fn set(&mut self, on: bool) {
        if on {
            self.read_pending();
            self.totals.clear();
            self.idle_nanos = 0;
            if let Some(end) = self.last_end.take() {
                self.spare.push(end);
            }
        } else {
            self.read_pending();
        }
        self.on = on;
    }

    /// Records the start event of a piece of work queued next on `stream`.
    #[inline]
    pub fn start(&mut self, stream: CUstream) -> Started {
        if !self.on {
            return None;
        }
        let event = self.event()?;
        // SAFETY: the event is ours and unused; the stream is the server's.
        unsafe { cudarc::driver::result::event::record(event, stream) }.ok()?;
        Some(event)
    }

    /// Records the end event of the piece of work started with `started`.
    #[inline]
    pub fn finish(&mut self, name: &'static str, started: Started, stream: CUstream) {
        let Some(start) = started else { return };
        let Some(end) = self.event() else {
            self.spare.push(start);
            return;
        };
        // SAFETY: as in `start`.
        if unsafe { cudarc::driver::result::event::record(end, stream) }.is_err() {
            self.spare.extend([start, end]);
            return;
        }
        self.pending.push(Timed { name, start, end });
        if self.pending.len() >= MAX_PENDING {
            self.read_pending();
        }
    }

    /// Reads the times of every pending piece of work, waiting for the last one to end.
    pub fn read_pending(&mut self) {
        let Some(last) = self.pending.last() else {
            return;
        };
        // SAFETY: recorded events of this context; a failed wait leaves the times unread.
        if unsafe { cudarc::driver::result::event::synchronize(last.end) }.is_err() {
            self.discard_pending();
            return;
        }
        let nanos = |from: Event, to: Event| {
            // SAFETY: both events are recorded and complete (the last one was waited for).
            unsafe { cudarc::driver::result::event::elapsed(from, to) }
                .map(|ms| (ms.max(0.0) as f64 * 1e6) as u64)
                .unwrap_or(0)
        };
        for timed in std::mem::take(&mut self.pending) {
            let total = self.totals.entry(timed.name).or_default();
            total.0 += 1;
            total.1 += nanos(timed.start, timed.end);
            if let Some(previous) = self.last_end.replace(timed.end) {
                self.idle_nanos += nanos(previous, timed.start);
                self.spare.push(previous);
            }
            self.spare.push(timed.start);
        }
    }

    /// What was measured since timing was turned on (reading what is pending first); the
    /// totals start again from zero.
    pub fn take(&mut self) -> LaunchTimings {
        self.read_pending();
        let mut kernels: Vec<LaunchTotal> = self
            .totals
            .drain()
            .map(|(name, (launches, device_nanos))| LaunchTotal {
                name: name.to_string(),
                launches,
                device_nanos,
            })
            .collect();
        kernels.sort_by_key(|k| std::cmp::Reverse(k.device_nanos));
        LaunchTimings {
            kernels,
            idle_nanos: std::mem::take(&mut self.idle_nanos),
        }
    }

    fn discard_pending(&mut self) {
        for timed in std::mem::take(&mut self.pending) {
            self.spare.extend([timed.start, timed.end]);
        }
        if let Some(end) = self.last_end.take() {
            self.spare.push(end);
        }
    }

    fn event(&mut self) -> Option<Event> {
        match self.spare.pop() {
            Some(event) => Some(event),
            // In the current context: the server's, made current when it was entered.
            None => cudarc::driver::result::event::create(CUevent_flags::CU_EVENT_DEFAULT).ok(),
        }
    }
}

impl Drop for LaunchTimer {
    fn drop(&mut self) {
        self.discard_pending();
        for event in self.spare.drain(..) {
            // SAFETY: every event here was created by `event` and is no longer recorded on
            // pending work that anyone reads.
            let _ = unsafe { cudarc::driver::result::event::destroy(event) };
        }
    }
}
