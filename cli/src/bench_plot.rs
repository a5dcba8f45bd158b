//! `dayone bench --csv FILE --plot FILE`: the long-context curves (TTFT, prefill tok/s, TPOT,
//! device memory against prompt length) as a table and a chart (plotters; `.svg` or `.png`,
//! labelled with a system TrueType font).

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;
use std::path::Path;

/// The CSV columns, each a key of a bench report.
const COLUMNS: [&str; 9] = [
    "batch",
    "prompt_len",
    "gen_len",
    "ttft_median_s",
    "prefill_tokens_per_s",
    "tpot_median_s",
    "decode_tokens_per_s",
    "output_tokens_per_s",
    "device_memory_bytes",
];

/// Writes one CSV row per run (a header first; an unknown figure is an empty cell).
pub fn write_csv(path: &Path, reports: &[Value]) -> Result<()> {
    let mut out = COLUMNS.join(",") + "\n";
    for r in reports {
        let cells: Vec<String> = COLUMNS
            .iter()
            .map(|k| match &r[*k] {
                Value::Number(n) => n.to_string(),
                _ => String::new(),
            })
            .collect();
        out += &(cells.join(",") + "\n");
    }
    std::fs::write(path, out).with_context(|| format!("--csv {}: cannot write it", path.display()))
}

/// TrueType fonts tried for a PNG's labels (SVG needs none).
const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// One panel: a figure of each run against its prompt length.
struct Panel {
    title: &'static str,
    key: &'static str,
    scale: f64,
}

const PANELS: [Panel; 4] = [
    Panel {
        title: "TTFT (s)",
        key: "ttft_median_s",
        scale: 1.0,
    },
    Panel {
        title: "prefill tokens/s",
        key: "prefill_tokens_per_s",
        scale: 1.0,
    },
    Panel {
        title: "TPOT (ms)",
        key: "tpot_median_s",
        scale: 1e3,
    },
    Panel {
        title: "device memory (GiB)",
        key: "device_memory_bytes",
        scale: 1.0 / (1u64 << 30) as f64,
    },
];

/// Checks a `--plot` file name before anything runs: a `.svg` or `.png` name in an existing
/// directory. Errors: another extension, a missing directory (naming the path).
pub fn check_plot_path(path: &Path) -> Result<()> {
    check_output_dir("--plot", path)?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ext != "svg" && ext != "png" {
        bail!(
            "--plot {}: expected a .svg or .png file name, got `.{ext}`",
            path.display()
        );
    }
    Ok(())
}

/// Refuses an output file (`flag` names it in the error) whose directory does not exist or that
/// is a directory, before a bench spends minutes on runs it then could not save.
pub fn check_output_dir(flag: &str, path: &Path) -> Result<()> {
    if path.is_dir() {
        bail!(
            "{flag} {}: is a directory, expected a file name",
            path.display()
        );
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(d) = dir {
        if !d.is_dir() {
            bail!(
                "{flag} {}: the directory {} does not exist",
                path.display(),
                d.display()
            );
        }
    }
    Ok(())
}

/// Draws the four curves, each against the prompt length on a log axis, into `path` (`.svg`
/// or `.png`). Errors: another extension, no font for a PNG (naming what was tried), fewer
/// than one run.
pub fn write_plot(path: &Path, reports: &[Value], title: &str) -> Result<()> {
    if reports.is_empty() {
        bail!("--plot: no runs to plot");
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let size = (1200, 900);
    let err = |e: String| anyhow::anyhow!("--plot {}: {e}", path.display());
    if ext != "svg" && ext != "png" {
        return Err(err(format!(
            "expected a .svg or .png file name, got `.{ext}`"
        )));
    }
    // The labels are laid out with a TrueType font (rasterised into a PNG, measured for SVG).
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .ok_or_else(|| err(format!("the chart's labels need a TrueType font and none of {FONTS:?} exists (the CSV has the figures)")))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| err("the font could not be read".into()))?;
    if ext == "svg" {
        draw(
            &SVGBackend::new(path, size).into_drawing_area(),
            reports,
            title,
        )
    } else {
        draw(
            &BitMapBackend::new(path, size).into_drawing_area(),
            reports,
            title,
        )
    }
    .map_err(|e| err(e.to_string()))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    reports: &[Value],
    title: &str,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 24))?;
    let x: Vec<f64> = reports
        .iter()
        .map(|r| r["prompt_len"].as_f64().unwrap_or(1.0))
        .collect();
    let (x0, x1) = x
        .iter()
        .fold((f64::MAX, 1.0f64), |(a, b), &v| (a.min(v), b.max(v)));
    let (x0, x1) = (x0.max(1.0) / 1.5, x1 * 1.5);
    for (area, p) in root.split_evenly((2, 2)).iter().zip(&PANELS) {
        let pts: Vec<(f64, f64)> = x
            .iter()
            .zip(reports)
            .filter_map(|(&x, r)| Some((x, r[p.key].as_f64()? * p.scale)))
            .filter(|(_, y)| y.is_finite())
            .collect();
        let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(p.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((x0..x1).log_scale(), 0.0..ymax)?;
        chart
            .configure_mesh()
            .x_desc("prompt tokens")
            .x_label_formatter(&|v| tokens(*v))
            .draw()?;
        if pts.is_empty() {
            chart.draw_series(std::iter::once(Text::new(
                "not measured on this backend",
                (x0 * 1.2, ymax / 2.0),
                ("sans-serif", 16),
            )))?;
            continue;
        }
        chart.draw_series(LineSeries::new(pts.iter().copied(), &BLUE))?;
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))?;
    }
    root.present()?;
    Ok(())
}

/// `8192` → `8K`, `1048576` → `1M`.
fn tokens(v: f64) -> String {
    let v = v.round() as u64;
    if v >= 1 << 20 && v.is_multiple_of(1 << 20) {
        format!("{}M", v >> 20)
    } else if v >= 1024 && v.is_multiple_of(1024) {
        format!("{}K", v >> 10)
    } else {
        v.to_string()
    }
}
