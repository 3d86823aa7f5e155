// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * netchannel's RSS relay: a tc program for the test bed's middle namespace that forwards
 * every frame arriving on one interface out of another, on the transmit queue an RSS NIC
 * with a given Toeplitz key and indirection table would deliver it to.
 *
 * A veth delivers a frame sent on its tx queue q to its peer's rx queue q. Attached at the
 * tc ingress of two veth ends of a middle namespace (mA, mB), the relay turns the two
 * outer ends (vA, vB) into NICs with RSS: a frame arrives at vB on the queue vB's "NIC"
 * picks from the frame's 4-tuple, whoever sent it and on whichever queue.
 *
 * Queue choice, as a NIC's RSS (Microsoft's RSS hashing specification):
 *   IPv4 TCP, not a fragment:   Toeplitz over saddr, daddr, sport, dport (12 bytes)
 *   other IPv4 and fragments:   Toeplitz over saddr, daddr (8 bytes)
 *   anything else:              queue 0
 * then queue = indir[hash % indir_len].
 *
 * The queue is handed to the egress device as a recorded rx queue (queue_mapping = q + 1):
 * a frame without a socket picks its tx queue from that (skb_tx_hash), and veth delivers
 * it on the peer's rx queue of the same number.
 *
 * Maps:
 *   dirs          HASH, key = ifindex the frame arrived on, value = struct rss_dir.
 *   queue_counts  ARRAY of 2 * MAX_QUEUES u64: frames sent toward side slot s on queue q
 *                 at index s * MAX_QUEUES + q.
 *   counters      PERCPU_ARRAY with one struct relay_counters.
 *   last          ARRAY with one struct last_frame: the hash and queue of the latest frame.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Keep in sync with src/rss_relay.rs. */
#define MAX_QUEUES 256
#define MAX_INDIR 512
#define MAX_KEY 52

struct rss_dir {
	__u32 out_ifindex; /* where frames arriving on the key's interface leave */
	__u32 slot;        /* 0 or 1: which side the frames go toward (queue_counts) */
	__u32 indir_len;   /* 1..=MAX_INDIR */
	__u32 pad;
	__u8 key[MAX_KEY + 4]; /* zero beyond the key's length */
	__u32 indir[MAX_INDIR];
};

struct relay_counters {
	__u64 tcp_hashed;   /* hashed over the 4-tuple */
	__u64 ip_hashed;    /* hashed over the addresses */
	__u64 unhashed;     /* not IPv4: queue 0 */
	__u64 no_route;     /* arrived on an interface without a direction (passed) */
};

struct last_frame {
	__u32 hash;
	__u32 queue;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, struct rss_dir);
} dirs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u64);
} queue_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct relay_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct last_frame);
} last SEC(".maps");

/*
 * Toeplitz over the first n (8 or 12) bytes of in. The 32-bit key windows of byte j's
 * eight bits all lie within key bytes j..j+4.
 */
static __always_inline __u32 toeplitz(const __u8 *key, const __u8 *in, __u32 n)
{
	__u32 hash = 0;
	int j, i;

	/* A bounded loop (Linux 5.3+); unrolled, it spilled past the 512-byte stack. */
#pragma clang loop unroll(disable)
	for (j = 0; j < 12; j++) {
		__u64 v;
		__u8 b;

		if (j >= n)
			continue;
		v = ((__u64)key[j] << 32) | ((__u64)key[j + 1] << 24) |
		    ((__u64)key[j + 2] << 16) | ((__u64)key[j + 3] << 8) | key[j + 4];
		b = in[j];
		for (i = 0; i < 8; i++)
			if (b & (0x80 >> i))
				hash ^= (__u32)(v >> (8 - i));
	}
	return hash;
}

SEC("tc")
int rss_relay(struct __sk_buff *skb)
{
	__u32 zero = 0, ifindex = skb->ifindex, n = 0, hash = 0, queue = 0, idx;
	struct relay_counters *c = bpf_map_lookup_elem(&counters, &zero);
	struct rss_dir *dir = bpf_map_lookup_elem(&dirs, &ifindex);
	struct last_frame *lf;
	struct iphdr ip;
	__u8 in[12] = {};
	__u16 proto;
	__u64 *count;

	if (!c)
		return TC_ACT_OK;
	if (!dir) {
		c->no_route++;
		return TC_ACT_OK;
	}
	if (bpf_skb_load_bytes(skb, 12, &proto, 2) == 0 && proto == bpf_htons(ETH_P_IP) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) == 0) {
		__builtin_memcpy(&in[0], &ip.saddr, 4);
		__builtin_memcpy(&in[4], &ip.daddr, 4);
		n = 8;
		/* Fragments carry no ports (or only the first does): addresses only, as NICs. */
		if (ip.protocol == IPPROTO_TCP && !(ip.frag_off & bpf_htons(0x3fff)) &&
		    ip.ihl >= 5 &&
		    bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &in[8], 4) == 0)
			n = 12;
	}
	if (n == 12)
		c->tcp_hashed++;
	else if (n == 8)
		c->ip_hashed++;
	else
		c->unhashed++;
	if (n) {
		hash = toeplitz(dir->key, in, n);
		if (dir->indir_len) {
			idx = hash % dir->indir_len;
			if (idx < MAX_INDIR)
				queue = dir->indir[idx];
		}
	}
	if (queue >= MAX_QUEUES)
		queue = 0;
	idx = (dir->slot & 1) * MAX_QUEUES + queue;
	count = bpf_map_lookup_elem(&queue_counts, &idx);
	if (count)
		__sync_fetch_and_add(count, 1);
	lf = bpf_map_lookup_elem(&last, &zero);
	if (lf) {
		lf->hash = hash;
		lf->queue = queue;
	}
	/* A recorded rx queue: the egress device's queue pick keeps it (see above). */
	skb->queue_mapping = queue + 1;
	return bpf_redirect(dir->out_ifindex, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
