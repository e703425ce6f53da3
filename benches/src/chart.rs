//! Bar chart of peak memory per configuration (Burn's and, when given, PyTorch's).

use std::path::Path;

use plotters::prelude::*;

/// One bar group: a configuration's peak allocated and peak reserved bytes.
pub struct Bars {
    /// Label under the group, e.g. "burn plain".
    pub label: String,
    /// Peak live tensor bytes, if known.
    pub allocated: Option<u64>,
    /// Peak reserved bytes of the device pool, if known.
    pub reserved: Option<u64>,
}

const GB: f64 = 1e9;

/// Draws grouped bars (allocated, reserved) in GB to `path` as a PNG.
pub fn peak_memory(title: &str, groups: &[Bars], path: &Path) -> Result<(), String> {
    gpt::plot::fonts();
    let err = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let top = groups
        .iter()
        .flat_map(|g| [g.allocated, g.reserved])
        .flatten()
        .max()
        .unwrap_or(1) as f64
        / GB
        * 1.15;
    let n = groups.len().max(1);
    let root = BitMapBackend::new(path, (160 * n as u32 + 200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("GB (1e9 bytes)")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, group) in groups.iter().enumerate() {
        let x = i as f64;
        for (offset, value, color) in [
            (0.15, group.allocated, BLUE.mix(0.8)),
            (0.5, group.reserved, RED.mix(0.6)),
        ] {
            if let Some(bytes) = value {
                let y = bytes as f64 / GB;
                chart
                    .draw_series([Rectangle::new(
                        [(x + offset, 0.0), (x + offset + 0.33, y)],
                        color.filled(),
                    )])
                    .map_err(|e| err(&e))?;
                chart
                    .draw_series([Text::new(
                        format!("{y:.2}"),
                        (x + offset, y + top * 0.01),
                        ("sans-serif", 13),
                    )])
                    .map_err(|e| err(&e))?;
            }
        }
        // Below the axis, in pixels: outside the chart's coordinate range.
        let (px, py) = chart.backend_coord(&(x + 0.1, 0.0));
        root.draw(&Text::new(
            group.label.clone(),
            (px, py + 12),
            ("sans-serif", 13),
        ))
        .map_err(|e| err(&e))?;
    }
    chart
        .draw_series([Rectangle::new(
            [(0.02, top * 0.95), (0.08, top * 0.98)],
            BLUE.mix(0.8).filled(),
        )])
        .map_err(|e| err(&e))?;
    chart
        .draw_series([Text::new(
            "peak allocated",
            (0.1, top * 0.985),
            ("sans-serif", 13),
        )])
        .map_err(|e| err(&e))?;
    chart
        .draw_series([Rectangle::new(
            [(0.02, top * 0.89), (0.08, top * 0.92)],
            RED.mix(0.6).filled(),
        )])
        .map_err(|e| err(&e))?;
    chart
        .draw_series([Text::new(
            "peak reserved",
            (0.1, top * 0.925),
            ("sans-serif", 13),
        )])
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
