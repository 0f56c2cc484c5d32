// GET /v1/admin/usage?org=NAME&since=DATE: the usage ledger's totals per organization × model ×
// tier, the same JSON `sluice usage --json` prints. Operators only: the caller's key must be an
// admin key (`sluice keys create --org NAME --admin`), which reads every organization's usage;
// any other key gets 403 permission_error. Not part of the public spec, so hidden from OpenAPI.

import type { FastifyInstance } from 'fastify';
import Type from 'typebox';
import { parseSince, usageReport } from '../../billing/usage-report.js';
import type { Runtime } from '../../runtime.js';
import { ApiError, invalidRequest } from '../../surfaces/errors.js';

const UsageQuerySchema = Type.Object({
  org: Type.Optional(Type.String({ minLength: 1 })),
  since: Type.Optional(Type.String({ minLength: 1 })),
}, { additionalProperties: false });

export function registerUsageRoutes(app: FastifyInstance, ctx: Runtime): void {
  app.get<{ Querystring: { org?: string; since?: string } }>('/admin/usage', {
    schema: { hide: true, querystring: UsageQuerySchema },
  }, async (request) => {
    if (!(await ctx.store.isAdminKey(request.caller.keyId))) {
      throw new ApiError(403, 'permission_error', 'usage reports need an admin API key (sluice keys create --org NAME --admin)',
        null, 'admin_key_required');
    }
    const { org, since } = request.query;
    let sinceMs: number | undefined;
    if (since !== undefined) {
      try {
        sinceMs = parseSince(since);
      } catch (err) {
        throw invalidRequest((err as Error).message, 'since');
      }
    }
    return usageReport(ctx.store, { ...(org !== undefined && { orgName: org }), ...(sinceMs !== undefined && { sinceMs }) });
  });
}
