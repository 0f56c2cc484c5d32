// A real HTTP server on a free local port that records completion callbacks. Each hook() is its
// own path with its own script: what to answer to its 1st, 2nd, ... call (a status code, or
// 'hang' to never answer), then `after` for every later call. It listens on 127.0.0.1 and, where
// the host has IPv6, on ::1 at the same port, so one hook is reachable under every loopback
// spelling (`hook.urlAt('[::1]')`, `hook.urlAt('localhost')`, ...). Loopback destinations are
// refused by default: servers that deliver here need `allowPrivateAddresses: true`.

import http, { type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';

export type Answer = number | 'hang';

export interface ReceivedCall {
  method: string;
  headers: IncomingHttpHeaders;
  /** The parsed JSON body. */
  body: Record<string, any>;
  /** Date.now() when the call arrived. */
  at: number;
}

export interface Hook {
  /** http://127.0.0.1:PORT/hook/N */
  url: string;
  /** The same hook under another host spelling: `urlAt('127.1')` -> http://127.1:PORT/hook/N. */
  urlAt(host: string): string;
  calls: ReceivedCall[];
  /** Resolves once `count` calls arrived (rejects after `timeoutMs`). */
  waitForCalls(count: number, timeoutMs?: number): Promise<ReceivedCall[]>;
}

export interface WebhookReceiver {
  hook(script?: Answer[], after?: Answer): Hook;
  close(): Promise<void>;
}

export async function startWebhookReceiver(): Promise<WebhookReceiver> {
  // path -> its script and the calls it got
  const hooks = new Map<string, { script: Answer[]; after: Answer; calls: ReceivedCall[]; changed: () => void }>();
  let nextPath = 0;
  const handle: http.RequestListener = (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const hook = hooks.get(req.url ?? '');
      if (!hook) return void res.writeHead(404).end();
      const answer = hook.script[hook.calls.length] ?? hook.after;
      hook.calls.push({ method: req.method ?? '', headers: req.headers, body: JSON.parse(Buffer.concat(chunks).toString('utf8')), at: Date.now() });
      hook.changed();
      if (answer !== 'hang') res.writeHead(answer, { 'content-type': 'application/json' }).end('{"ok":true}');
    });
  };
  const server = http.createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  // The same port on ::1 when the host has IPv6 (else [::1] URLs simply find no receiver).
  let server6: http.Server | undefined = http.createServer(handle);
  await new Promise<void>((resolve) => {
    server6!.once('error', () => { server6 = undefined; resolve(); });
    server6!.listen(port, '::1', resolve);
  });

  return {
    hook(script = [], after = 200) {
      const path = `/hook/${nextPath++}`;
      let waiters: Array<() => void> = [];
      const state = { script, after, calls: [] as ReceivedCall[], changed: () => waiters.forEach((w) => w()) };
      hooks.set(path, state);
      return {
        url: `http://127.0.0.1:${port}${path}`,
        urlAt: (host) => `http://${host}:${port}${path}`,
        calls: state.calls,
        waitForCalls(count, timeoutMs = 10_000) {
          return new Promise((resolve, reject) => {
            const check = () => {
              if (state.calls.length < count) return;
              clearTimeout(timer);
              waiters = waiters.filter((w) => w !== check);
              resolve(state.calls);
            };
            const timer = setTimeout(() => {
              waiters = waiters.filter((w) => w !== check);
              reject(new Error(`${path}: ${state.calls.length} of ${count} calls after ${timeoutMs} ms`));
            }, timeoutMs);
            waiters.push(check);
            check();
          });
        },
      };
    },
    async close() {
      for (const s of [server, server6]) {
        if (!s) continue;
        s.closeAllConnections(); // hung calls included
        await new Promise<void>((resolve) => s.close(() => resolve()));
      }
    },
  };
}
