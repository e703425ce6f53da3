//! Host memory faulted in by several threads at once, before the driver pins it.
//!
//! Pinning new host memory with `cuMemAllocHost` is slow, on one thread or many: the driver
//! faults the pages in one after another. Offloading tensors grows the pinned pool by tens of
//! gigabytes in a training step's first pass, so a budget that offloads spent most of that
//! step there. Faulting the pages in first, a piece per thread, and then registering them
//! (`cuMemHostRegister`, which finds them resident) is several times faster, as PyTorch's
//! `pinned_use_cuda_host_register` is (`docs/results.md`, "Pinned host memory faulted in on
//! several threads"). This module is the part that needs no driver:
//! the allocation, its pieces and the threads that touch them.

use std::alloc::{Layout, alloc, dealloc};
use std::mem::MaybeUninit;
use std::ops::Range;
use std::ptr::NonNull;

/// The host's page size as far as faulting goes: one write per this many bytes maps a page
/// (larger pages are mapped by the first write into them).
pub const HOST_PAGE: usize = 4096;

/// Bytes one thread faults in at least: smaller allocations are touched by the calling thread
/// alone, where a thread's start would cost more than it saves.
pub const BYTES_PER_TOUCH_THREAD: usize = 64 << 20;

/// The most threads that fault one allocation in.
pub const MAX_TOUCH_THREADS: usize = 16;

/// Page-aligned host memory whose every page is mapped (written once), not yet pinned. Freed
/// when dropped.
#[derive(Debug)]
pub struct FaultedPages {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value alone; nothing in it is tied to a thread.
unsafe impl Send for FaultedPages {}

impl FaultedPages {
    /// Allocates `size` bytes in whole pages aligned to [`HOST_PAGE`] and writes a zero
    /// into each of their pages, on up to `threads` threads (see [`touch_pieces`]). `None` if
    /// the host has no such memory.
    pub fn new(size: usize, threads: usize) -> Option<Self> {
        // Whole pages: the driver pins whole pages, and two registered ranges may not share one.
        let whole_pages = size.max(1).checked_next_multiple_of(HOST_PAGE)?;
        let layout = Layout::from_size_align(whole_pages, HOST_PAGE).ok()?;
        // SAFETY: the layout has a nonzero size.
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        let pages = Self { ptr, layout };
        // SAFETY: the allocation holds `layout.size()` bytes, owned by `pages` and not yet
        // handed out; `MaybeUninit` makes writing to uninitialised bytes sound.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<MaybeUninit<u8>>(), layout.size())
        };
        let pieces = touch_pieces(bytes.len(), threads);
        std::thread::scope(|scope| {
            let mut rest = &mut bytes[..];
            for (index, piece) in pieces.iter().enumerate() {
                let (mine, after) = rest.split_at_mut(piece.len());
                rest = after;
                if index + 1 == pieces.len() {
                    // The last piece on the calling thread, which would otherwise only wait.
                    touch(mine);
                } else {
                    scope.spawn(move || touch(mine));
                }
            }
        });
        Some(pages)
    }

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes held: the size asked for, rounded up to whole pages (one page for zero).
    pub fn len(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for FaultedPages {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Writes a zero into the first byte of each [`HOST_PAGE`] of `bytes`, which maps the page.
fn touch(bytes: &mut [MaybeUninit<u8>]) {
    for byte in bytes.iter_mut().step_by(HOST_PAGE) {
        byte.write(0);
    }
}

/// How `len` bytes split among at most `threads` threads: pieces of whole pages, in order,
/// each of at least [`BYTES_PER_TOUCH_THREAD`] bytes but the last, at most
/// [`MAX_TOUCH_THREADS`] of them. Together they cover `0..len` exactly.
pub fn touch_pieces(len: usize, threads: usize) -> Vec<Range<usize>> {
    let threads = threads
        .clamp(1, MAX_TOUCH_THREADS)
        .min(len.div_ceil(BYTES_PER_TOUCH_THREAD))
        .max(1);
    let piece = len
        .div_ceil(threads)
        .next_multiple_of(HOST_PAGE)
        .max(HOST_PAGE);
    (0..len)
        .step_by(piece)
        .map(|start| start..(start + piece).min(len))
        .collect()
}

/// Threads worth faulting host pages in with on this machine: its available parallelism, at
/// most [`MAX_TOUCH_THREADS`].
pub fn touch_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_TOUCH_THREADS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pieces_cover_every_byte_once_in_whole_pages() {
        for len in [
            0,
            1,
            HOST_PAGE,
            BYTES_PER_TOUCH_THREAD + 1,
            1 << 30,
            (1 << 30) + 12345,
        ] {
            for threads in [0, 1, 3, 8, 16, 64] {
                let pieces = touch_pieces(len, threads);
                assert!(
                    pieces.len() <= threads.clamp(1, MAX_TOUCH_THREADS),
                    "{len} {threads}"
                );
                let mut next = 0;
                for piece in &pieces {
                    assert_eq!(piece.start, next, "{len} {threads}: {pieces:?}");
                    assert_eq!(piece.start % HOST_PAGE, 0);
                    next = piece.end;
                }
                assert_eq!(next, len, "{len} {threads}: {pieces:?}");
            }
        }
    }

    #[test]
    fn small_allocations_stay_on_one_thread_and_large_ones_spread() {
        assert_eq!(touch_pieces(BYTES_PER_TOUCH_THREAD, 16).len(), 1);
        assert_eq!(touch_pieces(2 * BYTES_PER_TOUCH_THREAD, 16).len(), 2);
        assert_eq!(touch_pieces(1 << 30, 8).len(), 8);
        assert_eq!(touch_pieces(1 << 30, 64).len(), MAX_TOUCH_THREADS);
        let pieces = touch_pieces(1 << 30, 8);
        assert!(
            pieces[..7]
                .iter()
                .all(|p| p.len() >= BYTES_PER_TOUCH_THREAD)
        );
    }

    #[test]
    fn faulted_pages_are_aligned_written_and_usable() {
        let size = 3 * BYTES_PER_TOUCH_THREAD + 100;
        let pages = FaultedPages::new(size, 4).expect("host memory");
        assert_eq!(pages.as_ptr() as usize % HOST_PAGE, 0);
        assert_eq!(pages.len(), size.next_multiple_of(HOST_PAGE));
        // SAFETY: the first byte of every page was written by `new`.
        let written = (0..size)
            .step_by(HOST_PAGE)
            .all(|at| unsafe { pages.as_ptr().add(at).read() } == 0);
        assert!(written);
        // SAFETY: the allocation holds `size` bytes.
        unsafe { pages.as_ptr().add(size - 1).write(7) };
        assert_eq!(FaultedPages::new(0, 4).expect("one page").len(), HOST_PAGE);
    }
}
