// Request ids, the access log and the HTTP metrics: what the app records about every request.
//
// Request id: a client's `x-request-id` is kept when it is 1..128 characters of [A-Za-z0-9._:+/=-]
// (ids that logs and headers carry safely: no spaces, quotes or control characters), otherwise
// replaced by a new UUID. It is the `request_id` of every log line written for the request
// (fastify's request logger) and comes back as `x-request-id` on every response, and as
// `request-id` on /v1/messages, where Anthropic's clients read it.
//
// Access log: one info line per request, when its reply has been sent: route template, method,
// status, organization id, tokens (generation routes) and duration. The raw URL is not logged:
// it is the caller's text (ids, query strings), while the route template is bounded. The same
// fields (with the organization's name) go to the dashboard's ring of recent requests
// (metrics/recent-requests.ts), which only admin keys read.

import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Usage } from '../engine/request.js';
import type { ServiceMetrics } from '../metrics/service-metrics.js';
import type { RecentRequests } from '../metrics/recent-requests.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Tokens of the generations this request ran (set by the generation routes; the access log reads it). */
    tokens?: { prompt: number; completion: number; cached: number };
  }
}

/** What a client's x-request-id may be to be kept. */
const REQUEST_ID = /^[A-Za-z0-9._:+/=-]{1,128}$/;

/** fastify's genReqId: the client's x-request-id when it is safe to keep, else a new UUID. */
export function requestIdFor(req: IncomingMessage): string {
  const given = req.headers['x-request-id'];
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
}

/** The route label of a request: its route template, or `unmatched` (404s: the path is the caller's). */
export function routeOf(request: FastifyRequest): string {
  return request.routeOptions.url ?? 'unmatched';
}

/**
 * Records the request's tokens as its usage object and the ledger count them: n choices share one
 * prompt (the first's, and its cache hit) and add up their output.
 */
export function noteUsage(request: FastifyRequest, results: readonly { usage: Usage }[]): void {
  const first = results[0];
  if (first === undefined) return;
  request.tokens = {
    prompt: first.usage.promptTokens,
    completion: results.reduce((n, r) => n + r.usage.completionTokens, 0),
    cached: first.usage.cachedTokens,
  };
}

/** Sets x-request-id on the reply (every response of the app, errors included). */
export function echoRequestId(request: FastifyRequest, reply: FastifyReply): void {
  if (!reply.hasHeader('x-request-id')) reply.header('x-request-id', request.id);
}

/** Where the access-log hook also keeps what it logs: the dashboard's recent requests. */
export interface RecentRequestsSink {
  ring: RecentRequests;
  /** Route templates not kept (the dashboard's own polling, probes, scrapes). */
  ignoredRoutes: ReadonlySet<string>;
}

/**
 * Root hooks of the app: the request id on every reply, and once the reply is sent, the HTTP
 * metrics, the access log line and (with `recent`) the entry of the recent requests.
 */
export function recordRequests(app: FastifyInstance, metrics: ServiceMetrics, recent?: RecentRequestsSink): void {
  app.addHook('onRequest', async (request, reply) => echoRequestId(request, reply));
  app.addHook('onResponse', async (request, reply) => {
    const route = routeOf(request);
    const status = reply.statusCode;
    const ms = reply.elapsedTime;
    const caller = request.caller as typeof request.caller | undefined;
    const durationMs = Math.round(ms * 1000) / 1000;
    metrics.observeHttp(route, request.method, status, caller?.orgName, ms / 1000);
    request.log.info({
      route, method: request.method, status, org_id: caller?.orgId ?? null,
      ...(request.tokens && { tokens: request.tokens }),
      duration_ms: durationMs,
    }, 'request');
    if (recent && !recent.ignoredRoutes.has(route)) {
      recent.ring.record({
        time: new Date().toISOString(), request_id: request.id, method: request.method, route, status,
        organization: caller?.orgName ?? null, tokens: request.tokens ? { ...request.tokens } : null, duration_ms: durationMs,
      });
    }
  });
}
