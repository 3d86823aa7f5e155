//! The report of a run: every measurement, the configuration and the machine, written as
//! JSON by `--json` ([`SCHEMA`]), and the summary table printed at the end.

use serde::{Deserialize, Serialize};

use crate::stats::{median, min_max, Latency};

/// The schema name and version every report carries; a change that renames or removes a
/// field bumps the number.
pub const SCHEMA: &str = "ncperf-report/1";

/// Which stack carried a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// netchannel's `VirtualStream`s.
    Netchannel,
    /// Kernel TCP at its defaults, with no XDP program attached: the reference.
    Kernel,
    /// Kernel TCP while netchannel's XDP program is attached on both ends (it passes the
    /// kernel's flows, at a cost).
    KernelXdp,
}

impl Transport {
    /// How the table and the charts name it.
    pub fn label(self) -> &'static str {
        match self {
            Transport::Netchannel => "netchannel",
            Transport::Kernel => "kernel TCP",
            Transport::KernelXdp => "kernel TCP + XDP",
        }
    }
}

/// What a measurement measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Test {
    /// Bulk goodput of `streams` streams, client to server.
    Bulk,
    /// Closed-loop request rate: `conns` connections, one request of `size` bytes
    /// outstanding on each.
    Rpc,
    /// Request/response latency of one connection, one request of `size` bytes at a time.
    Latency,
    /// New connections per second: connect, one request, close (`conns` at a time).
    Connect,
    /// One latency-class connection's latency alone and beside `streams` bulk streams.
    Isolation,
    /// Bulk goodput of `streams` streams as netchannel's throughput channels per peer
    /// vary (`channels`).
    SweepChannels,
    /// Bulk goodput of `streams` streams as netchannel's copy workers vary
    /// (`copy_workers`).
    SweepCopyWorkers,
    /// Bulk goodput of `streams` streams over each link under netchannel's channels
    /// (`link`).
    SweepLinks,
}

impl Test {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            Test::Bulk => "bulk",
            Test::Rpc => "rpc",
            Test::Latency => "latency",
            Test::Connect => "connect",
            Test::Isolation => "isolation",
            Test::SweepChannels => "sweep_channels",
            Test::SweepCopyWorkers => "sweep_copy_workers",
            Test::SweepLinks => "sweep_links",
        }
    }
}

/// One measurement: one test, one transport, one setting, one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The test.
    pub test: Test,
    /// The stack that carried it.
    pub transport: Transport,
    /// The round (0-based); the suite runs every measurement once per round.
    pub round: u32,
    /// Bulk streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u32>,
    /// Connections (request rate, connect rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conns: Option<u32>,
    /// Request size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// netchannel's throughput channels per peer (sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
    /// netchannel's copy workers (sweeps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_workers: Option<u32>,
    /// The link under netchannel's channels (`xdp` or `packet`; the link sweep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// Wall time the measurement ran, seconds.
    pub seconds: f64,
    /// Bulk goodput, Gbit/s (bytes the server checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_gbps: Option<f64>,
    /// Completed and checked requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// Completed connections (connect, one checked request, close) per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_per_s: Option<f64>,
    /// Latency (alone, for isolation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// Isolation: the latency stream's latency beside the bulk streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_latency: Option<Latency>,
    /// Isolation: the bulk streams' goodput while the latency stream ran beside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_goodput_gbps: Option<f64>,
}

impl Measurement {
    /// A measurement of `test` on `transport` in `round` with no figure yet.
    pub fn new(test: Test, transport: Transport, round: u32, seconds: f64) -> Measurement {
        Measurement {
            test,
            transport,
            round,
            streams: None,
            conns: None,
            size: None,
            channels: None,
            copy_workers: None,
            link: None,
            seconds,
            goodput_gbps: None,
            requests_per_s: None,
            connections_per_s: None,
            latency: None,
            loaded_latency: None,
            loaded_goodput_gbps: None,
        }
    }
}

/// The machine a run took place on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Cores this process may run on.
    pub cores: u32,
    /// The CPU's model name.
    pub cpu: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The host's name.
    pub hostname: String,
    /// The interfaces the run used.
    pub interfaces: Vec<Interface>,
}

/// One network interface a run used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// What it was to the run (`client`, `server`, `test bed side A`, ...).
    pub role: String,
    /// Its name.
    pub name: String,
    /// The network namespace it lives in, if not the process's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// The driver (`ethtool -i`); empty if unknown.
    pub driver: String,
    /// Receive queues (combined or rx channels in use; the device's count otherwise).
    pub rx_queues: u32,
    /// Transmit queues.
    pub tx_queues: u32,
    /// The MTU.
    pub mtu: u32,
    /// Its IPv4 addresses.
    pub ipv4: Vec<String>,
}

/// The settings of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Seconds per measurement.
    pub duration_s: f64,
    /// Rounds of every measurement.
    pub rounds: u32,
    /// Request sizes of the request-rate test, bytes.
    pub sizes: Vec<u32>,
    /// Connection counts of the request-rate test.
    pub conns: Vec<u32>,
    /// Streams of the many-streams bulk test and of the sweeps.
    pub bulk_streams: u32,
    /// Request size of the latency and isolation tests, bytes.
    pub latency_size: u32,
    /// Connections opened at a time by the connect test.
    pub connect_concurrency: u32,
    /// Bulk streams beside the latency stream in the isolation test.
    pub isolation_streams: u32,
    /// Tokio worker threads of each side's application runtime.
    pub workers: u32,
    /// The netchannel stacks' settings (as asked; `null`: the stack's default).
    pub stack: StackConfig,
}

/// netchannel stack settings as the command line gave them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StackConfig {
    /// Interface queues with AF_XDP sockets (`null`: all).
    pub queues: Option<u32>,
    /// Throughput channels per peer (`null`: chosen from the host).
    pub channels: Option<u32>,
    /// Latency channels per peer.
    pub latency_channels: Option<u32>,
    /// Copy workers.
    pub copy_workers: Option<u32>,
    /// The scheduler.
    pub scheduler: String,
    /// Whether AF_XDP sockets bind in zero-copy mode.
    pub zero_copy: bool,
    /// The link under the channels (`xdp` or `packet`; `null` in reports from before the
    /// choice was recorded).
    #[serde(default)]
    pub link: Option<String>,
    /// Busy-poll cores (empty: no busy polling).
    pub busy_poll_cores: Vec<u32>,
    /// Busy-poll spin time, µs.
    pub busy_poll_us: u64,
}

/// One line of the summary table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// What the line measures, with its unit.
    pub what: String,
    /// Whether a higher figure is the better one.
    pub higher_is_better: bool,
    /// netchannel's figure (median over rounds).
    pub netchannel: Option<f64>,
    /// Kernel TCP at its defaults, nothing attached (median over rounds).
    pub kernel: Option<f64>,
    /// netchannel / kernel, the median of the per-round ratios.
    pub ratio: Option<f64>,
    /// The smallest and largest per-round ratio.
    pub ratio_range: Option<[f64; 2]>,
    /// Kernel TCP with netchannel's XDP program attached (median over rounds).
    pub kernel_xdp: Option<f64>,
}

/// Everything a run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: String,
    /// ncperf's version.
    pub version: String,
    /// `demo` or `client`.
    pub command: String,
    /// Where it ran: `af_xdp_test_bed`, `in_memory` or `hosts`.
    pub environment: String,
    /// Start, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// The settings.
    pub config: RunConfig,
    /// The machine.
    pub machine: Machine,
    /// Every measurement, in the order taken.
    pub measurements: Vec<Measurement>,
    /// The summary table.
    pub summary: Vec<SummaryRow>,
}

/// Picks a summary line's figure out of a measurement (`None`: not this line's).
type Pick = Box<dyn Fn(&Measurement) -> Option<f64>>;

/// How one summary line picks its figure out of the measurements.
struct Line {
    what: String,
    higher_is_better: bool,
    pick: Pick,
}

fn line(
    what: impl Into<String>,
    higher_is_better: bool,
    pick: impl Fn(&Measurement) -> Option<f64> + 'static,
) -> Line {
    Line {
        what: what.into(),
        higher_is_better,
        pick: Box::new(pick),
    }
}

/// A size in bytes as the table says it: `64 B`, `4 KB` (4096), `16 KB`.
pub fn size_label(size: u32) -> String {
    if size >= 1024 && size % 1024 == 0 {
        format!("{} KB", size / 1024)
    } else {
        format!("{size} B")
    }
}

/// The summary lines of a run's measurements: each test and setting present, netchannel
/// and kernel TCP side by side (medians over rounds), their ratio (median of the ratios
/// of the same round), and kernel TCP with XDP attached.
pub fn summarize(ms: &[Measurement]) -> Vec<SummaryRow> {
    let mut lines: Vec<Line> = Vec::new();
    let seen = |t: Test| ms.iter().filter(move |m| m.test == t);
    let mut bulk: Vec<u32> = seen(Test::Bulk).filter_map(|m| m.streams).collect();
    bulk.sort_unstable();
    bulk.dedup();
    for s in bulk {
        let what = format!(
            "bulk goodput, {s} stream{} (Gbit/s)",
            if s == 1 { "" } else { "s" }
        );
        lines.push(line(what, true, move |m| {
            (m.test == Test::Bulk && m.streams == Some(s))
                .then_some(m.goodput_gbps)
                .flatten()
        }));
    }
    let mut rpc: Vec<(u32, u32)> = seen(Test::Rpc)
        .filter_map(|m| Some((m.size?, m.conns?)))
        .collect();
    rpc.sort_unstable();
    rpc.dedup();
    for (size, conns) in rpc {
        let what = format!(
            "requests/s, {} × {conns} conn{}",
            size_label(size),
            if conns == 1 { "" } else { "s" }
        );
        lines.push(line(what, true, move |m| {
            (m.test == Test::Rpc && m.size == Some(size) && m.conns == Some(conns))
                .then_some(m.requests_per_s)
                .flatten()
        }));
    }
    let mut lat: Vec<u32> = seen(Test::Latency).filter_map(|m| m.size).collect();
    lat.sort_unstable();
    lat.dedup();
    for size in lat {
        for (name, q) in [("p50", 0), ("p99", 1), ("p99.9", 2)] {
            let what = format!("{} latency {name} (µs)", size_label(size));
            lines.push(line(what, false, move |m| {
                let l = (m.test == Test::Latency && m.size == Some(size))
                    .then_some(m.latency.as_ref())
                    .flatten()?;
                Some([l.p50_us, l.p99_us, l.p999_us][q])
            }));
        }
    }
    let mut conn: Vec<u32> = seen(Test::Connect).filter_map(|m| m.conns).collect();
    conn.sort_unstable();
    conn.dedup();
    for c in conn {
        let what = format!("new connections/s ({c} at a time)");
        lines.push(line(what, true, move |m| {
            (m.test == Test::Connect && m.conns == Some(c))
                .then_some(m.connections_per_s)
                .flatten()
        }));
    }
    let mut iso: Vec<u32> = seen(Test::Isolation).filter_map(|m| m.streams).collect();
    iso.sort_unstable();
    iso.dedup();
    for s in iso {
        lines.push(line("isolation: p99.9 alone (µs)", false, move |m| {
            (m.test == Test::Isolation && m.streams == Some(s))
                .then_some(m.latency.as_ref())
                .flatten()
                .map(|l| l.p999_us)
        }));
        lines.push(line(
            format!("isolation: p99.9 beside {s} bulk (µs)"),
            false,
            move |m| {
                (m.test == Test::Isolation && m.streams == Some(s))
                    .then_some(m.loaded_latency.as_ref())
                    .flatten()
                    .map(|l| l.p999_us)
            },
        ));
        lines.push(line("isolation: p99.9 loaded / alone", false, move |m| {
            if m.test != Test::Isolation || m.streams != Some(s) {
                return None;
            }
            Some(m.loaded_latency.as_ref()?.p999_us / m.latency.as_ref()?.p999_us)
        }));
    }
    lines
        .into_iter()
        .map(|l| {
            let figures = |t: Transport| -> Vec<(u32, f64)> {
                ms.iter()
                    .filter(|m| m.transport == t)
                    .filter_map(|m| Some((m.round, (l.pick)(m)?)))
                    .collect()
            };
            let (nc, k, kx) = (
                figures(Transport::Netchannel),
                figures(Transport::Kernel),
                figures(Transport::KernelXdp),
            );
            let values = |v: &[(u32, f64)]| v.iter().map(|p| p.1).collect::<Vec<_>>();
            // Ratios of the same round only: a host's load moves both alike.
            let ratios: Vec<f64> = nc
                .iter()
                .filter_map(|&(r, x)| {
                    let (_, y) = k.iter().find(|p| p.0 == r)?;
                    (*y > 0.0).then(|| x / y)
                })
                .collect();
            SummaryRow {
                what: l.what,
                higher_is_better: l.higher_is_better,
                netchannel: median(&values(&nc)),
                kernel: median(&values(&k)),
                ratio: median(&ratios),
                ratio_range: min_max(&ratios).map(|(a, b)| [a, b]),
                kernel_xdp: median(&values(&kx)),
            }
        })
        .collect()
}

/// A figure with three significant digits or so: `12.3`, `0.432`, `123456`.
pub fn fmt_figure(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The summary table as text, one line per row, under a header; ratios read
/// "netchannel / kernel" with whether that is ahead or behind.
pub fn table(rows: &[SummaryRow], with_xdp: bool) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), fmt_figure);
    let width = rows
        .iter()
        .map(|r| r.what.chars().count())
        .max()
        .unwrap_or(10)
        .max(11);
    let mut out = String::new();
    let pad = |s: &str, w: usize| format!("{s}{}", " ".repeat(w.saturating_sub(s.chars().count())));
    out.push_str(&format!(
        "{}  {:>11}  {:>11}  {:>7}  {:<14}{}\n",
        pad("measurement", width),
        "netchannel",
        "kernel TCP",
        "ratio",
        "",
        if with_xdp { "  kernel+XDP" } else { "" }
    ));
    for r in rows {
        let verdict = match r.ratio {
            Some(x) if (x - 1.0).abs() < 0.03 => "even",
            Some(x) if (x > 1.0) == r.higher_is_better => "ahead",
            Some(_) => "behind",
            None => "",
        };
        let spread = match r.ratio_range {
            Some([lo, hi]) if hi > lo => format!(" {lo:.2}-{hi:.2}"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "{}  {:>11}  {:>11}  {:>7}  {:<14}{}\n",
            pad(&r.what, width),
            opt(r.netchannel),
            opt(r.kernel),
            r.ratio
                .map_or_else(|| "-".to_string(), |x| format!("{x:.2}×")),
            format!("{verdict}{spread}"),
            if with_xdp {
                format!("  {:>10}", opt(r.kernel_xdp))
            } else {
                String::new()
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Samples;
    use std::time::Duration;

    fn latency(us: &[u64]) -> Latency {
        let mut s = Samples::default();
        for &v in us {
            s.push(Duration::from_micros(v));
        }
        s.summary().unwrap()
    }

    fn sample_report() -> Report {
        let mut ms = Vec::new();
        for round in 0..2 {
            for (t, rate) in [(Transport::Netchannel, 120.0), (Transport::Kernel, 100.0)] {
                let mut m = Measurement::new(Test::Rpc, t, round, 1.0);
                m.size = Some(64);
                m.conns = Some(8);
                m.requests_per_s = Some(rate * (1.0 + f64::from(round)));
                ms.push(m);
                let mut b = Measurement::new(Test::Bulk, t, round, 1.0);
                b.streams = Some(1);
                b.goodput_gbps = Some(if t == Transport::Netchannel {
                    5.0
                } else {
                    10.0
                });
                ms.push(b);
                let mut l = Measurement::new(Test::Latency, t, round, 1.0);
                l.size = Some(4096);
                l.latency = Some(latency(&[10, 20, 30]));
                ms.push(l);
            }
        }
        let mut x = Measurement::new(Test::Bulk, Transport::KernelXdp, 0, 1.0);
        x.streams = Some(1);
        x.goodput_gbps = Some(4.0);
        ms.push(x);
        let summary = summarize(&ms);
        Report {
            schema: SCHEMA.to_string(),
            version: "0.1.0".into(),
            command: "demo".into(),
            environment: "af_xdp_test_bed".into(),
            started_unix_s: 1,
            wall_s: 2.0,
            config: RunConfig::default(),
            machine: Machine {
                cores: 2,
                interfaces: vec![Interface {
                    role: "server".into(),
                    name: "vB".into(),
                    driver: "veth".into(),
                    rx_queues: 2,
                    tx_queues: 2,
                    mtu: 1500,
                    ..Interface::default()
                }],
                ..Machine::default()
            },
            measurements: ms,
            summary,
        }
    }

    #[test]
    fn summary_takes_medians_and_same_round_ratios() {
        let r = sample_report();
        let rpc = r
            .summary
            .iter()
            .find(|l| l.what.starts_with("requests/s"))
            .unwrap();
        assert_eq!(rpc.what, "requests/s, 64 B × 8 conns");
        // Rounds: netchannel 120, 240; kernel 100, 200: medians 180 and 150, ratio 1.2.
        assert_eq!(rpc.netchannel, Some(180.0));
        assert_eq!(rpc.kernel, Some(150.0));
        assert!((rpc.ratio.unwrap() - 1.2).abs() < 1e-12);
        assert!(rpc.higher_is_better);
        let bulk = r
            .summary
            .iter()
            .find(|l| l.what.starts_with("bulk"))
            .unwrap();
        assert_eq!(bulk.what, "bulk goodput, 1 stream (Gbit/s)");
        assert_eq!((bulk.ratio, bulk.kernel_xdp), (Some(0.5), Some(4.0)));
        let p99 = r
            .summary
            .iter()
            .find(|l| l.what == "4 KB latency p99 (µs)")
            .unwrap();
        assert!(!p99.higher_is_better);
        assert_eq!(p99.netchannel, Some(30.0));
        let text = table(&r.summary, true);
        assert!(text.contains("behind"), "{text}");
        assert!(text.contains("ahead"), "{text}");
        assert!(text.lines().next().unwrap().contains("kernel+XDP"));
    }

    #[test]
    fn json_schema_names_every_field_and_round_trips() {
        let r = sample_report();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["schema"], SCHEMA);
        for key in [
            "version",
            "command",
            "environment",
            "started_unix_s",
            "wall_s",
            "config",
            "machine",
            "measurements",
            "summary",
        ] {
            assert!(v.get(key).is_some(), "no {key}");
        }
        for key in ["cores", "cpu", "kernel", "hostname", "interfaces"] {
            assert!(v["machine"].get(key).is_some(), "no machine.{key}");
        }
        let iface = &v["machine"]["interfaces"][0];
        for key in ["name", "driver", "rx_queues", "tx_queues", "mtu", "ipv4"] {
            assert!(iface.get(key).is_some(), "no interface.{key}");
        }
        for key in ["duration_s", "rounds", "sizes", "conns", "workers", "stack"] {
            assert!(v["config"].get(key).is_some(), "no config.{key}");
        }
        let m = &v["measurements"][0];
        assert_eq!(m["test"], "rpc");
        assert_eq!(m["transport"], "netchannel");
        assert_eq!(m["requests_per_s"], 120.0);
        // Figures a measurement lacks are left out, not null.
        assert!(m.get("goodput_gbps").is_none());
        let l = v["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["test"] == "latency")
            .unwrap();
        for key in [
            "samples", "p50_us", "p99_us", "p999_us", "mean_us", "max_us", "cdf",
        ] {
            assert!(l["latency"].get(key).is_some(), "no latency.{key}");
        }
        assert!(v["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["transport"] == "kernel_xdp"));
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size_label(64), "64 B");
        assert_eq!(size_label(4096), "4 KB");
        assert_eq!(size_label(1000), "1000 B");
        assert_eq!(fmt_figure(123456.7), "123457");
        assert_eq!(fmt_figure(12.345), "12.35");
        assert_eq!(fmt_figure(0.4321), "0.432");
    }
}
