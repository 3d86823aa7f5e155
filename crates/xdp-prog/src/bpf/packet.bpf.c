// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * netchannel's steering for the AF_PACKET link, where no XDP program runs.
 *
 * Two programs share one `owned_ports` map (the same key as steer.bpf.c's):
 *
 *   packet_filter   SOCKET_FILTER, attached to the stack's AF_PACKET socket (SO_ATTACH_BPF):
 *                   keeps exactly the IPv4 TCP segments whose destination the stack owns and
 *                   drops everything else before it is copied to the socket.
 *   kernel_drop     TCX ingress on the interface: drops those same segments so that the
 *                   kernel's TCP never sees them (and never answers them with a RST). On
 *                   ingress the packet taps (AF_PACKET sockets bound to ETH_P_ALL) run
 *                   before TCX, so the stack's socket has its copy by then.
 *
 * Both read the frame from its Ethernet header (socket filters of SOCK_RAW packet sockets
 * and TCX programs both see the MAC header at offset 0) with bpf_skb_load_bytes, so a
 * GSO/GRO packet of 64 KiB costs one header read.
 *
 * Counters (PERCPU_ARRAY, one struct): `filtered_in` frames handed to the socket,
 * `kernel_dropped` frames kept from the kernel.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* TCX verdicts (linux/bpf.h of kernels 6.6+; older headers lack them). */
#define NC_TCX_NEXT (-1)
#define NC_TCX_DROP 2

#define MAX_OWNED 65536

struct owned_key {
	__u32 addr;  /* IPv4 destination, network byte order; 0 = any address */
	__u16 port;  /* TCP destination port, host byte order */
	__u16 pad;   /* always 0 */
};

struct packet_counters {
	__u64 filtered_in;
	__u64 kernel_dropped;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_OWNED);
	__type(key, struct owned_key);
	__type(value, __u8);
} owned_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct packet_counters);
} packet_counters SEC(".maps");

/* Returns 1 when the frame is an IPv4 TCP segment (not a fragment) to an owned destination. */
static __always_inline int owned(struct __sk_buff *skb)
{
	struct ethhdr eth;
	struct iphdr ip;
	__u16 dport;
	struct owned_key key = {};
	__u32 ihl;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return 0;
	if (eth.h_proto != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, sizeof(eth), &ip, sizeof(ip)) < 0)
		return 0;
	if (ip.protocol != IPPROTO_TCP)
		return 0;
	if (ip.frag_off & bpf_htons(0x3fff))
		return 0;
	ihl = ip.ihl * 4;
	if (ihl < sizeof(ip))
		return 0;
	/* The destination port: bytes 2..4 of the TCP header. */
	if (bpf_skb_load_bytes(skb, sizeof(eth) + ihl + 2, &dport, sizeof(dport)) < 0)
		return 0;

	key.port = bpf_ntohs(dport);
	key.addr = ip.daddr;
	if (bpf_map_lookup_elem(&owned_ports, &key))
		return 1;
	key.addr = 0;
	return bpf_map_lookup_elem(&owned_ports, &key) != NULL;
}

static __always_inline struct packet_counters *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&packet_counters, &zero);
}

SEC("socket")
int packet_filter(struct __sk_buff *skb)
{
	struct packet_counters *c;

	if (!owned(skb))
		return 0;
	c = counters();
	if (c)
		c->filtered_in++;
	/* Keep the whole frame. */
	return skb->len;
}

SEC("tcx/ingress")
int kernel_drop(struct __sk_buff *skb)
{
	struct packet_counters *c;

	if (!owned(skb))
		return NC_TCX_NEXT;
	c = counters();
	if (c)
		c->kernel_dropped++;
	return NC_TCX_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
