//! Kernel metadata kept on the device, so that a launch whose metadata the device already
//! holds queues no copy.
//!
//! CubeCL passes a kernel's shapes and strides (its dynamic metadata) in a device buffer, which
//! cubecl-cuda fills with a host-to-device copy before every launch: in a training step that is
//! one small copy for about every other kernel, each a few microseconds of the stream's time
//! and a few driver calls of the host's. A step launches the same kernels on the same shapes
//! every time, so the blobs repeat: each distinct blob is uploaded once into an append-only
//! device arena and found again by its bytes. A blob is never written again once uploaded, so
//! every launch that reads it, queued before or after, sees the same bytes.

use std::collections::HashMap;

use cubecl_core::server::{Binding, Handle};

/// Bytes of device memory per arena chunk.
pub(crate) const CHUNK_BYTES: u64 = 1 << 20;
/// Chunks at most; beyond, blobs not yet cached are uploaded at each launch, as before.
const MAX_CHUNKS: usize = 16;
/// Blobs longer than this are not cached (a chunk holds many).
const MAX_BLOB_BYTES: usize = 4096;
/// Blob offsets are aligned for any scalar the kernels read.
const ALIGN: u64 = 16;

#[derive(Debug)]
struct Chunk {
    handle: Handle,
    used: u64,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    chunk: usize,
    offset: u64,
    len: u64,
}

/// The arena and its index.
#[derive(Debug)]
pub(crate) struct MetadataCache {
    /// `FRUGAL_CUDA_METADATA_CACHE=0` turns the cache off (every launch uploads its metadata,
    /// as cubecl-cuda does), to compare.
    on: bool,
    chunks: Vec<Chunk>,
    index: HashMap<Box<[u8]>, Slot>,
    hits: u64,
}

impl Default for MetadataCache {
    fn default() -> Self {
        Self {
            on: std::env::var("FRUGAL_CUDA_METADATA_CACHE").map_or(true, |v| v != "0"),
            chunks: Vec::new(),
            index: HashMap::new(),
            hits: 0,
        }
    }
}

/// Where a blob goes: found on the device, to be written at a new place, or not cached.
pub(crate) enum Placement {
    /// Already on the device: bind this.
    Cached(Binding),
    /// A new place in the arena: write the blob there (once), then bind it.
    Fresh(Binding),
    /// No room in the last chunk, but the arena may grow: [`MetadataCache::add_chunk`], then
    /// place it again.
    NeedsChunk,
    /// Not cached (off, too long, or the arena is full): upload as before.
    Uncached,
}

impl MetadataCache {
    /// Adds a chunk of [`CHUNK_BYTES`] device bytes, which the arena keeps for good.
    pub fn add_chunk(&mut self, handle: Handle) {
        self.chunks.push(Chunk { handle, used: 0 });
    }

    /// Finds `blob` on the device, or gives it a place in the last chunk. One lookup of its
    /// bytes when it is found, which is every launch after a step's first.
    pub fn place(&mut self, blob: &[u8]) -> Placement {
        if !self.on || blob.len() > MAX_BLOB_BYTES {
            return Placement::Uncached;
        }
        if let Some(slot) = self.index.get(blob).copied() {
            self.hits += 1;
            return Placement::Cached(self.binding(slot));
        }
        let len = blob.len() as u64;
        let room = self.chunks.last().and_then(|chunk| {
            let offset = align(chunk.used);
            (offset + len <= CHUNK_BYTES).then_some(offset)
        });
        let Some(offset) = room else {
            return match self.chunks.len() < MAX_CHUNKS {
                true => Placement::NeedsChunk,
                false => Placement::Uncached,
            };
        };
        let chunk = self.chunks.len() - 1;
        self.chunks[chunk].used = offset + len;
        let slot = Slot { chunk, offset, len };
        self.index.insert(blob.into(), slot);
        Placement::Fresh(self.binding(slot))
    }

    /// Launches whose metadata was found on the device.
    #[allow(dead_code)]
    pub fn hits(&self) -> u64 {
        self.hits
    }

    fn binding(&self, slot: Slot) -> Binding {
        self.chunks[slot.chunk]
            .handle
            .clone()
            .offset_start(slot.offset)
            .offset_end(CHUNK_BYTES - slot.offset - slot.len)
            .binding()
    }
}

fn align(offset: u64) -> u64 {
    offset.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use cubecl_common::stream_id::StreamId;

    use super::*;

    fn cache() -> MetadataCache {
        MetadataCache {
            on: true,
            chunks: Vec::new(),
            index: HashMap::new(),
            hits: 0,
        }
    }

    fn chunk() -> Handle {
        Handle::new(StreamId::current(), CHUNK_BYTES)
    }

    fn range(binding: &Binding) -> (u64, u64) {
        let start = binding.offset_start.unwrap_or(0);
        (start, CHUNK_BYTES - binding.offset_end.unwrap_or(0))
    }

    #[test]
    fn a_blob_is_written_once_then_found_by_its_bytes_at_the_same_place() {
        let mut cache = cache();
        let blob = [1u8, 2, 3, 4, 5];
        assert!(
            matches!(cache.place(&blob), Placement::NeedsChunk),
            "no chunk yet"
        );
        cache.add_chunk(chunk());
        let Placement::Fresh(first) = cache.place(&blob) else {
            panic!("a new blob gets a place to be written");
        };
        assert_eq!(range(&first), (0, 5));
        let Placement::Cached(again) = cache.place(&blob) else {
            panic!("the same bytes are found");
        };
        assert_eq!(range(&again), (0, 5));
        assert_eq!(cache.hits(), 1);
        // Other bytes go after it, aligned, and never over it.
        let Placement::Fresh(other) = cache.place(&[9u8; 20]) else {
            panic!("new bytes");
        };
        assert_eq!(range(&other), (16, 36));
    }

    #[test]
    fn a_full_chunk_asks_for_another_and_a_full_arena_uploads_as_before() {
        let mut cache = cache();
        let blob = |i: u32| {
            let mut b = vec![0u8; MAX_BLOB_BYTES];
            b[..4].copy_from_slice(&i.to_le_bytes());
            b
        };
        let per_chunk = (CHUNK_BYTES / MAX_BLOB_BYTES as u64) as u32;
        let mut i = 0;
        for _ in 0..MAX_CHUNKS {
            assert!(matches!(cache.place(&blob(i)), Placement::NeedsChunk));
            cache.add_chunk(chunk());
            for _ in 0..per_chunk {
                assert!(matches!(cache.place(&blob(i)), Placement::Fresh(_)));
                i += 1;
            }
        }
        assert!(
            matches!(cache.place(&blob(i)), Placement::Uncached),
            "the arena is full"
        );
        assert!(matches!(cache.place(&blob(0)), Placement::Cached(_)));
        assert!(matches!(
            cache.place(&vec![0u8; MAX_BLOB_BYTES + 1]),
            Placement::Uncached
        ));
    }

    #[test]
    fn off_it_never_caches() {
        let mut cache = cache();
        cache.on = false;
        assert!(matches!(cache.place(&[1]), Placement::Uncached));
    }
}
