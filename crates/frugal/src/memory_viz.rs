//! PyTorch's memory_viz file (what `torch.cuda.memory._snapshot()` pickles and
//! <https://pytorch.org/memory_viz> draws) from a [`Snapshot`].
//!
//! **On frugal-cuda** the file holds the caching allocator's real segments and blocks, at
//! their device addresses, as the snapshot found them ([`Snapshot::allocator`]). An expandable
//! segment with unmapped gaps becomes one segment per mapped range, as PyTorch reports them,
//! because the viewer lays blocks out by adding their sizes from their segment's address. The
//! trace is the allocator's, if it was recording: turn it on with
//! `frugal_cuda::record_allocation_trace(&device, true)` before the part to look at (the gpt
//! example and the peak-memory bench do, for their recorded step) and take the snapshot
//! before turning it off. Its events are `alloc` and `free_completed` (blocks, at their rounded
//! request sizes), `segment_alloc` and `segment_free` (plain segments), `segment_map` and
//! `segment_unmap` (memory mapped into or out of expandable segments) and `oom` (an allocation
//! that found no memory: `size` is the request, `device_free` the room that was left under
//! the cap when the cap refused, 0 when the device did). `time_us` is the event's index, not
//! a time. The allocator sees blocks, not ops, so every frame says only what it knows:
//! `frugal-cuda stream 0` (there is one stream per device) and `frugal-cuda block`,
//! `frugal-cuda segment` or `frugal-cuda out of memory`. Without the trace, the file has the
//! segments and an empty trace.
//!
//! **Elsewhere** the ledger knows buffers, not addresses, so each buffer of the recorded
//! timeline gets a synthetic segment of its own at an address no other buffer uses: the
//! viewer's "Active Memory Timeline" then shows the ledger's live bytes, each allocation
//! labelled with the op that made it, its role ([`crate::memory::Role`]) and the last mark
//! ([`crate::memory::mark`]) before it was made.
//! Buffers allocated before recording started are not in the file (their allocation was not
//! seen).
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
use crate::runtime::{AllocatorBlock, AllocatorEvent, AllocatorSegment, AllocatorView};

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
    #[serde(skip_serializing_if = "Option::is_none")]
    is_expandable: Option<bool>,
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
    /// Absent from `oom` entries, as in PyTorch's.
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<i64>,
    /// Only in `oom` entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<i64>,
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
                let role = event.role.label();
                let name = match phase {
                    Some(phase) => format!("{} ({role}, after {phase})", event.op),
                    None => format!("{} ({role})", event.op),
                };
                let frames = vec![VizFrame {
                    filename: format!("{:?} {}", event.shape, event.dtype),
                    line: 0,
                    name,
                }];
                trace.push(VizTrace {
                    action: "alloc",
                    addr: Some(address as i64),
                    device_free: None,
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
                        addr: Some(buffer.address as i64),
                        device_free: None,
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
                is_expandable: None,
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

/// An address or size as the file's integers: `i64`, which every device address fits.
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// What the allocator knows of a block, segment or failure, as the viewer's stack frames.
fn allocator_frames(what: &str) -> Vec<VizFrame> {
    vec![VizFrame {
        filename: "frugal-cuda stream 0".into(),
        line: 0,
        name: format!("frugal-cuda {what}"),
    }]
}

/// One segment of the file: `run`, blocks of `segment` that touch one another.
fn allocator_segment(segment: &AllocatorSegment, run: &[&AllocatorBlock]) -> VizSegment {
    let live = || run.iter().filter(|b| b.allocated);
    VizSegment {
        device: 0,
        address: int(run[0].address),
        total_size: int(run.iter().map(|b| b.size).sum()),
        stream: 0,
        // PyTorch knows two pools; frugal-cuda's huge pool is a large one set apart.
        segment_type: if segment.pool == "small" {
            "small"
        } else {
            "large"
        },
        allocated_size: int(live().map(|b| b.requested).sum()),
        active_size: int(live().map(|b| b.size).sum()),
        is_expandable: Some(segment.expandable),
        blocks: run
            .iter()
            .map(|b| VizBlock {
                size: int(b.size),
                requested_size: int(b.requested),
                address: int(b.address),
                state: if b.allocated {
                    "active_allocated"
                } else {
                    "inactive"
                },
                frames: if b.allocated {
                    allocator_frames("block")
                } else {
                    Vec::new()
                },
            })
            .collect(),
    }
}

/// Builds the file's contents from frugal-cuda's segments, blocks and trace.
fn allocator_viz_file(view: &AllocatorView) -> VizFile {
    let mut segments = Vec::new();
    for segment in &view.segments {
        let mut run: Vec<&AllocatorBlock> = Vec::new();
        for block in &segment.blocks {
            if let Some(last) = run.last()
                && last.address + last.size != block.address
            {
                segments.push(allocator_segment(segment, &run));
                run.clear();
            }
            run.push(block);
        }
        if !run.is_empty() {
            segments.push(allocator_segment(segment, &run));
        }
    }
    segments.sort_by_key(|s| s.address);
    let trace = view
        .trace
        .iter()
        .flatten()
        .enumerate()
        .map(|(at, event)| {
            let (action, what, addr, size) = match *event {
                AllocatorEvent::Alloc { address, size } => ("alloc", "block", address, size),
                AllocatorEvent::Free { address, size } => {
                    ("free_completed", "block", address, size)
                }
                AllocatorEvent::SegmentAlloc { address, size } => {
                    ("segment_alloc", "segment", address, size)
                }
                AllocatorEvent::SegmentFree { address, size } => {
                    ("segment_free", "segment", address, size)
                }
                AllocatorEvent::SegmentMap { address, size } => {
                    ("segment_map", "segment", address, size)
                }
                AllocatorEvent::SegmentUnmap { address, size } => {
                    ("segment_unmap", "segment", address, size)
                }
                AllocatorEvent::Oom { bytes, free } => {
                    return VizTrace {
                        action: "oom",
                        addr: None,
                        device_free: Some(int(free)),
                        size: int(bytes),
                        stream: 0,
                        time_us: at as i64,
                        frames: allocator_frames("out of memory"),
                    };
                }
            };
            VizTrace {
                action,
                addr: Some(int(addr)),
                device_free: None,
                size: int(size),
                stream: 0,
                time_us: at as i64,
                frames: allocator_frames(what),
            }
        })
        .collect();
    VizFile {
        segments,
        device_traces: vec![trace],
    }
}

/// The file as pickle bytes.
fn pickle(file: &VizFile) -> io::Result<Vec<u8>> {
    serde_pickle::to_vec(file, serde_pickle::SerOptions::new()).map_err(io::Error::other)
}

impl Snapshot {
    /// Writes the snapshot as a PyTorch memory_viz pickle, to open at
    /// <https://pytorch.org/memory_viz> or load with Python's `pickle`: on frugal-cuda the
    /// allocator's real segments and blocks and, if it was recording
    /// (`frugal_cuda::record_allocation_trace`), its trace; elsewhere the recorded timeline,
    /// one synthetic segment per buffer (see the module doc of `memory_viz`). The file is
    /// written to a temporary name and renamed into place.
    pub fn write_memory_viz(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let bytes = pickle(&match &self.allocator {
            Some(view) => allocator_viz_file(view),
            None => viz_file(&self.events),
        })?;
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
            role: crate::ledger::Role::Other,
            live_by_role: Default::default(),
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
        assert_eq!(
            trace[0].frames[0].name,
            "float_matmul (other, after forward)"
        );
        assert_eq!(file.segments.len(), 1);
        let segment = &file.segments[0];
        assert_eq!(Some(segment.address), trace[1].addr);
        assert_eq!(segment.blocks[0].requested_size, 512);
        assert_eq!(segment.blocks[0].size, segment.total_size);
    }

    const MIB: u64 = 1 << 20;

    fn block(address: u64, size: u64, requested: u64) -> AllocatorBlock {
        AllocatorBlock {
            address,
            size,
            requested,
            allocated: requested > 0,
        }
    }

    /// A frugal-cuda allocator as `frugal_cuda::allocator_history` would show it, with the trace
    /// from its start: a small plain segment with two live blocks, an expandable segment whose
    /// middle granule was unmapped after a free, a plain segment that came and went, and an
    /// allocation that failed.
    fn allocator() -> AllocatorView {
        let (small, exp, gone) = (0x7f00_0000_0000, 0x7f10_0000_0000, 0x7f20_0000_0000);
        use AllocatorEvent::*;
        let trace = vec![
            SegmentAlloc {
                address: small,
                size: 2 * MIB,
            },
            Alloc {
                address: small,
                size: 1024,
            },
            Alloc {
                address: small + 1024,
                size: 512,
            },
            Free {
                address: small + 1024,
                size: 512,
            },
            Alloc {
                address: small + 1024,
                size: 512,
            },
            SegmentMap {
                address: exp,
                size: 8 * MIB,
            },
            Alloc {
                address: exp,
                size: 3 * MIB,
            },
            Alloc {
                address: exp + 3 * MIB,
                size: 3 * MIB,
            },
            Alloc {
                address: exp + 6 * MIB,
                size: 2 * MIB,
            },
            Free {
                address: exp + 3 * MIB,
                size: 3 * MIB,
            },
            SegmentUnmap {
                address: exp + 4 * MIB,
                size: 2 * MIB,
            },
            SegmentAlloc {
                address: gone,
                size: 20 * MIB,
            },
            Alloc {
                address: gone,
                size: 12 * MIB,
            },
            Free {
                address: gone,
                size: 12 * MIB,
            },
            SegmentFree {
                address: gone,
                size: 20 * MIB,
            },
            Oom {
                bytes: 64 * MIB,
                free: 0,
            },
        ];
        AllocatorView {
            segments: vec![
                AllocatorSegment {
                    address: small,
                    pool: "small",
                    expandable: false,
                    blocks: vec![
                        block(small, 1024, 1024),
                        block(small + 1024, 512, 512),
                        block(small + 1536, 2 * MIB - 1536, 0),
                    ],
                },
                AllocatorSegment {
                    address: exp,
                    pool: "large",
                    expandable: true,
                    blocks: vec![
                        block(exp, 3 * MIB, 3 * MIB),
                        block(exp + 3 * MIB, MIB, 0),
                        block(exp + 6 * MIB, 2 * MIB, 2 * MIB),
                    ],
                },
            ],
            reserved_bytes: 8 * MIB,
            allocated_bytes: 1536 + 5 * MIB,
            trace: Some(trace),
        }
    }

    #[test]
    fn allocator_segments_tile_add_up_to_reserved_and_the_trace_replays_to_them() {
        let view = allocator();
        let file = allocator_viz_file(&view);
        // The expandable segment's two mapped ranges are segments of their own.
        assert_eq!(file.segments.len(), 3);
        let mut total = 0;
        let mut active = HashMap::new();
        for segment in &file.segments {
            // The viewer's layout: block addresses are the segment's plus the sizes before.
            let mut address = segment.address;
            for b in &segment.blocks {
                assert_eq!(b.address, address);
                address += b.size;
                if b.state == "active_allocated" {
                    active.insert(b.address, b.requested_size);
                } else {
                    assert_eq!(b.state, "inactive");
                }
            }
            assert_eq!(address - segment.address, segment.total_size);
            total += segment.total_size;
        }
        assert_eq!(total, view.reserved_bytes as i64);
        assert_eq!(
            active.values().sum::<i64>(),
            view.allocated_bytes as i64,
            "live blocks at their requests"
        );

        let trace = &file.device_traces[0];
        let mut live = HashMap::new();
        let mut mapped = 0;
        for t in trace {
            match t.action {
                "alloc" => assert!(live.insert(t.addr.unwrap(), t.size).is_none()),
                "free_completed" => assert_eq!(live.remove(&t.addr.unwrap()), Some(t.size)),
                "segment_alloc" | "segment_map" => mapped += t.size,
                "segment_free" | "segment_unmap" => mapped -= t.size,
                "oom" => {
                    assert_eq!((t.addr, t.device_free, t.size), (None, Some(0), 64 << 20));
                }
                other => panic!("unexpected action {other}"),
            }
        }
        assert_eq!(
            live, active,
            "the replay ends in the segments' active blocks"
        );
        assert_eq!(mapped, total, "and in their memory");
        assert_eq!(trace[0].frames[0].name, "frugal-cuda segment");
        assert_eq!(trace[1].frames[0].name, "frugal-cuda block");
        assert_eq!(trace[1].frames[0].filename, "frugal-cuda stream 0");

        // Without the trace: the same segments, nothing to replay.
        let untraced = allocator_viz_file(&AllocatorView {
            trace: None,
            ..view.clone()
        });
        assert_eq!(untraced.segments.len(), 3);
        assert_eq!(untraced.device_traces.len(), 1);
        assert!(untraced.device_traces[0].is_empty());
    }

    #[test]
    fn the_allocator_file_loads_in_python_and_replays_to_its_segments() {
        let view = allocator();
        let path = std::env::temp_dir().join(format!(
            "frugal-allocator-viz-{}.pickle",
            std::process::id()
        ));
        std::fs::write(&path, pickle(&allocator_viz_file(&view)).unwrap()).unwrap();
        let script = r#"
import pickle, sys
f = pickle.load(open(sys.argv[1], "rb"))
reserved = int(sys.argv[2])
assert set(f) == {"segments", "device_traces"}, f.keys()
active, total = {}, 0
for s in f["segments"]:
    addr = s["address"]
    for b in s["blocks"]:
        assert b["address"] == addr, (b, addr)
        addr += b["size"]
        if b["state"] == "active_allocated":
            active[b["address"]] = b["requested_size"]
    assert addr - s["address"] == s["total_size"], s
    total += s["total_size"]
assert total == reserved, (total, reserved)
live = {}
for t in f["device_traces"][0]:
    assert {"action", "size", "stream", "time_us", "frames"} <= set(t), t
    if t["action"] == "alloc":
        live[t["addr"]] = t["size"]
    elif t["action"] == "free_completed":
        assert live.pop(t["addr"]) == t["size"], t
    elif t["action"] == "oom":
        assert "addr" not in t and t["device_free"] == 0, t
assert live == active, (live, active)
print("ok")
"#;
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&path)
            .arg(view.reserved_bytes.to_string())
            .output()
            .expect("python3 runs");
        std::fs::remove_file(&path).ok();
        assert!(
            out.status.success() && out.stdout == b"ok\n",
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
