//! [`MemNetwork`]: stacks in one process joined by netdriver's in-memory switch, for
//! tests and examples without privileges. Each stack on it is a channel set of its own,
//! with the same queue drivers, TCP and interfaces as over AF_XDP; only the link differs
//! (the switch's ports instead of AF_XDP sockets).

use std::net::Ipv4Addr;

use netdriver::channel::{ChannelError, ChannelSet, ChannelSetConfig, QueueLimits};
use netdriver::link::switch::{SimSwitch, SwitchConfig};

/// Per-direction limits of every channel's application queues on a [`MemNetwork`]
/// (`ChannelSetConfig::tx_queue` and `rx_queue`): small ones make backpressure reach the
/// sockets sooner, for tests of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLimits {
    /// Most chunks queued per direction.
    pub chunks: usize,
    /// Most bytes queued per direction (the last chunk may overshoot it).
    pub bytes: usize,
}

impl Default for MemLimits {
    fn default() -> Self {
        let q = QueueLimits::default();
        MemLimits {
            chunks: q.chunks,
            bytes: q.bytes,
        }
    }
}

/// An in-process network of stacks: an in-memory switch whose hosts each have
/// [`queues`](Self::queues) queues. Cloning shares the network.
///
/// ```
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use vns::stack::{MemNetwork, Stack};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let net = MemNetwork::new();
/// let a = Stack::builder().ipv4("10.0.0.1".parse().unwrap()).build_in_memory(&net)?;
/// let b = Stack::builder().ipv4("10.0.0.2".parse().unwrap()).build_in_memory(&net)?;
/// let listener = b.bind("10.0.0.2:7000".parse().unwrap()).await?;
/// let mut client = a.connect("10.0.0.2:7000".parse().unwrap()).await?;
/// let (mut server, _) = listener.accept().await?;
/// client.write_all(b"over the switch").await?;
/// let mut got = [0u8; 15];
/// server.read_exact(&mut got).await?;
/// assert_eq!(&got, b"over the switch");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemNetwork {
    switch: SimSwitch,
    limits: MemLimits,
    queues: usize,
}

impl Default for MemNetwork {
    fn default() -> Self {
        MemNetwork::new()
    }
}

/// Queues per host on a [`MemNetwork`] unless told otherwise: two, like the test bed's
/// veth pair, so that flows that arrive on another queue than their owner's are
/// exercised too.
pub const DEFAULT_MEM_QUEUES: usize = 2;

impl MemNetwork {
    /// An empty network with default channel limits and [`DEFAULT_MEM_QUEUES`] queues per
    /// host.
    pub fn new() -> MemNetwork {
        MemNetwork::with_switch(SwitchConfig::default())
    }

    /// An empty network whose channels have these per-direction limits.
    pub fn with_limits(limits: MemLimits) -> MemNetwork {
        MemNetwork {
            limits,
            ..MemNetwork::new()
        }
    }

    /// An empty network over a switch with these settings (MTU, per-port frame bound, a
    /// seeded loss rate).
    pub fn with_switch(config: SwitchConfig) -> MemNetwork {
        MemNetwork {
            switch: SimSwitch::new(config),
            limits: MemLimits::default(),
            queues: DEFAULT_MEM_QUEUES,
        }
    }

    /// The same network, with `n` queues for the hosts attached from now on.
    pub fn queues_per_host(mut self, n: usize) -> MemNetwork {
        self.queues = n.max(1);
        self
    }

    /// Queues per host.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// The switch.
    pub fn switch(&self) -> &SimSwitch {
        &self.switch
    }

    /// Applies the network's channel limits to a stack's channel set configuration.
    pub(crate) fn configure(&self, cfg: &mut ChannelSetConfig) {
        let q = QueueLimits {
            chunks: self.limits.chunks,
            bytes: self.limits.bytes,
        };
        cfg.tx_queue = q;
        cfg.rx_queue = q;
    }

    /// Starts a channel set for a host of this network.
    pub(crate) fn start(&self, cfg: ChannelSetConfig) -> Result<ChannelSet, ChannelError> {
        ChannelSet::start_on_switch(cfg, &self.switch, self.queues)
    }

    /// A host with address `ipv4` on this network that runs no stack: a bare channel set,
    /// to act as a plain-TCP peer (listen on a port, connect to a stack's listener) or to
    /// hand-craft what a peer sends on a stack's channel port (a hostile one, in tests).
    pub fn host(&self, ipv4: Ipv4Addr) -> Result<ChannelSet, ChannelError> {
        let mut cfg = ChannelSetConfig::new("mem", ipv4);
        self.configure(&mut cfg);
        self.start(cfg)
    }
}
