// How requests arrive, bounded, and the replies fastify's routing never sees.
//
// - Bodies: the whole body must arrive within bodyTimeoutSeconds of the request's headers, and,
//   once bodyRateGraceSeconds have passed, at an average of at least minBodyBytesPerSecond. A
//   request that breaks either gets a 408 in the error envelope and its connection is closed.
//   Generation itself is never timed here: only receiving the request is (Node's requestTimeout
//   stays 0, which would count the same thing but reply outside the envelope, and is checked only
//   every 30 s).
// - Connections (ConnectionGate): at most maxConnections open at once. Idle connections (none of
//   their requests in progress: fresh ones that have sent nothing yet, keep-alive ones between
//   requests) never lock anyone out: one arriving past the cap displaces the connection idle the
//   longest, and one address keeps at most maxIdleConnectionsPerAddress idle (its oldest idle one
//   goes first). Only when every connection is busy is the cap really full; then up to
//   reservedConnections more are let in for probes: GET /health and /ready answer on them, any
//   other request gets 503 and the connection is closed after each reply.
// - Malformed HTTP (Node's clientError: unparsable request, headers over 16 KiB, headers not
//   received within headersTimeout) is answered on the raw socket with the envelope too.
//
// The body guard reads progress from `socket.bytesRead`, polled on one shared timer; it never
// listens to the request's data (that would take chunks from the body parser).

import { randomUUID } from 'node:crypto';
import { Socket } from 'node:net';
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import { envelope, typeForStatus, type ErrorEnvelope } from '../surfaces/errors.js';

export interface TransportLimits {
  /** Seconds a request body may take to arrive, counted from its headers; 0: no limit. */
  bodyTimeoutSeconds: number;
  /** Average bytes per second a body must keep up once the grace period is over; 0: no minimum. */
  minBodyBytesPerSecond: number;
  /** Seconds a body may arrive at any rate before minBodyBytesPerSecond applies (slow starts, stalls). */
  bodyRateGraceSeconds: number;
  /** Connections open at once (idle ones give way to new ones, see ConnectionGate). 0: no cap. */
  maxConnections: number;
  /** Connections past maxConnections kept for /health and /ready while every other one is busy. */
  reservedConnections: number;
  /** Idle connections one client address may hold; past it, its longest idle one is closed. 0: no cap. */
  maxIdleConnectionsPerAddress: number;
}

/**
 * Suited to 500 MB uploads on ordinary links: an hour for a body (500 MB at 140 KB/s, about
 * 1.1 Mbit/s), and at least 1 KiB/s on average after 10 s, which only a stalled or dripping
 * client fails. 4096 connections is far above what one engine serves at once, with room for idle
 * keep-alive clients, and bounds the sockets a flood can hold.
 */
export const DEFAULT_TRANSPORT_LIMITS: TransportLimits = {
  bodyTimeoutSeconds: 3600,
  minBodyBytesPerSecond: 1024,
  bodyRateGraceSeconds: 10,
  maxConnections: 4096,
  reservedConnections: 16,
  maxIdleConnectionsPerAddress: 256,
};

/** The paths a reserved connection may ask for (probes; no key, no body, answered at once). */
export const PROBE_PATHS: ReadonlySet<string> = new Set(['/health', '/ready']);

interface Conn {
  address: string;
  /** Requests of this connection in progress (more than one only when pipelined). */
  numBusy: number;
  /** Let in past maxConnections: probes only, closed after each reply. */
  reserved: boolean;
}

/**
 * Counts a server's connections and enforces the connection limits (see the file comment). Installed
 * on the HTTP server in place of Node's maxConnections, which refuses everything, probes included,
 * once idle sockets fill it. Idle order is kept in insertion-ordered maps (re-inserted when a
 * connection turns idle), so the first entry is always the one idle the longest.
 */
export class ConnectionGate {
  private readonly conns = new Map<Socket, Conn>();
  /** Idle regular connections, longest idle first. */
  private readonly idle = new Map<Socket, Conn>();
  /** address -> its idle connections (regular or reserved), longest idle first. */
  private readonly idleByAddress = new Map<string, Map<Socket, Conn>>();
  private numRegular = 0;
  private numReserved = 0;

  constructor(private readonly limits: Pick<TransportLimits, 'maxConnections' | 'reservedConnections' | 'maxIdleConnectionsPerAddress'>) {}

  /** Watches `server`'s connections and requests. */
  install(server: { on(event: 'connection', fn: (socket: Socket) => void): unknown; on(event: 'request', fn: (req: IncomingMessage, res: ServerResponse) => void): unknown }): void {
    server.on('connection', (socket) => this.onConnection(socket));
    server.on('request', (req, res) => this.onRequest(req, res));
  }

  /** Whether `socket` was let in on the probe reserve (its requests other than probes are refused). */
  isReserved(socket: Socket | null | undefined): boolean {
    return socket != null && this.conns.get(socket)?.reserved === true;
  }

  /** Open connections: regular, and on the probe reserve. */
  get counts(): { regular: number; reserved: number } {
    return { regular: this.numRegular, reserved: this.numReserved };
  }

  private onConnection(socket: Socket): void {
    const conn: Conn = { address: socket.remoteAddress ?? '', numBusy: 0, reserved: false };
    const { maxConnections, reservedConnections } = this.limits;
    if (maxConnections > 0 && this.numRegular >= maxConnections) {
      const displaced = first(this.idle);
      if (displaced !== undefined) {
        this.close(displaced);
      } else {
        // Every regular connection is busy: the probe reserve, whose idle ones give way the same way.
        if (this.numReserved >= reservedConnections) {
          const reservedIdle = this.oldestIdleReserved();
          if (reservedIdle === undefined) {
            socket.destroy();
            return;
          }
          this.close(reservedIdle);
        }
        conn.reserved = true;
      }
    }
    this.conns.set(socket, conn);
    if (conn.reserved) this.numReserved++;
    else this.numRegular++;
    socket.once('close', () => this.forget(socket));
    this.markIdle(socket, conn);
  }

  private onRequest(req: IncomingMessage, res: ServerResponse): void {
    const socket = req.socket;
    const conn = this.conns.get(socket);
    if (conn === undefined) return;
    conn.numBusy++;
    this.unmarkIdle(socket, conn);
    res.once('close', () => {
      conn.numBusy--;
      if (conn.numBusy > 0 || socket.destroyed || !this.conns.has(socket)) return;
      // A probe's connection on the reserve holds no slot after its reply.
      if (conn.reserved) socket.end();
      else this.markIdle(socket, conn);
    });
  }

  private markIdle(socket: Socket, conn: Conn): void {
    if (!conn.reserved) this.idle.set(socket, conn);
    let mine = this.idleByAddress.get(conn.address);
    if (mine === undefined) this.idleByAddress.set(conn.address, (mine = new Map()));
    mine.set(socket, conn);
    const cap = this.limits.maxIdleConnectionsPerAddress;
    while (cap > 0 && mine.size > cap) this.close(first(mine)!);
  }

  private unmarkIdle(socket: Socket, conn: Conn): void {
    this.idle.delete(socket);
    const mine = this.idleByAddress.get(conn.address);
    mine?.delete(socket);
    if (mine?.size === 0) this.idleByAddress.delete(conn.address);
  }

  private oldestIdleReserved(): Socket | undefined {
    // A reserved connection is closed after its one reply, so an idle one has sent nothing yet and
    // arrival order (the map's) is idle order. NOTE: a scan over all connections, but only while
    // every regular one is busy and the reserve is full.
    for (const [socket, conn] of this.conns) if (conn.reserved && conn.numBusy === 0) return socket;
    return undefined;
  }

  /** Closes a connection now and forgets it (its 'close' event comes later). */
  private close(socket: Socket): void {
    this.forget(socket);
    socket.destroy();
  }

  private forget(socket: Socket): void {
    const conn = this.conns.get(socket);
    if (conn === undefined) return;
    this.conns.delete(socket);
    this.unmarkIdle(socket, conn);
    if (conn.reserved) this.numReserved--;
    else this.numRegular--;
  }
}

function first<K, V>(map: Map<K, V>): K | undefined {
  for (const key of map.keys()) return key;
  return undefined;
}

/** After a raw error reply, how long a client that keeps sending may hold the socket before it is destroyed. */
const LINGER_MS = 1000;

/**
 * Writes a complete HTTP/1.1 error reply on a socket and closes it: the reply is flushed, the
 * socket ended, and destroyed soon after if the client keeps it open. For replies outside a
 * ServerResponse (clientError) or instead of one whose headers were not sent. `requestId`: the
 * request's id (x-request-id); a new one where no request was parsed.
 */
export function writeRawError(socket: Socket, statusCode: number, body: ErrorEnvelope, requestId: string = randomUUID()): void {
  if (socket.destroyed || !socket.writable) {
    socket.destroy();
    return;
  }
  const json = JSON.stringify(body);
  socket.end(`HTTP/1.1 ${statusCode} ${STATUS_CODES[statusCode] ?? 'Error'}\r\n`
    + 'Content-Type: application/json; charset=utf-8\r\n'
    + `Content-Length: ${Buffer.byteLength(json)}\r\n`
    + `X-Request-Id: ${requestId}\r\n`
    + 'Connection: close\r\n\r\n'
    + json);
  setTimeout(() => socket.destroy(), LINGER_MS).unref();
}

/** Each socket's latest ServerResponse, so that a raw reply never cuts into a response already being sent. */
export class SocketResponses {
  private readonly latest = new WeakMap<Socket, ServerResponse>();

  track(socket: Socket, res: ServerResponse): void {
    this.latest.set(socket, res);
  }

  /** True when a response has started on this socket and not finished: raw bytes would corrupt it. */
  midResponse(socket: Socket): boolean {
    const res = this.latest.get(socket);
    return res !== undefined && res.headersSent && !res.writableFinished;
  }
}

/** Node's clientError codes -> status, envelope code and message. */
function describeClientError(err: NodeJS.ErrnoException & { reason?: string }): { status: number; code: string; message: string } {
  switch (err.code) {
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return { status: 408, code: 'request_timeout', message: 'the request headers did not arrive in time' };
    case 'HPE_HEADER_OVERFLOW':
      return { status: 431, code: 'headers_too_large', message: 'the request line and headers are larger than the limit of 16 KiB' };
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return { status: 413, code: 'request_too_large', message: 'the chunk extensions of the request body are too large' };
    default: {
      const why = err.reason ?? err.message;
      return { status: 400, code: 'malformed_request', message: `the request is not valid HTTP/1.1${why ? ` (${why})` : ''}` };
    }
  }
}

/** fastify's clientErrorHandler: the envelope on the raw socket, as Node would send its own reply. */
export function makeClientErrorHandler(responses: SocketResponses) {
  return function onClientError(err: NodeJS.ErrnoException, socket: Socket): void {
    if (err.code === 'ECONNRESET' || socket.destroyed || responses.midResponse(socket)) {
      socket.destroy();
      return;
    }
    const { status, code, message } = describeClientError(err);
    writeRawError(socket, status, envelope(typeForStatus(status), message, null, code));
  };
}

interface Watched {
  res: ServerResponse;
  requestId: string | undefined;
  startMs: number;
  startBytes: number;
}

function hasBody(req: IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
}

/** Cuts request bodies that arrive too slowly (see the file comment). One timer for all requests. */
export class BodyGuard {
  private readonly watched = new Map<IncomingMessage, Watched>();
  private timer: NodeJS.Timeout | undefined;
  private readonly checkMs: number;

  constructor(private readonly limits: TransportLimits) {
    const shortest = Math.min(
      limits.bodyTimeoutSeconds > 0 ? limits.bodyTimeoutSeconds : Infinity,
      limits.minBodyBytesPerSecond > 0 ? Math.max(limits.bodyRateGraceSeconds, 0.1) : Infinity,
    );
    // A quarter of the shortest limit, between 20 ms and 1 s: precise enough, and cheap.
    this.checkMs = Math.min(1000, Math.max(20, (shortest * 1000) / 4));
  }

  /**
   * Starts watching a request whose body is still to come (a no-op for bodiless or injected
   * requests). `requestId` goes on the 408 if it is cut.
   */
  watch(req: IncomingMessage, res: ServerResponse, requestId?: string): void {
    if (this.limits.bodyTimeoutSeconds <= 0 && this.limits.minBodyBytesPerSecond <= 0) return;
    // light-my-request (app.inject) has no real socket and no bytes on the wire to count.
    if (!(req.socket instanceof Socket) || req.complete || !hasBody(req)) return;
    this.watched.set(req, { res, requestId, startMs: Date.now(), startBytes: req.socket.bytesRead });
    this.timer ??= setInterval(() => this.check(), this.checkMs).unref();
  }

  /** Stops the timer and forgets every request (the server is closing). */
  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.watched.clear();
  }

  private check(): void {
    const now = Date.now();
    for (const [req, w] of this.watched) {
      if (req.complete || req.destroyed) {
        this.watched.delete(req);
        continue;
      }
      const seconds = (now - w.startMs) / 1000;
      const { bodyTimeoutSeconds: timeout, minBodyBytesPerSecond: minRate, bodyRateGraceSeconds: grace } = this.limits;
      if (timeout > 0 && seconds > timeout) {
        this.cut(req, w, `the request body did not arrive within ${timeout} s (the server's body timeout)`);
      } else if (minRate > 0 && seconds > grace && (req.socket.bytesRead - w.startBytes) / seconds < minRate) {
        this.cut(req, w, `the request body arrived slower than ${minRate} bytes/s on average (the server's minimum body rate)`);
      }
    }
    if (this.watched.size === 0) this.close();
  }

  private cut(req: IncomingMessage, w: Watched, message: string): void {
    this.watched.delete(req);
    // A reply already under way (a refusal sent before the body ended) is left as it is; the rest is dropped.
    if (w.res.headersSent) req.socket.destroy();
    else writeRawError(req.socket, 408, envelope('invalid_request_error', message, null, 'request_timeout'), w.requestId);
  }
}
