// Which addresses a completion callback may reach (issue 11, point 5): the pure address policy,
// and the guarded lookup that applies it to every DNS answer of the connection it is used for.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { LookupAddress } from 'node:dns';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { refusedAddressReason } from '../src/webhooks/address-policy.js';
import { guardedLookup, postCallback, RefusedDestinationError } from '../src/webhooks/callback-sender.js';

describe('refusedAddressReason', () => {
  it.each([
    ['127.0.0.1', /loopback/], ['127.255.255.254', /loopback/], ['10.20.30.40', /private/], ['172.16.0.1', /private/],
    ['172.31.255.255', /private/], ['192.168.0.1', /private/], ['100.64.0.1', /shared/], ['100.127.255.255', /shared/],
    ['169.254.169.254', /link-local/], ['0.0.0.0', /unspecified/], ['0.1.2.3', /unspecified/], ['255.255.255.255', /broadcast/],
    ['224.0.0.251', /multicast/], ['239.255.255.250', /multicast/], ['240.0.0.1', /reserved/], ['192.0.0.8', /reserved/],
    ['192.0.2.1', /documentation/], ['198.18.0.1', /benchmarking/], ['198.51.100.7', /documentation/], ['203.0.113.9', /documentation/],
    ['::', /unspecified/], ['::1', /loopback/], ['fc00::1', /unique-local/], ['fd12:3456::1', /unique-local/],
    ['fe80::1', /link-local/], ['fe80::1%eth0', /link-local/], ['febf::1', /link-local/], ['fec0::1', /site-local/],
    ['ff02::1', /multicast/], ['::ffff:127.0.0.1', /embeds 127\.0\.0\.1, a loopback/], ['::ffff:7f00:1', /embeds 127\.0\.0\.1/],
    ['::ffff:a9fe:a9fe', /embeds 169\.254\.169\.254/], ['64:ff9b::a00:1', /embeds 10\.0\.0\.1/], ['64:ff9b::192.168.1.1', /embeds 192\.168\.1\.1/],
    ['2002:7f00:1::1', /embeds 127\.0\.0\.1/], ['2002:c0a8:101::', /embeds 192\.168\.1\.1/], ['::7f00:1', /not a global unicast/],
    ['64:ff9b:1::a00:1', /not a global unicast/], ['100::1', /not a global unicast/], ['2001::1', /Teredo/],
    ['2001:db8::1', /documentation/], ['3fff::1', /documentation/], ['localhost', /not an IP address/],
  ])('%s is refused', (address, why) => {
    expect(refusedAddressReason(address)).toMatch(why);
  });

  it.each(['8.8.8.8', '1.1.1.1', '100.128.0.1', '172.32.0.1', '192.169.0.1', '223.255.255.255', '2606:4700:4700::1111',
    '2001:4860:4860::8888', '2a00:1450::1', '::ffff:8.8.8.8', '64:ff9b::808:808', '2002:808:808::1'])('%s is allowed', (address) => {
    expect(refusedAddressReason(address)).toBeUndefined();
  });
});

/** A lookup callback as a promise: [addresses] with options.all, else [address, family]. */
function lookUp(allowPrivate: boolean, answer: LookupAddress[], all: boolean): Promise<unknown> {
  const lookup = guardedLookup(allowPrivate, async () => answer);
  return new Promise((resolve, reject) => {
    lookup('receiver.example', { all }, (err, address, family) => (err ? reject(err) : resolve(all ? address : [address, family])));
  });
}

describe('guardedLookup', () => {
  const publicV4 = { address: '93.184.216.34', family: 4 };
  const publicV6 = { address: '2606:2800:220:1::1', family: 6 };

  it('hands the socket exactly the checked answer', async () => {
    await expect(lookUp(false, [publicV6, publicV4], true)).resolves.toEqual([publicV6, publicV4]);
    await expect(lookUp(false, [publicV4], false)).resolves.toEqual(['93.184.216.34', 4]);
  });

  it('refuses a name when any address of its answer is internal', async () => {
    const err = await lookUp(false, [publicV4, { address: 'fd00::5', family: 6 }], true).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RefusedDestinationError);
    expect((err as Error).message).toBe('receiver.example resolves to a refused address: fd00::5 is a private (unique-local) address');
    await expect(lookUp(false, [{ address: '10.1.1.1', family: 4 }], false)).rejects.toThrow(RefusedDestinationError);
  });

  it('lets internal answers through when private destinations are allowed', async () => {
    await expect(lookUp(true, [{ address: '127.0.0.1', family: 4 }], true)).resolves.toEqual([{ address: '127.0.0.1', family: 4 }]);
  });
});

describe('the connection is pinned to the checked answer', () => {
  let server: http.Server;
  let port: number;
  let calls = 0;
  beforeAll(async () => {
    server = http.createServer((_req, res) => { calls++; res.end(); });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(async () => { await new Promise<void>((resolve) => server.close(() => resolve())); });

  it('a name whose DNS answer is loopback never connects: the socket only gets checked addresses', async () => {
    let lookups = 0;
    const lookup = guardedLookup(false, async () => { lookups++; return [{ address: '127.0.0.1', family: 4 }]; });
    const sent = postCallback(new URL(`http://rebind.example:${port}/hook`), '{}', {
      headers: {}, signal: AbortSignal.timeout(5_000), lookup, allowPrivateAddresses: false,
    });
    await expect(sent).rejects.toThrow(RefusedDestinationError);
    expect(lookups).toBe(1); // the connection's own lookup: there is no separate check to race with
    expect(calls).toBe(0);
  });

  it('the same name is reached when private destinations are allowed', async () => {
    const lookup = guardedLookup(true, async () => [{ address: '127.0.0.1', family: 4 }]);
    const status = await postCallback(new URL(`http://rebind.example:${port}/hook`), '{}', {
      headers: {}, signal: AbortSignal.timeout(5_000), lookup, allowPrivateAddresses: true,
    });
    expect(status).toBe(200);
    expect(calls).toBe(1);
  });
});
