//! SVG charts of a run's measurements (`--plot DIR`): latency CDFs (netchannel against
//! kernel TCP, and a latency stream alone against beside bulk streams), request rate
//! against connections, and bulk goodput against channels and against copy workers.
//! A chart whose data the run did not take is not written.

use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{size_label, Measurement, Test, Transport};
use crate::stats::{median, Latency};

type Res<T> = Result<T, Box<dyn Error>>;

const SIZE: (u32, u32) = (720, 440);
const FONT: &str = "sans-serif";
const NETCHANNEL: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const KERNEL: RGBColor = RGBColor(0xe4, 0x6c, 0x0a);
const KERNEL_XDP: RGBColor = RGBColor(0x8c, 0x8c, 0x8c);

fn colour(t: Transport) -> RGBColor {
    match t {
        Transport::Netchannel => NETCHANNEL,
        Transport::Kernel => KERNEL,
        Transport::KernelXdp => KERNEL_XDP,
    }
}

/// Writes every chart the measurements allow into `dir`; returns the files written.
pub fn write_all(dir: &Path, ms: &[Measurement]) -> Res<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    let mut put = |name: &str, f: &dyn Fn(&Path) -> Res<bool>| -> Res<()> {
        let p = dir.join(name);
        if f(&p)? {
            out.push(p);
        }
        Ok(())
    };
    put("latency_cdf.svg", &|p| latency_cdf(p, ms))?;
    put("isolation_cdf.svg", &|p| isolation_cdf(p, ms))?;
    put("request_rate.svg", &|p| request_rate(p, ms))?;
    put("goodput_channels.svg", &|p| {
        sweep(
            p,
            ms,
            Test::SweepChannels,
            "throughput channels per peer",
            |m| m.channels,
        )
    })?;
    put("goodput_copy_workers.svg", &|p| {
        sweep(p, ms, Test::SweepCopyWorkers, "copy workers", |m| {
            m.copy_workers
        })
    })?;
    Ok(out)
}

/// The y coordinate of cumulative fraction `p` on a "nines" axis: 0 at 0 %, 1 at 90 %,
/// 2 at 99 %, 3 at 99.9 %, capped at `top`.
fn nines(p: f64, top: f64) -> f64 {
    if p >= 1.0 {
        top
    } else {
        (-(1.0 - p).log10()).min(top)
    }
}

fn nines_label(y: &f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-*y));
    if p < 1e-9 {
        "0 %".into()
    } else if y.fract().abs() < 1e-9 {
        format!("{} %", trim(p))
    } else {
        String::new()
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A latency axis label: `30`, `300`, `3k` µs (log axes label powers and their halves).
fn us_label(x: &f64) -> String {
    if *x >= 1000.0 {
        format!("{}k", trim(*x / 1000.0))
    } else {
        trim(*x)
    }
}

/// One latency CDF line per `(label, colour, dashed, latency)`; `false` when there is
/// none.
fn cdf_chart(path: &Path, title: &str, lines: &[(String, RGBColor, bool, &Latency)]) -> Res<bool> {
    if lines.is_empty() {
        return Ok(false);
    }
    let all = lines.iter().flat_map(|l| l.3.cdf.iter());
    let (lo, hi) = all.fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p[0]), hi.max(p[0])));
    let (lo, hi) = ((lo * 0.8).max(0.1), (hi * 1.25).max(lo * 2.0));
    let top = lines
        .iter()
        .map(|l| nines(1.0 - 1.0 / l.3.samples.max(1) as f64, 6.0))
        .fold(2.0f64, f64::max)
        .ceil();
    let (root, area, legend_area) = canvas(path, lines.len(), 1)?;
    let mut entries: Vec<Entry> = Vec::new();
    let mut chart = ChartBuilder::on(&area)
        .caption(title, (FONT, 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("round-trip latency (µs, log scale)")
        .y_desc("requests at or below (percentile)")
        .y_labels(top as usize * 2 + 1)
        .y_label_formatter(&nines_label)
        .x_label_formatter(&us_label)
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .draw()?;
    for (label, c, dashed, l) in lines {
        let pts: Vec<(f64, f64)> = l.cdf.iter().map(|p| (p[0], nines(p[1], top))).collect();
        let style = ShapeStyle::from(c).stroke_width(2);
        let legend = format!(
            "{label}: p50 {} µs, p99 {} µs, p99.9 {} µs",
            trim(round3(l.p50_us)),
            trim(round3(l.p99_us)),
            trim(round3(l.p999_us))
        );
        if *dashed {
            chart.draw_series(DashedLineSeries::new(pts, 6, 4, style))?;
        } else {
            chart.draw_series(LineSeries::new(pts, style))?;
        }
        entries.push((legend, *c, *dashed));
    }
    draw_legend(&legend_area, &entries, 1)?;
    root.present()?;
    Ok(true)
}

/// A legend entry: label, colour, dashed.
type Entry = (String, RGBColor, bool);

/// The drawing area of a chart.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Height of a legend strip of `n` entries in `cols` columns.
fn legend_height(n: usize, cols: usize) -> u32 {
    (n.div_ceil(cols.max(1)) as u32) * 20 + 12
}

/// A white canvas of [`SIZE`] with a legend strip for `n` entries in `cols` columns
/// below it: (the whole, the chart's area, the legend's area).
fn canvas(path: &Path, n: usize, cols: usize) -> Res<(Area<'_>, Area<'_>, Area<'_>)> {
    let root = SVGBackend::new(path, (SIZE.0, SIZE.1 + legend_height(n, cols))).into_drawing_area();
    root.fill(&WHITE)?;
    let (chart, legend) = root.split_vertically(SIZE.1);
    Ok((root, chart, legend))
}

/// Draws `entries` in `cols` columns: a line sample (dashed or not) and the label.
fn draw_legend(area: &Area<'_>, entries: &[Entry], cols: usize) -> Res<()> {
    let cols = cols.max(1);
    let width = (SIZE.0 as i32 - 80) / cols as i32;
    for (i, (label, c, dashed)) in entries.iter().enumerate() {
        let x = 70 + (i % cols) as i32 * width;
        let y = 8 + (i / cols) as i32 * 20;
        let style = c.stroke_width(2);
        if *dashed {
            for k in 0..3 {
                let x0 = x + k * 9;
                area.draw(&PathElement::new(vec![(x0, y), (x0 + 5, y)], style))?;
            }
        } else {
            area.draw(&PathElement::new(vec![(x, y), (x + 24, y)], style))?;
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 32, y - 7),
            (FONT, 13).into_font().color(&BLACK),
        ))?;
    }
    Ok(())
}

/// Three significant digits.
fn round3(v: f64) -> f64 {
    if v <= 0.0 {
        return v;
    }
    let mag = 10f64.powi(v.log10().floor() as i32 - 2);
    (v / mag).round() * mag
}

fn first(ms: &[Measurement], test: Test, t: Transport) -> Option<&Measurement> {
    ms.iter().find(|m| m.test == test && m.transport == t)
}

/// `" (round 1 of N)"` when `test` ran in N > 1 rounds: a CDF shows one round's samples.
fn round_note(ms: &[Measurement], test: Test) -> String {
    let rounds = ms
        .iter()
        .filter(|m| m.test == test)
        .map(|m| m.round + 1)
        .max()
        .unwrap_or(1);
    if rounds > 1 {
        format!(" (round 1 of {rounds})")
    } else {
        String::new()
    }
}

fn latency_cdf(path: &Path, ms: &[Measurement]) -> Res<bool> {
    let mut lines = Vec::new();
    let mut size = None;
    for t in [
        Transport::Netchannel,
        Transport::Kernel,
        Transport::KernelXdp,
    ] {
        if let Some(m) = first(ms, Test::Latency, t) {
            if let Some(l) = &m.latency {
                size = size.or(m.size);
                lines.push((
                    t.label().to_string(),
                    colour(t),
                    t == Transport::KernelXdp,
                    l,
                ));
            }
        }
    }
    let title = format!(
        "{} request/response latency, one connection{}",
        size_label(size.unwrap_or(0)),
        round_note(ms, Test::Latency)
    );
    cdf_chart(path, &title, &lines)
}

fn isolation_cdf(path: &Path, ms: &[Measurement]) -> Res<bool> {
    let mut lines = Vec::new();
    let mut streams = None;
    for t in [Transport::Netchannel, Transport::Kernel] {
        if let Some(m) = first(ms, Test::Isolation, t) {
            streams = streams.or(m.streams);
            if let Some(l) = &m.latency {
                lines.push((format!("{}, alone", t.label()), colour(t), true, l));
            }
            if let Some(l) = &m.loaded_latency {
                lines.push((format!("{}, beside bulk", t.label()), colour(t), false, l));
            }
        }
    }
    let title = format!(
        "Latency stream alone and beside {} bulk streams{}",
        streams.unwrap_or(0),
        round_note(ms, Test::Isolation)
    );
    cdf_chart(path, &title, &lines)
}

/// Medians over rounds of `value` per x, for one transport.
fn medians(
    ms: &[Measurement],
    keep: impl Fn(&Measurement) -> bool,
    x: impl Fn(&Measurement) -> Option<u32>,
    value: impl Fn(&Measurement) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let mut xs: Vec<u32> = ms.iter().filter(|m| keep(m)).filter_map(&x).collect();
    xs.sort_unstable();
    xs.dedup();
    xs.into_iter()
        .filter_map(|xv| {
            let vals: Vec<f64> = ms
                .iter()
                .filter(|m| keep(m) && x(m) == Some(xv))
                .filter_map(&value)
                .collect();
            Some((f64::from(xv), median(&vals)?))
        })
        .collect()
}

fn request_rate(path: &Path, ms: &[Measurement]) -> Res<bool> {
    let mut sizes: Vec<u32> = ms
        .iter()
        .filter(|m| m.test == Test::Rpc)
        .filter_map(|m| m.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Ok(false);
    }
    let shown: Vec<Transport> = [
        Transport::Netchannel,
        Transport::Kernel,
        Transport::KernelXdp,
    ]
    .into_iter()
    .filter(|&t| ms.iter().any(|m| m.test == Test::Rpc && m.transport == t))
    .collect();
    let (root, area, legend_area) = canvas(path, shown.len(), 3)?;
    let (top, body) = area.split_vertically(36);
    top.titled(
        "Closed-loop request rate (one request outstanding per connection)",
        (FONT, 20),
    )?;
    let panels = body.split_evenly((1, sizes.len()));
    for (panel, &size) in panels.iter().zip(&sizes) {
        rate_panel(panel, ms, size)?;
    }
    let entries: Vec<Entry> = shown
        .iter()
        .map(|&t| (t.label().to_string(), colour(t), t == Transport::KernelXdp))
        .collect();
    draw_legend(&legend_area, &entries, 3)?;
    root.present()?;
    Ok(true)
}

fn rate_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, ms: &[Measurement], size: u32) -> Res<()> {
    let series: Vec<(Transport, Vec<(f64, f64)>)> = [
        Transport::Netchannel,
        Transport::Kernel,
        Transport::KernelXdp,
    ]
    .into_iter()
    .map(|t| {
        // x: log2 of the connections, labelled with the counts measured.
        let pts: Vec<(f64, f64)> = medians(
            ms,
            |m| m.test == Test::Rpc && m.transport == t && m.size == Some(size),
            |m| m.conns,
            |m| m.requests_per_s.map(|r| r / 1e3),
        )
        .into_iter()
        .map(|(x, y)| (x.log2(), y))
        .collect();
        (t, pts)
    })
    .filter(|(_, p)| !p.is_empty())
    .collect();
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .collect();
    let xmax = xs.iter().copied().fold(1.0, f64::max);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{} requests", size_label(size)), (FONT, 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.4f64..xmax + 0.4, 0f64..ymax.max(1.0))?;
    let label = |x: &f64| {
        if xs.iter().any(|v| (v - x).abs() < 1e-6) {
            format!("{}", 2f64.powf(*x).round())
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc("connections (log scale)")
        .y_desc("thousand requests/s")
        .x_labels(xmax as usize + 1)
        .x_label_formatter(&label)
        .y_label_formatter(&|y| trim(*y))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .axis_desc_style((FONT, 14))
        .label_style((FONT, 12))
        .draw()?;
    for (t, pts) in series {
        let c = colour(t);
        let style = ShapeStyle::from(&c).stroke_width(2);
        if t == Transport::KernelXdp {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?;
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))?;
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    Ok(())
}

/// Goodput against the swept setting, one line per stream count, kernel TCP's bulk
/// goodput with as many streams as dashed references.
fn sweep(
    path: &Path,
    ms: &[Measurement],
    test: Test,
    x_desc: &str,
    x: impl Fn(&Measurement) -> Option<u32> + Copy,
) -> Res<bool> {
    let mut streams: Vec<u32> = ms
        .iter()
        .filter(|m| m.test == test)
        .filter_map(|m| m.streams)
        .collect();
    streams.sort_unstable();
    streams.dedup();
    if streams.is_empty() {
        return Ok(false);
    }
    let lines: Vec<(u32, Vec<(f64, f64)>)> = streams
        .iter()
        .map(|&s| {
            let pts = medians(
                ms,
                |m| m.test == test && m.streams == Some(s),
                x,
                |m| m.goodput_gbps,
            );
            (s, pts)
        })
        .collect();
    let refs: Vec<(u32, f64)> = streams
        .iter()
        .filter_map(|&s| {
            let v: Vec<f64> = ms
                .iter()
                .filter(|m| {
                    m.test == Test::Bulk && m.transport == Transport::Kernel && m.streams == Some(s)
                })
                .filter_map(|m| m.goodput_gbps)
                .collect();
            Some((s, median(&v)?))
        })
        .collect();
    let (xmin, xmax) = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.0))
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let ymax = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .chain(refs.iter().map(|r| r.1))
        .fold(0.0, f64::max)
        * 1.2;
    let (root, area, legend_area) = canvas(path, lines.len() + refs.len(), 2)?;
    let mut entries: Vec<Entry> = Vec::new();
    let title = format!("Bulk goodput against {x_desc}");
    let pad = ((xmax - xmin) * 0.08).max(0.2);
    let mut chart = ChartBuilder::on(&area)
        .caption(title, (FONT, 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(xmin - pad..xmax + pad, 0f64..ymax.max(0.1))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("Gbit/s")
        .x_labels((xmax - xmin) as usize + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{}", x.round())
            } else {
                String::new()
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .draw()?;
    let shades = [
        NETCHANNEL,
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
    ];
    let kernel_shades = [
        KERNEL,
        RGBColor(0xb0, 0x4a, 0x00),
        RGBColor(0x70, 0x38, 0x00),
    ];
    let plural = |s: u32| if s == 1 { "stream" } else { "streams" };
    for (i, (s, pts)) in lines.into_iter().enumerate() {
        let c = shades[i % shades.len()];
        chart.draw_series(LineSeries::new(
            pts.clone(),
            ShapeStyle::from(&c).stroke_width(2),
        ))?;
        entries.push((format!("netchannel, {s} {}", plural(s)), c, false));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    for (i, (s, v)) in refs.into_iter().enumerate() {
        let c = kernel_shades[i % kernel_shades.len()];
        chart.draw_series(DashedLineSeries::new(
            vec![(xmin - pad, v), (xmax + pad, v)],
            6,
            4,
            ShapeStyle::from(&c).stroke_width(2),
        ))?;
        entries.push((
            format!("kernel TCP, {s} {} (reference)", plural(s)),
            c,
            true,
        ));
    }
    draw_legend(&legend_area, &entries, 2)?;
    root.present()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Samples;
    use std::time::Duration;

    #[test]
    fn nines_axis() {
        assert_eq!(nines(0.0, 4.0), 0.0);
        assert!((nines(0.9, 4.0) - 1.0).abs() < 1e-9);
        assert!((nines(0.999, 4.0) - 3.0).abs() < 1e-9);
        assert_eq!(nines(1.0, 4.0), 4.0);
        assert_eq!(nines_label(&0.0), "0 %");
        assert_eq!(nines_label(&2.0), "99 %");
        assert_eq!(nines_label(&3.0), "99.9 %");
        assert_eq!(nines_label(&2.5), "");
        assert_eq!(us_label(&3000.0), "3k");
        assert_eq!(round3(12345.0), 12300.0);
    }

    #[test]
    fn charts_are_written_for_the_data_there_is() {
        let mut ms = Vec::new();
        let mut s = Samples::default();
        for v in 1..=5000u64 {
            s.push(Duration::from_micros(20 + v % 97));
        }
        let l = s.summary().unwrap();
        for t in [Transport::Netchannel, Transport::Kernel] {
            let mut m = Measurement::new(Test::Latency, t, 0, 1.0);
            m.size = Some(4096);
            m.latency = Some(l.clone());
            ms.push(m);
            for c in [1, 8, 32] {
                let mut m = Measurement::new(Test::Rpc, t, 0, 1.0);
                (m.size, m.conns, m.requests_per_s) = (Some(64), Some(c), Some(1e4 * f64::from(c)));
                ms.push(m);
            }
        }
        let dir = std::env::temp_dir().join(format!("ncperf-plot-{}", std::process::id()));
        let written = write_all(&dir, &ms).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["latency_cdf.svg", "request_rate.svg"]);
        let svg = std::fs::read_to_string(dir.join("latency_cdf.svg")).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("netchannel: p50"), "no legend");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
