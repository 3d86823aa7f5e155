//! Runs a test of the suite on a client's host against a target and records its
//! measurements, one progress step each.

use std::io;
use std::time::Duration;

use crate::cli::{Plan, TestName};
use crate::host::Host;
use crate::progress::Progress;
use crate::report::{size_label, Measurement, Test, Transport};
use crate::setup::{fail, Fail};
use crate::suite::{self, Target};

/// The measurements `test` takes under `plan` (its progress steps).
pub fn steps(test: TestName, plan: &Plan) -> u64 {
    match test {
        TestName::Bulk => {
            if plan.streams == 1 {
                1
            } else {
                2
            }
        }
        TestName::Rpc => (plan.sizes.len() * plan.conns.len()) as u64,
        TestName::Latency | TestName::Connect | TestName::Isolation => 1,
    }
}

fn failed(what: &str, transport: Transport, e: io::Error) -> Fail {
    fail(format!("{what} over {}: {e}", transport.label()))
}

/// One request and its response on a fresh connection, so that a stack's channels are
/// open before the first measurement.
pub fn warm_up(host: &Host, target: &Target) -> io::Result<()> {
    let t = target.clone();
    host.run(async move { suite::latency(&t, 64, Duration::ZERO).await.map(drop) })
}

/// Runs `test` from `host` against `target`, carried by `transport`, in `round`.
pub fn run_test(
    host: &Host,
    target: &Target,
    test: TestName,
    transport: Transport,
    round: u32,
    plan: &Plan,
    progress: &Progress,
) -> Result<Vec<Measurement>, Fail> {
    let d = plan.duration;
    let label = transport.label();
    let mut out = Vec::new();
    match test {
        TestName::Bulk => {
            let mut counts = vec![1];
            if plan.streams != 1 {
                counts.push(plan.streams);
            }
            for streams in counts {
                let what = format!("bulk, {streams} stream(s)");
                let step = progress.step(format!("{what}, {label}"));
                let t = target.clone();
                let b = host
                    .run(async move { suite::bulk(&t, streams as usize, d).await })
                    .map_err(|e| failed(&what, transport, e))?;
                step.done();
                let mut m = Measurement::new(Test::Bulk, transport, round, b.elapsed.as_secs_f64());
                m.streams = Some(streams);
                m.goodput_gbps = Some(b.gbps());
                out.push(m);
            }
        }
        TestName::Rpc => {
            let max = plan.conns.iter().copied().max().unwrap_or(1) as usize;
            let t = target.clone();
            let mut pool = host
                .run(async move { suite::echo_pool(&t, max).await })
                .map_err(|e| failed(&format!("opening {max} connections"), transport, e))?;
            for &size in &plan.sizes {
                for &conns in &plan.conns {
                    let what = format!("requests, {} × {conns} conns", size_label(size));
                    let step = progress.step(format!("{what}, {label}"));
                    let (rate, back) = host.run(async move {
                        let r = suite::rpc_rate(&mut pool, conns as usize, size as usize, d).await;
                        (r, pool)
                    });
                    pool = back;
                    let rate = rate.map_err(|e| failed(&what, transport, e))?;
                    step.done();
                    let mut m = Measurement::new(Test::Rpc, transport, round, d.as_secs_f64());
                    (m.size, m.conns, m.requests_per_s) = (Some(size), Some(conns), Some(rate));
                    out.push(m);
                }
            }
            host.run(suite::close_pool(pool));
        }
        TestName::Latency => {
            let size = plan.latency_size;
            let what = format!("{} latency", size_label(size));
            let step = progress.step(format!("{what}, {label}"));
            let t = target.clone();
            let mut s = host
                .run(async move { suite::latency(&t, size as usize, d).await })
                .map_err(|e| failed(&what, transport, e))?;
            step.done();
            let mut m = Measurement::new(Test::Latency, transport, round, d.as_secs_f64());
            m.size = Some(size);
            m.latency = s.summary();
            out.push(m);
        }
        TestName::Connect => {
            let c = plan.connect_concurrency;
            let what = format!("new connections, {c} at a time");
            let step = progress.step(format!("{what}, {label}"));
            let t = target.clone();
            let rate = host
                .run(async move { suite::connect_rate(&t, c as usize, d).await })
                .map_err(|e| failed(&what, transport, e))?;
            step.done();
            let mut m = Measurement::new(Test::Connect, transport, round, d.as_secs_f64());
            m.conns = Some(c);
            m.connections_per_s = Some(rate);
            out.push(m);
        }
        TestName::Isolation => {
            let (size, streams) = (plan.latency_size, plan.isolation_streams);
            let what = format!("isolation, latency stream beside {streams} bulk");
            let step = progress.step(format!("{what}, {label}"));
            let t = target.clone();
            let mut iso = host
                .run(async move { suite::isolation(&t, size as usize, streams as usize, d).await })
                .map_err(|e| failed(&what, transport, e))?;
            step.done();
            let mut m = Measurement::new(Test::Isolation, transport, round, 2.0 * d.as_secs_f64());
            m.size = Some(size);
            m.streams = Some(streams);
            m.latency = iso.alone.summary();
            m.loaded_latency = iso.loaded.summary();
            m.loaded_goodput_gbps = Some(iso.bulk.gbps());
            out.push(m);
        }
    }
    Ok(out)
}
