//! A PNG of live bytes over one training step, by role, from the ledger's timeline, with the phases and
//! the peak marked.

use std::path::Path;
use std::sync::Once;

use frugal::memory::{EventKind, Role, Snapshot, format_bytes};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

const MIB: f64 = (1 << 20) as f64;

/// Registers the bundled font as plotters' "sans-serif" (once per process).
pub fn fonts() {
    static ONCE: Once = Once::new();
    // The font ships inside a crate, so plots render the same on machines without fonts.
    ONCE.call_once(|| {
        register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        )
        .unwrap_or_else(|_| panic!("the bundled font is valid"));
    });
}

/// Colours of the roles, in `Role::ALL` order.
const ROLE_COLOURS: [RGBColor; 5] = [
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(160, 160, 160),
];

/// The PNG's size in pixels.
const WIDTH: u32 = 1000;
const HEIGHT: u32 = 560;
/// The plotting area's width in pixels: the image less its margins (12 each side) and the
/// y axis' labels (70).
pub const PLOT_WIDTH: f64 = (WIDTH - 2 * 12 - 70) as f64;
/// The phase labels' font size, the top of their first row and the height of a row, as
/// fractions of the y axis (about 470 pixels tall: a row of 14-pixel text and a gap is 20).
const LABEL_PX: u32 = 14;
const LABELS_TOP: f64 = 0.97;
const ROW: f64 = 0.043;

/// A phase mark and where its label goes.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseLabel {
    /// The phase's name.
    pub text: String,
    /// Where the mark is, in events.
    pub x: f64,
    /// Where its label starts, in events: right of the mark, or left of it near the right edge.
    pub label_x: f64,
    /// The label's row from the top: a label goes down a row until it overlaps no other.
    pub row: usize,
}

/// Places the labels of `snapshot`'s phase marks on a plot of `x_end` events, so that no two
/// overlap: `width(text)` is a label's width in pixels. Marks of one step sit close together
/// ("backward done" and "update starts" are often a few events apart), so their labels go
/// into rows, each label into the first row where it has room.
pub fn phase_labels(
    snapshot: &Snapshot,
    x_end: f64,
    width: impl Fn(&str) -> u32,
) -> Vec<PhaseLabel> {
    let per_pixel = x_end / PLOT_WIDTH;
    let gap = 6.0 * per_pixel;
    let mut rows: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut labels = Vec::new();
    for (i, event) in snapshot.events.iter().enumerate() {
        if event.kind != EventKind::Mark {
            continue;
        }
        let x = i as f64;
        let w = width(&event.op) as f64 * per_pixel;
        let label_x = if x + gap + w > x_end {
            x - gap - w
        } else {
            x + gap / 2.0
        };
        let span = (label_x - gap, label_x + w + gap);
        let free = |row: &Vec<(f64, f64)>| row.iter().all(|&(a, b)| span.1 <= a || b <= span.0);
        let row = rows.iter().position(free).unwrap_or(rows.len());
        if row == rows.len() {
            rows.push(Vec::new());
        }
        rows[row].push(span);
        labels.push(PhaseLabel {
            text: event.op.clone(),
            x,
            label_x,
            row,
        });
    }
    labels
}

/// Draws the snapshot's timeline (live bytes after each event, split by role) to `path` as a
/// PNG.
pub fn step_memory(snapshot: &Snapshot, path: &Path) -> Result<(), String> {
    fonts();
    let points: Vec<(f64, f64)> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind != EventKind::Mark)
        .map(|(i, e)| (i as f64, e.live_bytes as f64 / MIB))
        .collect();
    if points.is_empty() {
        return Err("the timeline holds no events to plot".into());
    }
    let (peak_x, peak_y) =
        points.iter().copied().fold(
            (0.0, f64::MIN),
            |best, p| if p.1 > best.1 { p } else { best },
        );
    let x_end = snapshot.events.len() as f64;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    let phases = phase_labels(snapshot, x_end, |text| {
        root.estimate_text_size(text, &("sans-serif", LABEL_PX).into_text_style(&root))
            .map(|(w, _)| w)
            .unwrap_or(8 * text.len() as u32)
    });
    // Room above the peak's own label for every row of phase labels.
    let rows = phases.iter().map(|p| p.row + 1).max().unwrap_or(1);
    let lowest_bottom = (LABELS_TOP - (rows as f64 - 1.0) * ROW - ROW * 0.8).max(0.3);
    let y_end = (peak_y * 1.15).max(peak_y * 1.08 / lowest_bottom) + 1e-3;

    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Live tensor memory over one training step ({})",
                snapshot.report.device
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_end, 0.0..y_end)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("allocation / free events")
        .y_desc("live MiB (Frugal ledger)")
        .draw()
        .map_err(|e| err(&e))?;
    // Live bytes by role, stacked in `Role::ALL` order: each layer is drawn as the area under
    // its cumulative sum, the tallest first so the lower ones stay visible over it.
    let stacked: Vec<(f64, [f64; 5])> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind != EventKind::Mark)
        .map(|(i, e)| {
            let mut sums = [0.0; 5];
            let mut sum = 0.0;
            for (layer, role) in Role::ALL.into_iter().enumerate() {
                sum += e.live_by_role.get(role) as f64 / MIB;
                sums[layer] = sum;
            }
            (i as f64, sums)
        })
        .collect();
    for (layer, role) in Role::ALL.into_iter().enumerate().rev() {
        let colour = ROLE_COLOURS[layer];
        chart
            .draw_series(AreaSeries::new(
                stacked.iter().map(|(x, sums)| (*x, sums[layer])),
                0.0,
                colour.filled(),
            ))
            .map_err(|e| err(&e))?
            .label(role.label())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label("live (all)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLUE.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    for phase in &phases {
        chart
            .draw_series(LineSeries::new(
                [(phase.x, 0.0), (phase.x, y_end)],
                BLACK.mix(0.35),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series([Text::new(
                phase.text.clone(),
                (phase.label_x, y_end * (LABELS_TOP - phase.row as f64 * ROW)),
                ("sans-serif", LABEL_PX),
            )])
            .map_err(|e| err(&e))?;
    }
    chart
        .draw_series([Circle::new((peak_x, peak_y), 6, RED.filled())])
        .map_err(|e| err(&e))?;
    chart
        .draw_series([Text::new(
            format!("peak {}", format_bytes((peak_y * MIB) as u64)),
            (peak_x, peak_y * 1.06),
            ("sans-serif", 16).into_font().color(&RED),
        )])
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
