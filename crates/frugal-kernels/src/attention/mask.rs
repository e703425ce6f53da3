//! The rules every attention kernel applies to a score, the flash kernels and the score-matrix
//! kernels alike: the scale, the additive bias, the causal mask, and how a masked score is
//! stored and turned into a probability.
//!
//! Masked scores are represented by a large finite negative number rather than `-inf`, and a
//! probability is computed only for unmasked scores, so that fast-math compilers and rows with
//! every key masked give 0 rather than NaN.

// `if mask.has_bias { if play { .. } }`: the outer test is comptime, so a kernel built without
// a bias has no branch at all; merged into one condition it would become a runtime test.
#![allow(clippy::collapsible_if)]

use cubecl::prelude::*;

/// A score at or below this is masked (an additive bias of `-inf` or of a very large negative
/// value masks too).
pub(crate) const MASKED: f32 = -1.0e30;
/// What a masked score is stored as.
pub(crate) const MASKED_SCORE: f32 = -1.0e38;

/// The sizes, bias strides and scale of an attention call, as every attention kernel takes
/// them at run time.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct ScoreArgs {
    /// Query rows.
    pub seq_q: usize,
    /// Key rows.
    pub seq_k: usize,
    /// Heads (the bias is indexed by batch and head separately).
    pub heads: usize,
    /// Bias elements between batches (0 where it broadcasts).
    pub bias_batch: usize,
    /// Bias elements between heads (0 where it broadcasts).
    pub bias_head: usize,
    /// Bias elements between query rows (0 where it broadcasts).
    pub bias_row: usize,
    /// Factor applied to `q kᵀ`.
    pub scale: f32,
}

/// The masks a kernel is built with: compile-time, so that a kernel without a bias or without
/// the causal mask has no code for it.
#[derive(Debug, Hash, PartialEq, Eq, Clone, Copy)]
pub(crate) struct Mask {
    /// Keys after the query are masked.
    pub causal: bool,
    /// A bias is added (and can mask).
    pub has_bias: bool,
}

/// Whether the pair (`row`, `key`) takes part: both in range and, when causal, `key <= row`
/// (keys after the query are masked, aligned at the top left as Burn's own causal mask is).
#[cube]
fn in_play(row: usize, key: usize, args: &ScoreArgs, #[comptime] causal: bool) -> bool {
    let mut ok = row < args.seq_q && key < args.seq_k;
    if causal {
        ok = ok && key <= row;
    }
    ok
}

/// The bias added to the score of (`row`, `key`) of the `(batch, head)` pair `bh`: the bias is
/// indexed with strides `bias_batch`, `bias_head`, `bias_row` (0 where it broadcasts) and 1.
#[cube]
fn bias_at<E: Float>(bias: &Array<E>, bh: usize, row: usize, key: usize, args: &ScoreArgs) -> f32 {
    let index = (bh / args.heads) * args.bias_batch
        + (bh % args.heads) * args.bias_head
        + row * args.bias_row
        + key;
    f32::cast_from(bias[index])
}

/// The score of (`row`, `key`) of the `(batch, head)` pair `bh` from its unscaled `q · k`:
/// `unscaled · scale + bias`, or [`MASKED_SCORE`] where the pair is out of range, masked by
/// the causal mask, or masked by the bias.
#[cube]
pub(crate) fn masked_score<E: Float>(
    unscaled: f32,
    bias: &Array<E>,
    bh: usize,
    row: usize,
    key: usize,
    args: &ScoreArgs,
    #[comptime] mask: Mask,
) -> f32 {
    let mut score = unscaled * args.scale;
    let play = in_play(row, key, args, mask.causal);
    if mask.has_bias {
        if play {
            score += bias_at::<E>(bias, bh, row, key, args);
        }
    }
    select(play && score > MASKED, score, MASKED_SCORE)
}

/// `exp(score − offset)` for an unmasked score (the offset a running maximum or a logsumexp),
/// 0 for a masked one.
#[cube]
pub(crate) fn prob(score: f32, offset: f32) -> f32 {
    select(score > MASKED, (score - offset).exp(), 0.0f32)
}
