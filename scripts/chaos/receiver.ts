// The completion webhook receiver: a node:http server on 127.0.0.1 inside the chaos process (so it
// outlives every kill of the server) with one path per organization, /hook/<org>. It records
// every call: the hook's organization, the body's id, the Authorization header and the body.
//
// To exercise retries, the first call for some ids (a seeded tenth of them) is answered 503; the
// dispatcher must come back (after its 1 s backoff) and is then answered 200. Every other call is
// answered 200 at once.

import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { hash32 } from './rng.js';

export interface ReceivedCall {
  /** The organization whose hook was called (undefined: a path no organization was given). */
  org: string | undefined;
  /** body.id, or undefined when the body had none or was not JSON. */
  id: string | undefined;
  authorization: string | undefined;
  body: any;
  status: number;
  at: number;
}

export interface Receiver {
  hookUrl(org: string): string;
  calls: ReceivedCall[];
  /** body id -> its calls, in arrival order */
  byId: Map<string, ReceivedCall[]>;
  /** Calls answered 503 on purpose. */
  refusedOnPurpose: number;
  close(): Promise<void>;
}

export async function startReceiver(seed: string, orgs: readonly string[]): Promise<Receiver> {
  const calls: ReceivedCall[] = [];
  const byId = new Map<string, ReceivedCall[]>();
  const state = { refusedOnPurpose: 0 };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const match = /^\/hook\/([^/?]+)$/.exec(req.url ?? '');
      const org = match && orgs.includes(match[1]!) ? match[1] : undefined;
      let body: any;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        body = Buffer.concat(chunks).toString('utf8');
      }
      const id = typeof body?.id === 'string' ? body.id as string : undefined;
      const earlier = id === undefined ? [] : (byId.get(id) ?? []);
      const refuse = id !== undefined && earlier.length === 0 && hash32(`${seed}:${id}`) % 10 === 0;
      const status = refuse ? 503 : 200;
      if (refuse) state.refusedOnPurpose++;
      const received: ReceivedCall = { org, id, authorization: req.headers.authorization, body, status, at: Date.now() };
      calls.push(received);
      if (id !== undefined) byId.set(id, [...earlier, received]);
      res.writeHead(status, { 'content-type': 'application/json' }).end(refuse ? '{"retry":true}' : '{"ok":true}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    hookUrl: (org) => `http://127.0.0.1:${port}/hook/${org}`,
    calls,
    byId,
    get refusedOnPurpose() { return state.refusedOnPurpose; },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
