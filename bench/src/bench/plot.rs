//! `--latency-plot=FILE.svg`: the latency CDF of every transport (and of the raw-TCP
//! ping-pong) on one chart, as hand-written SVG: log-scale latency on x, fraction of I/Os
//! completed within that latency on y.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// One curve.
pub struct Series<'a> {
    pub label: String,
    pub hist: &'a Histogram<u64>,
    /// Index into the palette.
    pub color: usize,
    /// SVG stroke-dasharray, e.g. "6 4" (None: solid).
    pub dash: Option<&'static str>,
}

/// Dash pattern of the raw-TCP baseline curves.
pub const DASH_BASELINE: &str = "6 4";
/// Dash pattern of a second transport on a chart coloured by workload.
pub const DASH_ALT: &str = "2 3";

const W: f64 = 960.0;
const H: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 300.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A decade's label: 10^e nanoseconds.
fn decade_label(e: i32) -> String {
    match e {
        i32::MIN..=2 => format!("{}ns", 10u64.pow(e.max(0) as u32)),
        3..=5 => format!("{}µs", 10u64.pow((e - 3) as u32)),
        6..=8 => format!("{}ms", 10u64.pow((e - 6) as u32)),
        _ => format!("{}s", 10u64.pow((e - 9) as u32)),
    }
}

/// The SVG document. Empty histograms are listed in the legend as "(no data)".
pub fn svg(title: &str, series: &[Series<'_>]) -> String {
    let with_data: Vec<&Series<'_>> = series.iter().filter(|s| !s.hist.is_empty()).collect();
    let lo = with_data
        .iter()
        .map(|s| s.hist.min().max(1))
        .min()
        .unwrap_or(1000);
    let hi = with_data
        .iter()
        .map(|s| s.hist.max().max(1))
        .max()
        .unwrap_or(1_000_000);
    let e0 = (lo as f64).log10().floor() as i32;
    let mut e1 = (hi as f64).log10().ceil() as i32;
    if e1 <= e0 {
        e1 = e0 + 1;
    }
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |ns: f64| LEFT + ((ns.max(1.0)).log10() - e0 as f64) / (e1 - e0) as f64 * pw;
    let y = |f: f64| TOP + (1.0 - f) * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(o, r##"<rect width="{W}" height="{H}" fill="white"/>"##);
    let _ = writeln!(
        o,
        r##"<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"##,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid and ticks: decades with labels, 2x and 5x without.
    for e in e0..=e1 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e);
            if e == e1 && m > 1.0 {
                break;
            }
            let xv = x(v);
            let (stroke, w) = if m == 1.0 {
                ("#bbb", 1.0)
            } else {
                ("#e4e4e4", 0.8)
            };
            let _ = writeln!(
                o,
                r##"<line x1="{xv:.1}" y1="{TOP}" x2="{xv:.1}" y2="{:.1}" stroke="{stroke}" stroke-width="{w}"/>"##,
                TOP + ph
            );
            if m == 1.0 {
                let _ = writeln!(
                    o,
                    r##"<text x="{xv:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                    TOP + ph + 18.0,
                    decade_label(e)
                );
            }
        }
    }
    for i in 0..=10 {
        let f = i as f64 / 10.0;
        let yv = y(f);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{yv:.1}" x2="{:.1}" y2="{yv:.1}" stroke="{}" stroke-width="0.8"/>"##,
            LEFT + pw,
            if i % 5 == 0 { "#bbb" } else { "#e4e4e4" }
        );
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}%</text>"##,
            LEFT - 8.0,
            yv + 4.0,
            i * 10
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">latency, submission to completion (log scale)</text>"##,
        LEFT + pw / 2.0,
        H - 22.0
    );
    let _ = writeln!(
        o,
        r##"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle" font-size="13">I/Os completed within the latency (CDF)</text>"##,
        TOP + ph / 2.0
    );
    // Curves: a step line through every recorded bucket.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[s.color % COLORS.len()];
        let dash = s
            .dash
            .map(|d| format!(r##" stroke-dasharray="{d}""##))
            .unwrap_or_default();
        if !s.hist.is_empty() {
            let mut d = String::new();
            let total = s.hist.len() as f64;
            let mut cum = 0u64;
            let mut last_x = f64::NEG_INFINITY;
            let mut prev_y = y(0.0);
            let _ = write!(d, "M{:.1},{:.1}", x(s.hist.min() as f64), prev_y);
            for v in s.hist.iter_recorded() {
                cum += v.count_since_last_iteration();
                let xv = x(s.hist.highest_equivalent(v.value_iterated_to()) as f64);
                let yv = y(cum as f64 / total);
                if xv - last_x < 0.5 && cum < s.hist.len() {
                    // Same pixel column: the next point carries the rise.
                    continue;
                }
                let _ = write!(d, " L{xv:.1},{prev_y:.1} L{xv:.1},{yv:.1}");
                last_x = xv;
                prev_y = yv;
            }
            let _ = writeln!(
                o,
                r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"##
            );
        }
        // Legend.
        let ly = TOP + 10.0 + i as f64 * 22.0;
        let lx = LEFT + pw + 20.0;
        let _ = writeln!(
            o,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>"##,
            lx + 28.0
        );
        let label = if s.hist.is_empty() {
            format!("{} (no data)", s.label)
        } else {
            s.label.clone()
        };
        let _ = writeln!(
            o,
            r##"<text x="{}" y="{:.1}">{}</text>"##,
            lx + 36.0,
            ly + 4.0,
            esc(&label)
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_axes_labels_and_one_path_per_series() {
        let mut a = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        let mut b = a.clone();
        for v in [20_000u64, 25_000, 30_000, 90_000] {
            a.record(v).unwrap();
        }
        for v in [5_000u64, 6_000, 7_000] {
            b.record(v).unwrap();
        }
        let empty = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        let s = svg(
            "4k randread <qd32>",
            &[
                Series {
                    label: "tcp".into(),
                    hist: &a,
                    color: 0,
                    dash: None,
                },
                Series {
                    label: "raw-tcp & co".into(),
                    hist: &b,
                    color: 0,
                    dash: Some(DASH_BASELINE),
                },
                Series {
                    label: "rdma".into(),
                    hist: &empty,
                    color: 1,
                    dash: None,
                },
            ],
        );
        assert!(s.starts_with("<svg"));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<path").count(), 2);
        assert!(s.contains("4k randread &lt;qd32&gt;"));
        assert!(s.contains("raw-tcp &amp; co"));
        assert!(s.contains("rdma (no data)"));
        assert!(s.contains("log scale"));
        assert!(s.contains("1µs") && s.contains("100µs"));
        assert_eq!(s.matches(r#"stroke-dasharray="6 4""#).count(), 2);
        // Each curve ends at 100% (y = TOP).
        assert!(s.contains(&format!(",{TOP:.1}\"")));
    }
}
