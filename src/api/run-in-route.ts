// A foreground request's run from a route: the request lifecycle (serving/lifecycle.ts) with the
// client's disconnect as its signal, then what the HTTP reply reports of it (the access line's
// token counts, the server-timing header).

import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Runtime } from '../runtime.js';
import type { EndObject, Ended, RunSpec } from '../serving/lifecycle.js';
import { disconnectSignal } from './disconnect.js';
import { noteUsage } from './request-log.js';
import { serverTiming } from './server-timing.js';

export type RouteRun<Out extends EndObject> = Omit<RunSpec<Out>, 'mode' | 'signal' | 'onEndFailed'>;

export async function runInRoute<Out extends EndObject>(runtime: Runtime, request: FastifyRequest, reply: FastifyReply,
  spec: RouteRun<Out>): Promise<Ended<Out>> {
  const id = spec.billed.requestId;
  const ended = await runtime.lifecycle.run({
    ...spec,
    mode: 'foreground',
    signal: disconnectSignal(reply),
    onEndFailed: (err, which) => request.log.error({ err, id }, which === 'finished'
      ? 'could not store the end of a finished request; storing it as failed'
      : 'could not store the end of a failed request'),
  });
  noteUsage(request, ended.results);
  reply.header('server-timing', serverTiming(ended.results.map((r) => r.timings)));
  return ended;
}
