//! PyTorch's memory_viz file (what `torch.cuda.memory._snapshot()` pickles and
//! <https://pytorch.org/memory_viz> draws) from a [`Snapshot`]'s recorded timeline.
//!
//! The ledger knows buffers, not addresses, so each recorded buffer gets a synthetic segment
//! of its own at an address no other buffer uses: the viewer's "Active Memory Timeline" then
//! shows the ledger's live bytes, each allocation labelled with the op that made it and the
//! phase ([`crate::memory::mark`]) it was made in. Buffers allocated before recording started
//! are not in the file (their allocation was not seen).
//!
//! The viewer's unpickler reads protocol 2–4 dicts, lists, ints of at most 8 bytes, floats,
//! strings, None and bools; sizes and addresses are written as `i64` so that none needs a
//! longer integer.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::ledger::{Event, EventKind};
use crate::report::Snapshot;

/// The alignment of the synthetic addresses (CUDA's allocation granule for small blocks).
const ALIGN: u64 = 512;

#[derive(Serialize)]
struct VizFile {
    segments: Vec<VizSegment>,
    device_traces: Vec<Vec<VizTrace>>,
}

#[derive(Serialize)]
struct VizSegment {
    device: i64,
    address: i64,
    total_size: i64,
    stream: i64,
    segment_type: &'static str,
    allocated_size: i64,
    active_size: i64,
    blocks: Vec<VizBlock>,
}

#[derive(Serialize)]
struct VizBlock {
    size: i64,
    requested_size: i64,
    address: i64,
    state: &'static str,
    frames: Vec<VizFrame>,
}

#[derive(Serialize, Clone)]
struct VizFrame {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Serialize)]
struct VizTrace {
    action: &'static str,
    addr: i64,
    size: i64,
    stream: i64,
    time_us: i64,
    frames: Vec<VizFrame>,
}

/// A recorded buffer: its synthetic address, size and where it was made.
struct Buffer {
    address: u64,
    bytes: u64,
    frames: Vec<VizFrame>,
}

/// Builds the file's contents from a snapshot's events.
fn viz_file(events: &[Event]) -> VizFile {
    let mut next_address = ALIGN;
    let mut phase: Option<&str> = None;
    let mut live: HashMap<u64, Buffer> = HashMap::new();
    let mut trace = Vec::with_capacity(events.len());
    for event in events {
        match event.kind {
            EventKind::Mark => phase = Some(&event.op),
            EventKind::Alloc => {
                let address = next_address;
                next_address += event.bytes.div_ceil(ALIGN).max(1) * ALIGN;
                let name = match phase {
                    Some(phase) => format!("{} ({phase})", event.op),
                    None => event.op.clone(),
                };
                let frames = vec![VizFrame {
                    filename: format!("{:?} {}", event.shape, event.dtype),
                    line: 0,
                    name,
                }];
                trace.push(VizTrace {
                    action: "alloc",
                    addr: address as i64,
                    size: event.bytes as i64,
                    stream: 0,
                    time_us: event.seq as i64,
                    frames: frames.clone(),
                });
                live.insert(
                    event.alloc_seq,
                    Buffer {
                        address,
                        bytes: event.bytes,
                        frames,
                    },
                );
            }
            EventKind::Free => {
                // A buffer allocated before recording started has no address here.
                if let Some(buffer) = live.remove(&event.alloc_seq) {
                    trace.push(VizTrace {
                        action: "free_completed",
                        addr: buffer.address as i64,
                        size: buffer.bytes as i64,
                        stream: 0,
                        time_us: event.seq as i64,
                        frames: buffer.frames,
                    });
                }
            }
        }
    }
    let mut buffers: Vec<Buffer> = live.into_values().collect();
    buffers.sort_by_key(|b| b.address);
    let segments = buffers
        .into_iter()
        .map(|buffer| {
            // One block tiling the segment: the viewer recomputes block addresses from
            // their sizes in order.
            let size = buffer.bytes.div_ceil(ALIGN).max(1) * ALIGN;
            VizSegment {
                device: 0,
                address: buffer.address as i64,
                total_size: size as i64,
                stream: 0,
                segment_type: "large",
                allocated_size: size as i64,
                active_size: size as i64,
                blocks: vec![VizBlock {
                    size: size as i64,
                    requested_size: buffer.bytes as i64,
                    address: buffer.address as i64,
                    state: "active_allocated",
                    frames: buffer.frames,
                }],
            }
        })
        .collect();
    VizFile {
        segments,
        device_traces: vec![trace],
    }
}

impl Snapshot {
    /// Writes the recorded timeline as a PyTorch memory_viz pickle (see the module doc of
    /// `memory_viz`), to open at <https://pytorch.org/memory_viz> or load with Python's
    /// `pickle`. The file is written to a temporary name and renamed into place.
    pub fn write_memory_viz(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let bytes = serde_pickle::to_vec(&viz_file(&self.events), serde_pickle::SerOptions::new())
            .map_err(io::Error::other)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, op: &str, bytes: u64, alloc_seq: u64, seq: u64) -> Event {
        Event {
            seq,
            kind,
            op: op.into(),
            bytes,
            shape: vec![],
            dtype: String::new(),
            alloc_seq,
            live_bytes: 0,
        }
    }

    #[test]
    fn frees_name_their_allocation_and_what_stays_live_becomes_segments() {
        let events = vec![
            event(EventKind::Mark, "forward", 0, 0, 0),
            event(EventKind::Alloc, "float_matmul", 1000, 7, 1),
            event(EventKind::Alloc, "float_add", 512, 8, 2),
            event(EventKind::Free, "", 1000, 7, 3),
            // Allocated before recording started: no address, left out.
            event(EventKind::Free, "", 64, 3, 4),
        ];
        let file = viz_file(&events);
        let trace = &file.device_traces[0];
        let actions: Vec<_> = trace.iter().map(|t| (t.action, t.size)).collect();
        assert_eq!(
            actions,
            [("alloc", 1000), ("alloc", 512), ("free_completed", 1000)]
        );
        assert_eq!(trace[0].addr, trace[2].addr);
        assert_ne!(trace[0].addr, trace[1].addr);
        assert_eq!(trace[0].frames[0].name, "float_matmul (forward)");
        assert_eq!(file.segments.len(), 1);
        let segment = &file.segments[0];
        assert_eq!(segment.address, trace[1].addr);
        assert_eq!(segment.blocks[0].requested_size, 512);
        assert_eq!(segment.blocks[0].size, segment.total_size);
    }
}
