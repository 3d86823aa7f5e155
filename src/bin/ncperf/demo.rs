//! `ncperf demo`: the whole suite on one machine, netchannel against kernel TCP at its
//! defaults, in one run.
//!
//! On the test bed (root): two network namespaces joined by a veth pair, the client's
//! side in one and the server's in the other, each side a runtime whose threads live in
//! its namespace. Every round takes each test in turn, twice: over kernel TCP with
//! nothing attached (no netchannel stack runs, and the demo checks that no XDP program
//! is attached), and with a netchannel stack on each end at its defaults (or the flags'
//! settings; the isolation test with the `Isolating` scheduler), over netchannel and over
//! kernel TCP while netchannel's XDP program sits on both ends (the secondary column).
//! The order alternates from round to round. After the rounds, the sweeps over channels
//! and copy workers.
//!
//! Without the privileges for the bed, netchannel runs on in-memory stacks (no TCP, no
//! AF_XDP) against kernel TCP over loopback, and the first line says so.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use netchannel::vns::stack::MemNetwork;
use netchannel::Stack;
use testbed::{Side, TestBed};

use crate::cli::{DemoArgs, Link, Plan, Scheduler, StackArgs, TestName, DEFAULT_PORT};
use crate::host::{Host, Serving};
use crate::machine;
use crate::net::Net;
use crate::progress::Progress;
use crate::report::{self, Measurement, Report, Test, Transport, SCHEMA};
use crate::runner::{run_test, steps, warm_up};
use crate::setup::{self, fail, Fail};
use crate::suite::{self, Target};

/// The in-memory stacks' addresses.
const MEM_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const MEM_SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The port of the kernel server that runs beside the netchannel one (kernel TCP with
/// XDP attached).
const XDP_KERNEL_PORT: u16 = DEFAULT_PORT + 2;

const ALL: [TestName; 5] = [
    TestName::Bulk,
    TestName::Rpc,
    TestName::Latency,
    TestName::Connect,
    TestName::Isolation,
];

/// Where the two sides live.
enum Place {
    /// The two-namespace AF_XDP test bed.
    Bed(Box<TestBed>),
    /// In-memory stacks in this process's namespace; why.
    Memory(String),
}

/// The two sides.
struct Sides {
    client: Host,
    server: Host,
    place: Place,
}

impl Sides {
    fn bed(&self) -> Option<&TestBed> {
        match &self.place {
            Place::Bed(b) => Some(b.as_ref()),
            Place::Memory(_) => None,
        }
    }

    /// The server's address for kernel TCP on `port`. In memory, kernel TCP runs over
    /// the host's loopback, which other programs share: a free pair of ports (the server
    /// binds the next one too, for its latency application) rather than `port`.
    fn kernel_addr(&self, port: u16) -> SocketAddr {
        match &self.place {
            Place::Bed(b) => SocketAddr::new(b.side(Side::B).ipv4.into(), port),
            Place::Memory(_) => {
                let port = free_loopback_pair().unwrap_or(port);
                SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)
            }
        }
    }

    /// The server stack's address.
    fn netchannel_addr(&self) -> SocketAddr {
        match &self.place {
            Place::Bed(b) => SocketAddr::new(b.side(Side::B).ipv4.into(), DEFAULT_PORT),
            Place::Memory(_) => SocketAddr::new(MEM_SERVER.into(), DEFAULT_PORT),
        }
    }

    /// A stack on each side, with `args`' settings: (client, server).
    fn stacks(&self, args: &StackArgs) -> Result<(Stack, Stack), Fail> {
        match &self.place {
            Place::Bed(bed) => {
                let build = |host: &Host, side: Side| {
                    let e = bed.side(side).clone();
                    let a = args.clone();
                    host.run(async move { setup::build(&a, &e.ifname, e.ipv4) })
                };
                let server = build(&self.server, Side::B)?;
                let client = build(&self.client, Side::A).inspect_err(|_| server.abort())?;
                Ok((client, server))
            }
            Place::Memory(_) => {
                let net = MemNetwork::new();
                let build = |ip| {
                    setup::builder(args)
                        .ipv4(ip)
                        .build_in_memory(&net)
                        .map_err(|e| fail(format!("starting an in-memory stack: {e}")))
                };
                let server = build(MEM_SERVER)?;
                Ok((build(MEM_CLIENT)?, server))
            }
        }
    }

    fn target(&self, net: Net, addr: SocketAddr) -> Target {
        Target {
            net,
            addr,
            lat_addr: SocketAddr::new(addr.ip(), addr.port() + 1),
            lat_rt: self.client.lat_handle(),
        }
    }

    /// Fails if an XDP program is attached to either end of the bed (the kernel
    /// reference must have nothing attached).
    fn check_nothing_attached(&self) -> Result<(), Fail> {
        let Some(bed) = self.bed() else { return Ok(()) };
        for side in Side::BOTH {
            let e = bed.side(side);
            let out = bed
                .output_in(side, "ip", &["-j", "link", "show", "dev", &e.ifname])
                .map_err(|err| fail(format!("reading {}: {err}", e.ifname)))?;
            if out.contains("\"xdp\"") {
                return Err(fail(format!(
                    "an XDP program is still attached to {} after its stack stopped; the \
                     kernel reference needs nothing attached (a netchannel bug: please \
                     report it)",
                    e.ifname
                )));
            }
        }
        Ok(())
    }
}

/// A netchannel stack pair serving on the server side, with the client's target.
struct Stacks {
    client: Stack,
    server: Stack,
    serving: Serving,
    target: Target,
}

impl Stacks {
    fn start(sides: &Sides, args: &StackArgs) -> Result<Stacks, Fail> {
        let (client, server) = sides.stacks(args)?;
        let addr = sides.netchannel_addr();
        let serving = Serving::start(&sides.server, &Net::Netchannel(server.clone()), addr)
            .map_err(|e| fail(format!("netchannel server on {addr}: {e}")))?;
        let target = sides.target(Net::Netchannel(client.clone()), addr);
        warm_up(&sides.client, &target)
            .map_err(|e| fail(format!("first netchannel connection to {addr}: {e}")))?;
        Ok(Stacks {
            client,
            server,
            serving,
            target,
        })
    }

    fn stop(self) {
        self.serving.stop();
        self.client.abort();
        self.server.abort();
    }
}

/// A port of the loopback that is free, with the next one free too (they are released
/// before they are used, so another program could still take them: the bind then fails
/// with a clear message).
fn free_loopback_pair() -> Option<u16> {
    for _ in 0..32 {
        let a = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
        let port = a.local_addr().ok()?.port();
        if port < u16::MAX && std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port + 1)).is_ok() {
            return Some(port);
        }
    }
    None
}

fn kernel_serving(sides: &Sides, port: u16) -> Result<(Serving, Target), Fail> {
    let addr = sides.kernel_addr(port);
    let serving = Serving::start(&sides.server, &Net::Kernel, addr)
        .map_err(|e| fail(format!("kernel TCP server on {addr}: {e}")))?;
    Ok((serving, sides.target(Net::Kernel, addr)))
}

/// Runs the demo; returns its report (the table is printed already).
pub fn run(args: &DemoArgs) -> Result<Report, Fail> {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let plan = Plan::new(&args.suite, args.quick, cores, 3).map_err(fail)?;
    let sweep_channels = args.sweep_channels.clone().unwrap_or_else(|| {
        if args.quick {
            vec![1, 2]
        } else {
            vec![1, 2, 4]
        }
    });
    let sweep_copy = args.sweep_copy_workers.clone().unwrap_or_else(|| {
        if args.quick {
            vec![0, 1]
        } else {
            vec![0, 1, 2]
        }
    });
    let sweep_links = args
        .sweep_links
        .clone()
        .unwrap_or_else(|| vec![Link::Xdp, Link::Packet]);
    let (sweep_channels, sweep_copy, mut sweep_links) = if args.no_sweeps {
        (Vec::new(), Vec::new(), Vec::new())
    } else {
        (sweep_channels, sweep_copy, sweep_links)
    };
    if args.stack.kernel {
        return Err(fail(
            "--kernel is for client and server; the demo measures both stacks",
        ));
    }

    let place = if args.in_memory {
        Place::Memory("asked for with --in-memory".into())
    } else {
        match TestBed::builder()
            .queues(args.bed_queues)
            .mtu(args.bed_mtu)
            .build()
        {
            Ok(bed) => Place::Bed(Box::new(bed)),
            Err(e) if testbed::required() => {
                return Err(fail(format!(
                    "{}=1 but the test bed cannot be built: {e}",
                    testbed::REQUIRE_ENV
                )))
            }
            Err(e) => Place::Memory(e.to_string()),
        }
    };
    let link = args.stack.effective_link();
    match &place {
        Place::Bed(_) => println!(
            "ncperf demo: {} TEST BED, two network namespaces joined by a veth pair \
             ({} queues, MTU {}); netchannel over {} against kernel TCP at its defaults",
            link.title(),
            args.bed_queues,
            args.bed_mtu,
            link.title()
        ),
        Place::Memory(why) => println!(
            "ncperf demo: IN-MEMORY STACKS, not a network ({why}): netchannel's virtual \
             sockets over in-memory channels (no TCP, no AF_XDP) against kernel TCP over \
             loopback; run as root for the AF_XDP test bed"
        ),
    }
    let enter = |side: Side| -> Result<Option<crate::host::Enter>, Fail> {
        let Place::Bed(bed) = &place else {
            return Ok(None);
        };
        let h = Arc::new(
            bed.netns_handle(side)
                .map_err(|e| fail(format!("opening the bed's namespace: {e}")))?,
        );
        Ok(Some(Arc::new(move || {
            h.enter().expect("entering the test bed's namespace")
        })))
    };
    let rt_err = |e: std::io::Error| fail(format!("starting a tokio runtime: {e}"));
    let client = Host::new("client", plan.workers as usize, enter(Side::A)?).map_err(rt_err)?;
    let server = Host::new("server", plan.workers as usize, enter(Side::B)?).map_err(rt_err)?;
    let sides = Sides {
        client,
        server,
        place,
    };
    let on_bed = sides.bed().is_some();
    if !on_bed {
        // In-memory stacks have no link to choose.
        sweep_links.clear();
    }

    let per_round: u64 = ALL.iter().map(|&t| steps(t, &plan)).sum::<u64>() * 2
        + if on_bed {
            ALL.iter().map(|&t| steps(t, &plan)).sum::<u64>()
        } else {
            0
        };
    let sweep_steps = (sweep_channels.len() + sweep_links.len()) as u64
        * steps(TestName::Bulk, &plan)
        + sweep_copy.len() as u64;
    let progress = Progress::new(per_round * u64::from(plan.rounds) + sweep_steps);
    println!(
        "{} s per measurement, {} round{}, {} tokio worker{} per side{}",
        plan.duration.as_secs_f64(),
        plan.rounds,
        if plan.rounds == 1 { "" } else { "s" },
        plan.workers,
        if plan.workers == 1 { "" } else { "s" },
        if on_bed {
            ""
        } else {
            "; kernel TCP with XDP attached is not measured"
        }
    );

    let mut ms: Vec<Measurement> = Vec::new();
    let mut iso_args = args.stack.clone();
    iso_args.scheduler = Scheduler::Isolating;
    for round in 0..plan.rounds {
        for t in ALL {
            // A test's kernel and netchannel measurements next to each other, in an order
            // that alternates with the rounds, so that load from elsewhere on the host
            // falls on both alike. Kernel TCP first, with nothing attached.
            let kernel = |ms: &mut Vec<Measurement>| -> Result<(), Fail> {
                sides.check_nothing_attached()?;
                let (serving, target) = kernel_serving(&sides, DEFAULT_PORT)?;
                let r = run_test(
                    &sides.client,
                    &target,
                    t,
                    Transport::Kernel,
                    round,
                    &plan,
                    &progress,
                );
                serving.stop();
                ms.extend(r?);
                Ok(())
            };
            // netchannel (with `Isolating` for the isolation test), and kernel TCP while
            // its XDP program is attached.
            let stacks = |ms: &mut Vec<Measurement>| -> Result<(), Fail> {
                let a = if t == TestName::Isolation {
                    &iso_args
                } else {
                    &args.stack
                };
                let nc = Stacks::start(&sides, a)?;
                let kx = if on_bed {
                    Some(kernel_serving(&sides, XDP_KERNEL_PORT)?)
                } else {
                    None
                };
                let mut order: Vec<(Transport, &Target)> =
                    vec![(Transport::Netchannel, &nc.target)];
                if let Some((_, kt)) = &kx {
                    order.push((Transport::KernelXdp, kt));
                }
                if round % 2 == 1 {
                    order.reverse();
                }
                let mut result = Ok(());
                for (transport, target) in order {
                    match run_test(&sides.client, target, t, transport, round, &plan, &progress) {
                        Ok(m) => ms.extend(m),
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
                if let Some((s, _)) = kx {
                    s.stop();
                }
                nc.stop();
                result
            };
            if round % 2 == 0 {
                kernel(&mut ms)?;
                stacks(&mut ms)?;
            } else {
                stacks(&mut ms)?;
                kernel(&mut ms)?;
            }
        }
    }

    // Sweeps.
    let mut counts = vec![1];
    if plan.streams != 1 {
        counts.push(plan.streams);
    }
    for &c in &sweep_channels {
        let mut a = args.stack.clone();
        a.channels = Some(c);
        let what = format!("{c} channel(s) per peer");
        ms.extend(sweep_point(
            &sides,
            &a,
            &counts,
            &plan,
            &progress,
            (Test::SweepChannels, &what),
            |m| m.channels = Some(c),
        )?);
    }
    for &l in &sweep_links {
        let mut a = args.stack.clone();
        a.link = Some(l);
        let what = format!("over {}", l.title());
        ms.extend(sweep_point(
            &sides,
            &a,
            &counts,
            &plan,
            &progress,
            (Test::SweepLinks, &what),
            |m| m.link = Some(l.name().to_string()),
        )?);
    }
    for &w in &sweep_copy {
        let mut a = args.stack.clone();
        a.copy_workers = Some(w);
        let what = format!("{w} copy worker(s)");
        ms.extend(sweep_point(
            &sides,
            &a,
            &[1],
            &plan,
            &progress,
            (Test::SweepCopyWorkers, &what),
            |m| m.copy_workers = Some(w),
        )?);
    }
    progress.finish();

    let machine = match sides.bed() {
        Some(bed) => {
            let (a, b) = (bed.side(Side::A), bed.side(Side::B));
            machine::machine(&[
                ("client (test bed side A)", &a.ifname, Some(&a.netns)),
                ("server (test bed side B)", &b.ifname, Some(&b.netns)),
            ])
        }
        None => machine::machine(&[]),
    };
    let summary = report::summarize(&ms);
    let report = Report {
        schema: SCHEMA.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        command: "demo".into(),
        environment: if on_bed {
            "af_xdp_test_bed"
        } else {
            "in_memory"
        }
        .into(),
        started_unix_s: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        wall_s: t0.elapsed().as_secs_f64(),
        config: plan.config(args.stack.config()),
        machine,
        measurements: ms,
        summary,
    };
    print_demo(&report, on_bed, link);
    Ok(report)
}

/// One point of a sweep: stacks with `stack`'s settings, then bulk goodput over each of
/// `streams` stream counts, a measurement of `test` each, the point's setting recorded by
/// `mark` (`what` names the point in progress lines and errors).
fn sweep_point(
    sides: &Sides,
    stack: &StackArgs,
    streams: &[u32],
    plan: &Plan,
    progress: &Progress,
    (test, what): (Test, &str),
    mark: impl Fn(&mut Measurement),
) -> Result<Vec<Measurement>, Fail> {
    let nc = Stacks::start(sides, stack)?;
    let mut ms = Vec::with_capacity(streams.len());
    for &s in streams {
        let step = progress.step(format!("bulk, {s} stream(s), {what}"));
        let t = nc.target.clone();
        let d = plan.duration;
        let b = sides
            .client
            .run(async move { suite::bulk(&t, s as usize, d).await })
            .map_err(|e| fail(format!("sweep, bulk {what}: {e}")));
        let b = match b {
            Ok(b) => b,
            Err(e) => {
                nc.stop();
                return Err(e);
            }
        };
        step.done();
        let mut m = Measurement::new(test, Transport::Netchannel, 0, d.as_secs_f64());
        (m.streams, m.goodput_gbps) = (Some(s), Some(b.gbps()));
        mark(&mut m);
        ms.push(m);
    }
    nc.stop();
    Ok(ms)
}

/// The demo's table and what to read in it.
fn print_demo(r: &Report, on_bed: bool, link: Link) {
    println!();
    println!(
        "machine: {} cores ({}), kernel {}{}",
        r.machine.cores,
        if r.machine.cpu.is_empty() {
            "cpu unknown"
        } else {
            &r.machine.cpu
        },
        r.machine.kernel,
        r.machine
            .interfaces
            .first()
            .map(|i| format!(
                ", {} driver, {} queues, MTU {}",
                i.driver, i.rx_queues, i.mtu
            ))
            .unwrap_or_default()
    );
    println!();
    print!("{}", report::table(&r.summary, on_bed));
    println!();
    println!(
        "ratio: netchannel / kernel TCP at its defaults with nothing attached, the median of \
         the rounds' ratios (their range after it); \"ahead\" means netchannel's figure is \
         the better one."
    );
    if on_bed {
        match link {
            Link::Xdp => println!(
                "kernel+XDP: kernel TCP while netchannel's XDP program is attached to both \
                 ends (it passes the kernel's flows, and veth loses its offloads)."
            ),
            Link::Packet => println!(
                "kernel+XDP: kernel TCP while netchannel's AF_PACKET steering (a socket \
                 filter and a TCX ingress program) is attached to both ends."
            ),
        }
    }
    println!(
        "isolation: netchannel runs it with the Isolating scheduler (latency channels on \
         NIC queues of their own, driven by the latency application's runtime); the latency \
         stream's client and server are applications of their own (one-worker runtimes)."
    );
    let sweep = |test: Test, name: &str, x: fn(&Measurement) -> Option<String>| {
        let mut pts: Vec<(u32, String, f64)> = r
            .measurements
            .iter()
            .filter(|m| m.test == test)
            .filter_map(|m| Some((m.streams?, x(m)?, m.goodput_gbps?)))
            .collect();
        // Numbers in their order, names as they came.
        pts.sort_by_key(|a| (a.0, a.1.parse::<u32>().unwrap_or(u32::MAX)));
        let mut streams: Vec<u32> = pts.iter().map(|p| p.0).collect();
        streams.dedup();
        for s in streams {
            let row: Vec<String> = pts
                .iter()
                .filter(|p| p.0 == s)
                .map(|p| format!("{} → {}", p.1, report::fmt_figure(p.2)))
                .collect();
            println!(
                "netchannel bulk goodput, {s} stream{} (Gbit/s) by {name}: {}",
                if s == 1 { "" } else { "s" },
                row.join(", ")
            );
        }
    };
    sweep(Test::SweepChannels, "channels", |m| {
        m.channels.map(|c| c.to_string())
    });
    sweep(Test::SweepCopyWorkers, "copy workers", |m| {
        m.copy_workers.map(|w| w.to_string())
    });
    sweep(Test::SweepLinks, "link", |m| m.link.clone());
    println!("took {:.0} s", r.wall_s);
}
