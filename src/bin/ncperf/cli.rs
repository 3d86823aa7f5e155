//! The command line.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::report::{RunConfig, StackConfig, Test};

/// The server's main port unless told otherwise; the latency application's is the next.
pub const DEFAULT_PORT: u16 = crate::proto::DEFAULT_PORT;

/// ncperf: netchannel against kernel TCP, on one machine's test bed or between two hosts.
///
/// `ncperf demo` runs the whole suite on a two-namespace test bed (root) and prints one
/// table; `ncperf server` and `ncperf client` run the same tests between two hosts.
#[derive(Debug, Parser)]
#[command(name = "ncperf", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// ncperf's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole suite on a two-namespace test bed (AF_XDP over a veth pair; needs root),
    /// netchannel against kernel TCP at its defaults, one summary table. Without the
    /// privileges it runs in-memory stacks against kernel TCP over loopback and says so.
    Demo(DemoArgs),
    /// Serves ncperf clients: port P (bulk, request rate, latency, connect) and P+1 (a
    /// latency application on a runtime of its own, for isolation).
    Server(ServerArgs),
    /// Runs tests against an `ncperf server` on another host.
    Client(ClientArgs),
    /// Draws the charts of a report written with `--json` again.
    Plot(PlotArgs),
}

/// `ncperf plot`.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// The report (`--json`'s file).
    pub report: PathBuf,
    /// Where to write the SVG charts.
    pub dir: PathBuf,
}

/// The stack a side runs and its settings.
#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    /// Use kernel TCP (tokio's TcpStream) instead of netchannel.
    #[arg(long)]
    pub kernel: bool,
    /// The interface whose queues get AF_XDP sockets.
    #[arg(long, short = 'i', value_name = "IFACE")]
    pub interface: Option<String>,
    /// This host's IPv4 address on that interface.
    #[arg(long, short = 'a', value_name = "IPV4")]
    pub address: Option<Ipv4Addr>,
    /// Interface queues to open AF_XDP sockets on, from queue 0 (default: all).
    #[arg(long, value_name = "N")]
    pub queues: Option<u32>,
    /// Throughput channels per peer (default: chosen from the host's cores).
    #[arg(long, value_name = "N")]
    pub channels: Option<u32>,
    /// Latency channels per peer (default 1).
    #[arg(long, value_name = "N")]
    pub latency_channels: Option<u32>,
    /// Copy workers (default 0: the application's threads copy).
    #[arg(long, value_name = "N")]
    pub copy_workers: Option<u32>,
    /// The scheduling policy.
    #[arg(long, value_enum, default_value_t = Scheduler::RoundRobin)]
    pub scheduler: Scheduler,
    /// Bind the AF_XDP sockets in zero-copy mode (NICs whose driver supports it; veth
    /// does not).
    #[arg(long)]
    pub zero_copy: bool,
    /// The link under the channels (default: `NETCHANNEL_LINK`, else xdp). Pick packet
    /// where AF_XDP can only copy (veth, containers, drivers without zero-copy AF_XDP).
    #[arg(long, value_enum, value_name = "LINK")]
    pub link: Option<Link>,
    /// Busy polling: the cores the stack's queue runtimes are pinned to and spin on
    /// (comma-separated core ids).
    #[arg(long, value_name = "CORES", value_delimiter = ',')]
    pub busy_poll: Vec<u32>,
    /// Busy polling: how long an idle queue runtime spins before it sleeps, µs.
    #[arg(long, value_name = "US", default_value_t = 50)]
    pub busy_poll_us: u64,
}

impl StackArgs {
    /// The link the stacks run over: `--link`, else the stack builder's environment
    /// (`NETCHANNEL_LINK`, which the builder reads and reports if it does not parse), else
    /// AF_XDP.
    pub fn effective_link(&self) -> Link {
        self.link.unwrap_or_else(|| {
            match std::env::var("NETCHANNEL_LINK")
                .ok()
                .and_then(|v| v.parse::<netchannel::netdriver::channel::LinkKind>().ok())
            {
                Some(netchannel::netdriver::channel::LinkKind::Packet) => Link::Packet,
                _ => Link::Xdp,
            }
        })
    }

    /// The settings as the report records them.
    pub fn config(&self) -> StackConfig {
        StackConfig {
            queues: self.queues,
            channels: self.channels,
            latency_channels: self.latency_channels,
            copy_workers: self.copy_workers,
            scheduler: self.scheduler.name().to_string(),
            zero_copy: self.zero_copy,
            link: Some(self.effective_link().name().to_string()),
            busy_poll_cores: self.busy_poll.clone(),
            busy_poll_us: if self.busy_poll.is_empty() {
                0
            } else {
                self.busy_poll_us
            },
        }
    }
}

/// The links netchannel's channels run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Link {
    /// AF_XDP sockets fed by an XDP program (the default): frames without a copy on NICs
    /// whose driver has zero-copy AF_XDP.
    #[value(alias = "af_xdp")]
    Xdp,
    /// AF_PACKET sockets with segmentation and checksum offload (64 KiB segments each way):
    /// for hosts where AF_XDP must copy.
    #[value(alias = "af_packet")]
    Packet,
}

impl Link {
    /// The command line's name.
    pub fn name(self) -> &'static str {
        match self {
            Link::Xdp => "xdp",
            Link::Packet => "packet",
        }
    }

    /// How people call it.
    pub fn title(self) -> &'static str {
        match self {
            Link::Xdp => "AF_XDP",
            Link::Packet => "AF_PACKET",
        }
    }

    /// The channel sets' name for it.
    pub fn kind(self) -> netchannel::netdriver::channel::LinkKind {
        match self {
            Link::Xdp => netchannel::netdriver::channel::LinkKind::Xdp,
            Link::Packet => netchannel::netdriver::channel::LinkKind::Packet,
        }
    }
}

/// netchannel's scheduling policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scheduler {
    /// Round robin per chunk over the throughput channels (the default).
    RoundRobin,
    /// Each socket pinned to one channel by its source port.
    SourcePort,
    /// Latency channels on threads and cores of their own.
    Isolating,
}

impl Scheduler {
    /// The command line's name.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::RoundRobin => "round-robin",
            Scheduler::SourcePort => "source-port",
            Scheduler::Isolating => "isolating",
        }
    }
}

/// How long and how much the tests run.
#[derive(Debug, Clone, Args)]
pub struct SuiteArgs {
    /// Seconds per measurement.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Rounds: every measurement is taken this many times, interleaved, and the table
    /// gives medians and the ratios of the same round.
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Request sizes of the request-rate test, bytes.
    #[arg(long, value_name = "BYTES", value_delimiter = ',')]
    pub sizes: Option<Vec<u32>>,
    /// Connection counts of the request-rate test.
    #[arg(long, value_name = "N", value_delimiter = ',')]
    pub conns: Option<Vec<u32>>,
    /// Streams of the many-streams bulk test.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub streams: u32,
    /// Request size of the latency and isolation tests, bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 4096)]
    pub latency_size: u32,
    /// Connections the connect test opens at a time.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub connect_concurrency: u32,
    /// Bulk streams beside the latency stream in the isolation test.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub isolation_streams: u32,
    /// Worker threads of each side's application runtime (default: the cores, as
    /// tokio's own default).
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// Write every figure, the configuration and the machine to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write SVG charts into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
}

/// `ncperf demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// A short run (a quarter of a second per measurement, one round, fewer settings),
    /// for trying the tool out and for tests.
    #[arg(long)]
    pub quick: bool,
    /// Use in-memory stacks even where the test bed could be built.
    #[arg(long)]
    pub in_memory: bool,
    /// Throughput channels per peer of the channel sweep (default 1,2,4).
    #[arg(long, value_name = "N", value_delimiter = ',')]
    pub sweep_channels: Option<Vec<u32>>,
    /// Copy workers of the copy-worker sweep (default 0,1,2).
    #[arg(long, value_name = "N", value_delimiter = ',')]
    pub sweep_copy_workers: Option<Vec<u32>>,
    /// Links of the link sweep, on the test bed (default xdp,packet).
    #[arg(long, value_enum, value_name = "LINK", value_delimiter = ',')]
    pub sweep_links: Option<Vec<Link>>,
    /// Skip the sweeps.
    #[arg(long)]
    pub no_sweeps: bool,
    /// Queues of the test bed's veth pair.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub bed_queues: u32,
    /// MTU of the test bed's veth pair.
    #[arg(long, value_name = "BYTES", default_value_t = 1500)]
    pub bed_mtu: u32,
    /// The netchannel stacks' settings (interface and address come from the bed).
    #[command(flatten)]
    pub stack: StackArgs,
    /// The tests' settings.
    #[command(flatten)]
    pub suite: SuiteArgs,
}

/// `ncperf server`.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The main port; the latency application listens on the next one.
    #[arg(long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Worker threads of the application runtime (default: the cores).
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long, value_name = "SECS")]
    pub for_secs: Option<f64>,
    /// The stack and its settings.
    #[command(flatten)]
    pub stack: StackArgs,
}

/// `ncperf client`.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The server: IPV4 or IPV4:PORT (default port 7700).
    #[arg(long, value_name = "ADDR", value_parser = parse_peer)]
    pub peer: SocketAddr,
    /// The tests to run (comma-separated).
    #[arg(long, short = 't', value_enum, value_delimiter = ',', required = true)]
    pub test: Vec<TestName>,
    /// The stack and its settings.
    #[command(flatten)]
    pub stack: StackArgs,
    /// The tests' settings.
    #[command(flatten)]
    pub suite: SuiteArgs,
}

/// The tests a client can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TestName {
    /// Bulk goodput, 1 stream and `--streams` streams.
    Bulk,
    /// Closed-loop request rate over `--conns` connections, each of `--sizes`.
    Rpc,
    /// `--latency-size` request/response latency percentiles.
    Latency,
    /// New connections per second (connect, one request, close).
    Connect,
    /// A latency-class stream's latency alone and beside `--isolation-streams` bulk streams.
    Isolation,
}

impl TestName {
    /// The report's test.
    pub fn test(self) -> Test {
        match self {
            TestName::Bulk => Test::Bulk,
            TestName::Rpc => Test::Rpc,
            TestName::Latency => Test::Latency,
            TestName::Connect => Test::Connect,
            TestName::Isolation => Test::Isolation,
        }
    }
}

/// `IPV4` or `IPV4:PORT`.
pub fn parse_peer(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return match a {
            SocketAddr::V4(_) => Ok(a),
            SocketAddr::V6(_) => Err("netchannel speaks IPv4 only".into()),
        };
    }
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Ok(SocketAddr::new(ip.into(), DEFAULT_PORT)),
        Ok(IpAddr::V6(_)) => Err("netchannel speaks IPv4 only".into()),
        Err(_) => Err(format!("{s:?} is not IPV4 or IPV4:PORT")),
    }
}

/// What a run does, with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Time per measurement.
    pub duration: Duration,
    /// Rounds.
    pub rounds: u32,
    /// Request-rate sizes.
    pub sizes: Vec<u32>,
    /// Request-rate connection counts.
    pub conns: Vec<u32>,
    /// Streams of the many-streams bulk test.
    pub streams: u32,
    /// Latency test request size.
    pub latency_size: u32,
    /// Connect test concurrency.
    pub connect_concurrency: u32,
    /// Isolation test bulk streams.
    pub isolation_streams: u32,
    /// Application runtime workers per side.
    pub workers: u32,
}

impl Plan {
    /// The plan of `args`, with the defaults of a full run or, when `quick`, of a short
    /// one; `workers` and `rounds` when not given.
    pub fn new(args: &SuiteArgs, quick: bool, workers: u32, rounds: u32) -> Result<Plan, String> {
        let duration = args.duration.unwrap_or(if quick { 0.25 } else { 2.0 });
        if !(duration.is_finite() && duration > 0.0 && duration <= 3600.0) {
            return Err(format!(
                "--duration {duration}: give seconds between 0 and 3600"
            ));
        }
        let conns = args.conns.clone().unwrap_or_else(|| {
            if quick {
                vec![1, 8]
            } else {
                vec![1, 8, 32, 128]
            }
        });
        let sizes = args.sizes.clone().unwrap_or_else(|| vec![64, 4096]);
        if conns.is_empty() || conns.contains(&0) || conns.iter().any(|&c| c > 10_000) {
            return Err("--conns: give counts between 1 and 10000".into());
        }
        if sizes.is_empty() || sizes.contains(&0) || sizes.iter().any(|&s| s > 1 << 20) {
            return Err("--sizes: give sizes between 1 byte and 1 MiB".into());
        }
        if !(1..=1 << 20).contains(&args.latency_size) {
            return Err("--latency-size: give a size between 1 byte and 1 MiB".into());
        }
        for (name, v) in [
            ("--streams", args.streams),
            ("--connect-concurrency", args.connect_concurrency),
            ("--isolation-streams", args.isolation_streams),
        ] {
            if !(1..=1024).contains(&v) {
                return Err(format!("{name} {v}: give a count between 1 and 1024"));
            }
        }
        Ok(Plan {
            duration: Duration::from_secs_f64(duration),
            rounds: args.rounds.unwrap_or(if quick { 1 } else { rounds }).max(1),
            sizes,
            conns,
            streams: args.streams,
            latency_size: args.latency_size,
            connect_concurrency: args.connect_concurrency,
            isolation_streams: args.isolation_streams,
            workers: args.workers.unwrap_or(workers).max(1),
        })
    }

    /// The plan as the report records it.
    pub fn config(&self, stack: StackConfig) -> RunConfig {
        RunConfig {
            duration_s: self.duration.as_secs_f64(),
            rounds: self.rounds,
            sizes: self.sizes.clone(),
            conns: self.conns.clone(),
            bulk_streams: self.streams,
            latency_size: self.latency_size,
            connect_concurrency: self.connect_concurrency,
            isolation_streams: self.isolation_streams,
            workers: self.workers,
            stack,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ncperf").chain(args.iter().copied()))
    }

    #[test]
    fn demo_defaults_and_quick() {
        let Command::Demo(d) = parse(&["demo"]).unwrap().command else {
            panic!("not demo")
        };
        assert!(!d.quick && !d.in_memory && !d.stack.kernel);
        assert_eq!((d.bed_queues, d.bed_mtu), (2, 1500));
        let p = Plan::new(&d.suite, d.quick, 1, 2).unwrap();
        assert_eq!(p.duration, Duration::from_secs(2));
        assert_eq!(p.rounds, 2, "the default given");
        assert_eq!(p.conns, vec![1, 8, 32, 128]);
        assert_eq!(p.sizes, vec![64, 4096]);
        assert_eq!((p.streams, p.latency_size, p.workers), (8, 4096, 1));

        let Command::Demo(q) = parse(&["demo", "--quick", "--duration", "0.1", "--json", "r.json"])
            .unwrap()
            .command
        else {
            panic!("not demo")
        };
        let p = Plan::new(&q.suite, q.quick, 1, 2).unwrap();
        assert_eq!(p.duration, Duration::from_millis(100));
        assert_eq!((p.rounds, p.conns.clone()), (1, vec![1, 8]));
        assert_eq!(q.suite.json, Some(PathBuf::from("r.json")));
    }

    #[test]
    fn client_takes_a_peer_tests_and_the_stack_knobs() {
        let Command::Client(c) = parse(&[
            "client",
            "--peer",
            "10.0.0.2",
            "--test",
            "rpc,latency",
            "-i",
            "eth1",
            "-a",
            "10.0.0.1",
            "--channels",
            "4",
            "--copy-workers",
            "2",
            "--queues",
            "8",
            "--scheduler",
            "isolating",
            "--zero-copy",
            "--busy-poll",
            "2,3",
            "--conns",
            "1,16",
        ])
        .unwrap()
        .command
        else {
            panic!("not client")
        };
        assert_eq!(c.peer, "10.0.0.2:7700".parse().unwrap());
        assert_eq!(c.test, vec![TestName::Rpc, TestName::Latency]);
        assert_eq!(c.stack.interface.as_deref(), Some("eth1"));
        assert_eq!(c.stack.address, Some(Ipv4Addr::new(10, 0, 0, 1)));
        let cfg = c.stack.config();
        assert_eq!(
            (cfg.channels, cfg.copy_workers, cfg.queues),
            (Some(4), Some(2), Some(8))
        );
        assert_eq!(cfg.scheduler, "isolating");
        assert!(cfg.zero_copy);
        assert_eq!((cfg.busy_poll_cores, cfg.busy_poll_us), (vec![2, 3], 50));
        assert_eq!(c.suite.conns, Some(vec![1, 16]));
    }

    #[test]
    fn the_link_is_chosen_by_flag_and_recorded() {
        let Command::Client(c) = parse(&[
            "client", "--peer", "10.0.0.2", "--test", "bulk", "--link", "packet",
        ])
        .unwrap()
        .command
        else {
            panic!("not client")
        };
        assert_eq!(c.stack.link, Some(Link::Packet));
        assert_eq!(c.stack.effective_link(), Link::Packet);
        assert_eq!(c.stack.config().link.as_deref(), Some("packet"));
        assert_eq!(
            Link::Packet.kind(),
            netchannel::netdriver::channel::LinkKind::Packet
        );
        let Command::Server(s) = parse(&["server", "--link", "af_xdp"]).unwrap().command else {
            panic!("not server")
        };
        assert_eq!(s.stack.link, Some(Link::Xdp));
        let e = parse(&["server", "--link", "dpdk"]).unwrap_err();
        assert!(e.to_string().contains("--link"), "{e}");
        let Command::Demo(d) = parse(&["demo", "--sweep-links", "packet"]).unwrap().command else {
            panic!("not demo")
        };
        assert_eq!(d.sweep_links, Some(vec![Link::Packet]));
    }

    #[test]
    fn refusals_name_the_flag() {
        // No test.
        assert!(parse(&["client", "--peer", "10.0.0.2"]).is_err());
        // An unknown test, a v6 peer, a bad address.
        assert!(parse(&["client", "--peer", "10.0.0.2", "--test", "fast"]).is_err());
        let e = parse(&["client", "--peer", "::1", "--test", "rpc"]).unwrap_err();
        assert!(e.to_string().contains("IPv4"), "{e}");
        assert!(parse(&["server", "-a", "10.0.0.300"]).is_err());
        let Command::Demo(d) = parse(&["demo", "--duration=-1"]).unwrap().command else {
            panic!("not demo")
        };
        assert!(Plan::new(&d.suite, false, 1, 2)
            .unwrap_err()
            .contains("--duration"));
        let Command::Demo(d) = parse(&["demo", "--conns", "0,8"]).unwrap().command else {
            panic!("not demo")
        };
        assert!(Plan::new(&d.suite, false, 1, 2)
            .unwrap_err()
            .contains("--conns"));
    }

    #[test]
    fn peers_with_and_without_a_port() {
        assert_eq!(
            parse_peer("10.1.2.3:9").unwrap(),
            "10.1.2.3:9".parse().unwrap()
        );
        assert_eq!(
            parse_peer("10.1.2.3").unwrap(),
            SocketAddr::from(([10, 1, 2, 3], DEFAULT_PORT))
        );
        assert!(parse_peer("host").is_err());
    }

    #[test]
    fn server_defaults() {
        let Command::Server(s) = parse(&["server", "--kernel"]).unwrap().command else {
            panic!("not server")
        };
        assert_eq!(s.port, DEFAULT_PORT);
        assert!(s.stack.kernel);
        assert_eq!(s.stack.scheduler, Scheduler::RoundRobin);
    }
}
