// The routes a built fastify app registers, read from printRoutes({commonPrefix: false}): one line
// per route node, four columns of indent per level, `segment (METHOD, ...)` where a route ends.
// Callers should check the result against app.hasRoute (as the fuzz test does) so that a change of
// printRoutes' format cannot pass as an empty or garbled table.

import type { FastifyInstance } from 'fastify';

export interface RegisteredRoute {
  method: string;
  /** fastify's form, parameters as `:name` (e.g. `/v1/files/:file_id/content`). */
  url: string;
}

export function registeredRoutes(app: FastifyInstance, opts: { withHead?: boolean } = {}): RegisteredRoute[] {
  const routes: RegisteredRoute[] = [];
  // parents[d]: the full path of the node last seen at depth d.
  const parents: string[] = [];
  for (const raw of app.printRoutes({ commonPrefix: false }).split('\n')) {
    const line = raw.replace(/\u00a0/g, ' ');
    const m = /^((?:[│ ] {3})*)[├└]── (\S+)(?: \(([^)]*)\))?$/.exec(line);
    if (!m) continue;
    const depth = m[1]!.length / 4;
    const url = (depth > 0 ? parents[depth - 1]! : '') + m[2]!;
    parents.length = depth;
    parents.push(url);
    for (const method of (m[3] ?? '').split(',').map((s) => s.trim()).filter((s) => s !== '')) {
      if (method === 'HEAD' && !opts.withHead) continue;
      routes.push({ method, url });
    }
  }
  return routes;
}
