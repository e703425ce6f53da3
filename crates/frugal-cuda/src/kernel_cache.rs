//! Compiled kernels on disk, so that a second process loads what the first compiled instead of
//! running NVRTC again.
//!
//! An entry is keyed by the SHA-256 of everything that decides the compiler's output: the
//! kernel id's stable hash (CubeCL's name for a kernel and every setting that changes its
//! code), the compiler's options (architecture, include paths), the NVRTC and driver versions
//! and this file's format version. Each entry is one file named by its key's hex:
//! `FRUGALK1`, the key, the payload's length and SHA-256, then the payload. Writers write a
//! file of their own and rename it into place, so concurrent processes never see a half-written
//! entry (the last rename wins, and every entry is complete). A file that does not check out —
//! truncated, another key, a payload whose hash differs — is a miss, and the next compilation
//! replaces it.
//!
//! Where: the folder `FRUGAL_CUDA_KERNEL_CACHE` names (`off` turns the cache off), by default
//! `target/frugal-cuda-kernels` under the working directory, next to CubeCL's autotune cache.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"FRUGALK1";
const HEADER: usize = MAGIC.len() + 32 + 8 + 32;

/// The environment variable naming the cache's folder (`off`: no cache).
pub const KERNEL_CACHE_ENV: &str = "FRUGAL_CUDA_KERNEL_CACHE";

/// The key of one compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelKey([u8; 32]);

impl KernelKey {
    /// The key of the compiler's output for these inputs (each is length-prefixed, so no two
    /// lists of parts hash the same).
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(MAGIC);
        for part in parts {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    fn file_name(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Compiled kernels in one folder (see the module doc).
#[derive(Debug)]
pub struct KernelCache {
    dir: PathBuf,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl KernelCache {
    /// The cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The cache [`KERNEL_CACHE_ENV`] names, or the default folder; `None` when it says `off`.
    pub fn from_env() -> Option<Self> {
        match std::env::var_os(KERNEL_CACHE_ENV) {
            Some(value) if value == "off" => None,
            Some(value) if !value.is_empty() => Some(Self::new(value)),
            _ => Some(Self::new(Path::new("target").join("frugal-cuda-kernels"))),
        }
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The payload stored under `key`, if a complete and intact entry is there.
    pub fn get(&self, key: &KernelKey) -> Option<Vec<u8>> {
        let found = fs::read(self.dir.join(key.file_name()))
            .ok()
            .and_then(|bytes| Self::check(key, bytes));
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Relaxed);
        found
    }

    fn check(key: &KernelKey, mut bytes: Vec<u8>) -> Option<Vec<u8>> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC || bytes[8..40] != key.0 {
            return None;
        }
        let len = u64::from_le_bytes(bytes[40..48].try_into().ok()?) as usize;
        if bytes.len() - HEADER != len {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(&bytes[HEADER..]).into();
        if bytes[48..80] != digest {
            return None;
        }
        Some(bytes.split_off(HEADER))
    }

    /// Stores `payload` under `key`: written to a file of this process and thread, then renamed
    /// into place.
    pub fn put(&self, key: &KernelKey, payload: &[u8]) -> io::Result<()> {
        static WRITES: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(&self.dir)?;
        let name = key.file_name();
        let tmp = self.dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            WRITES.fetch_add(1, Relaxed)
        ));
        let write = || -> io::Result<()> {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(MAGIC)?;
            file.write_all(&key.0)?;
            file.write_all(&(payload.len() as u64).to_le_bytes())?;
            file.write_all(&Sha256::digest(payload))?;
            file.write_all(payload)?;
            file.sync_all()?;
            fs::rename(&tmp, self.dir.join(&name))
        };
        let written = write();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Lookups that found an entry, and lookups that did not, since the cache was made.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("frugal-kernel-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_stored_kernel_comes_back_and_other_keys_miss() {
        let dir = scratch("round-trip");
        let cache = KernelCache::new(&dir);
        let key = KernelKey::of(&[b"source", b"sm_90a"]);
        assert_eq!(cache.get(&key), None);
        cache.put(&key, b"ptx text\0").unwrap();
        assert_eq!(cache.get(&key).as_deref(), Some(&b"ptx text\0"[..]));
        // Another option, or the same bytes split differently, is another kernel.
        assert_eq!(cache.get(&KernelKey::of(&[b"source", b"sm_89"])), None);
        assert_ne!(KernelKey::of(&[b"sourcesm", b"_90a"]), key);
        assert_eq!(cache.hits_and_misses(), (1, 2));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_truncated_or_misnamed_entries_are_misses_and_get_replaced() {
        let dir = scratch("corrupt");
        let cache = KernelCache::new(&dir);
        let key = KernelKey::of(&[b"kernel a"]);
        let path = dir.join(key.file_name());
        cache.put(&key, b"payload of a").unwrap();
        let good = fs::read(&path).unwrap();

        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert_eq!(cache.get(&key), None, "a flipped payload byte");

        fs::write(&path, &good[..good.len() - 3]).unwrap();
        assert_eq!(cache.get(&key), None, "a truncated file");

        fs::write(&path, &good[..10]).unwrap();
        assert_eq!(cache.get(&key), None, "a file shorter than the header");

        // Kernel b's entry copied under a's name.
        let other = KernelKey::of(&[b"kernel b"]);
        cache.put(&other, b"payload of b").unwrap();
        fs::copy(dir.join(other.file_name()), &path).unwrap();
        assert_eq!(cache.get(&key), None, "another key's entry");

        cache.put(&key, b"payload of a").unwrap();
        assert_eq!(cache.get(&key).as_deref(), Some(&b"payload of a"[..]));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_writers_and_readers_only_ever_see_whole_entries() {
        let dir = scratch("concurrent");
        let key = KernelKey::of(&[b"shared kernel"]);
        let payloads: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 64 * 1024]).collect();
        std::thread::scope(|scope| {
            for payload in &payloads {
                let cache = KernelCache::new(&dir);
                scope.spawn(move || {
                    for _ in 0..20 {
                        cache.put(&key, payload).unwrap();
                    }
                });
            }
            let cache = KernelCache::new(&dir);
            let all = &payloads;
            scope.spawn(move || {
                for _ in 0..200 {
                    if let Some(found) = cache.get(&key) {
                        assert!(all.contains(&found), "a mixed or partial entry");
                    }
                }
            });
        });
        let found = KernelCache::new(&dir).get(&key).expect("an entry");
        assert!(payloads.contains(&found));
        let leftovers = fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1, "temporary files left behind");
        let _ = fs::remove_dir_all(&dir);
    }
}
