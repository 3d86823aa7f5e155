//! A simulation harness: two `Endpoint`s joined by N in-memory channels.
//!
//! Each channel direction is a reliable, in-order byte stream with a window: the sender's
//! transmit queue (`staging`, one chunk taken from `poll_transmit` at a time) moves into
//! the wire while the wire holds fewer than `window` bytes; the receiver consumes a prefix
//! of the wire. So a receiver that stops consuming a channel closes its window, and the
//! sender's chunks for that channel wait — backpressure exists. A seeded RNG picks which
//! channel delivers how many bytes next, with per-channel weights that make some channels
//! much slower than others (reordering across channels).
#![allow(dead_code)]

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use vns::{ChannelClass, ChannelId, ChannelLoad, Config, Endpoint, PeerId};

pub const A: usize = 0;
pub const B: usize = 1;

#[derive(Debug, Default)]
struct Pipe {
    staging: VecDeque<u8>,
    wire: VecDeque<u8>,
}

pub struct Sim {
    pub ends: [Endpoint; 2],
    pub channels: Vec<ChannelId>,
    pipes: Vec<[Pipe; 2]>,
    lost: Vec<bool>,
    weights: Vec<u32>,
    window: usize,
    pub rng: SmallRng,
    pub steps: u64,
    buf: Vec<u8>,
}

impl Sim {
    /// `classes[i]` is channel i's class on both ends; endpoint A is peer 0, B is peer 1.
    pub fn new(
        config: Config,
        classes: &[ChannelClass],
        window: usize,
        threshold: u64,
        seed: u64,
    ) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mk = || {
            Endpoint::new(
                config.clone(),
                netsched::RoundRobin::with_threshold(threshold),
            )
            .unwrap()
        };
        let mut ends = [mk(), mk()];
        let channels: Vec<ChannelId> = (0..classes.len() as u32).map(ChannelId).collect();
        for (i, (&ch, &class)) in channels.iter().zip(classes).enumerate() {
            ends[A].add_channel(ch, PeerId(1), class).unwrap();
            ends[B].add_channel(ch, PeerId(0), class).unwrap();
            let _ = i;
        }
        let weights = channels
            .iter()
            .map(|_| {
                if rng.gen_bool(0.3) {
                    1
                } else {
                    rng.gen_range(2..=20)
                }
            })
            .collect();
        Sim {
            ends,
            pipes: channels.iter().map(|_| Default::default()).collect(),
            lost: vec![false; channels.len()],
            channels,
            weights,
            window: window.max(1),
            rng,
            steps: 0,
            buf: Vec::new(),
        }
    }

    pub fn throughput(n: usize, config: Config, window: usize, seed: u64) -> Sim {
        Sim::new(
            config,
            &vec![ChannelClass::Throughput; n],
            window,
            netsched::DEFAULT_QUEUED_THRESHOLD,
            seed,
        )
    }

    /// Moves chunks from endpoints into channel transmit queues and onto the wire.
    pub fn pump_tx(&mut self) {
        for i in 0..self.channels.len() {
            if self.lost[i] {
                continue;
            }
            let ch = self.channels[i];
            for d in [A, B] {
                let pipe = &mut self.pipes[i][d];
                if pipe.staging.is_empty() {
                    self.buf.clear();
                    if self.ends[d].poll_transmit(ch, &mut self.buf).is_some() {
                        pipe.staging.extend(&self.buf);
                    }
                }
                while pipe.wire.len() < self.window {
                    match pipe.staging.pop_front() {
                        Some(b) => pipe.wire.push_back(b),
                        None => break,
                    }
                }
                let load = ChannelLoad {
                    queued_bytes: pipe.staging.len() as u64,
                    in_flight_bytes: pipe.wire.len() as u64,
                    ..ChannelLoad::default()
                };
                self.ends[d].set_channel_load(ch, load).unwrap();
            }
        }
    }

    /// Delivers up to `max` bytes of channel `i` in direction `from` → other end; returns
    /// bytes consumed.
    pub fn deliver(&mut self, i: usize, from: usize, max: usize) -> usize {
        let to = 1 - from;
        let ch = self.channels[i];
        if self.lost[i] || self.ends[to].should_pause_channel_reads(ch) {
            return 0;
        }
        let pipe = &mut self.pipes[i][from];
        let k = max.min(pipe.wire.len());
        if k == 0 {
            return 0;
        }
        let bytes = &pipe.wire.make_contiguous()[..k];
        let used = self.ends[to]
            .handle_chunk_bytes(ch, bytes)
            .expect("well-formed stream");
        pipe.wire.drain(..used);
        used
    }

    /// One step: fill channels, then one randomly chosen channel direction delivers a
    /// random number of bytes. Returns bytes delivered.
    pub fn step(&mut self) -> usize {
        self.steps += 1;
        self.pump_tx();
        let mut total = 0u32;
        let mut choices = Vec::new();
        for i in 0..self.channels.len() {
            for d in [A, B] {
                let to = 1 - d;
                if !self.lost[i]
                    && !self.pipes[i][d].wire.is_empty()
                    && !self.ends[to].should_pause_channel_reads(self.channels[i])
                {
                    total += self.weights[i];
                    choices.push((i, d, total));
                }
            }
        }
        if total == 0 {
            return 0;
        }
        let r = self.rng.gen_range(0..total);
        let &(i, d, _) = choices.iter().find(|c| r < c.2).unwrap();
        let max = self.rng.gen_range(1..=self.window);
        let n = self.deliver(i, d, max);
        self.pump_tx();
        n
    }

    /// Steps until nothing is on any wire or in any transmit queue.
    pub fn settle(&mut self) {
        for _ in 0..1_000_000 {
            self.pump_tx();
            if self.step() == 0 && self.idle() {
                return;
            }
        }
        panic!("simulation did not settle");
    }

    pub fn idle(&self) -> bool {
        self.pipes
            .iter()
            .flatten()
            .all(|p| p.staging.is_empty() && p.wire.is_empty())
    }

    /// Opens another channel of `class` between the two ends (a fresh id); returns its
    /// index.
    pub fn add_channel(&mut self, class: ChannelClass) -> usize {
        let id = ChannelId(self.channels.iter().map(|c| c.0 + 1).max().unwrap_or(0));
        self.ends[A].add_channel(id, PeerId(1), class).unwrap();
        self.ends[B].add_channel(id, PeerId(0), class).unwrap();
        self.channels.push(id);
        self.pipes.push(Default::default());
        self.lost.push(false);
        let w = self.rng.gen_range(1..=20);
        self.weights.push(w);
        self.channels.len() - 1
    }

    /// Whether channel `i` was lost.
    pub fn is_lost(&self, i: usize) -> bool {
        self.lost[i]
    }

    pub fn lose_channel(&mut self, i: usize) {
        self.lost[i] = true;
        self.pipes[i] = Default::default();
        let ch = self.channels[i];
        self.ends[A].handle_channel_lost(ch);
        self.ends[B].handle_channel_lost(ch);
    }

    /// Channel `i` ends as a retired channel does: `closer`'s side closed it gracefully
    /// once drained, so everything it sent is delivered first and the other end sees the
    /// end of the stream (`handle_channel_closed`); that end then aborts, so what it had
    /// on the wire towards `closer` is lost (`handle_channel_lost` there).
    pub fn close_retired_channel(&mut self, i: usize, closer: usize) {
        let other = 1 - closer;
        while self.deliver(i, closer, usize::MAX) > 0 {}
        assert!(
            self.pipes[i][closer].wire.is_empty() && self.pipes[i][closer].staging.is_empty(),
            "a retired channel is closed only once drained"
        );
        self.lost[i] = true;
        self.pipes[i] = Default::default();
        let ch = self.channels[i];
        self.ends[other].handle_channel_closed(ch);
        self.ends[closer].handle_channel_lost(ch);
    }

    /// Bytes each receiver holds on the wire for channel `i` (its channel receive buffer).
    pub fn wire_bytes(&self, i: usize, from: usize) -> usize {
        self.pipes[i][from].wire.len()
    }

    pub fn drain_events(&mut self) {
        for e in &mut self.ends {
            while e.poll_events().is_some() {}
        }
    }
}

/// A deterministic test pattern, distinct per socket.
pub fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(u32::from(tag)) as u8
                ^ tag
        })
        .collect()
}

/// Small buffers so that tests exercise the limits quickly.
pub fn small_config(max_chunk: usize) -> Config {
    Config {
        max_chunk_payload: max_chunk,
        send_buffer: 4 * max_chunk,
        recv_buffer: 4 * max_chunk,
        credit_window: 8 * max_chunk,
        credit_update_threshold: max_chunk,
        channel_budget: 16 * max_chunk,
        // Predictable ISNs (tests craft chunks of the first connection's stream) and a
        // fixed seed for the ports: reproducible runs.
        first_isn: Some(0x4e43_0001),
        rng_seed: Some(0x5eed),
        ..Config::default()
    }
}

/// `RoundRobin`, with every NIC queue driven on the application's runtime whatever the
/// host (the default placement does so on hosts of fewer than
/// `netsched::DISAGGREGATE_MIN_CORES` cores only).
#[derive(Debug, Clone, Default)]
pub struct OnApplication(netsched::RoundRobin);

impl netsched::NetScheduler for OnApplication {
    fn pick_channel(
        &mut self,
        chunk: &netsched::ChunkInfo,
        channels: &[netsched::ChannelStats],
    ) -> Option<netsched::ChannelId> {
        self.0.pick_channel(chunk, channels)
    }

    fn fork(&self) -> Option<Box<dyn netsched::NetScheduler>> {
        Some(Box::new(self.clone()))
    }

    fn place_queues(&self, host: &netsched::QueueHost) -> Vec<netsched::QueuePlace> {
        vec![netsched::QueuePlace::Application; host.queues.len()]
    }
}
