// The Batch API in OpenAI's shape: POST /v1/batches, GET /v1/batches, GET /v1/batches/{batch_id},
// POST /v1/batches/{batch_id}/cancel. The routes only record and read batches; the BatchRunner
// (src/batches) validates the input, runs the lines and writes the result files.
//
// Checked at creation (a 400, no batch is made): the input file exists for the caller and has
// purpose `batch`. Checked by validation (the batch becomes `failed` with `errors`): every line
// targets the batch's endpoint.

import type { FastifyInstance } from 'fastify';
import { FileStorage } from '../../files/file-storage.js';
import type { BatchRecord } from '../../store/batch-records.js';
import type { Runtime } from '../../runtime.js';
import { ApiError, invalidRequest, notFound } from '../../surfaces/errors.js';
import {
  BatchIdParamsSchema, BatchListSchema, BatchObjectSchema, CreateBatchSchema, DEFAULT_BATCH_LIST_LIMIT, ListBatchesQuerySchema,
  type BatchIdParams, type BatchObject, type CreateBatchBody, type ListBatchesQuery,
} from '../schemas/batches.js';
import { ErrorEnvelopeSchema, errorResponses } from '../../surfaces/common-schema.js';

export function toBatchObject(b: BatchRecord): BatchObject {
  return {
    id: b.id,
    object: 'batch',
    endpoint: b.endpoint,
    errors: b.errors === null ? null : { object: 'list', data: b.errors },
    input_file_id: b.inputFileId,
    completion_window: b.completionWindow,
    status: b.status,
    output_file_id: b.outputFileId,
    error_file_id: b.errorFileId,
    created_at: b.createdAt,
    in_progress_at: b.inProgressAt,
    expires_at: b.expiresAt,
    finalizing_at: b.finalizingAt,
    completed_at: b.completedAt,
    failed_at: b.failedAt,
    expired_at: b.expiredAt,
    cancelling_at: b.cancellingAt,
    cancelled_at: b.cancelledAt,
    request_counts: { ...b.requestCounts },
    metadata: b.metadata,
  };
}

const noSuchBatch = (id: string) => notFound(`no batch with id "${id}"`, 'batch_id');

export async function registerBatchRoutes(app: FastifyInstance, ctx: Runtime): Promise<void> {
  const runner = ctx.batches;

  app.post<{ Body: CreateBatchBody }>('/batches', {
    schema: {
      summary: 'Create a batch',
      body: CreateBatchSchema,
      response: { 200: BatchObjectSchema, ...errorResponses },
    },
  }, async (request) => {
    const { orgId, orgName, keyId } = request.caller;
    const body = request.body;
    const id = body.input_file_id;
    const file = FileStorage.isFileId(id) ? await ctx.store.getFile(orgId, id) : undefined;
    if (!file) throw invalidRequest(`input_file_id: no file with id "${id}"`, 'input_file_id', 'file_not_found');
    if (file.purpose !== 'batch') {
      throw invalidRequest(`input_file_id: the file ${id} has purpose "${file.purpose}"; a batch takes a file uploaded with purpose "batch"`,
        'input_file_id', 'invalid_file_purpose');
    }
    const batch = await runner.create({
      orgId, orgName, keyId, endpoint: body.endpoint, inputFileId: id, completionWindow: body.completion_window,
      metadata: body.metadata ?? null,
    });
    return toBatchObject(batch);
  });

  app.get<{ Querystring: ListBatchesQuery }>('/batches', {
    schema: {
      summary: 'List batches, newest first',
      querystring: ListBatchesQuerySchema,
      response: { 200: BatchListSchema, ...errorResponses },
    },
  }, async (request) => {
    const { orgId } = request.caller;
    const { limit = DEFAULT_BATCH_LIST_LIMIT, after, before } = request.query;
    // An unknown cursor would otherwise list from the top again, which loops a paginating client.
    for (const [param, cursor] of [['after', after], ['before', before]] as const) {
      if (cursor !== undefined && !(await ctx.store.getBatch(orgId, cursor))) {
        throw invalidRequest(`${param}: no batch with id "${cursor}"`, param, 'invalid_request');
      }
    }
    const opts: { limit: number; after?: string; before?: string } = { limit: limit + 1 };
    if (after !== undefined) opts.after = after;
    if (before !== undefined) opts.before = before;
    const rows = await ctx.store.listBatches(orgId, opts);
    // With `before` the rows are the nearest newer ones, newest first: the extra one is the first.
    const page = rows.length > limit ? (before !== undefined ? rows.slice(1) : rows.slice(0, limit)) : rows;
    const data = page.map(toBatchObject);
    return { object: 'list' as const, data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: rows.length > limit };
  });

  app.get<{ Params: BatchIdParams }>('/batches/:batch_id', {
    schema: {
      summary: 'Retrieve a batch',
      params: BatchIdParamsSchema,
      response: { 200: BatchObjectSchema, ...errorResponses },
    },
  }, async (request) => {
    const batch = await ctx.store.getBatch(request.caller.orgId, request.params.batch_id);
    if (!batch) throw noSuchBatch(request.params.batch_id);
    return toBatchObject(batch);
  });

  app.post<{ Params: BatchIdParams }>('/batches/:batch_id/cancel', {
    schema: {
      summary: 'Cancel a batch',
      description: 'Stops starting requests and aborts running ones; the batch ends as cancelled with the results finished so far.',
      params: BatchIdParamsSchema,
      response: { 200: BatchObjectSchema, ...errorResponses, 409: ErrorEnvelopeSchema },
    },
  }, async (request) => {
    const id = request.params.batch_id;
    const outcome = await runner.cancel(request.caller.orgId, id);
    switch (outcome.state) {
      case 'not_found':
        throw noSuchBatch(id);
      case 'not_cancellable':
        throw new ApiError(409, 'conflict_error', `the batch is ${outcome.batch.status}; only a validating or in_progress batch can be cancelled`,
          'batch_id', 'batch_not_cancellable');
      default:
        return toBatchObject(outcome.batch);
    }
  });
}
