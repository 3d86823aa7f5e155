//! The default stack, built from the environment, end to end on the bed: a program that
//! only says `netchannel::net::TcpStream::connect` gets a VirtualStream over AF_XDP. Its
//! own test binary, because it sets process-wide environment variables.
//!
//! Privileged: skips without root, and fails instead when `NETCHANNEL_REQUIRE_XDP=1`.
#![cfg(target_os = "linux")]

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use netchannel::net::{TcpListener, TcpStream};
use netchannel::Stack;
use testbed::{testbed_or_skip, Side, TestBed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn default_stack_from_the_environment_end_to_end() {
    // Nothing installed, nothing set: the error says what to set.
    std::env::remove_var("NETCHANNEL_INTERFACE");
    std::env::remove_var("NETCHANNEL_IPV4");
    netchannel::clear_default_stack();
    let e = netchannel::default_stack().unwrap_err();
    assert!(
        e.to_string().contains("NETCHANNEL_INTERFACE"),
        "the error names the variable: {e}"
    );

    let Some(bed) = testbed_or_skip(TestBed::builder().queues(2)) else {
        return;
    };
    let (a, b) = (bed.side(Side::A).clone(), bed.side(Side::B).clone());
    // A value that does not parse is named too.
    std::env::set_var("NETCHANNEL_INTERFACE", &a.ifname);
    std::env::set_var("NETCHANNEL_IPV4", "not-an-address");
    let e = netchannel::default_stack().unwrap_err();
    assert!(e.to_string().contains("NETCHANNEL_IPV4"), "{e}");

    // A policy name it does not know: the message lists the ones it does.
    std::env::set_var("NETCHANNEL_IPV4", a.ipv4.to_string());
    std::env::set_var("NETCHANNEL_SCHEDULER", "fastest");
    let e = netchannel::default_stack().unwrap_err();
    assert!(
        e.to_string().contains("NETCHANNEL_SCHEDULER") && e.to_string().contains("round-robin"),
        "{e}"
    );
    std::env::set_var("NETCHANNEL_SCHEDULER", "source-port");
    std::env::set_var("NETCHANNEL_SEND_BUFFER", "1048576");
    std::env::set_var("NETCHANNEL_RECV_BUFFER", "524288");

    // Valid settings, some of the optional ones included; built inside A's namespace
    // (its threads and sockets stay there).
    std::env::set_var("NETCHANNEL_CHANNELS", "2");
    std::env::set_var("NETCHANNEL_CONNECT_TIMEOUT_MS", "10000");
    std::env::set_var("NETCHANNEL_RUNTIME_RX", "all");
    let stack = bed
        .run_in(Side::A, netchannel::default_stack)
        .expect("enter namespace A")
        .expect("the default stack from the environment");
    assert_eq!(stack.ipv4(), a.ipv4);
    // The buffer sizes reached the stack's sockets.
    let probe = stack.socket();
    assert_eq!(probe.send_buffer_size().unwrap(), 1 << 20);
    assert_eq!(probe.recv_buffer_size().unwrap(), 1 << 19);

    let (bif, bip) = (b.ifname.clone(), b.ipv4);
    let server = bed
        .run_in(Side::B, move || {
            Stack::builder()
                .interface(bif)
                .ipv4(bip)
                .channels(2)
                .build()
        })
        .expect("enter namespace B")
        .expect("B's stack");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = server
            .bind(SocketAddr::from(SocketAddrV4::new(bip, 7400)))
            .await
            .unwrap();
        let echo = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
            s.shutdown().await.unwrap();
        });
        // tokio's names, an address given as a string: the default stack.
        let mut c = timeout(LIMIT, TcpStream::connect(format!("{bip}:7400")))
            .await
            .expect("connect in time")
            .expect("connect");
        let msg: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut r, mut w) = c.split();
        let send = async {
            w.write_all(&msg).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let recv = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let (_, got) = timeout(LIMIT, async { tokio::join!(send, recv) })
            .await
            .expect("echo in time");
        assert!(got == msg, "the echo differs");
        timeout(LIMIT, echo).await.unwrap().unwrap();
        // A listener on the default stack, by string, keeps its bound address.
        let l = TcpListener::bind("0.0.0.0:7401").await.unwrap();
        assert_eq!(l.local_addr().unwrap().to_string(), "0.0.0.0:7401");
        drop(l);
        assert_eq!(
            timeout(LIMIT, stack.shutdown_graceful(Duration::from_secs(5)))
                .await
                .expect("stop in time")
                .map_err(|e| e.kind()),
            Ok(())
        );
        let _ = server.shutdown_graceful(Duration::from_secs(5)).await;
    });
    netchannel::clear_default_stack();
    drop(stack);
    drop(server);
}
