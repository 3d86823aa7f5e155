// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * netchannel's steering program.
 *
 * Redirects to the AF_XDP socket of the receiving queue exactly the IPv4 TCP segments whose
 * destination the stack owns, and passes every other frame (ARP, ICMP, IPv6, VLAN-tagged
 * frames, IPv4 fragments, the kernel's own TCP, ssh) to the kernel untouched.
 *
 * Maps (shared by both programs of this object):
 *   xsks          XSKMAP, key = rx queue index, value = AF_XDP socket fd (set from user space).
 *   owned_ports   HASH, key = struct owned_key { IPv4 destination in network byte order, or 0
 *                 for "any address"; TCP destination port in HOST byte order }. A segment is
 *                 owned when (daddr, dport) or (0, dport) is present.
 *   counters      PERCPU_ARRAY with one struct counters.
 *
 * Counters: every frame is counted in `seen`, then in exactly one of `redirected` (handed to
 * bpf_redirect_map; the socket may still drop it when its rings are full) or `passed`.
 * `no_socket` counts the owned segments that found no socket on their queue: they are also
 * counted in `passed`, since they go to the kernel.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Keep in sync with MAX_QUEUES in src/lib.rs. */
#define MAX_QUEUES 256
#define MAX_OWNED 65536

struct owned_key {
	__u32 addr;  /* IPv4 destination, network byte order; 0 = any address */
	__u16 port;  /* TCP destination port, host byte order */
	__u16 pad;   /* always 0 */
};

struct counters {
	__u64 seen;
	__u64 redirected;
	__u64 passed;
	__u64 no_socket;
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

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
	__type(value, struct counters);
} counters SEC(".maps");

/* Returns 1 when the frame is an IPv4 TCP segment to an owned destination. */
static __always_inline int owned(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct tcphdr *tcp;
	struct owned_key key = {};
	__u32 ihl;

	if ((void *)(eth + 1) > data_end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return 0;
	if (ip->protocol != IPPROTO_TCP)
		return 0;
	/* Fragments (MF set or a non-zero offset) go to the kernel, which reassembles. */
	if (ip->frag_off & bpf_htons(0x3fff))
		return 0;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return 0;
	tcp = (void *)ip + ihl;
	if ((void *)(tcp + 1) > data_end)
		return 0;

	key.port = bpf_ntohs(tcp->dest);
	key.addr = ip->daddr;
	if (bpf_map_lookup_elem(&owned_ports, &key))
		return 1;
	key.addr = 0;
	return bpf_map_lookup_elem(&owned_ports, &key) != NULL;
}

static __always_inline int steer(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&counters, &zero);
	long action;

	if (!c) /* cannot happen for index 0 of an array; keeps the verifier happy */
		return XDP_PASS;
	c->seen++;
	if (!owned(ctx)) {
		c->passed++;
		return XDP_PASS;
	}
	/* With no socket in the slot, bpf_redirect_map returns the low bits of flags: XDP_PASS. */
	action = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	if (action == XDP_REDIRECT) {
		c->redirected++;
		return XDP_REDIRECT;
	}
	c->no_socket++;
	c->passed++;
	return XDP_PASS;
}

/* For MTUs up to 3506 on veth, and for every driver without multi-buffer XDP. */
SEC("xdp")
int steer_linear(struct xdp_md *ctx)
{
	return steer(ctx);
}

/*
 * Multi-buffer variant: the headers are in the first buffer, which is all this program reads.
 * Sockets must bind with XDP_USE_SG to receive frames that span several buffers.
 */
SEC("xdp.frags")
int steer_frags(struct xdp_md *ctx)
{
	return steer(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
