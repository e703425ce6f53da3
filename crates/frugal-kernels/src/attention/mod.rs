//! Flash attention, forward and backward, for training without s² storage.
//!
//! [`attention_forward`] computes `out = softmax(scale · q kᵀ + bias, masked) · v` and each
//! query row's logsumexp (f32) in one pass over the keys, keeping running maxima and sums
//! (online softmax), so the `seq_q × seq_k` scores never reach device memory.
//! [`attention_backward`] recomputes the probabilities block by block from q, k and the
//! logsumexp: a prepass computes `delta = rowsum(dO ∘ O)`, one kernel walks the query blocks
//! for each block of keys (dK, dV), another the key blocks for each block of queries (dQ), as
//! in FlashAttention-2, so no two units write the same gradient and no atomics are needed.
//!
//! Inputs are f32, f16 or bf16 (one dtype for q, k, v, the output and its gradient), with f32
//! arithmetic throughout. Tensors are `[batch, heads, seq, head_dim]`, contiguous;
//! `head_dim` is at most [`MAX_HEAD_DIM`]. Causal masking is aligned at the top left (query
//! `i` sees keys `0..=i`), as Burn's `attention` does. An optional additive bias
//! (`[batch, heads, seq_q, seq_k]`, broadcast over batch or heads with a stride of 0) is added
//! to the scaled scores; a bias of `-inf` (or below `-1e30`) masks a score. The bias gets no
//! gradient here.
//!
//! Where a matrix library runs the products on tensor cores, [`scores_softmax`],
//! [`attention_delta`] and [`scores_backward`] are the element-wise passes between the
//! products of the same attention computed on a materialised score matrix (see `scores.rs`).

mod kernels;
mod mask;
pub(crate) mod scores;
mod tiles;

pub use scores::{ScoreGrads, ScoresSoftmax, attention_delta, scores_backward, scores_softmax};

use cubecl::{prelude::*, server::Handle};

use crate::{FloatDtype, KernelError, cast::check_buffer};
use kernels::{OperandsLaunch, SavedLaunch};
use mask::{Mask, ScoreArgsLaunch};
use tiles::Flash;

/// The largest head dimension the kernels take (each unit keeps a few rows of this length in
/// registers).
pub const MAX_HEAD_DIM: usize = 128;

/// Sizes of an attention call: q is `[batch, heads, seq_q, head_dim]`, k and v are
/// `[batch, heads, seq_k, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Number of heads.
    pub heads: usize,
    /// Query rows.
    pub seq_q: usize,
    /// Key and value rows.
    pub seq_k: usize,
    /// Elements per row of q, k and v.
    pub head_dim: usize,
}

impl AttentionShape {
    /// Elements of q (and of the output).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.seq_q * self.head_dim
    }

    /// Elements of k (and of v).
    pub fn kv_len(&self) -> usize {
        self.batch * self.heads * self.seq_k * self.head_dim
    }

    /// Elements of the logsumexp (one per query row).
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.seq_q
    }
}

/// Masking and scaling of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionConfig {
    /// Mask every key after the query (`key > row`).
    pub causal: bool,
    /// Factor applied to `q kᵀ`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
}

impl AttentionConfig {
    /// The scale in use for `head_dim`.
    pub fn scale_for(&self, head_dim: usize) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (head_dim as f32).sqrt())
    }
}

/// An additive bias on the scores, in the dtype of q: element `(b, h, i, j)` is at
/// `b * batch_stride + h * head_stride + i * row_stride + j` (a stride of 0 broadcasts; a
/// dense `[batch, heads, seq_q, seq_k]` bias has strides `heads * seq_q * seq_k`,
/// `seq_q * seq_k` and `seq_k`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionBias<'a> {
    /// The buffer.
    pub handle: &'a Handle,
    /// Elements between batches (0: the same bias for every batch).
    pub batch_stride: usize,
    /// Elements between heads (0: the same bias for every head).
    pub head_stride: usize,
    /// Elements between query rows (0: the same bias for every query, e.g. a padding mask).
    pub row_stride: usize,
}

/// One attention call: q `[batch, heads, seq_q, head_dim]`, k and v `[batch, heads, seq_k,
/// head_dim]` (contiguous, in `dtype`), the bias, and the call's settings.
#[derive(Debug, Clone, Copy)]
pub struct AttentionArgs<'a> {
    /// The queries.
    pub q: &'a Handle,
    /// The keys.
    pub k: &'a Handle,
    /// The values.
    pub v: &'a Handle,
    /// An additive bias on the scores, if any.
    pub bias: Option<AttentionBias<'a>>,
    /// The sizes.
    pub shape: AttentionShape,
    /// The dtype of q, k, v, the bias and the output.
    pub dtype: FloatDtype,
    /// Causal masking and the scale.
    pub config: AttentionConfig,
}

/// What the backward pass reads beside the call's operands: the forward's output and
/// logsumexp, and the output's gradient (same shape and dtype as the output).
#[derive(Debug, Clone, Copy)]
pub struct AttentionSaved<'a> {
    /// The forward's output, `[batch, heads, seq_q, head_dim]`.
    pub out: &'a Handle,
    /// The forward's logsumexp, `[batch, heads, seq_q]` in f32.
    pub lse: &'a Handle,
    /// The output's gradient, `[batch, heads, seq_q, head_dim]`.
    pub grad_out: &'a Handle,
}

/// What the forward pass returns.
#[derive(Debug, Clone)]
pub struct AttentionForward {
    /// The output, `[batch, heads, seq_q, head_dim]` in the input dtype.
    pub out: Handle,
    /// The logsumexp of each query row's scaled (and biased) scores, `[batch, heads, seq_q]`
    /// in f32 (a very large negative number for a row whose every key is masked).
    pub lse: Handle,
}

/// What the backward pass returns: the gradients of q, k and v, in the input dtype.
#[derive(Debug, Clone)]
pub struct AttentionGrads {
    /// Gradient of q, `[batch, heads, seq_q, head_dim]`.
    pub grad_q: Handle,
    /// Gradient of k, `[batch, heads, seq_k, head_dim]`.
    pub grad_k: Handle,
    /// Gradient of v, `[batch, heads, seq_k, head_dim]`.
    pub grad_v: Handle,
}

/// Rows one cube owns (one unit each).
const ROWS_PER_CUBE: usize = 64;

/// The launch geometry for one device and head dimension (what a kernel's [`Flash`] shape is
/// made of).
#[derive(Debug, Clone, Copy)]
struct Tiles {
    /// Rows one cube owns (query rows in the forward and dQ kernels, key rows in dK/dV).
    rows: usize,
    /// Units sharing a row (1, or 2 on native GPUs where the row's vectors split evenly).
    split: usize,
    /// Rows of the other side staged in shared memory per step, forward and dQ.
    staged: usize,
    /// Query rows the dK/dV kernel stages per step (with their logsumexp and delta).
    kv_staged: usize,
    /// f32 lanes per vector the kernels compute with (4, 2 or 1, dividing `head_dim`).
    width: usize,
}

impl Tiles {
    /// The geometry for rows of `head_dim` elements on this device.
    fn for_device<R: Runtime>(client: &ComputeClient<R>, head_dim: usize) -> Self {
        let hardware = &client.properties().hardware;
        let max_units = (hardware.max_units_per_cube as usize).max(1);
        let width = vector_width(client, head_dim);
        let lanes = head_dim / width;
        let split =
            if unroll_rows(client) && lanes.is_multiple_of(2) && 2 * ROWS_PER_CUBE <= max_units {
                2
            } else {
                1
            };
        let rows = ROWS_PER_CUBE.min(max_units / split).max(1);
        // Within the device's shared memory, capped at 48 KiB (what every CUDA device gives
        // without opting in to more); a staged row has one vector of padding per extra part.
        let budget = hardware.max_shared_memory_size.clamp(1024, 48 * 1024) - 512;
        let row_bytes = (lanes + split - 1) * width * 4;
        let mut staged = 64;
        while staged > 1 && 2 * staged * row_bytes > budget {
            staged /= 2;
        }
        let mut kv_staged = 64;
        while kv_staged > 1 && 2 * kv_staged * (row_bytes + 4) > budget {
            kv_staged /= 2;
        }
        Tiles {
            rows,
            split,
            staged,
            kv_staged,
            width,
        }
    }

    /// Units per cube.
    fn units(&self) -> u32 {
        (self.rows * self.split) as u32
    }
}

/// The f32 lanes per vector the kernels compute with: the widest of 4, 2 and 1 dividing
/// `head_dim` on native GPU runtimes; 1 on wgpu, where lavapipe keeps the rows' vectors in
/// function memory and runs the kernels an order of magnitude slower than with scalars.
fn vector_width<R: Runtime>(client: &ComputeClient<R>, head_dim: usize) -> usize {
    if !unroll_rows(client) {
        return 1;
    }
    [4, 2, 1]
        .into_iter()
        .find(|w| head_dim.is_multiple_of(*w))
        .unwrap_or(1)
}

/// Whether the kernels unroll their loops over `head_dim` (keeping rows in registers): yes on
/// native GPU runtimes (CUDA, HIP); not on wgpu, whose CI driver (Mesa's lavapipe, LLVM on the
/// CPU) takes minutes to compile the unrolled kernels.
fn unroll_rows<R: Runtime>(client: &ComputeClient<R>) -> bool {
    !R::name(client).starts_with("wgpu")
}

/// An invalid-argument error: `what` was `value`, and `accepted` says what is taken.
pub(crate) fn invalid(what: &str, value: impl ToString, accepted: impl ToString) -> KernelError {
    KernelError::InvalidArgument {
        what: what.to_string(),
        value: value.to_string(),
        accepted: accepted.to_string(),
    }
}

/// Checks a call's sizes, dtype and scale against what the kernels and this device take,
/// without looking at any buffer; returns the scale in use. [`attention_forward`] and
/// [`attention_backward`] make these checks too; callers that must know beforehand whether a
/// launch will be accepted (e.g. before registering it to run later) call this.
pub fn validate<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &AttentionShape,
    dtype: FloatDtype,
    config: &AttentionConfig,
) -> Result<f32, KernelError> {
    dtype.check_supported(client)?;
    let AttentionShape {
        batch,
        heads,
        seq_q,
        seq_k,
        head_dim,
    } = *shape;
    for (what, value) in [
        ("batch", batch),
        ("heads", heads),
        ("seq_q", seq_q),
        ("seq_k", seq_k),
    ] {
        if value == 0 {
            return Err(invalid(what, value, "at least 1"));
        }
    }
    if head_dim == 0 || head_dim > MAX_HEAD_DIM {
        return Err(invalid(
            "head_dim",
            head_dim,
            format!("1..={MAX_HEAD_DIM} (split larger heads or use the written-out attention)"),
        ));
    }
    let scale = config.scale_for(head_dim);
    if !scale.is_finite() {
        return Err(invalid("scale", scale, "a finite number"));
    }
    let hardware = &client.properties().hardware;
    let max_x = hardware.max_cube_count.0 as usize;
    if batch * heads > max_x {
        return Err(invalid(
            "batch * heads",
            batch * heads,
            format!("at most {max_x} on this device"),
        ));
    }
    let max_y = hardware.max_cube_count.1 as usize;
    let rows_per_cube = Tiles::for_device(client, head_dim).rows;
    if seq_q.max(seq_k).div_ceil(rows_per_cube) > max_y {
        return Err(invalid(
            "sequence length",
            seq_q.max(seq_k),
            format!("at most {} on this device", max_y * rows_per_cube),
        ));
    }
    for (what, len) in [("q", shape.q_len()), ("k and v", shape.kv_len())] {
        crate::cast::check_len(what, len)?;
    }
    Ok(scale)
}

/// Checks a call's sizes, dtype and scale (as [`validate`]), its buffers (name, handle and
/// elements each) and its bias; returns the scale.
fn check_call<R: Runtime>(
    client: &ComputeClient<R>,
    buffers: &[(&str, &Handle, usize)],
    bias: Option<&AttentionBias<'_>>,
    shape: &AttentionShape,
    dtype: FloatDtype,
    config: &AttentionConfig,
) -> Result<f32, KernelError> {
    let scale = validate(client, shape, dtype, config)?;
    for &(what, handle, len) in buffers {
        check_buffer(what, handle, len, dtype)?;
    }
    if let Some(bias) = bias {
        check_buffer("bias", bias.handle, bias_len(shape, bias), dtype)?;
    }
    Ok(scale)
}

/// Elements a bias with these strides spans.
fn bias_len(shape: &AttentionShape, bias: &AttentionBias<'_>) -> usize {
    (shape.batch - 1) * bias.batch_stride
        + (shape.heads - 1) * bias.head_stride
        + (shape.seq_q - 1) * bias.row_stride
        + shape.seq_k
}

/// `len` elements of `handle` as a kernel argument.
///
/// # Safety
///
/// The buffer must hold `len` elements of the kernel's type, and the kernel must read and
/// write below `len` only.
unsafe fn array<R: Runtime>(handle: &Handle, len: usize) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), len) }
}

/// A call's bias as the kernels take it: without one, a stand-in buffer that a kernel built
/// without a bias never reads.
struct BiasArg {
    /// The bias, or the stand-in.
    handle: Handle,
    /// Elements the strides reach (1 for the stand-in).
    len: usize,
    /// Batch, head and row strides (0 for the stand-in).
    strides: [usize; 3],
    /// Whether there is a bias.
    present: bool,
}

impl BiasArg {
    /// The bias of a call, or `stand_in` (one of the call's buffers) without one.
    fn new(stand_in: &Handle, shape: &AttentionShape, bias: Option<&AttentionBias<'_>>) -> Self {
        match bias {
            Some(b) => BiasArg {
                handle: b.handle.clone(),
                len: bias_len(shape, b),
                strides: [b.batch_stride, b.head_stride, b.row_stride],
                present: true,
            },
            None => BiasArg {
                handle: stand_in.clone(),
                len: 1,
                strides: [0; 3],
                present: false,
            },
        }
    }

    /// The bias buffer as a kernel argument.
    fn array<R: Runtime>(&self) -> ArrayArg<R> {
        // SAFETY: the buffer holds `len` elements (a checked bias spans every index its strides
        // reach; the stand-in holds at least one element and is never read).
        unsafe { array(&self.handle, self.len) }
    }

    /// The sizes, bias strides and scale every attention kernel takes.
    fn score_args<R: Runtime>(&self, shape: &AttentionShape, scale: f32) -> ScoreArgsLaunch<R> {
        let [batch, head, row] = self.strides;
        ScoreArgsLaunch::new(
            shape.seq_q,
            shape.seq_k,
            shape.heads,
            batch,
            head,
            row,
            scale,
        )
    }

    /// The masks a kernel is built with.
    fn mask(&self, causal: bool) -> Mask {
        Mask {
            causal,
            has_bias: self.present,
        }
    }
}

/// A checked flash-attention call: what its kernels' launches share.
struct FlashCall<'a, R: Runtime> {
    /// The device.
    client: &'a ComputeClient<R>,
    /// The queries.
    q: &'a Handle,
    /// The keys.
    k: &'a Handle,
    /// The values.
    v: &'a Handle,
    /// The bias, or q standing in for it.
    bias: BiasArg,
    /// The sizes.
    shape: AttentionShape,
    /// The dtype of q, k, v, the output and the gradients.
    dtype: FloatDtype,
    /// The scale in use.
    scale: f32,
    /// Whether keys after the query are masked.
    causal: bool,
    /// The launch geometry.
    tiles: Tiles,
}

impl<'a, R: Runtime> FlashCall<'a, R> {
    /// Checks a call and its input buffers (see [`attention_forward`]).
    fn new(client: &'a ComputeClient<R>, args: AttentionArgs<'a>) -> Result<Self, KernelError> {
        let (q, k, v, bias) = (args.q, args.k, args.v, args.bias);
        let (shape, dtype, config) = (args.shape, args.dtype, args.config);
        let buffers = [
            ("q", q, shape.q_len()),
            ("k", k, shape.kv_len()),
            ("v", v, shape.kv_len()),
        ];
        let scale = check_call(client, &buffers, bias.as_ref(), &shape, dtype, &config)?;
        Ok(FlashCall {
            client,
            q,
            k,
            v,
            bias: BiasArg::new(q, &shape, bias.as_ref()),
            shape,
            dtype,
            scale,
            causal: config.causal,
            tiles: Tiles::for_device(client, shape.head_dim),
        })
    }

    /// q, k, v and the bias, as every flash kernel takes them first.
    fn operands<E: Float>(&self) -> OperandsLaunch<E, R> {
        let (q_len, kv_len) = (self.shape.q_len(), self.shape.kv_len());
        // SAFETY: q, k and v hold their shapes' elements (checked in `new`).
        unsafe {
            OperandsLaunch::new(
                array(self.q, q_len),
                array(self.k, kv_len),
                array(self.v, kv_len),
                self.bias.array(),
            )
        }
    }

    /// Cubes for every `(batch, head)` pair and block of the `own_len` rows a kernel owns.
    fn count(&self, own_len: usize) -> CubeCount {
        let pairs = (self.shape.batch * self.shape.heads) as u32;
        CubeCount::Static(pairs, own_len.div_ceil(self.tiles.rows) as u32, 1)
    }

    /// The compile-time shape of a flash kernel of this call that stages `staged` rows per step.
    fn flash(&self, staged: usize) -> Flash {
        Flash {
            head_dim: self.shape.head_dim,
            lanes: self.shape.head_dim / self.tiles.width,
            split: self.tiles.split,
            rows: self.tiles.rows,
            staged,
            mask: self.bias.mask(self.causal),
            unroll: unroll_rows(self.client),
        }
    }
}

/// Launches the flash kernel `kernels::$kernel` for the [`FlashCall`] `$call`, with a cube for
/// every `(batch, head)` pair and block of the `$own` rows it owns, staging `$staged` rows of
/// the other side per step; its tensors are the operands, then `$tensor`s. Unsafe: the
/// tensors must hold what the kernel reads and writes.
macro_rules! launch_flash {
    ($call:expr, $kernel:ident, $own:expr, $staged:expr, $($tensor:expr),+ $(,)?) => {{
        let call = &$call;
        kernels::$kernel::launch_unchecked::<R>(
            call.client,
            call.count($own),
            CubeDim::new_1d(call.tiles.units()),
            call.tiles.width,
            call.operands(),
            $($tensor,)+
            call.bias.score_args(&call.shape, call.scale),
            call.flash($staged),
            call.dtype.storage_type(),
        )
    }};
}

/// Flash-attention forward pass: the output and each query row's logsumexp (see the module
/// docs). Errors, before anything is launched, on an unsupported dtype, a zero size, a head
/// dimension above [`MAX_HEAD_DIM`], a non-finite scale, sizes beyond the device's grid, or a
/// buffer smaller than its shape.
pub fn attention_forward<R: Runtime>(
    client: &ComputeClient<R>,
    args: AttentionArgs<'_>,
) -> Result<AttentionForward, KernelError> {
    let call = FlashCall::new(client, args)?;
    let (shape, dtype) = (args.shape, args.dtype);
    let out = client.empty(shape.q_len() * dtype.size_bytes());
    let lse = client.empty(shape.rows() * 4);
    // SAFETY: every buffer holds its shape's elements (checked in `FlashCall::new`; the outputs
    // were just allocated so), the bias spans every index the strides reach, and the kernel
    // reads and writes rows below `seq_q` / `seq_k` only.
    unsafe {
        launch_flash!(
            call,
            forward_kernel,
            shape.seq_q,
            call.tiles.staged,
            array(&out, shape.q_len()),
            array(&lse, shape.rows()),
        );
    }
    Ok(AttentionForward { out, lse })
}

/// Flash-attention backward pass: the gradients of q, k and v from the forward's inputs and
/// what it saved (see [`AttentionSaved`]). Same checks as [`attention_forward`], and the saved
/// buffers must hold their shapes' elements.
pub fn attention_backward<R: Runtime>(
    client: &ComputeClient<R>,
    args: AttentionArgs<'_>,
    saved: AttentionSaved<'_>,
) -> Result<AttentionGrads, KernelError> {
    let call = FlashCall::new(client, args)?;
    let (shape, dtype) = (args.shape, args.dtype);
    let AttentionSaved { out, lse, grad_out } = saved;
    check_buffer("out", out, shape.q_len(), dtype)?;
    check_buffer("grad_out", grad_out, shape.q_len(), dtype)?;
    check_buffer("lse", lse, shape.rows(), FloatDtype::F32)?;

    let delta = delta(client, out, grad_out, &shape, dtype);
    let grad_q = client.empty(shape.q_len() * dtype.size_bytes());
    let grad_k = client.empty(shape.kv_len() * dtype.size_bytes());
    let grad_v = client.empty(shape.kv_len() * dtype.size_bytes());
    // SAFETY: as in `attention_forward`; `lse` and `delta` hold one f32 per query row.
    unsafe {
        launch_flash!(
            call,
            grad_kv_kernel,
            shape.seq_k,
            call.tiles.kv_staged,
            saved_launch(grad_out, lse, &delta, &shape),
            array(&grad_k, shape.kv_len()),
            array(&grad_v, shape.kv_len()),
        );
        launch_flash!(
            call,
            grad_q_kernel,
            shape.seq_q,
            call.tiles.staged,
            saved_launch(grad_out, lse, &delta, &shape),
            array(&grad_q, shape.q_len()),
        );
    }
    Ok(AttentionGrads {
        grad_q,
        grad_k,
        grad_v,
    })
}

/// The output's gradient, the logsumexp and `delta` as the backward kernels take them.
///
/// # Safety
///
/// `grad_out` must hold `shape.q_len()` elements, `lse` and `delta` one f32 per query row.
unsafe fn saved_launch<R: Runtime, E: Float>(
    grad_out: &Handle,
    lse: &Handle,
    delta: &Handle,
    shape: &AttentionShape,
) -> SavedLaunch<E, R> {
    let rows = shape.rows();
    unsafe {
        SavedLaunch::new(
            array(grad_out, shape.q_len()),
            array(lse, rows),
            array(delta, rows),
        )
    }
}

/// Launches the backward prepass `delta = rowsum(dO ∘ O)` (f32, one per query row) on buffers
/// already checked to hold `shape.q_len()` elements.
fn delta<R: Runtime>(
    client: &ComputeClient<R>,
    out: &Handle,
    grad_out: &Handle,
    shape: &AttentionShape,
    dtype: FloatDtype,
) -> Handle {
    let rows = shape.rows();
    let delta = client.empty(rows * 4);
    let units = client
        .properties()
        .hardware
        .max_units_per_cube
        .clamp(1, 256);
    // SAFETY: `out` and `grad_out` hold `rows * head_dim` elements and `delta` `rows`; units
    // past the last row return at once.
    unsafe {
        kernels::delta_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static((rows as u32).div_ceil(units), 1, 1),
            CubeDim::new_1d(units),
            array(out, shape.q_len()),
            array(grad_out, shape.q_len()),
            array(&delta, rows),
            shape.head_dim,
            unroll_rows(client),
            dtype.storage_type(),
        );
    }
    delta
}
