//! Where a stack's NIC queues are driven, as its builder sets them up, on the in-memory
//! network (the same channel sets and placements as over AF_XDP, no privileges).
#![cfg(target_os = "linux")]

use netdriver::channel::{DriverPlace, Placement};
use vns::stack::{MemNetwork, Stack};

/// A placement set through `StackBuilder::configure_channels` is the one the channel set
/// starts with: the hook runs after the builder's own settings so that it may override
/// them, and the scheduler's placement is one of those settings. Queue 0 on runtime 1 and
/// queue 1 on runtime 0 is a placement no default makes.
#[test]
fn a_placement_set_by_configure_channels_is_kept() {
    let net = MemNetwork::new().queues_per_host(2);
    let stack = Stack::builder()
        .ipv4("10.0.0.1".parse().unwrap())
        .application_runtime(false)
        .configure_channels(|c| {
            c.placement = Placement::Explicit {
                places: vec![DriverPlace::Runtime(1), DriverPlace::Runtime(0)],
                external: Vec::new(),
                cores: None,
            };
        })
        .build_in_memory(&net)
        .expect("stack");
    let p = stack.channel_placement();
    assert_eq!(
        (p.place_of(0), p.place_of(1)),
        (Some(DriverPlace::Runtime(1)), Some(DriverPlace::Runtime(0))),
        "{p}"
    );
    // A hook that leaves the placement alone gets the scheduler's: without a runtime of
    // the application's, runtimes of the stack's own.
    let other = Stack::builder()
        .ipv4("10.0.0.2".parse().unwrap())
        .configure_channels(|c| c.nodelay = true)
        .build_in_memory(&net)
        .expect("stack");
    let p = other.channel_placement();
    assert!(
        (0..2).all(|q| matches!(p.place_of(q), Some(DriverPlace::Runtime(_)))),
        "{p}"
    );
}
