//! How the device tests judge a case from several runs of a plain backend (the reference) and
//! of Frugal over it: bit for bit where the reference repeats itself exactly, within
//! [`tolerance`] where its own runs differ.
//!
//! Some GPU kernels do not repeat themselves: float atomics add in the order threads arrive,
//! and autotune picks among kernels that sum in different orders by timing each process.
//! Frugal forwards to the same kernels, so on such an op it differs from the reference exactly
//! as much as two runs of the reference differ from each other. A Frugal bug (a wrong argument,
//! a tensor freed or reused too early) is of another order, or else repeats itself exactly.

use std::hash::{Hash, Hasher};

use burn::tensor::{DType, bf16, f16};

use crate::Out;

/// Absolute part of the tolerance: the cases' inputs are of order one, so a value that sums
/// terms of order one in another order moves by some ulps of the largest partial sum (about
/// 1e-7 each in f32), even where the terms cancel and the value itself is near zero. A slip of
/// Frugal's (a wrong input, a reused buffer) moves values by their own size.
pub const ABS_TOL: f64 = 1e-5;

/// Relative part of the tolerance for f32 (and f64): reordering a sum of n f32 terms changes it
/// by at most about n·ε relative to the sum of their magnitudes (ε ≈ 1.2e-7), and typically
/// by √n·ε; 1e-4 leaves two orders of magnitude for the cases' reductions of up to a few
/// hundred terms, and still sits four orders below a wrong value's error.
pub const REL_TOL: f64 = 1e-4;

/// How far beyond the reference runs' own spread a Frugal run may lie, as a multiple of that
/// spread: a handful of reference runs does not show the whole of it, and a Frugal run is one
/// more draw from the same kernels.
pub const SPREAD_WIDENING: f64 = 1.0;

/// The margin a value may lie outside `[low, high]` (the reference runs' range at one element)
/// in a tensor of `dtype`: [`SPREAD_WIDENING`] times the range, plus [`ABS_TOL`], plus the
/// relative tolerance times the larger magnitude. The relative part is [`REL_TOL`], or eight
/// ulps of a half-precision dtype (whose one rounding of an f32 sum outweighs the reorder).
pub fn tolerance(dtype: DType, low: f64, high: f64) -> f64 {
    let epsilon = match dtype {
        DType::F16 => f64::from(f16::EPSILON),
        DType::BF16 => f64::from(bf16::EPSILON),
        _ => 0.0,
    };
    let relative = REL_TOL.max(8.0 * epsilon);
    SPREAD_WIDENING * (high - low) + ABS_TOL + relative * low.abs().max(high.abs())
}

/// One output of a case, as it crosses from a child process to the harness.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// A float tensor, its values widened to f64 (exactly).
    Floats {
        /// Data type (a float one).
        dtype: DType,
        /// Shape.
        shape: Vec<usize>,
        /// Values, in order.
        values: Vec<f64>,
    },
    /// Any other output, by a digest of its dtype, shape and bytes or of its text: compared
    /// exactly.
    Exact(u64),
}

impl Reading {
    /// The reading of one output. A device reads as its mere presence (see [`Out::Device`]).
    pub fn of(out: &Out) -> Reading {
        match out {
            Out::Data {
                dtype,
                shape,
                bytes,
            } => match float_values(*dtype, bytes) {
                Some(values) => Reading::Floats {
                    dtype: *dtype,
                    shape: shape.clone(),
                    values,
                },
                None => Reading::Exact(digest(&(format!("{dtype:?}"), shape, bytes))),
            },
            Out::Value(text) => Reading::Exact(digest(&("value", text))),
            Out::Device(_) => Reading::Exact(digest(&"device")),
        }
    }
}

/// A float tensor's little-endian bytes as f64 values, or `None` for other dtypes.
fn float_values(dtype: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    let values = match dtype {
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        DType::F32 | DType::Flex32 => bytes
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
        _ => return None,
    };
    Some(values)
}

fn float_dtype(name: &str) -> Option<DType> {
    [
        DType::F64,
        DType::F32,
        DType::Flex32,
        DType::F16,
        DType::BF16,
    ]
    .into_iter()
    .find(|dtype| format!("{dtype:?}") == name)
}

/// A 64-bit digest (the same in every process of one build).
pub fn digest(value: &impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Readings as one word without spaces: `-` for none, else each reading followed by `;`, a
/// float tensor as `<dtype>:<dims joined by x>:<values joined by ,>`, anything else as
/// `=<digest>`. Values print in Rust's shortest form that reads back to the same f64.
pub fn encode(readings: &[Reading]) -> String {
    if readings.is_empty() {
        return "-".into();
    }
    let mut text = String::new();
    for reading in readings {
        match reading {
            Reading::Floats {
                dtype,
                shape,
                values,
            } => {
                let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
                let values: Vec<String> = values.iter().map(|v| format!("{v:e}")).collect();
                text += &format!("{dtype:?}:{}:{};", dims.join("x"), values.join(","));
            }
            Reading::Exact(digest) => text += &format!("={digest:016x};"),
        }
    }
    text
}

/// The readings [`encode`] wrote, or `None` if `text` is not such a word (a line cut short).
pub fn decode(text: &str) -> Option<Vec<Reading>> {
    if text == "-" {
        return Some(Vec::new());
    }
    let body = text.strip_suffix(';')?;
    body.split(';')
        .map(|item| {
            if let Some(hex) = item.strip_prefix('=') {
                return u64::from_str_radix(hex, 16).ok().map(Reading::Exact);
            }
            let mut parts = item.split(':');
            let dtype = float_dtype(parts.next()?)?;
            let dims = parts.next()?;
            let values = parts.next()?;
            let shape = if dims.is_empty() {
                Vec::new()
            } else {
                dims.split('x')
                    .map(|d| d.parse().ok())
                    .collect::<Option<_>>()?
            };
            let values = if values.is_empty() {
                Vec::new()
            } else {
                values
                    .split(',')
                    .map(|v| v.parse().ok())
                    .collect::<Option<_>>()?
            };
            let count: usize = shape.iter().product();
            (count == values.len()).then_some(Reading::Floats {
                dtype,
                shape,
                values,
            })
        })
        .collect()
}

/// One run of one case on one side.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// `ok <digest>`, `panic <message>`, `crashed` or `timeout`: equal results are equal
    /// outputs, bit for bit.
    pub result: String,
    /// The outputs, where the run succeeded.
    pub readings: Option<Vec<Reading>>,
}

impl Run {
    /// Whether the run succeeded.
    pub fn ok(&self) -> bool {
        self.result.starts_with("ok")
    }
}

/// How far the runs of a case that varies lie apart.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Spread {
    /// The largest difference between two reference runs at one element.
    pub reference: f64,
    /// The largest difference between a wrapped run and a reference run at one element.
    pub wrapped: f64,
    /// The largest distance of a wrapped value outside the reference runs' range, as a
    /// fraction of the [`tolerance`] there (at most 1 when the case passes).
    pub used: f64,
}

/// What the runs of one case say.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Every run of both sides gave one result (the same outputs, or the same panic).
    Same,
    /// Some runs differ, but the wrapped runs lie within [`tolerance`] of the reference's.
    Varies(Spread),
    /// A real difference, described.
    Differ(String),
}

/// Judges a case from its runs on the reference side (named `reference`) and on the wrapped
/// side (named `wrapped`), at least one of each:
/// - all runs alike: [`Verdict::Same`];
/// - any run failed while another did not, or failed otherwise: a difference;
/// - each side repeats itself bit for bit, but the two differ: a difference (what two
///   nondeterministic kernels would not do);
/// - otherwise some side varies by itself: every wrapped value must lie within [`tolerance`]
///   of the reference runs' range at that element, non-finite values and all other outputs
///   must agree exactly.
pub fn judge(
    reference: &str,
    reference_runs: &[Run],
    wrapped: &str,
    wrapped_runs: &[Run],
) -> Verdict {
    let first = &reference_runs[0];
    let all = || reference_runs.iter().chain(wrapped_runs);
    if all().all(|run| run.result == first.result) {
        return Verdict::Same;
    }
    let results = |runs: &[Run]| {
        let mut results: Vec<&str> = runs.iter().map(|run| run.result.as_str()).collect();
        results.dedup();
        format!("{results:?}")
    };
    let both = || {
        format!(
            "{reference} {} / {wrapped} {}",
            results(reference_runs),
            results(wrapped_runs)
        )
    };
    if !all().all(Run::ok) {
        return Verdict::Differ(both());
    }
    let repeats = |runs: &[Run]| runs.iter().all(|run| run.result == runs[0].result);
    if repeats(reference_runs) && repeats(wrapped_runs) {
        return Verdict::Differ(format!("each side repeats itself, yet {}", both()));
    }
    fn readings(runs: &[Run]) -> Option<Vec<&Vec<Reading>>> {
        runs.iter().map(|run| run.readings.as_ref()).collect()
    }
    let (Some(refs), Some(wraps)) = (readings(reference_runs), readings(wrapped_runs)) else {
        return Verdict::Differ(format!("a run gave no values: {}", both()));
    };
    match within_tolerance(&refs, &wraps) {
        Ok(spread) => Verdict::Varies(spread),
        Err(why) => Verdict::Differ(format!(
            "{why} ({reference} runs vary by themselves; {})",
            both()
        )),
    }
}

/// Compares wrapped runs' readings with the reference runs' range, output by output.
fn within_tolerance(refs: &[&Vec<Reading>], wraps: &[&Vec<Reading>]) -> Result<Spread, String> {
    let shape_of = |readings: &Vec<Reading>| -> Vec<Reading> {
        readings
            .iter()
            .map(|reading| match reading {
                Reading::Floats {
                    dtype,
                    shape,
                    values,
                } => Reading::Floats {
                    dtype: *dtype,
                    shape: shape.clone(),
                    values: vec![0.0; values.len()],
                },
                exact => exact.clone(),
            })
            .collect()
    };
    let layout = shape_of(refs[0]);
    if let Some(other) = refs.iter().chain(wraps).find(|r| shape_of(r) != layout) {
        return Err(format!(
            "outputs other than float values differ, or float outputs differ in dtype or \
             shape: {:?} / {:?}",
            short(refs[0]),
            short(other)
        ));
    }
    let mut spread = Spread::default();
    for (output, reading) in refs[0].iter().enumerate() {
        let Reading::Floats { dtype, values, .. } = reading else {
            continue;
        };
        let at = |runs: &[&Vec<Reading>], i: usize| -> Vec<f64> {
            runs.iter()
                .map(|r| match &r[output] {
                    Reading::Floats { values, .. } => values[i],
                    Reading::Exact(_) => unreachable!("layouts were compared"),
                })
                .collect()
        };
        for i in 0..values.len() {
            let (ref_values, wrapped_values) = (at(refs, i), at(wraps, i));
            if ref_values
                .iter()
                .chain(&wrapped_values)
                .any(|v| !v.is_finite())
            {
                let same = |a: &f64, b: &f64| a == b || (a.is_nan() && b.is_nan());
                if !ref_values
                    .iter()
                    .chain(&wrapped_values)
                    .all(|v| same(v, &ref_values[0]))
                {
                    return Err(format!(
                        "output {output} element {i}: reference {ref_values:?}, wrapped \
                         {wrapped_values:?}"
                    ));
                }
                continue;
            }
            let low = ref_values.iter().copied().fold(f64::INFINITY, f64::min);
            let high = ref_values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let allowed = tolerance(*dtype, low, high);
            spread.reference = spread.reference.max(high - low);
            for &value in &wrapped_values {
                let outside = (low - value).max(value - high).max(0.0);
                spread.wrapped = spread
                    .wrapped
                    .max((value - low).abs().max((high - value).abs()));
                spread.used = spread.used.max(outside / allowed);
                if outside > allowed {
                    return Err(format!(
                        "output {output} element {i}: wrapped {value:e} lies {outside:.1e} \
                         outside the reference runs' range [{low:e}, {high:e}] (tolerance \
                         {allowed:.1e})"
                    ));
                }
            }
        }
    }
    Ok(spread)
}

fn short(readings: &[Reading]) -> String {
    let text = format!("{readings:?}");
    if text.len() > 200 {
        format!("{}...", &text[..200])
    } else {
        text
    }
}
