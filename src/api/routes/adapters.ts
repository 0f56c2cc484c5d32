// LoRA adapters on a running server (issue 36), operators only (an admin API key, as for
// /v1/admin/usage; any other key is 403):
//   GET    /v1/admin/adapters       the adapters served as models: id, base model, rank, bytes, resident, requests
//   POST   /v1/admin/adapters       {id, base, dir, name?, pricing?, restricted?, granted_organizations?,
//                                    negotiated_pricing?}: loads the adapter in `dir` (PEFT layout, a path
//                                    on the server) into the base model's engine and serves it as model `id`
//   DELETE /v1/admin/adapters/{id}  stops serving it: refused from then on (404), its accepted requests
//                                    finish first
// Not part of the public spec, so hidden from OpenAPI.

import type { FastifyInstance } from 'fastify';
import Type, { type Static } from 'typebox';
import { ModelPriceSchema, type CatalogModel } from '../../config/catalog.js';
import type { Runtime } from '../../runtime.js';
import { isSluiceError } from '../../errors.js';
import { ApiError, invalidRequest } from '../../surfaces/errors.js';

const ADAPTER_FILE_ERRORS = new Set(['model_file_missing', 'model_file_invalid', 'unsupported_model', 'invalid_argument']);

const AdapterBodySchema = Type.Object({
  id: Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:/-]*$', maxLength: 256 }),
  base: Type.String({ minLength: 1, maxLength: 256 }),
  dir: Type.String({ minLength: 1, maxLength: 4096 }),
  name: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
  pricing: Type.Optional(Type.Array(ModelPriceSchema, { maxItems: 3 })),
  restricted: Type.Optional(Type.Boolean()),
  granted_organizations: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { maxItems: 10_000 })),
  negotiated_pricing: Type.Optional(Type.Record(Type.String({ maxLength: 256 }), Type.Array(ModelPriceSchema, { maxItems: 3 }))),
}, { additionalProperties: false });
type AdapterBody = Static<typeof AdapterBodySchema>;

export function registerAdapterRoutes(app: FastifyInstance, ctx: Runtime): void {
  const requireAdmin = async (keyId: string) => {
    if (!(await ctx.store.isAdminKey(keyId))) {
      throw new ApiError(403, 'permission_error', 'adapters are managed with an admin API key (sluice keys create --org NAME --admin)',
        null, 'admin_key_required');
    }
  };

  app.get('/admin/adapters', { schema: { hide: true } }, async (request) => {
    await requireAdmin(request.caller.keyId);
    return { object: 'list' as const, data: ctx.registry.adapters() };
  });

  app.post<{ Body: AdapterBody }>('/admin/adapters', { schema: { hide: true, body: AdapterBodySchema } }, async (request, reply) => {
    await requireAdmin(request.caller.keyId);
    const b = request.body;
    const entry: CatalogModel = {
      id: b.id, checkpoint: '', lora: b.dir,
      ...(b.name !== undefined && { name: b.name }),
      ...(b.pricing !== undefined && { pricing: b.pricing }),
      ...(b.restricted !== undefined && { restricted: b.restricted }),
      ...(b.granted_organizations !== undefined && { granted_organizations: b.granted_organizations }),
      ...(b.negotiated_pricing !== undefined && { negotiated_pricing: b.negotiated_pricing }),
    };
    try {
      await ctx.registry.addAdapter(entry, b.base);
    } catch (err) {
      // The operator's adapter does not load (a missing or malformed file, an unsupported form, a
      // shape that does not fit the base): their input, said as such.
      if (isSluiceError(err) && ADAPTER_FILE_ERRORS.has(err.code)) throw invalidRequest(err.message, 'dir');
      throw err;
    }
    return reply.code(201).send(ctx.registry.adapters().find((a) => a.id === b.id));
  });

  app.delete<{ Params: { id: string } }>('/admin/adapters/:id', { schema: { hide: true } }, async (request) => {
    await requireAdmin(request.caller.keyId);
    const { id } = request.params;  // an id with '/' comes URL-encoded (decoded here)
    await ctx.registry.removeAdapter(id);
    return { id, object: 'adapter' as const, deleted: true };
  });
}
