//! Unit tests of the stack's defaults and of what its builder hands the channel set.

use super::*;

/// One throughput channel per peer where the process has fewer than 4 cores to share
/// with the application, the default elsewhere; a user's count is kept.
#[test]
fn the_default_channel_count_follows_the_cores() {
    use sizing::auto_channels;
    assert_eq!(auto_channels(1), 1);
    assert_eq!(auto_channels(2), 1, "2-core bed");
    assert_eq!(auto_channels(3), 1);
    assert_eq!(auto_channels(4), DEFAULT_CHANNELS);
    assert_eq!(auto_channels(16), DEFAULT_CHANNELS);
    let net = MemNetwork::new();
    let default = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 1))
        .build_in_memory(&net)
        .unwrap();
    let usable = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(default.channels_per_peer(), auto_channels(usable));
    let set = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 2))
        .channels(3)
        .build_in_memory(&net)
        .unwrap();
    assert_eq!(set.channels_per_peer(), 3);
}

#[test]
fn default_liveness_probes_idle_channels_within_15_s() {
    let l = Liveness::default();
    assert_eq!(l.keepalive, Some(Duration::from_secs(10)));
    assert_eq!(l.idle_detection(), Some(Duration::from_secs(15)));
    assert_eq!(l.user_timeout, Duration::from_secs(30));
    let off = Liveness {
        keepalive: None,
        ..l
    };
    assert_eq!(off.idle_detection(), None);
    // 0 probes count as 1, as in the TCP.
    let zero = Liveness {
        keepalive_probes: 0,
        ..l
    };
    assert_eq!(zero.idle_detection(), Some(Duration::from_secs(11)));
}

#[test]
fn socket_buffers_keep_the_windows_proportions() {
    let net = MemNetwork::new();
    let s = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 1))
        .socket_buffers(4096, 65536)
        .build_in_memory(&net)
        .unwrap();
    let sock = s.socket();
    assert_eq!(sock.send_buffer_size().unwrap(), 4096);
    assert_eq!(sock.recv_buffer_size().unwrap(), 65536);
    let c = s.core().lock_shard(0).ep.config().clone();
    let d = crate::endpoint::Config::default();
    assert_eq!(c.credit_window, 65536 * d.credit_window / d.recv_buffer);
    assert_eq!(
        c.credit_update_threshold,
        c.credit_window * d.credit_update_threshold / d.credit_window
    );
    c.validate().unwrap();
}

#[test]
fn in_memory_stack_reports_the_configured_policy() {
    let net = MemNetwork::new();
    let s = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 1))
        .keepalive(Some(Duration::from_millis(200)))
        .keepalive_interval(Duration::from_millis(100))
        .keepalive_probes(3)
        .user_timeout(Duration::from_secs(2))
        .build_in_memory(&net)
        .unwrap();
    let l = s.liveness();
    assert_eq!(l.keepalive, Some(Duration::from_millis(200)));
    assert_eq!(l.idle_detection(), Some(Duration::from_millis(500)));
    assert_eq!(l.user_timeout, Duration::from_secs(2));
}

#[cfg(target_os = "linux")]
#[test]
fn every_channel_gets_the_liveness_policy() {
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    // Defaults: keep-alive on, unlike netdriver's TCP default.
    let cfg = Stack::builder().channel_set_config("x0".into(), ip);
    assert_eq!(netdriver::tcp::Config::default().keepalive, None);
    assert_eq!(cfg.tcp.keepalive, Some(Duration::from_secs(10)));
    assert_eq!(cfg.tcp.keepalive_interval, Some(Duration::from_secs(1)));
    assert_eq!(cfg.tcp.keepalive_probes, 5);
    assert_eq!(cfg.tcp.user_timeout, Duration::from_secs(30));

    let mut b = Stack::builder()
        .keepalive(Some(Duration::from_millis(200)))
        .keepalive_interval(Duration::from_millis(50))
        .keepalive_probes(4)
        .user_timeout(Duration::from_secs(2));
    let cfg = b.channel_set_config("x0".into(), ip);
    // The channel set's TCP configuration serves every connection it opens or
    // accepts (NetChannel channels and plain-TCP streams alike).
    assert_eq!(cfg.tcp.keepalive, Some(Duration::from_millis(200)));
    assert_eq!(cfg.tcp.keepalive_interval, Some(Duration::from_millis(50)));
    assert_eq!(cfg.tcp.keepalive_probes, 4);
    assert_eq!(cfg.tcp.user_timeout, Duration::from_secs(2));
    assert_eq!(Liveness::of_tcp(&cfg.tcp), b.liveness);

    // Keep-alive off, and `configure_channels` has the last word.
    let mut b = Stack::builder()
        .keepalive(None)
        .configure_channels(|c| c.tcp.user_timeout = Duration::from_secs(7));
    let cfg = b.channel_set_config("x0".into(), ip);
    assert_eq!(cfg.tcp.keepalive, None);
    let seen = Liveness::of_tcp(&cfg.tcp);
    assert_eq!(seen.user_timeout, Duration::from_secs(7));
    assert_eq!(seen.idle_detection(), None);
}

#[cfg(target_os = "linux")]
#[test]
fn the_syn_cookie_switch_reaches_the_channel_set() {
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    let cookies = |mut b: StackBuilder| b.channel_set_config("x0".into(), ip).syn_cookies;
    assert!(cookies(Stack::builder()), "on by default");
    assert!(!cookies(Stack::builder().syn_cookies(false)));
    assert!(cookies(
        Stack::builder().syn_cookies(false).syn_cookies(true)
    ));
    // `configure_channels` still has the last word.
    assert!(cookies(
        Stack::builder()
            .syn_cookies(false)
            .configure_channels(|c| c.syn_cookies = true)
    ));
    // NETCHANNEL_SYN_COOKIES.
    use env::parse_switch;
    assert!(!parse_switch("NETCHANNEL_SYN_COOKIES", "0").unwrap());
    assert!(parse_switch("NETCHANNEL_SYN_COOKIES", "1").unwrap());
    for bad in ["", "on", "2", " 1"] {
        let e = parse_switch("NETCHANNEL_SYN_COOKIES", bad).unwrap_err();
        assert!(e.to_string().contains("NETCHANNEL_SYN_COOKIES"), "{e}");
    }
}

#[cfg(target_os = "linux")]
#[test]
fn the_xdp_mode_and_rss_alignment_reach_the_channel_set() {
    use netdriver::channel::RssAlignment;
    use netdriver::link::xdp::BindMode;
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    let cfg = |mut b: StackBuilder| b.channel_set_config("x0".into(), ip);
    let d = cfg(StackBuilder::default());
    assert_eq!((d.link.bind, d.rss), (BindMode::Auto, RssAlignment::Probe));
    for mode in [BindMode::Copy, BindMode::ZeroCopy, BindMode::Auto] {
        assert_eq!(cfg(StackBuilder::default().xdp_mode(mode)).link.bind, mode);
    }
    assert_eq!(
        cfg(StackBuilder::default().rss_align(false)).rss,
        RssAlignment::Off
    );
    assert_eq!(
        cfg(StackBuilder::default().rss_align(false).rss_align(true)).rss,
        RssAlignment::Probe
    );
    assert!(d.link.tx_checksum_offload);
    assert!(
        !cfg(StackBuilder::default().xdp_tx_checksum(false))
            .link
            .tx_checksum_offload
    );
    // `configure_channels` still has the last word.
    let c = cfg(StackBuilder::default()
        .xdp_mode(BindMode::ZeroCopy)
        .configure_channels(|c| c.link.bind = BindMode::Copy));
    assert_eq!(c.link.bind, BindMode::Copy);
}

/// A plan attempt that a busy shard turns away does not measure the queue runtimes: the
/// plan that follows sees their utilisation over the whole time since the last plan, not
/// since the last attempt (which retries every millisecond while the shard is held).
#[test]
fn a_plan_turned_away_by_a_busy_shard_keeps_the_utilisation_window() {
    use std::sync::Mutex;

    #[derive(Debug, Clone, Default)]
    struct Record(
        Arc<Mutex<Vec<Vec<netsched::ThreadStats>>>>,
        netsched::RoundRobin,
    );

    impl netsched::NetScheduler for Record {
        fn pick_channel(
            &mut self,
            chunk: &netsched::ChunkInfo,
            channels: &[netsched::ChannelStats],
        ) -> Option<netsched::ChannelId> {
            self.1.pick_channel(chunk, channels)
        }
        fn plan(&mut self, snapshot: &netsched::StackSnapshot) -> Vec<netsched::PlanAction> {
            self.0.lock().unwrap().push(snapshot.threads.clone());
            Vec::new()
        }
        fn plan_period(&self) -> Duration {
            Duration::from_millis(5)
        }
        fn fork(&self) -> Option<Box<dyn netsched::NetScheduler>> {
            Some(Box::new(self.clone()))
        }
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let net = MemNetwork::new();
    let stack = Stack::builder()
        .ipv4(Ipv4Addr::new(10, 0, 0, 1))
        .shards(2)
        .application_runtime(false)
        .execute_plans(true)
        .scheduler(Record(seen.clone(), netsched::RoundRobin::default()))
        .build_in_memory(&net)
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plans = |s: &Stack| s.diagnostics().plan_counters().plans;
    // Two plans: the second lists the queue runtimes with a window.
    let wait = stack.plans_reach(2);
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), wait).await })
        .expect("two plans");
    let held_for = Duration::from_millis(60);
    let before = {
        let _held = stack.core().lock_shard(1);
        let before = plans(&stack);
        // Twelve plan periods with the shard held: every attempt is turned away.
        std::thread::sleep(held_for);
        assert_eq!(plans(&stack), before, "no plan while a shard is held");
        before
    };
    let wait = stack.plans_reach(before + 1);
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), wait).await })
        .expect("a plan once the shard is free");
    let seen = seen.lock().unwrap();
    let threads = &seen[before as usize];
    assert!(!threads.is_empty(), "the queue runtimes are listed");
    // The plan's clock is read when its control round starts, which may be a little
    // before the shard is let go on a loaded machine: half the hold is the bound (an
    // attempt's measurement would leave about a millisecond).
    for t in threads {
        assert!(
            t.window >= held_for / 2,
            "the window runs from the last plan, not the last attempt: {t:?}"
        );
    }
}
