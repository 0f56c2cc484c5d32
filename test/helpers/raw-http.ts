// Raw HTTP/1.1 over node:net, for requests no HTTP client will send (malformed, slow, partial) and
// for reading exactly what the server wrote back, including replies written on the raw socket.

import net from 'node:net';

export interface RawReply {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The whole text received. */
  text: string;
  /** Whether the server closed the connection (within the wait). */
  closed: boolean;
}

/** Parses the first HTTP response in `text` (latin1: one char per byte; Content-Length or chunked body); undefined if none. */
export function parseFirstReply(text: string, closed: boolean): RawReply | undefined {
  const headEnd = text.indexOf('\r\n\r\n');
  if (headEnd === -1) return undefined;
  const [statusLine, ...lines] = text.slice(0, headEnd).split('\r\n');
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine ?? '')?.[1]);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  let rest = text.slice(headEnd + 4);
  let body = rest;
  if (headers['content-length'] !== undefined) {
    body = Buffer.from(rest, 'latin1').subarray(0, Number(headers['content-length'])).toString('utf8');
  } else if (headers['transfer-encoding'] === 'chunked') {
    body = '';
    for (;;) {
      const eol = rest.indexOf('\r\n');
      const size = parseInt(rest.slice(0, eol), 16);
      if (!(size > 0)) break;
      body += rest.slice(eol + 2, eol + 2 + size);
      rest = rest.slice(eol + 2 + size + 2);
    }
  }
  return { status, headers, body, text, closed };
}

export interface RawOptions {
  /** Pieces written one after another, `gapMs` apart (default: one write). */
  gapMs?: number;
  /** How long to wait for the server to close after the writes (default 3 s). */
  waitMs?: number;
  /** Stop writing as soon as any reply arrives (a slow client that listens). */
  stopOnReply?: boolean;
}

/** Writes `pieces` to a new connection and collects what comes back until the server closes or waitMs passes. */
export function rawExchange(origin: string, pieces: string | Buffer | Array<string | Buffer>, opts: RawOptions = {}): Promise<RawReply & { raw: string }> {
  const { hostname, port } = new URL(origin);
  const list = Array.isArray(pieces) ? pieces : [pieces];
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname);
    let text = '';
    let closed = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = () => {
      clearTimeout(timer);
      socket.destroy();
      const reply = parseFirstReply(text, closed);
      if (!reply) reject(new Error(`no HTTP reply (closed: ${closed}): ${JSON.stringify(text.slice(0, 200))}`));
      else resolve({ ...reply, raw: text });
    };
    socket.on('data', (d) => { text += d.toString('latin1'); });
    socket.on('error', () => {}); // a reset after the reply is expected for some cases
    socket.on('close', () => { closed = true; finish(); });
    socket.on('connect', async () => {
      for (let i = 0; i < list.length; i++) {
        if (socket.destroyed || (opts.stopOnReply && text !== '')) break;
        socket.write(list[i]!);
        if (opts.gapMs && i < list.length - 1) await new Promise((r) => setTimeout(r, opts.gapMs));
      }
      timer = setTimeout(finish, opts.waitMs ?? 3000);
    });
  });
}

/** A request head (with CRLFs) and body. */
export function httpRequest(method: string, path: string, headers: Record<string, string | number>, body = ''): string {
  const lines = [`${method} ${path} HTTP/1.1`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  return `${lines.join('\r\n')}\r\n\r\n${body}`;
}
