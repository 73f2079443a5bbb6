//! `--plot FILE.svg`: the latency-throughput curve of a sweep as a picture: TTFT p50 and p99
//! (left axis, ms) and output tokens/s (right axis) against the levels' concurrency or offered
//! rate, with target B's curves beside A's under `--compare`, and the TTFT SLO as a dashed line
//! when one is given.
//!
//! The x axis is logarithmic in base 2: sweeps double their load (1, 2, 4, .. 64), and on a
//! linear axis the first levels, where the curve is decided, crowd into the left edge. Colours
//! are Okabe and Ito's palette, told apart with every common colour-vision deficiency.
//!
//! Drawn by plotters' SVG backend alone (no fonts, no bitmaps), so the picture costs no system
//! library and the file is text a test can read.

use std::path::Path;

use plotters::prelude::*;

use super::report::{Load, Slo};
use super::{LevelReport, Sweep};

/// One curve: its legend, its colour, and which axis it belongs to.
struct Curve {
    name: String,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
    throughput: bool,
}

fn curves(levels: &[LevelReport], prefix: &str, colours: [RGBColor; 3]) -> Vec<Curve> {
    let series = |name: &str, colour, throughput, f: &dyn Fn(&LevelReport) -> Option<f64>| Curve {
        name: format!("{prefix}{name}"),
        colour,
        points: levels
            .iter()
            .filter_map(|l| Some((l.load.value(), f(l)?)))
            .collect(),
        throughput,
    };
    vec![
        series("TTFT p50 (ms)", colours[0], false, &|l| l.ttft.p50),
        series("TTFT p99 (ms)", colours[1], false, &|l| l.ttft.p99),
        series("output tokens/s", colours[2], true, &|l| {
            Some(l.output_tokens_per_s)
        }),
    ]
}

use crate::tools::palette::{BLUE, BLUISH_GREEN, ORANGE, REDDISH_PURPLE, SKY_BLUE, VERMILLION};

/// Draws the sweep into `path` (an SVG file).
pub fn write_svg(path: &Path, sweep: &Sweep) -> Result<(), String> {
    write_svg_with(path, sweep, &Slo::default())
}

/// [`write_svg`], with the TTFT threshold of `slo` drawn as a dashed line when it has one.
pub fn write_svg_with(path: &Path, sweep: &Sweep, slo: &Slo) -> Result<(), String> {
    let a = [BLUE, VERMILLION, BLUISH_GREEN];
    let mut all = if sweep.compared.is_empty() {
        curves(&sweep.levels, "", a)
    } else {
        curves(&sweep.levels, "A ", a)
    };
    if !sweep.compared.is_empty() {
        all.extend(curves(
            &sweep.compared,
            "B ",
            [SKY_BLUE, ORANGE, REDDISH_PURPLE],
        ));
    }
    let xs = sweep
        .levels
        .iter()
        .map(|l| l.load.value())
        .filter(|&x| x > 0.0);
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if x_lo > x_hi {
        return Err("no levels to plot".into());
    }
    // Half a doubling of room on each side, so the end points are not on the frame.
    let x_range = (x_lo / std::f64::consts::SQRT_2..x_hi * std::f64::consts::SQRT_2)
        .log_scale()
        .base(2.0);
    let slo_ms = slo.ttft.map(|d| d.as_secs_f64() * 1000.0);
    let top = |throughput: bool| {
        let highest = all
            .iter()
            .filter(|c| c.throughput == throughput)
            .flat_map(|c| c.points.iter().map(|p| p.1))
            .fold(0.0f64, f64::max);
        let slo = if throughput { None } else { slo_ms };
        highest.max(slo.unwrap_or(0.0)).max(1.0) * 1.1
    };
    let x_desc = match sweep.levels[0].load {
        Load::Concurrency(_) => "concurrency (requests in flight)",
        Load::Rate(_) => "offered rate (requests/s)",
    };
    let err = |e: &dyn std::fmt::Display| e.to_string();

    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "tokenmeter bench: latency and throughput",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .right_y_label_area_size(72)
        .build_cartesian_2d(x_range.clone(), 0.0..top(false))
        .map_err(|e| err(&e))?
        .set_secondary_coord(x_range, 0.0..top(true));
    chart
        .configure_mesh()
        .x_labels(8)
        .x_desc(x_desc)
        .y_desc("TTFT (ms)")
        .x_label_formatter(&|x| format!("{}", (x * 1000.0).round() / 1000.0))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .configure_secondary_axes()
        .y_desc("output tokens/s")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    for curve in all {
        let colour = curve.colour;
        let line = LineSeries::new(curve.points, colour.stroke_width(2)).point_size(3);
        let drawn = if curve.throughput {
            chart.draw_secondary_series(line)
        } else {
            chart.draw_series(line)
        };
        drawn
            .map_err(|e| err(&e))?
            .label(curve.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    if let Some(ms) = slo_ms {
        let colour = BLACK;
        let (lo, hi) = (
            x_lo / std::f64::consts::SQRT_2,
            x_hi * std::f64::consts::SQRT_2,
        );
        chart
            .draw_series(DashedLineSeries::new(
                [(lo, ms), (hi, ms)],
                8,
                5,
                colour.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("SLO: TTFT {} ms", (ms * 1000.0).round() / 1000.0))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
