//! Fragmentation on a recorded allocation trace of the reference GPT training step.
//!
//! The trace is generated, deterministically, from the model's shapes (`GptConfig::reference()`
//! of the `gpt` example: 12 layers, d_model 768, 12 heads, seq 512, batch 8, vocab 8192, f32,
//! AdamW), not captured from a GPU run. It is an approximation of what Burn's autodiff does,
//! op by op, with these simplifications:
//!
//! - every op result is a fresh allocation (no in-place reuse, no fusion), views (reshape,
//!   swap_dims, slice, expand) allocate nothing, and the head split `q`, `k`, `v` and the head
//!   merge before the output projection are contiguous copies;
//! - LayerNorm, softmax, GELU, log-softmax and AdamW are written out as Burn writes them
//!   (several elementwise temporaries each), with the tensors autodiff keeps for the backward
//!   pass (`x̂`, `1/σ`, softmax output, GELU input, matmul inputs) saved until the backward
//!   consumes them;
//! - the backward visits the ops in reverse, allocating each input gradient and each parameter
//!   gradient, freeing an op's saved tensors and its output gradient once its backward ran;
//!   parameter gradients live until the optimizer step, which updates parameters one by one
//!   (new `m`, `v` and parameter tensors, the old ones freed), creating `m` and `v` at the
//!   first step;
//! - integer tensors (tokens, targets, positions) are 4 bytes per element, the causal mask
//!   1 byte.
//!
//! Three steps are replayed on a simulated device (80 GiB, 2 MiB granules, virtual memory
//! management): the goal is peak reserved ≤ 1.1 × peak allocated.

mod common;

use common::MIB;
use common::trace::{Event, replay_within_goal};
use frugal_cuda::allocator::round_size;

/// Records the trace; tensor ids are indices.
#[derive(Default)]
struct Tracer {
    events: Vec<Event>,
    sizes: Vec<u64>,
    live: Vec<bool>,
}

type T = usize;

impl Tracer {
    fn alloc(&mut self, bytes: u64) -> T {
        let id = self.sizes.len();
        self.sizes.push(bytes);
        self.live.push(true);
        self.events.push(Event::Alloc { id, bytes });
        id
    }

    /// `elems` f32 elements.
    fn f32(&mut self, elems: u64) -> T {
        self.alloc(elems * 4)
    }

    fn free(&mut self, id: T) {
        assert!(self.live[id], "trace frees tensor {id} twice");
        self.live[id] = false;
        self.events.push(Event::Free { id });
    }

    fn free_all(&mut self, ids: &[T]) {
        for &id in ids {
            self.free(id);
        }
    }
}

struct Shapes {
    layers: u64,
    d: u64,
    heads: u64,
    seq: u64,
    batch: u64,
    vocab: u64,
}

impl Shapes {
    fn reference() -> Self {
        Self {
            layers: 12,
            d: 768,
            heads: 12,
            seq: 512,
            batch: 8,
            vocab: 8192,
        }
    }
    /// Tokens per batch.
    fn n(&self) -> u64 {
        self.batch * self.seq
    }
    /// Elements of one attention score tensor `[batch, heads, seq, seq]`.
    fn scores(&self) -> u64 {
        self.batch * self.heads * self.seq * self.seq
    }
}

/// What a LayerNorm keeps for its backward pass.
struct LnSaved {
    xhat: T,
    rstd: T,
}

/// Burn's LayerNorm written out: mean, centre, variance, 1/σ, normalise, scale, shift.
fn layer_norm(t: &mut Tracer, rows: u64, d: u64) -> (T, LnSaved) {
    let mean = t.f32(rows);
    let centred = t.f32(rows * d);
    t.free(mean);
    let sq = t.f32(rows * d);
    let var = t.f32(rows);
    t.free(sq);
    let rstd = t.f32(rows);
    t.free(var);
    let xhat = t.f32(rows * d);
    t.free(centred);
    let scaled = t.f32(rows * d);
    let out = t.f32(rows * d);
    t.free(scaled);
    (out, LnSaved { xhat, rstd })
}

/// LayerNorm backward: gradients of γ and β (kept), of the input (returned); frees the saved
/// tensors and the output gradient.
fn layer_norm_backward(
    t: &mut Tracer,
    rows: u64,
    d: u64,
    saved: LnSaved,
    dout: T,
    grads: &mut Vec<T>,
) -> T {
    let dgamma = t.f32(d);
    let dbeta = t.f32(d);
    // Pushed in reverse, so the reversed list lines up with the parameters.
    grads.extend([dbeta, dgamma]);
    let dxhat = t.f32(rows * d);
    let proj = t.f32(rows * d);
    let dot = t.f32(rows);
    t.free(proj);
    let tmp = t.f32(rows * d);
    t.free(dxhat);
    let dx = t.f32(rows * d);
    t.free_all(&[tmp, dot, saved.xhat, saved.rstd, dout]);
    dx
}

/// Linear backward: weight and bias gradients (kept), input gradient (returned); frees the
/// saved input and the output gradient.
fn linear_backward(
    t: &mut Tracer,
    rows: u64,
    d_in: u64,
    d_out: u64,
    input: T,
    dout: T,
    grads: &mut Vec<T>,
) -> T {
    let dw = t.f32(d_in * d_out);
    let db = t.f32(d_out);
    grads.extend([db, dw]);
    let dx = t.f32(rows * d_in);
    t.free_all(&[input, dout]);
    dx
}

struct LayerSaved {
    x: T,
    ln1: LnSaved,
    a1: T,
    q: T,
    k: T,
    v: T,
    p: T,
    y2: T,
    x1: T,
    ln2: LnSaved,
    a2: T,
    f1: T,
    g: T,
}

/// Records one training step. `params` are live; `state` holds AdamW's `(m, v)` per parameter
/// once the first step made them. Returns the new parameters.
fn step(t: &mut Tracer, s: &Shapes, params: &[(T, u64)], state: &mut Vec<(T, T)>) -> Vec<(T, u64)> {
    let (n, d, v) = (s.n(), s.d, s.vocab);
    let bht = s.batch * s.heads * s.seq;
    // Data.
    let tokens = t.alloc(n * 4);
    let targets = t.alloc(n * 4);

    // Forward.
    let positions = t.alloc(s.seq * 4);
    let tok_out = t.f32(n * d);
    let pos_out = t.f32(n * d);
    t.free(positions);
    let mut h = t.f32(n * d);
    t.free_all(&[tok_out, pos_out]);
    let mask = t.alloc(s.seq * s.seq);
    let mut saved = Vec::new();
    for _ in 0..s.layers {
        let x = h;
        let (a1, ln1) = layer_norm(t, n, d);
        let qkv = t.f32(n * 3 * d);
        let q = t.f32(n * d);
        let k = t.f32(n * d);
        let vv = t.f32(n * d);
        t.free(qkv);
        let scores = t.f32(s.scores());
        let scaled = t.f32(s.scores());
        t.free(scores);
        let masked = t.f32(s.scores());
        t.free(scaled);
        // softmax = exp(x - max) / sum
        let max = t.f32(bht);
        let shifted = t.f32(s.scores());
        t.free_all(&[max, masked]);
        let e = t.f32(s.scores());
        t.free(shifted);
        let sum = t.f32(bht);
        let p = t.f32(s.scores());
        t.free_all(&[e, sum]);
        let y = t.f32(n * d);
        let y2 = t.f32(n * d);
        t.free(y);
        let po = t.f32(n * d);
        let x1 = t.f32(n * d);
        t.free(po);
        let (a2, ln2) = layer_norm(t, n, d);
        let f1 = t.f32(n * 4 * d);
        // gelu(x) = x/2 (1 + erf(x/√2))
        let e1 = t.f32(n * 4 * d);
        let e2 = t.f32(n * 4 * d);
        t.free(e1);
        let e3 = t.f32(n * 4 * d);
        t.free(e2);
        let g = t.f32(n * 4 * d);
        t.free(e3);
        let f2 = t.f32(n * d);
        h = t.f32(n * d);
        t.free(f2);
        saved.push(LayerSaved {
            x,
            ln1,
            a1,
            q,
            k,
            v: vv,
            p,
            y2,
            x1,
            ln2,
            a2,
            f1,
            g,
        });
    }
    let (af, lnf) = layer_norm(t, n, d);
    let logits = t.f32(n * v);
    // log_softmax = x - max - log(sum(exp(x - max)))
    let max = t.f32(n);
    let shifted = t.f32(n * v);
    t.free(max);
    let e = t.f32(n * v);
    let se = t.f32(n);
    t.free(e);
    let lse = t.f32(n);
    t.free(se);
    let lsm = t.f32(n * v);
    t.free_all(&[shifted, lse, logits]);
    let picked = t.f32(n);
    let loss = t.f32(1);
    t.free(picked);

    // Backward.
    let mut grads = Vec::new();
    let dloss = t.f32(1);
    let dpicked = t.f32(n);
    t.free_all(&[dloss, loss]);
    let dlsm = t.f32(n * v);
    t.free_all(&[dpicked, targets]);
    let ex = t.f32(n * v);
    let sdl = t.f32(n);
    let tmp = t.f32(n * v);
    t.free_all(&[ex, sdl]);
    let dlogits = t.f32(n * v);
    t.free_all(&[tmp, dlsm, lsm]);
    let daf = linear_backward(t, n, d, v, af, dlogits, &mut grads);
    let mut dh = layer_norm_backward(t, n, d, lnf, daf, &mut grads);
    t.free(h);
    for l in saved.into_iter().rev() {
        // h = x1 + fc2(gelu(fc1(ln2(x1))))
        let dres = t.f32(n * d); // the gradient copy autodiff keeps for the residual branch
        let dg = linear_backward(t, n, 4 * d, d, l.g, dh, &mut grads);
        let t1 = t.f32(n * 4 * d);
        let t2 = t.f32(n * 4 * d);
        t.free(t1);
        let df1 = t.f32(n * 4 * d);
        t.free_all(&[t2, dg, l.f1]);
        let da2 = linear_backward(t, n, d, 4 * d, l.a2, df1, &mut grads);
        let dx1p = layer_norm_backward(t, n, d, l.ln2, da2, &mut grads);
        let dx1 = t.f32(n * d);
        t.free_all(&[dx1p, dres, l.x1]);
        // x1 = x + proj(merge(softmax(mask(q kᵀ / √hd)) v))
        let dres = t.f32(n * d);
        let dy2 = linear_backward(t, n, d, d, l.y2, dx1, &mut grads);
        let dy = t.f32(n * d);
        t.free(dy2);
        let dp = t.f32(s.scores());
        let dv = t.f32(n * d);
        t.free(dy);
        let prod = t.f32(s.scores());
        let rows = t.f32(bht);
        t.free(prod);
        let diff = t.f32(s.scores());
        t.free_all(&[rows, dp]);
        let dmasked = t.f32(s.scores());
        t.free_all(&[diff, l.p]);
        let dscaled = t.f32(s.scores());
        t.free(dmasked);
        let dscores = t.f32(s.scores());
        t.free(dscaled);
        let dq = t.f32(n * d);
        let dk = t.f32(n * d);
        t.free_all(&[dscores, l.q, l.k]);
        let dqkv = t.f32(n * 3 * d);
        t.free_all(&[dq, dk, dv, l.v]);
        let da1 = linear_backward(t, n, d, 3 * d, l.a1, dqkv, &mut grads);
        let dxp = layer_norm_backward(t, n, d, l.ln1, da1, &mut grads);
        dh = t.f32(n * d);
        t.free_all(&[dxp, dres, l.x]);
    }
    // Embeddings: scatter-add into zeros for the token table, a sum over the batch for the
    // position table.
    let dtok = t.f32(v * d);
    let dpos = t.f32(s.seq * d);
    grads.extend([dtok, dpos]);
    t.free_all(&[dh, tokens, mask]);

    // Gradients come out in reverse order of the parameters (except the embeddings, last):
    // line them up with the parameters.
    assert_eq!(grads.len(), params.len());
    let emb = grads.split_off(grads.len() - 2);
    grads.reverse();
    let grads: Vec<T> = emb.into_iter().chain(grads).collect();

    // AdamW, one parameter at a time.
    let first = state.is_empty();
    let mut new_params = Vec::with_capacity(params.len());
    for (i, (&(p, elems), &g)) in params.iter().zip(&grads).enumerate() {
        assert_eq!(
            t.sizes[g],
            elems * 4,
            "gradient {i} does not match its parameter"
        );
        let decayed = t.f32(elems);
        let gm = t.f32(elems);
        let m = t.f32(elems);
        t.free(gm);
        let g2 = t.f32(elems);
        let g2b = t.f32(elems);
        t.free(g2);
        let vv = t.f32(elems);
        t.free(g2b);
        if first {
            state.push((m, vv));
        } else {
            let (old_m, old_v) = state[i];
            t.free_all(&[old_m, old_v]);
            state[i] = (m, vv);
        }
        let m_hat = t.f32(elems);
        let v_hat = t.f32(elems);
        let sq = t.f32(elems);
        t.free(v_hat);
        let den = t.f32(elems);
        t.free(sq);
        let u = t.f32(elems);
        t.free_all(&[m_hat, den]);
        let lr_u = t.f32(elems);
        t.free(u);
        let new_p = t.f32(elems);
        t.free_all(&[lr_u, decayed, p, g]);
        new_params.push((new_p, elems));
    }
    new_params
}

/// Parameters in module order, as `(tensor, elements)`.
fn parameters(t: &mut Tracer, s: &Shapes) -> Vec<(T, u64)> {
    let d = s.d;
    let mut shapes = vec![s.vocab * d, s.seq * d];
    for _ in 0..s.layers {
        shapes.extend([
            d,
            d,
            d * 3 * d,
            3 * d,
            d * d,
            d,
            d,
            d,
            d * 4 * d,
            4 * d,
            4 * d * d,
            d,
        ]);
    }
    shapes.extend([d, d, d * s.vocab, s.vocab]);
    shapes.into_iter().map(|e| (t.f32(e), e)).collect()
}

/// The trace of model creation and `steps` training steps, and the bytes that stay live after
/// it (parameters and optimizer state).
fn trace(steps: usize) -> (Vec<Event>, u64) {
    let s = Shapes::reference();
    let mut t = Tracer::default();
    let mut params = parameters(&mut t, &s);
    let count: u64 = params.iter().map(|p| p.1).sum();
    // Same count as `GptConfig::parameters()` (and PyTorch's) for the reference model.
    assert_eq!(count, 98_040_320);
    let mut state = Vec::new();
    for _ in 0..steps {
        params = step(&mut t, &s, &params, &mut state);
    }
    let persistent = t
        .live
        .iter()
        .zip(&t.sizes)
        .filter(|(l, _)| **l)
        .map(|(_, s)| round_size(*s).unwrap())
        .sum();
    (t.events, persistent)
}

#[test]
fn reference_gpt_step_reserves_at_most_1_1x_its_peak() {
    let (events, persistent) = trace(3);
    let allocs = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    println!(
        "trace: {} events, {allocs} allocations, {:.1} MiB live at the end",
        events.len(),
        persistent as f64 / MIB as f64
    );
    // The trace itself is sane: what is left is the parameters and AdamW's two moments.
    assert_eq!(persistent, 3 * 98_040_320 * 4);

    let st = replay_within_goal(&events);
    assert_eq!(st.allocated_bytes, persistent);
}
