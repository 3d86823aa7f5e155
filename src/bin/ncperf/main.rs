//! ncperf: netchannel against kernel TCP, as a user measures a network stack.
//!
//! ```text
//! ncperf demo                          # the whole suite on a two-namespace test bed (root)
//! ncperf demo --quick --json r.json --plot charts/
//! ncperf server -i eth1 -a 10.0.0.2    # netchannel on eth1 (root)
//! ncperf client -i eth1 -a 10.0.0.1 --peer 10.0.0.2 --test rpc,latency
//! ncperf server --kernel               # kernel TCP, for the reference
//! ncperf client --kernel --peer 10.0.0.2 --test rpc,latency
//! ```
//!
//! The tests (bulk goodput, closed-loop request rate, request/response latency
//! percentiles, new connections per second, isolation of a latency stream from bulk
//! streams) run the same code over both stacks; every response is checked. `--json`
//! writes every figure with the configuration and the machine, `--plot` SVG charts.
//! Measurement and reporting live in this binary's modules; the stack is used only
//! through netchannel's public API.

mod cli;
#[cfg(target_os = "linux")]
mod demo;
mod host;
mod machine;
mod net;
mod plot;
mod progress;
mod proto;
mod report;
mod runner;
mod setup;
mod stats;
mod suite;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use clap::Parser;

use cli::{Cli, ClientArgs, Command, Plan, ServerArgs, StackArgs};
use host::{Host, Serving};
use net::Net;
use progress::Progress;
use report::{Report, Transport, SCHEMA};
use setup::{fail, Fail};
use suite::Target;

fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(d) => demo(d),
        Command::Server(s) => server(s),
        Command::Client(c) => client(c),
        Command::Plot(p) => replot(p),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ncperf: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
fn demo(d: &cli::DemoArgs) -> Result<(), Fail> {
    let report = demo::run(d)?;
    outputs(&report, &d.suite)
}

#[cfg(not(target_os = "linux"))]
fn demo(_: &cli::DemoArgs) -> Result<(), Fail> {
    Err(fail("the demo's test bed is Linux only"))
}

/// Writes `--json` and `--plot`.
fn outputs(report: &Report, suite: &cli::SuiteArgs) -> Result<(), Fail> {
    if let Some(path) = &suite.json {
        let text = serde_json::to_string_pretty(report)
            .map_err(|e| fail(format!("encoding the report: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
        println!("report: {}", path.display());
    }
    if let Some(dir) = &suite.plot {
        let files = plot::write_all(dir, &report.measurements)
            .map_err(|e| fail(format!("writing charts into {}: {e}", dir.display())))?;
        for f in files {
            println!("chart: {}", f.display());
        }
    }
    Ok(())
}

/// `ncperf plot REPORT DIR`.
fn replot(args: &cli::PlotArgs) -> Result<(), Fail> {
    let text = std::fs::read_to_string(&args.report)
        .map_err(|e| fail(format!("reading {}: {e}", args.report.display())))?;
    let report: Report = serde_json::from_str(&text).map_err(|e| {
        fail(format!(
            "{} is not an ncperf report ({SCHEMA}): {e}",
            args.report.display()
        ))
    })?;
    if report.schema != SCHEMA {
        return Err(fail(format!(
            "{} has schema {:?}; this ncperf reads {SCHEMA}",
            args.report.display(),
            report.schema
        )));
    }
    let files = plot::write_all(&args.dir, &report.measurements)
        .map_err(|e| fail(format!("writing charts into {}: {e}", args.dir.display())))?;
    for f in files {
        println!("chart: {}", f.display());
    }
    Ok(())
}

fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The transport a side's flags ask for, built on `host` (netchannel) with its one-line
/// description.
fn side_net(host: &Host, args: &StackArgs) -> Result<(Net, String), Fail> {
    if args.kernel {
        return Ok((Net::Kernel, "kernel TCP".into()));
    }
    let iface = args.interface.clone().ok_or_else(|| {
        fail("netchannel needs --interface IFACE and --address IPV4 (or --kernel for kernel TCP)")
    })?;
    let addr = args.address.ok_or_else(|| {
        fail(format!(
            "netchannel needs --address: this host's IPv4 address on {iface}"
        ))
    })?;
    let a = args.clone();
    let i = iface.clone();
    let stack = host.run(async move { setup::build(&a, &i, addr) })?;
    let desc = format!(
        "netchannel over {} on {iface} ({addr}), {} throughput channel(s) per peer, {} copy \
         worker(s), scheduler {}",
        args.effective_link().title(),
        stack.channels_per_peer(),
        stack.copy_workers(),
        args.scheduler.name()
    );
    Ok((Net::Netchannel(stack), desc))
}

fn server(args: &ServerArgs) -> Result<(), Fail> {
    let workers = args.workers.unwrap_or_else(cores).max(1);
    let host = Host::new("server", workers as usize, None)
        .map_err(|e| fail(format!("starting a tokio runtime: {e}")))?;
    let (net, desc) = side_net(&host, &args.stack)?;
    let ip = args.stack.address.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let addr = SocketAddr::new(ip.into(), args.port);
    let serving = Serving::start(&host, &net, addr).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            fail(format!(
                "port {} or {} is in use (another ncperf server?); stop it or pick --port",
                args.port,
                args.port.wrapping_add(1)
            ))
        } else {
            fail(format!("listening on {addr}: {e}"))
        }
    })?;
    println!(
        "ncperf server: {desc}, listening on {addr} (latency application on port {}); stop \
         with Ctrl-C",
        serving.lat_addr.port()
    );
    let for_secs = args.for_secs;
    host.run(async move {
        match for_secs {
            Some(s) => tokio::time::sleep(std::time::Duration::from_secs_f64(s.max(0.0))).await,
            None => wait_for_signal().await,
        }
    });
    let counters = serving.counters.clone();
    serving.stop();
    if let Net::Netchannel(stack) = net {
        stack.abort();
    }
    println!(
        "ncperf server: stopped after {} connections ({} ended in an error)",
        counters.accepted.load(std::sync::atomic::Ordering::Relaxed),
        counters.failed.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn client(args: &ClientArgs) -> Result<(), Fail> {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let plan = Plan::new(&args.suite, false, cores(), 1).map_err(fail)?;
    let host = Host::new("client", plan.workers as usize, None)
        .map_err(|e| fail(format!("starting a tokio runtime: {e}")))?;
    let (net, desc) = side_net(&host, &args.stack)?;
    let transport = if args.stack.kernel {
        Transport::Kernel
    } else {
        Transport::Netchannel
    };
    let target = Target {
        net: net.clone(),
        addr: args.peer,
        lat_addr: SocketAddr::new(args.peer.ip(), args.peer.port().wrapping_add(1)),
        lat_rt: host.lat_handle(),
    };
    let names: Vec<&str> = args.test.iter().map(|t| t.test().name()).collect();
    println!(
        "ncperf client: {} against {} over {desc}; {} s per measurement, {} round(s)",
        names.join(", "),
        args.peer,
        plan.duration.as_secs_f64(),
        plan.rounds
    );
    runner::warm_up(&host, &target)
        .map_err(|e| setup::explain_connect(&e, args.peer, args.stack.kernel))?;
    let total: u64 = args.test.iter().map(|&t| runner::steps(t, &plan)).sum();
    let progress = Progress::new(total * u64::from(plan.rounds));
    let mut ms = Vec::new();
    let result = (|| {
        for round in 0..plan.rounds {
            for &t in &args.test {
                ms.extend(runner::run_test(
                    &host, &target, t, transport, round, &plan, &progress,
                )?);
            }
        }
        Ok::<(), Fail>(())
    })();
    progress.finish();
    if let Net::Netchannel(stack) = &net {
        stack.abort();
    }
    result?;
    let summary = report::summarize(&ms);
    println!();
    for row in &summary {
        let v = match transport {
            Transport::Kernel => row.kernel,
            _ => row.netchannel,
        };
        if let Some(v) = v {
            println!("{:<44} {:>12}", row.what, report::fmt_figure(v));
        }
    }
    let iface = args.stack.interface.clone();
    let machine = match &iface {
        Some(i) if !args.stack.kernel => machine::machine(&[("client", i, None)]),
        _ => machine::machine(&[]),
    };
    let report = Report {
        schema: SCHEMA.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        command: "client".into(),
        environment: "hosts".into(),
        started_unix_s: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        wall_s: t0.elapsed().as_secs_f64(),
        config: plan.config(args.stack.config()),
        machine,
        measurements: ms,
        summary,
    };
    outputs(&report, &args.suite)
}
