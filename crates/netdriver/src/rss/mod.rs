//! Receive-side scaling: which NIC queue a frame arrives on, and making it the queue that
//! owns the frame's channel.
//!
//! On a NIC the receiver's RSS picks the queue of every frame: the Toeplitz hash of its
//! TCP/IPv4 4-tuple under the NIC's key selects an entry of its indirection table. A
//! channel is served by one queue, so its frames should arrive there; otherwise each one
//! is forwarded between queues for the channel's whole life. This module holds the parts
//! of that decision:
//!
//! - [`toeplitz`]: the hash (checked against Microsoft's verification vectors), the
//!   hashed fields and input transforms, and [`RssConfig::queue_of`].
//! - [`ethtool`] (Linux): reading a NIC's key, table and hashed fields, and installing
//!   ntuple rules (`SIOCETHTOOL`), with typed errors where the driver has neither (veth).
//! - [`port`]: [`PortChooser`], a free local port whose replies land on a given queue
//!   (optionally also on given queues at the peer).
//! - [`align`] (Linux): [`RssAligner`], the per-channel decision: aligned port, else ntuple
//!   rule, else forwarding, counted per kind.
//! - [`steering`]: [`ChannelSteering`], the record a channel keeps of which happened, and
//!   its counters for the stack's statistics.
//! - [`peer`]: [`PeerAlignment`], the record an opened channel keeps of whether its port
//!   was also chosen to land on given queues at the peer (its RSS known), and counters.
//!
//! Accepted channels need none of this: the queue their SYN arrived on owns them, and RSS
//! puts their later frames on the same queue.
//!
//! Every [`ChannelSet`](crate::channel::ChannelSet) holds one [`RssAligner`], made when it
//! starts as [`ChannelSetConfig::rss`](crate::channel::ChannelSetConfig::rss) says, and
//! asks it for the port (and, where RSS decides, the queue) of every channel it opens.

#[cfg(target_os = "linux")]
pub mod align;
#[cfg(target_os = "linux")]
pub mod ethtool;
pub mod peer;
pub mod port;
pub mod steering;
pub mod toeplitz;

#[cfg(target_os = "linux")]
pub use align::{ChannelEnds, ConnectSteering, NoFreePort, PeerTarget, RssAligner, RssState};
#[cfg(target_os = "linux")]
pub use ethtool::{
    driver_info, install_ntuple, read_rss, DriverInfo, EthtoolSocket, NtupleRule, RssError,
};
pub use peer::{PeerAlignment, PeerAlignmentCounters, PeerAlignmentCounts};
pub use port::{End, PortChoice, PortChoiceError, PortChooser};
pub use steering::{ChannelSteering, ForwardReason, SteeringCounters, SteeringCounts};
pub use toeplitz::{
    toeplitz_hash, FlowTuple, HashFields, HashFunction, InputTransform, RssConfig, Unpredictable,
    MICROSOFT_VERIFICATION_KEY,
};
