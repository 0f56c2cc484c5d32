// Which network addresses a completion callback may reach. A callback URL is chosen by the caller
// and the service POSTs to it with a caller-chosen bearer token, so without this policy any tenant
// could make the server call its own loopback, the cloud metadata endpoint or the private network
// it sits in. Pure functions over address strings; the sender applies them to every address it is
// about to connect to (a literal host, and each DNS answer of a name: see guarded-lookup.ts).
//
// Policy: only globally routable unicast is allowed. IPv4: everything outside the special-purpose
// ranges below (IANA IPv4 special-purpose registry: loopback, private, shared/CGNAT, link-local,
// "this network", documentation, benchmarking, multicast, reserved, broadcast). IPv6: only global
// unicast 2000::/3, minus its special blocks (2001::/23 IETF protocol assignments, Teredo included;
// documentation 2001:db8::/32 and 3fff::/20); addresses that embed an IPv4 address (IPv4-mapped
// ::ffff:0:0/96, NAT64 64:ff9b::/96, 6to4 2002::/16) are judged by the IPv4 address they embed.
// Everything else (::, ::1, fc00::/7, fe80::/10, fec0::/10, ff00::/8, IPv4-compatible ::/96,
// 64:ff9b:1::/48, 100::/64...) is not global unicast and is refused.

import { BlockList, isIPv4, isIPv6 } from 'node:net';

interface Range {
  list: BlockList;
  /** Completes "<address> is ...". */
  what: string;
}

function range(prefix: string, bits: number, family: 'ipv4' | 'ipv6', what: string): Range {
  const list = new BlockList();
  list.addSubnet(prefix, bits, family);
  return { list, what };
}

/** Checked in order: the first match names the reason. */
const REFUSED_V4: readonly Range[] = [
  range('255.255.255.255', 32, 'ipv4', 'the broadcast address'),
  range('0.0.0.0', 8, 'ipv4', 'an unspecified ("this network") address'),
  range('10.0.0.0', 8, 'ipv4', 'a private address'),
  range('100.64.0.0', 10, 'ipv4', 'a shared (carrier-grade NAT) address'),
  range('127.0.0.0', 8, 'ipv4', 'a loopback address'),
  range('169.254.0.0', 16, 'ipv4', 'a link-local address'),
  range('172.16.0.0', 12, 'ipv4', 'a private address'),
  range('192.0.0.0', 24, 'ipv4', 'a reserved (IETF protocol assignment) address'),
  range('192.0.2.0', 24, 'ipv4', 'a reserved (documentation) address'),
  range('192.88.99.0', 24, 'ipv4', 'a reserved (6to4 relay) address'),
  range('192.168.0.0', 16, 'ipv4', 'a private address'),
  range('198.18.0.0', 15, 'ipv4', 'a reserved (benchmarking) address'),
  range('198.51.100.0', 24, 'ipv4', 'a reserved (documentation) address'),
  range('203.0.113.0', 24, 'ipv4', 'a reserved (documentation) address'),
  range('224.0.0.0', 4, 'ipv4', 'a multicast address'),
  range('240.0.0.0', 4, 'ipv4', 'a reserved address'),
];

const GLOBAL_UNICAST_V6 = range('2000::', 3, 'ipv6', '');

/** Outside global unicast: named for the log where a name is known. */
const NON_GLOBAL_V6: readonly Range[] = [
  range('::', 128, 'ipv6', 'the unspecified address'),
  range('::1', 128, 'ipv6', 'the loopback address'),
  range('fc00::', 7, 'ipv6', 'a private (unique-local) address'),
  range('fe80::', 10, 'ipv6', 'a link-local address'),
  range('fec0::', 10, 'ipv6', 'a site-local address'),
  range('ff00::', 8, 'ipv6', 'a multicast address'),
];

/** Inside 2000::/3 but not globally reachable unicast. */
const REFUSED_GLOBAL_V6: readonly Range[] = [
  range('2001:db8::', 32, 'ipv6', 'a reserved (documentation) address'),
  range('2001::', 23, 'ipv6', 'a reserved (IETF protocol assignment, Teredo included) address'),
  range('3fff::', 20, 'ipv6', 'a reserved (documentation) address'),
];

/** The eight 16-bit words of a valid IPv6 address (zone id dropped; a dotted IPv4 tail allowed). */
function ipv6Words(address: string): number[] {
  let text = address.split('%')[0]!;
  const dotted = /^(.*:)(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a, b, c, d] = dotted.slice(2).map(Number) as [number, number, number, number];
    text = `${dotted[1]}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const halves = text.split('::');
  const head = halves[0] ? halves[0].split(':') : [];
  const tail = halves.length > 1 && halves[1] ? halves[1].split(':') : [];
  const zeros = halves.length > 1 ? Array<string>(8 - head.length - tail.length).fill('0') : [];
  return [...head, ...zeros, ...tail].map((w) => parseInt(w, 16));
}

const ipv4Of = (high: number, low: number): string => `${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`;

/** The IPv4 address an IPv6 address stands for (mapped, NAT64, 6to4), if it is such a one. */
function embeddedIpv4(words: number[]): string | undefined {
  const [w0, w1, w2, w3, w4, w5, w6, w7] = words as [number, number, number, number, number, number, number, number];
  if (w0 === 0 && w1 === 0 && w2 === 0 && w3 === 0 && w4 === 0 && w5 === 0xffff) return ipv4Of(w6, w7); // ::ffff:a.b.c.d
  if (w0 === 0x64 && w1 === 0xff9b && w2 === 0 && w3 === 0 && w4 === 0 && w5 === 0) return ipv4Of(w6, w7); // 64:ff9b::a.b.c.d
  if (w0 === 0x2002) return ipv4Of(w1, w2); // 2002:AABB:CCDD::/48
  return undefined;
}

/** What kind of refused IPv4 address this is, or undefined when it is allowed. */
function ipv4Refusal(address: string): string | undefined {
  return REFUSED_V4.find((r) => r.list.check(address, 'ipv4'))?.what;
}

/**
 * Why a callback may not connect to `address` (an IPv4 or IPv6 literal, no brackets), as a
 * sentence for the operator's log; undefined when the address is globally routable unicast.
 * A string that is no IP address at all is refused too: the caller resolves names first.
 */
export function refusedAddressReason(address: string): string | undefined {
  if (isIPv4(address)) {
    const what = ipv4Refusal(address);
    return what && `${address} is ${what}`;
  }
  if (!isIPv6(address)) return `${address} is not an IP address`;
  const embedded = embeddedIpv4(ipv6Words(address));
  if (embedded !== undefined) {
    const what = ipv4Refusal(embedded);
    return what && `${address} embeds ${embedded}, ${what}`;
  }
  const plain = address.split('%')[0]!;
  if (!GLOBAL_UNICAST_V6.list.check(plain, 'ipv6')) {
    const named = NON_GLOBAL_V6.find((r) => r.list.check(plain, 'ipv6'));
    return `${address} is ${named?.what ?? 'not a global unicast address'}`;
  }
  const hit = REFUSED_GLOBAL_V6.find((r) => r.list.check(plain, 'ipv6'));
  return hit && `${address} is ${hit.what}`;
}

/** The host of a URL as an IP literal (brackets removed), or undefined when it is a name. */
export function literalAddressOf(url: URL): string | undefined {
  const host = url.hostname.startsWith('[') ? url.hostname.slice(1, -1) : url.hostname;
  return isIPv4(host) || isIPv6(host) ? host : undefined;
}
