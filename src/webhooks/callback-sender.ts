// One HTTP POST of a completion callback, to a destination the address policy allows
// (address-policy.ts). node:http / node:https rather than fetch, because the check must hold for
// the very connection that is made: a name is resolved by our own `lookup`, which checks EVERY
// address of the answer and hands the socket only checked addresses, so a second DNS answer (DNS
// rebinding) cannot slip an internal address in between the check and the connect. TLS still
// verifies the certificate against the URL's host name. A literal IP host involves no lookup and
// is checked before the request starts.
//
// Redirects are not followed (node:http never does): a 3xx is a failed attempt, since following
// one would hand the bearer token to another address. The reply's body is never read.

import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import { literalAddressOf, refusedAddressReason } from './address-policy.js';

/** The destination is not allowed: a permanent failure, never retried. */
export class RefusedDestinationError extends Error {
  readonly code = 'ERR_REFUSED_DESTINATION';
}

/** Resolves a host name to all its addresses (dns.lookup by default; tests substitute answers). */
export type ResolveAll = (hostname: string) => Promise<LookupAddress[]>;

const systemResolveAll: ResolveAll = (hostname) => new Promise((resolve, reject) => {
  dnsLookup(hostname, { all: true }, (err, addresses) => (err ? reject(err) : resolve(addresses)));
});

/**
 * A socket `lookup` that resolves the name, refuses the connection (RefusedDestinationError) when
 * any address of the answer is refused, and otherwise returns exactly the checked addresses. Any
 * refused address refuses the name: a receiver that also answers with internal addresses is
 * misconfigured or probing, and a verdict that does not depend on which address a connection
 * happens to try is one the operator can act on.
 */
export function guardedLookup(allowPrivateAddresses: boolean, resolveAll: ResolveAll = systemResolveAll): LookupFunction {
  return (hostname, options: LookupOptions, callback) => {
    resolveAll(hostname).then((answer) => {
      const addresses = options.family === 4 || options.family === 6 ? answer.filter((a) => a.family === options.family) : answer;
      if (!allowPrivateAddresses) {
        for (const { address } of addresses) {
          const why = refusedAddressReason(address);
          if (why !== undefined) throw new RefusedDestinationError(`${hostname} resolves to a refused address: ${why}`);
        }
      }
      const first = addresses[0];
      if (!first) throw Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' });
      if (options.all) callback(null, addresses);
      else callback(null, first.address, first.family);
    }).catch((err: NodeJS.ErrnoException) => callback(err, ''));
  };
}

/** Why the URL's host may not be called without resolving anything, or undefined. */
export function refusedLiteralHost(url: URL, allowPrivateAddresses: boolean): string | undefined {
  if (allowPrivateAddresses) return undefined;
  const literal = literalAddressOf(url);
  return literal === undefined ? undefined : refusedAddressReason(literal);
}

export interface PostOptions {
  headers: Record<string, string>;
  /** Aborts the attempt (timeout or shutdown); the promise then rejects. */
  signal: AbortSignal;
  lookup: LookupFunction;
  allowPrivateAddresses: boolean;
}

/**
 * POSTs `body` and resolves with the reply's status code as soon as it arrives. Rejects with
 * RefusedDestinationError for a refused destination, with the abort reason when `signal` fires,
 * and with the network error otherwise.
 */
export function postCallback(url: URL, body: string, opts: PostOptions): Promise<number> {
  const refused = refusedLiteralHost(url, opts.allowPrivateAddresses);
  if (refused !== undefined) return Promise.reject(new RefusedDestinationError(refused));
  const send = url.protocol === 'https:' ? https.request : http.request;
  return new Promise((resolve, reject) => {
    const req = send(url, {
      method: 'POST',
      headers: { ...opts.headers, 'content-length': String(Buffer.byteLength(body)) },
      lookup: opts.lookup,
      signal: opts.signal,
      // A fresh connection per attempt: a pooled socket would skip the lookup above, and one
      // opened under another dispatcher's policy must not serve this one.
      agent: false,
    }, (res) => {
      resolve(res.statusCode ?? 0);
      res.destroy(); // the reply's body means nothing to us, however long it is
    });
    req.on('error', reject);
    req.end(body);
  });
}
