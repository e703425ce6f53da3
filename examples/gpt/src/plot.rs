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
    let y_end = peak_y * 1.15 + 1e-3;
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());

    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
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
    for (i, event) in snapshot.events.iter().enumerate() {
        if event.kind == EventKind::Mark {
            let x = i as f64;
            chart
                .draw_series(LineSeries::new([(x, 0.0), (x, y_end)], BLACK.mix(0.35)))
                .map_err(|e| err(&e))?;
            // Labels near the right edge go left of their line so they stay inside.
            let label_x = if x > x_end * 0.85 {
                x - x_end * 0.09
            } else {
                x + x_end * 0.005
            };
            chart
                .draw_series([Text::new(
                    event.op.clone(),
                    (label_x, y_end * 0.97),
                    ("sans-serif", 14),
                )])
                .map_err(|e| err(&e))?;
        }
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
