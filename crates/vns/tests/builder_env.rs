//! `Stack::builder()` takes the `NETCHANNEL_*` environment as its defaults: a program's
//! stack can be tuned from outside, its explicit builder calls win, and a variable that
//! does not parse fails `build` naming it. Its own test binary, because it sets
//! process-wide environment variables.

use std::net::Ipv4Addr;
use std::time::Duration;

use vns::stack::{MemNetwork, Stack, StackBuilder};

fn build(b: StackBuilder) -> Result<Stack, vns::stack::StackError> {
    let net = MemNetwork::new();
    b.ipv4(Ipv4Addr::new(10, 0, 0, 1)).build_in_memory(&net)
}

#[test]
fn the_builder_reads_the_environment_and_explicit_calls_win() {
    std::env::set_var("NETCHANNEL_KEEPALIVE_MS", "1234");
    std::env::set_var("NETCHANNEL_USER_TIMEOUT_MS", "4321");
    std::env::set_var("NETCHANNEL_SEND_BUFFER", "1048576");

    // The environment's values, where the program said nothing.
    let stack = build(Stack::builder()).unwrap();
    assert_eq!(
        stack.liveness().keepalive,
        Some(Duration::from_millis(1234))
    );
    assert_eq!(stack.liveness().user_timeout, Duration::from_millis(4321));
    assert_eq!(stack.socket().send_buffer_size().unwrap(), 1 << 20);
    drop(stack);

    // The program's own calls win.
    let stack = build(Stack::builder().user_timeout(Duration::from_secs(7))).unwrap();
    assert_eq!(stack.liveness().user_timeout, Duration::from_secs(7));
    assert_eq!(
        stack.liveness().keepalive,
        Some(Duration::from_millis(1234))
    );
    drop(stack);

    // The built-in defaults ignore the environment.
    let stack = build(StackBuilder::default()).unwrap();
    assert_eq!(stack.liveness().keepalive, Some(Duration::from_secs(10)));
    drop(stack);

    // A value that does not parse fails the build, named.
    std::env::set_var("NETCHANNEL_KEEPALIVE_MS", "soon");
    let e = build(Stack::builder()).unwrap_err();
    assert!(e.to_string().contains("NETCHANNEL_KEEPALIVE_MS"), "{e}");
    std::env::set_var("NETCHANNEL_KEEPALIVE_MS", "0");
    let stack = build(Stack::builder()).unwrap();
    assert_eq!(stack.liveness().keepalive, None, "0 turns keep-alive off");
    drop(stack);

    // The AF_XDP bind mode and RSS alignment reach the channel set's configuration (an
    // in-memory set keeps it, though its switch has neither).
    #[cfg(target_os = "linux")]
    {
        use netdriver::channel::RssAlignment;
        use netdriver::link::xdp::BindMode;
        std::env::set_var("NETCHANNEL_XDP_MODE", "zerocopy");
        std::env::set_var("NETCHANNEL_RSS_ALIGN", "0");
        std::env::set_var("NETCHANNEL_XDP_TX_CHECKSUM", "0");
        let stack = build(Stack::builder()).unwrap();
        let c = stack.diagnostics().channel_set().config();
        assert_eq!(
            (c.link.bind, &c.rss),
            (BindMode::ZeroCopy, &RssAlignment::Off)
        );
        assert!(!c.link.tx_checksum_offload);
        drop(stack);
        let stack = build(Stack::builder().xdp_mode(BindMode::Copy).rss_align(true)).unwrap();
        let c = stack.diagnostics().channel_set().config();
        assert_eq!(
            (c.link.bind, &c.rss),
            (BindMode::Copy, &RssAlignment::Probe)
        );
        drop(stack);
        for (name, bad) in [
            ("NETCHANNEL_XDP_MODE", "fast"),
            ("NETCHANNEL_RSS_ALIGN", "yes"),
            ("NETCHANNEL_XDP_TX_CHECKSUM", "on"),
        ] {
            let before = std::env::var(name).unwrap();
            std::env::set_var(name, bad);
            let e = build(Stack::builder()).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
            std::env::set_var(name, before);
        }
        std::env::remove_var("NETCHANNEL_XDP_MODE");
        std::env::remove_var("NETCHANNEL_RSS_ALIGN");
        std::env::remove_var("NETCHANNEL_XDP_TX_CHECKSUM");
    }
    #[cfg(target_os = "linux")]
    {
        use netdriver::channel::LinkKind;
        use std::sync::{Arc, Mutex};
        // The link: the environment's, then the program's call; the channel set's
        // configuration shows which.
        let link_of = |b: StackBuilder| {
            let seen = Arc::new(Mutex::new(None));
            let s = seen.clone();
            let stack =
                build(b.configure_channels(move |c| *s.lock().unwrap() = Some(c.link_kind)))
                    .unwrap();
            drop(stack);
            let kind = seen.lock().unwrap().take();
            kind
        };
        assert_eq!(
            link_of(Stack::builder()),
            Some(LinkKind::Xdp),
            "the default"
        );
        std::env::set_var("NETCHANNEL_LINK", "packet");
        assert_eq!(link_of(Stack::builder()), Some(LinkKind::Packet));
        for alias in ["af_packet", "AF_PACKET"] {
            std::env::set_var("NETCHANNEL_LINK", alias);
            assert_eq!(link_of(Stack::builder()), Some(LinkKind::Packet), "{alias}");
        }
        std::env::set_var("NETCHANNEL_LINK", "af_xdp");
        assert_eq!(link_of(Stack::builder()), Some(LinkKind::Xdp), "af_xdp");
        std::env::set_var("NETCHANNEL_LINK", "packet");
        assert_eq!(
            link_of(Stack::builder().link(LinkKind::Xdp)),
            Some(LinkKind::Xdp),
            "the program's call wins"
        );
        std::env::set_var("NETCHANNEL_LINK", "dpdk");
        let e = build(Stack::builder()).unwrap_err();
        assert!(
            e.to_string().contains("NETCHANNEL_LINK") && e.to_string().contains("xdp or packet"),
            "{e}"
        );
        std::env::remove_var("NETCHANNEL_LINK");
    }
}
