//! Bench charts: per workload, one panel per unit, a horizontal bar per
//! series at its median with an error bar from its minimum to its maximum,
//! written as SVG and PNG.

use crate::bench::{median, Outcome};
use anyhow::{anyhow, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where a TrueType sans-serif font usually is (Debian: fonts-dejavu-core).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Register the font plotters draws text with (once per process).
fn register_font() -> Result<()> {
    static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let env = std::env::var("FOLIOFS_CHART_FONT").ok();
            let bytes = env
                .iter()
                .map(String::as_str)
                .chain(FONTS.iter().copied())
                .find_map(|p| std::fs::read(p).ok())
                .ok_or_else(|| {
                    "no TrueType font found for the charts: install fonts-dejavu-core \
                     or set FOLIOFS_CHART_FONT to a .ttf file"
                        .to_string()
                })?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| "the chart font is not a usable TrueType file".to_string())
        })
        .clone()
        .map_err(|e| anyhow!("{e}"))
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// 1234567 -> "1.23M", 0.5 -> "0.5".
fn compact(x: f64) -> String {
    let a = x.abs();
    let (v, suffix) = match a {
        a if a >= 1e9 => (x / 1e9, "G"),
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e4 => (x / 1e3, "k"),
        _ => (x, ""),
    };
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!(" {s}{suffix}")
}

/// Units in first-seen order.
fn units(o: &Outcome) -> Vec<String> {
    let mut u: Vec<String> = Vec::new();
    for s in &o.series {
        if !u.contains(&s.unit) {
            u.push(s.unit.clone());
        }
    }
    u
}

fn size(o: &Outcome) -> (u32, u32) {
    let bars: usize = o.series.len();
    (1100, 70 + 90 * units(o).len() as u32 + 34 * bars as u32)
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, o: &Outcome) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing the {} chart: {e}", o.id);
    root.fill(&WHITE).map_err(e)?;
    let root = root
        .titled(&format!("{}: {}", o.id, o.title), ("sans-serif", 17))
        .map_err(e)?;
    let units = units(o);
    let heights: Vec<u32> = units
        .iter()
        .map(|u| 90 + 34 * o.series.iter().filter(|s| &s.unit == u).count() as u32)
        .collect();
    let mut rest = root;
    let label_px = o.series.iter().map(|s| s.name.len()).max().unwrap_or(10) as u32 * 8 + 20;
    for (unit, h) in units.iter().zip(heights) {
        let (panel, below) = rest.split_vertically(h);
        rest = below;
        let series: Vec<_> = o.series.iter().filter(|s| &s.unit == unit).collect();
        let top = series
            .iter()
            .flat_map(|s| s.values.iter().copied())
            .fold(0.0f64, f64::max);
        let top = if top > 0.0 { top * 1.12 } else { 1.0 };
        let n = series.len();
        let mut chart = ChartBuilder::on(&panel)
            .margin(8)
            .x_label_area_size(40)
            .y_label_area_size(label_px)
            .build_cartesian_2d(0f64..top, (0..n).into_segmented())
            .map_err(e)?;
        let names: Vec<String> = series.iter().map(|s| s.name.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_label_formatter(&|x| compact(*x))
            .x_desc(format!("{unit} (bar: median; whiskers: min to max)"))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(e)?;
        draw_bars(&mut chart, &series).map_err(e)?;
    }
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(
    chart: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<
            RangedCoordf64,
            plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordusize>,
        >,
    >,
    series: &[&crate::bench::Series],
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let m = median(&s.values);
        let lo = s.values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (m, SegmentValue::Exact(i + 1)),
            ],
            c.mix(0.8).filled(),
        );
        bar.set_margin(5, 5, 0, 0);
        chart.draw_series(std::iter::once(bar))?;
        chart.draw_series(std::iter::once(Text::new(
            compact(m),
            (hi.max(m), SegmentValue::CenterOf(i)),
            ("sans-serif", 13).into_font().color(&BLACK),
        )))?;
        chart.draw_series(std::iter::once(ErrorBar::new_horizontal(
            SegmentValue::CenterOf(i),
            lo,
            m,
            hi,
            BLACK.stroke_width(2),
            12,
        )))?;
    }
    Ok(())
}

/// Write `DIR/W<n>.svg` and `DIR/W<n>.png` for every outcome; returns the
/// files written.
pub fn write(dir: &Path, outcomes: &[Outcome]) -> Result<Vec<PathBuf>> {
    register_font()?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut out = Vec::new();
    for o in outcomes {
        let (w, h) = size(o);
        let svg = dir.join(format!("{}.svg", o.id));
        {
            let root = SVGBackend::new(&svg, (w, h)).into_drawing_area();
            draw(root.clone(), o)?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
        }
        let png = dir.join(format!("{}.png", o.id));
        {
            let root = BitMapBackend::new(&png, (w, h)).into_drawing_area();
            draw(root.clone(), o)?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
        }
        out.push(svg);
        out.push(png);
    }
    Ok(out)
}
