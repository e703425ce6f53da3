//! Training text and batches of byte tokens.
//!
//! The default corpus is generated at run time from a small grammar (sentences about animals
//! and sums of small numbers), so nothing is downloaded and the loss has structure to learn.
//! Any UTF-8 file can be used instead (`--data`). Tokens are bytes: vocabulary 256.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One step's tokens: `batch` rows of `seq` inputs and the next-token targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Input tokens, row-major `[batch, seq]`.
    pub inputs: Vec<i64>,
    /// Target tokens, row-major `[batch, seq]`.
    pub targets: Vec<i64>,
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
}

/// Vocabulary size of byte tokens.
pub const BYTE_VOCAB: usize = 256;

/// A token stream to sample training windows from.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The tokens (bytes of the text).
    pub tokens: Vec<u8>,
}

impl Corpus {
    /// Reads a UTF-8 text file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --data {}: {e}", path.display()))?;
        Ok(Self {
            tokens: text.into_bytes(),
        })
    }

    /// The generated default corpus of about `bytes` bytes, the same for the same seed.
    pub fn generated(bytes: usize, seed: u64) -> Self {
        const SUBJECTS: [&str; 8] = [
            "the cat",
            "a dog",
            "the old fox",
            "my bird",
            "the small horse",
            "a brown bear",
            "the quiet owl",
            "a young wolf",
        ];
        const VERBS: [&str; 6] = ["sees", "follows", "likes", "finds", "chases", "watches"];
        const PLACES: [&str; 5] = [
            "near the river",
            "in the forest",
            "at dawn",
            "under the bridge",
            "on the hill",
        ];
        let mut rng = StdRng::seed_from_u64(seed);
        let mut text = String::with_capacity(bytes + 64);
        while text.len() < bytes {
            if rng.random_bool(0.3) {
                let (a, b) = (rng.random_range(0..50u32), rng.random_range(0..50u32));
                text.push_str(&format!("{a} plus {b} is {}.\n", a + b));
            } else {
                let s = SUBJECTS[rng.random_range(0..SUBJECTS.len())];
                let v = VERBS[rng.random_range(0..VERBS.len())];
                let o = SUBJECTS[rng.random_range(0..SUBJECTS.len())];
                let p = PLACES[rng.random_range(0..PLACES.len())];
                text.push_str(&format!("{s} {v} {o} {p}.\n"));
            }
        }
        Self {
            tokens: text.into_bytes(),
        }
    }

    /// The `step`-th batch: `batch` random windows of `seq + 1` tokens, split into inputs and
    /// next-token targets. Depends only on `(seed, step)`, so a resumed run sees the same data.
    pub fn batch(&self, seed: u64, step: u64, batch: usize, seq: usize) -> Result<Batch, String> {
        if self.tokens.len() <= seq + 1 {
            return Err(format!(
                "the corpus has {} tokens; --seq {seq} needs at least {}",
                self.tokens.len(),
                seq + 2
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let start = rng.random_range(0..self.tokens.len() - seq - 1);
            let window = &self.tokens[start..start + seq + 1];
            inputs.extend(window[..seq].iter().map(|&t| t as i64));
            targets.extend(window[1..].iter().map(|&t| t as i64));
        }
        Ok(Batch {
            inputs,
            targets,
            batch,
            seq,
        })
    }
}

impl Batch {
    /// The first `rows` sequences (all of them if there are fewer).
    pub fn first_rows(&self, rows: usize) -> Batch {
        let rows = rows.min(self.batch);
        let len = rows * self.seq;
        Batch {
            inputs: self.inputs[..len].to_vec(),
            targets: self.targets[..len].to_vec(),
            batch: rows,
            seq: self.seq,
        }
    }

    /// The batch split into `parts` equal micro-batches of consecutive sequences; refused
    /// when `parts` does not divide the batch.
    pub fn split(self, parts: usize) -> Result<Vec<Batch>, frugal::AccumulationError> {
        let rows = frugal::micro_batch_size(self.batch, parts)?;
        if parts == 1 {
            return Ok(vec![self]);
        }
        let len = rows * self.seq;
        Ok(self
            .inputs
            .chunks(len)
            .zip(self.targets.chunks(len))
            .map(|(inputs, targets)| Batch {
                inputs: inputs.to_vec(),
                targets: targets.to_vec(),
                batch: rows,
                seq: self.seq,
            })
            .collect())
    }
}

/// Uniformly random tokens, as `torch_gpt.py` trains on: the `step`-th batch for a seed.
pub fn random_tokens(seed: u64, step: u64, batch: usize, seq: usize, vocab: usize) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut draw = || {
        (0..batch * seq)
            .map(|_| rng.random_range(0..vocab as i64))
            .collect::<Vec<_>>()
    };
    let inputs = draw();
    let targets = draw();
    Batch {
        inputs,
        targets,
        batch,
        seq,
    }
}
