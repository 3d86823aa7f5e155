//! Privileged tests of the steering program on a veth pair between two network namespaces
//! this test creates (and always deletes).
//!
//! They need root (CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF) and `ip` from iproute2. Without
//! them each test prints why it skips, unless `NETCHANNEL_REQUIRE_XDP=1`, which turns the
//! skip into a failure (CI).

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use xdp_prog::{
    attached_program, detach_stale, AttachMode, AttachOptions, AttachedProgram, XdpError,
    XdpSteering,
};

/// The end the program is attached to (in namespace `a`).
const DEV_A: &str = "vxa";
/// Its peer (in namespace `b`).
const DEV_B: &str = "vxb";
const DEADLINE: Duration = Duration::from_secs(10);

/// Whether the privileged tests can run; without `NETCHANNEL_REQUIRE_XDP=1` a missing
/// privilege skips (with a printed reason), with it the test fails.
fn privileged(test: &str) -> bool {
    let why = if !nix::unistd::geteuid().is_root() {
        Some("not running as root")
    } else if Command::new("ip").arg("-V").output().is_err() {
        Some("`ip` (iproute2) is not installed")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if std::env::var("NETCHANNEL_REQUIRE_XDP").as_deref() == Ok("1") => {
            panic!("{test}: NETCHANNEL_REQUIRE_XDP=1 but {why}")
        }
        Some(why) => {
            eprintln!(
                "skipping {test}: {why} (set NETCHANNEL_REQUIRE_XDP=1 to make this a failure)"
            );
            false
        }
    }
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    out
}

fn run_ok(args: &[&str]) {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces `ncxdp-<pid>-<n>-{a,b}` joined by the veth pair `vxa` (in a, 10.77.n.1/24)
/// and `vxb` (in b, 10.77.n.2/24). Dropping it deletes both namespaces, and with them the
/// veth pair and anything attached to it.
struct Bed {
    a: String,
    b: String,
    addr_a: Ipv4Addr,
    addr_b: Ipv4Addr,
}

impl Bed {
    fn new(mtu: u32, queues: u32) -> Bed {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let bed = Bed {
            a: format!("ncxdp-{pid}-{n}-a"),
            b: format!("ncxdp-{pid}-{n}-b"),
            addr_a: Ipv4Addr::new(10, 77, 100 + n as u8, 1),
            addr_b: Ipv4Addr::new(10, 77, 100 + n as u8, 2),
        };
        // From here on a panic drops `bed`, which deletes whatever was created.
        run_ok(&["ip", "netns", "add", &bed.a]);
        run_ok(&["ip", "netns", "add", &bed.b]);
        // `queues` queues each way; a frame sent on vxb's tx queue q arrives on vxa's rx queue q.
        let q = queues.to_string();
        run_ok(&[
            "ip",
            "-n",
            &bed.a,
            "link",
            "add",
            DEV_A,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            DEV_B,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &bed.b,
        ]);
        let mtu = mtu.to_string();
        for (ns, dev, addr) in [(&bed.a, DEV_A, bed.addr_a), (&bed.b, DEV_B, bed.addr_b)] {
            run_ok(&["ip", "-n", ns, "link", "set", "lo", "up"]);
            run_ok(&["ip", "-n", ns, "link", "set", dev, "mtu", &mtu]);
            run_ok(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                dev,
            ]);
            run_ok(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        bed
    }

    /// `ip -d link show vxa` in namespace a.
    fn link_details_a(&self) -> String {
        let out = run(&["ip", "-n", &self.a, "-d", "link", "show", "dev", DEV_A]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let out = Command::new("ip").args(["netns", "del", ns]).output();
            if !matches!(&out, Ok(o) if o.status.success()) {
                eprintln!("deleting namespace {ns}: {out:?}");
            }
        }
    }
}

/// Runs `f` on a new thread inside namespace `ns` (the test harness's threads stay where
/// they are); a panic in `f` is re-raised here.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    let handle = thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    });
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Polls `cond` until it holds or the deadline passes.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        thread::yield_now();
        thread::sleep(Duration::from_millis(5));
    }
}

fn ping(from_ns: &str, to: Ipv4Addr, size: u32) {
    run_ok(&[
        "ip",
        "netns",
        "exec",
        from_ns,
        "ping",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "5",
        "-s",
        &size.to_string(),
        &to.to_string(),
    ]);
}

/// A kernel TCP round trip from namespace b to a listener in namespace a (the caller's).
fn kernel_tcp_round_trip(bed: &Bed) {
    let listener = TcpListener::bind((bed.addr_a, 0)).expect("listen in a");
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn({
        let b = bed.b.clone();
        move || {
            in_ns(&b, move || {
                let mut s =
                    TcpStream::connect_timeout(&addr, DEADLINE).expect("kernel TCP connect");
                s.set_read_timeout(Some(DEADLINE)).unwrap();
                let payload = vec![0x5au8; 100_000];
                s.write_all(&payload).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                let mut back = Vec::new();
                s.read_to_end(&mut back).unwrap();
                assert_eq!(back, payload, "echoed bytes");
            })
        }
    });
    let (mut conn, _) = listener.accept().expect("accept");
    conn.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).unwrap();
    conn.write_all(&got).unwrap();
    drop(conn);
    client
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
}

/// Connects from namespace b to `to`, waiting at most `timeout`.
fn connect_from(bed: &Bed, to: SocketAddr, timeout: Duration) -> io::Result<()> {
    in_ns(&bed.b, move || {
        TcpStream::connect_timeout(&to, timeout).map(drop)
    })
}

fn opts(mode: AttachMode, frags: bool, replace_stale: bool) -> AttachOptions {
    AttachOptions {
        mode,
        frags,
        replace_stale,
    }
}

#[test]
fn passes_kernel_traffic_and_counts_owned_ports_without_socket() {
    if !privileged("passes_kernel_traffic_and_counts_owned_ports_without_socket") {
        return;
    }
    let bed = Bed::new(1500, 1);
    let a = bed.a.clone();
    let bed = std::sync::Arc::new(bed);
    let bed2 = bed.clone();
    in_ns(&a, move || {
        let bed = bed2;
        let s = XdpSteering::attach(DEV_A, opts(AttachMode::Native, false, false))
            .expect("native attach");
        assert_eq!(s.mode(), AttachMode::Native);
        assert!(!s.frags());
        let found = attached_program(DEV_A)
            .unwrap()
            .expect("a program is attached");
        assert_eq!((found.id, found.mode), (s.prog_id(), AttachMode::Native));
        assert!(
            bed.link_details_a().contains("prog/xdp"),
            "ip -d link shows the program"
        );

        // ICMP (and the ARP before it) pass to the kernel.
        ping(&bed.b, bed.addr_a, 56);
        let c = s.counters().unwrap();
        assert!(c.seen >= 3 && c.passed >= 3, "{c:?}");
        assert_eq!((c.redirected, c.no_socket), (0, 0), "{c:?}");

        // The kernel's own TCP still works through the program.
        kernel_tcp_round_trip(&bed);
        let c2 = s.counters().unwrap();
        assert!(c2.seen > c.seen + 10 && c2.passed > c.passed + 10, "{c2:?}");
        assert_eq!(c2.seen, c2.redirected + c2.passed, "{c2:?}");
        assert_eq!((c2.redirected, c2.no_socket), (0, 0), "{c2:?}");

        // An owned port with no socket on the queue: counted, passed to the kernel, which has
        // no listener there and refuses.
        let port = 47_011;
        s.own_port(port).unwrap();
        let err = connect_from(&bed, SocketAddr::from((bed.addr_a, port)), DEADLINE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        let c3 = s.counters().unwrap();
        assert!(c3.no_socket >= 1, "{c3:?}");
        assert_eq!(c3.redirected, 0, "{c3:?}");
        assert_eq!(c3.seen, c3.redirected + c3.passed, "{c3:?}");
        assert!(s.release_port(port).unwrap());
        assert!(!s.release_port(port).unwrap(), "released twice");

        // An endpoint on another address is not ours: no new no_socket.
        s.own_endpoint(SocketAddrV4::new(Ipv4Addr::new(10, 77, 255, 1), port))
            .unwrap();
        let err = connect_from(&bed, SocketAddr::from((bed.addr_a, port)), DEADLINE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        assert_eq!(s.counters().unwrap().no_socket, c3.no_socket);
        // The same port on this end's address is.
        s.own_endpoint(SocketAddrV4::new(bed.addr_a, port)).unwrap();
        let _ = connect_from(&bed, SocketAddr::from((bed.addr_a, port)), DEADLINE);
        assert!(s.counters().unwrap().no_socket > c3.no_socket);

        drop(s);
        assert_eq!(attached_program(DEV_A).unwrap(), None, "detached on drop");
        assert!(
            !bed.link_details_a().contains("prog/xdp"),
            "ip -d link still shows XDP: {}",
            bed.link_details_a()
        );
        // And the kernel path is back to normal.
        ping(&bed.b, bed.addr_a, 56);
    });
    drop(bed);
}

/// Page-aligned memory registered as a UMEM.
struct Umem {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Umem {
    fn new(size: usize) -> Umem {
        let layout = std::alloc::Layout::from_size_align(size, 4096).unwrap();
        // SAFETY: a non-zero-sized layout; freed in Drop.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Umem { ptr, layout }
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; `BareXsk` closes its socket (which
        // unpins the pages) before dropping its `Umem`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A minimal AF_XDP socket bound in copy mode to (`ifindex`, `queue`) with an rx ring and an
/// empty fill ring: whatever is redirected to it is dropped and counted in `rx_dropped`.
struct BareXsk {
    // Field order matters: the socket closes before the UMEM is freed.
    fd: OwnedFd,
    _umem: Umem,
}

impl BareXsk {
    fn bind(ifindex: u32, queue: u32) -> BareXsk {
        let umem = Umem::new(32 * 2048);
        // SAFETY: socket(2) system call.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0, "socket(AF_XDP): {}", io::Error::last_os_error());
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr as u64,
            len: umem.layout.size() as u64,
            chunk_size: 2048,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let xsk = BareXsk { fd, _umem: umem };
        xsk.setsockopt(libc::XDP_UMEM_REG, &reg);
        xsk.setsockopt(libc::XDP_UMEM_FILL_RING, &32u32);
        xsk.setsockopt(libc::XDP_UMEM_COMPLETION_RING, &32u32);
        xsk.setsockopt(libc::XDP_RX_RING, &32u32);
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: bind(2) with a valid sockaddr_xdp of the size given.
        let ret = unsafe {
            libc::bind(
                xsk.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as u32,
            )
        };
        assert_eq!(ret, 0, "bind AF_XDP: {}", io::Error::last_os_error());
        xsk
    }

    fn setsockopt<T>(&self, opt: i32, value: &T) {
        // SAFETY: setsockopt(2) reading `size_of::<T>()` bytes from `value`; for XDP_UMEM_REG
        // the kernel pins the UMEM pages, which stay allocated until Drop closes the socket.
        let ret = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                opt,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as u32,
            )
        };
        assert_eq!(
            ret,
            0,
            "setsockopt SOL_XDP {opt}: {}",
            io::Error::last_os_error()
        );
    }

    fn rx_dropped(&self) -> u64 {
        // SAFETY: xdp_statistics is plain integers; all-zero is valid.
        let mut stats: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as u32;
        // SAFETY: getsockopt(2) writing at most `len` bytes into `stats`.
        let ret = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut stats as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        assert_eq!(ret, 0, "XDP_STATISTICS: {}", io::Error::last_os_error());
        stats.rx_dropped
    }
}

#[test]
fn owned_segments_reach_the_registered_socket() {
    if !privileged("owned_segments_reach_the_registered_socket") {
        return;
    }
    let bed = std::sync::Arc::new(Bed::new(1500, 1));
    let bed2 = bed.clone();
    in_ns(&bed.a.clone(), move || {
        let bed = bed2;
        let s = XdpSteering::attach(DEV_A, AttachOptions::default()).expect("attach");
        assert_eq!(s.mode(), AttachMode::Native, "veth supports native XDP");
        let xsk = BareXsk::bind(s.ifindex(), 0);
        s.register_socket(0, xsk.fd.as_raw_fd()).unwrap();
        let port = 47_012;
        s.own_port(port).unwrap();

        // The SYN is redirected to the socket (which drops it: its fill ring is empty), so
        // the kernel never answers and the connection attempt times out.
        let err = connect_from(
            &bed,
            SocketAddr::from((bed.addr_a, port)),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        wait_for("the SYN to be redirected", || {
            s.counters().unwrap().redirected >= 1
        });
        assert_eq!(s.counters().unwrap().no_socket, 0);
        wait_for("the socket to see the redirected SYN", || {
            xsk.rx_dropped() >= 1
        });

        // Other traffic still reaches the kernel.
        kernel_tcp_round_trip(&bed);

        // Without the socket the port is counted in no_socket and the kernel refuses.
        s.unregister_socket(0).unwrap();
        s.unregister_socket(0).unwrap(); // idempotent
        let err = connect_from(&bed, SocketAddr::from((bed.addr_a, port)), DEADLINE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        let c2 = s.counters().unwrap();
        assert!(c2.no_socket >= 1, "{c2:?}");
        assert_eq!(c2.seen, c2.redirected + c2.passed, "{c2:?}");

        assert!(matches!(
            s.register_socket(xdp_prog::MAX_QUEUES, xsk.fd.as_raw_fd()),
            Err(XdpError::QueueOutOfRange { .. })
        ));
        let not_xsk = File::open("/dev/null").unwrap();
        assert!(matches!(
            s.register_socket(0, not_xsk.as_raw_fd()),
            Err(XdpError::Map { map: "xsks", .. })
        ));
    });
}

#[test]
fn steers_to_the_socket_of_the_receiving_queue() {
    if !privileged("steers_to_the_socket_of_the_receiving_queue") {
        return;
    }
    let bed = std::sync::Arc::new(Bed::new(1500, 2));
    let bed2 = bed.clone();
    in_ns(&bed.a.clone(), move || {
        let bed = bed2;
        let s = XdpSteering::attach(DEV_A, AttachOptions::default()).expect("attach");
        // A socket on queue 1 only; queue 0 has none.
        let xsk = BareXsk::bind(s.ifindex(), 1);
        s.register_socket(1, xsk.fd.as_raw_fd()).unwrap();
        let port = 47_013;
        s.own_port(port).unwrap();
        // SYNs from many source ports spread over vxb's two tx queues by flow hash (all on one
        // queue has probability 2^-31). Those arriving on queue 1 reach the socket and get no
        // answer; those on queue 0 find no socket and the kernel refuses them.
        let to = SocketAddr::from((bed.addr_a, port));
        let outcomes: Vec<io::ErrorKind> = in_ns(&bed.b, move || {
            (0..32)
                .map(|_| {
                    TcpStream::connect_timeout(&to, Duration::from_millis(50))
                        .unwrap_err()
                        .kind()
                })
                .collect()
        });
        let refused = outcomes
            .iter()
            .filter(|k| **k == io::ErrorKind::ConnectionRefused)
            .count() as u64;
        let timed_out = outcomes
            .iter()
            .filter(|k| **k == io::ErrorKind::TimedOut)
            .count() as u64;
        assert_eq!(refused + timed_out, 32, "{outcomes:?}");
        // Each SYN is steered exactly once (the first retransmission would come after 1 s,
        // long after its socket was closed); a late one may still be on its way.
        wait_for("all 32 SYNs to be steered", || {
            let c = s.counters().unwrap();
            c.redirected + c.no_socket >= 32
        });
        let c = s.counters().unwrap();
        assert_eq!(c.redirected + c.no_socket, 32, "{c:?}");
        assert!(c.redirected >= 1 && c.no_socket >= 1, "{c:?} {outcomes:?}");
        // Refused means the SYN found no socket; a redirected one can only time out (and an
        // unanswered one may also be a RST slower than 50 ms).
        assert!(
            refused <= c.no_socket && c.redirected <= timed_out,
            "{c:?} {outcomes:?}"
        );
        wait_for("the queue-1 socket to see every redirected SYN", || {
            xsk.rx_dropped() == c.redirected
        });
        assert_eq!(c.seen, c.redirected + c.passed, "{c:?}");
    });
}

/// Attaches the program `prog` to `DEV_A` through netlink in `mode`, then closes the
/// descriptor: like a loader that crashed, it stays attached. Returns its id.
fn netlink_attach(prog: OwnedFd, mode: AttachMode) -> u32 {
    let flags = || match mode {
        AttachMode::Generic => libbpf_rs::XdpFlags::SKB_MODE,
        _ => libbpf_rs::XdpFlags::DRV_MODE,
    };
    let ifindex = nix::net::if_::if_nametoindex(DEV_A).unwrap() as i32;
    let xdp = libbpf_rs::Xdp::new(prog.as_fd());
    xdp.attach(ifindex, flags()).expect("netlink attach");
    let id = xdp.query_id(ifindex, flags()).unwrap();
    drop(prog);
    id
}

/// Another tool's program: loads a two-instruction XDP_PASS program named `name` (no
/// maps) and attaches it through netlink. Returns its id.
fn attach_foreign_netlink_program(mode: AttachMode, name: &std::ffi::CStr) -> u32 {
    use libbpf_rs::libbpf_sys;
    // r0 = XDP_PASS (2); exit
    let insns = [
        libbpf_sys::bpf_insn {
            code: 0xb7,
            imm: 2,
            ..Default::default()
        },
        libbpf_sys::bpf_insn {
            code: 0x95,
            ..Default::default()
        },
    ];
    // SAFETY: BPF_PROG_LOAD with two valid instructions and NUL-terminated strings; null
    // options are allowed.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(
            libbpf_sys::BPF_PROG_TYPE_XDP,
            name.as_ptr(),
            c"GPL".as_ptr(),
            insns.as_ptr(),
            insns.len() as _,
            std::ptr::null_mut(),
        )
    };
    assert!(
        fd >= 0,
        "loading the foreign program: {}",
        io::Error::from_raw_os_error(-fd)
    );
    // SAFETY: a fresh descriptor nothing else owns.
    netlink_attach(unsafe { OwnedFd::from_raw_fd(fd) }, mode)
}

/// A stale copy of our own program, as a loader of it that attached through netlink and
/// crashed would leave: attached with a BPF link, a descriptor of the program kept, the
/// link removed, the program attached through netlink and its descriptor closed. Returns
/// its id.
fn leave_stale_copy_of_ours(mode: AttachMode) -> u32 {
    let s = XdpSteering::attach(DEV_A, opts(mode, false, false)).expect("attach ours");
    let id = s.prog_id();
    let prog = libbpf_rs::Program::fd_from_id(id).expect("a descriptor of our program");
    s.detach().expect("detach our link");
    assert_eq!(attached_program(DEV_A).unwrap(), None);
    assert_eq!(netlink_attach(prog, mode), id, "the same program");
    id
}

#[test]
fn stale_program_is_replaced_and_live_ones_are_not() {
    if !privileged("stale_program_is_replaced_and_live_ones_are_not") {
        return;
    }
    let bed = Bed::new(1500, 1);
    in_ns(&bed.a, || {
        // A stale generic-mode copy of ours, removed on its own.
        let stale = leave_stale_copy_of_ours(AttachMode::Generic);
        let found = attached_program(DEV_A)
            .unwrap()
            .expect("stale program attached");
        assert_eq!((found.id, found.mode), (stale, AttachMode::Generic));
        assert_eq!(detach_stale(DEV_A).unwrap().map(|p| p.id), Some(stale));
        assert_eq!(attached_program(DEV_A).unwrap(), None);
        assert_eq!(detach_stale(DEV_A).unwrap(), None);

        // A stale native one: refused without replace_stale, replaced with it.
        let stale = leave_stale_copy_of_ours(AttachMode::Native);
        match XdpSteering::attach(DEV_A, opts(AttachMode::Native, false, false)) {
            Err(XdpError::Busy { prog_id, .. }) => assert_eq!(prog_id, stale),
            other => panic!("expected Busy, got {other:?}"),
        }
        assert_eq!(
            attached_program(DEV_A).unwrap().map(|p| p.id),
            Some(stale),
            "left in place"
        );
        let s = XdpSteering::attach(DEV_A, opts(AttachMode::Native, false, true)).expect("replace");
        assert_ne!(s.prog_id(), stale);
        assert_eq!(
            attached_program(DEV_A).unwrap().map(|p| p.id),
            Some(s.prog_id())
        );

        // A live attachment (ours, held by a BPF link) is neither detached nor replaced.
        assert!(matches!(detach_stale(DEV_A), Err(XdpError::Busy { .. })));
        assert!(matches!(
            XdpSteering::attach(DEV_A, AttachOptions::default()),
            Err(XdpError::Busy { .. })
        ));
        assert_eq!(
            attached_program(DEV_A).unwrap().map(|p| p.id),
            Some(s.prog_id())
        );

        s.detach().unwrap();
        assert_eq!(attached_program(DEV_A).unwrap(), None);

        // Generic mode on request.
        let g =
            XdpSteering::attach(DEV_A, opts(AttachMode::Generic, false, false)).expect("generic");
        assert_eq!(g.mode(), AttachMode::Generic);
        assert_eq!(
            attached_program(DEV_A).unwrap().map(|p| p.mode),
            Some(AttachMode::Generic)
        );
    });
    in_ns(&bed.a, || {
        assert_eq!(attached_program(DEV_A).unwrap(), None, "detached on drop")
    });
}

/// Another tool's program (one with a name of its own, and one named like ours but without
/// our maps) is never replaced nor detached, even with `replace_stale`: the error names it
/// and the command that removes it, and that command works.
#[test]
fn foreign_programs_are_left_in_place() {
    if !privileged("foreign_programs_are_left_in_place") {
        return;
    }
    let bed = Bed::new(1500, 1);
    let ns = bed.a.clone();
    in_ns(&bed.a, move || {
        for (mode, name) in [
            (AttachMode::Native, c"other_tool"),
            (AttachMode::Generic, c"steer_linear"),
        ] {
            let foreign = attach_foreign_netlink_program(mode, name);
            let name = name.to_str().unwrap();
            let err = XdpSteering::attach(DEV_A, opts(AttachMode::Auto, false, true))
                .expect_err("a foreign program is not replaced");
            let msg = err.to_string();
            match err {
                XdpError::ForeignProgram {
                    ifname,
                    prog_id,
                    name: found,
                    mode: found_mode,
                } => assert_eq!(
                    (ifname.as_str(), prog_id, found.as_str(), found_mode),
                    (DEV_A, foreign, name, mode)
                ),
                other => panic!("expected ForeignProgram, got {other:?}"),
            }
            let keyword = match mode {
                AttachMode::Generic => "xdpgeneric",
                _ => "xdpdrv",
            };
            let off = format!("ip link set dev {DEV_A} {keyword} off");
            assert!(msg.contains(&format!("`{off}`")), "{msg}");
            assert!(
                matches!(detach_stale(DEV_A), Err(XdpError::ForeignProgram { prog_id, .. }) if prog_id == foreign)
            );
            assert_eq!(
                attached_program(DEV_A).unwrap(),
                Some(AttachedProgram { id: foreign, mode }),
                "still attached"
            );

            // The command the error gives removes it; then ours attaches.
            let mut cmd: Vec<&str> = vec!["ip", "-n", &ns];
            cmd.extend(off.split(' ').skip(1));
            run_ok(&cmd);
            assert_eq!(attached_program(DEV_A).unwrap(), None, "{off}");
            let s = XdpSteering::attach(DEV_A, opts(AttachMode::Auto, false, true))
                .expect("attach once it is gone");
            s.detach().unwrap();
        }
    });
}

#[test]
fn frags_variant_for_jumbo_mtu_and_generic_fallback() {
    if !privileged("frags_variant_for_jumbo_mtu_and_generic_fallback") {
        return;
    }
    let bed = std::sync::Arc::new(Bed::new(9000, 1));
    let bed2 = bed.clone();
    in_ns(&bed.a.clone(), move || {
        let bed = bed2;
        // Native non-frags is refused on veth when the peer's MTU is above 3506.
        match XdpSteering::attach(DEV_A, opts(AttachMode::Native, false, false)) {
            Err(e @ XdpError::Attach { .. }) => assert!(e.to_string().contains("xdp.frags"), "{e}"),
            other => panic!("expected an Attach error, got {other:?}"),
        }
        assert_eq!(
            attached_program(DEV_A).unwrap(),
            None,
            "nothing left after the failure"
        );

        // Auto falls back to generic mode.
        let s = XdpSteering::attach(DEV_A, opts(AttachMode::Auto, false, false)).expect("auto");
        assert_eq!(s.mode(), AttachMode::Generic);
        drop(s);

        // The frags variant attaches natively and passes 8000-byte pings.
        let s = XdpSteering::attach(DEV_A, opts(AttachMode::Native, true, false)).expect("frags");
        assert_eq!((s.mode(), s.frags()), (AttachMode::Native, true));
        ping(&bed.b, bed.addr_a, 8000);
        let c = s.counters().unwrap();
        assert!(c.seen >= 3 && c.passed >= 3, "{c:?}");
        kernel_tcp_round_trip(&bed);
        drop(s);
        assert_eq!(attached_program(DEV_A).unwrap(), None);
    });
}

/// In a child process (this test binary, this test, with `NCXDP_CRASH_NETNS` set): attach,
/// report, abort. The parent checks the kernel detached the program when the child died.
#[test]
fn crashed_process_leaves_no_program() {
    if let Ok(ns) = std::env::var("NCXDP_CRASH_NETNS") {
        let file = File::open(format!("/var/run/netns/{ns}")).unwrap();
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let s = XdpSteering::attach(DEV_A, AttachOptions::default()).unwrap();
        println!("NCXDP-ATTACHED {}", s.prog_id());
        io::stdout().flush().unwrap();
        std::process::abort();
    }
    if !privileged("crashed_process_leaves_no_program") {
        return;
    }
    let bed = Bed::new(1500, 1);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "crashed_process_leaves_no_program",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NCXDP_CRASH_NETNS", &bed.a)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "the child aborts");
    let id: u32 = stdout
        .lines()
        .find_map(|l| l.split("NCXDP-ATTACHED ").nth(1))
        .unwrap_or_else(|| {
            panic!(
                "child did not attach: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .parse()
        .unwrap();
    assert!(id > 0);
    in_ns(&bed.a, || {
        wait_for("the kernel to detach the crashed process's program", || {
            attached_program(DEV_A).unwrap().is_none()
        })
    });
    assert!(!bed.link_details_a().contains("prog/xdp"));
}
