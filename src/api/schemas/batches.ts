// Schemas of the Batch API (spec: Batch, endpoint 11; the rest in OpenAI's Batch API shape).

import Type, { type Static } from 'typebox';
import { BATCH_URLS } from '../../files/batch-file.js';
import { BATCH_STATUSES, type BatchStatus } from '../../store/batch-records.js';
import { METADATA_LIMITS } from '../../surfaces/common-schema.js';

/** The windows a batch may ask for; OpenAI's "24h" runs as flex. */
export const BATCH_COMPLETION_WINDOWS = ['asap', 'standard', 'flex', '24h'] as const;

/** Default and largest page of GET /batches (spec: 1 to 200, default 25). */
export const DEFAULT_BATCH_LIST_LIMIT = 25;
export const MAX_BATCH_LIST_LIMIT = 200;

const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()]);

/** OpenAI's batch metadata: at most 16 string pairs, keys up to 64 and values up to 512 characters. */
const BatchMetadataSchema = Type.Record(Type.String(), Type.String({ maxLength: METADATA_LIMITS.maxValueLength }), {
  maxProperties: METADATA_LIMITS.maxKeys,
  propertyNames: { maxLength: METADATA_LIMITS.maxKeyLength },
});

export const CreateBatchSchema = Type.Object({
  input_file_id: Type.String({ minLength: 1, maxLength: 128, description: 'A file uploaded with purpose `batch`.' }),
  endpoint: Type.Unsafe<string>({ type: 'string', enum: [...BATCH_URLS], description: 'Every line of the file must target it.' }),
  completion_window: Type.Unsafe<(typeof BATCH_COMPLETION_WINDOWS)[number]>({
    type: 'string', enum: [...BATCH_COMPLETION_WINDOWS], description: 'The window the requests run at; `24h` runs as flex. Also sets the deadline.',
  }),
  metadata: Type.Optional(Nullable(BatchMetadataSchema)),
}, { additionalProperties: false });
export type CreateBatchBody = Static<typeof CreateBatchSchema>;

const Time = Nullable(Type.Integer({ description: 'Unix seconds.' }));

export const BatchObjectSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('batch'),
  endpoint: Type.String(),
  errors: Nullable(Type.Object({
    object: Type.Literal('list'),
    data: Type.Array(Type.Object({
      code: Type.String(),
      message: Type.String(),
      line: Nullable(Type.Integer()),
      param: Nullable(Type.String()),
    }, { additionalProperties: false })),
  }, { additionalProperties: false })),
  input_file_id: Type.String(),
  completion_window: Type.String(),
  status: Type.Unsafe<BatchStatus>({ type: 'string', enum: [...BATCH_STATUSES] }),
  output_file_id: Nullable(Type.String()),
  error_file_id: Nullable(Type.String()),
  created_at: Type.Integer(),
  in_progress_at: Time,
  expires_at: Time,
  finalizing_at: Time,
  completed_at: Time,
  failed_at: Time,
  expired_at: Time,
  cancelling_at: Time,
  cancelled_at: Time,
  request_counts: Type.Object({
    total: Type.Integer({ minimum: 0 }),
    completed: Type.Integer({ minimum: 0 }),
    failed: Type.Integer({ minimum: 0 }),
  }, { additionalProperties: false }),
  metadata: Nullable(Type.Record(Type.String(), Type.String())),
}, { additionalProperties: false });
export type BatchObject = Static<typeof BatchObjectSchema>;

export const BatchListSchema = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(BatchObjectSchema),
  first_id: Nullable(Type.String()),
  last_id: Nullable(Type.String()),
  has_more: Type.Boolean(),
}, { additionalProperties: false });

export const ListBatchesQuerySchema = Type.Object({
  after: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'A batch id: list the batches created before it.' })),
  before: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'A batch id: list the batches created after it.' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_BATCH_LIST_LIMIT, default: DEFAULT_BATCH_LIST_LIMIT })),
});
export type ListBatchesQuery = Static<typeof ListBatchesQuerySchema>;

export const BatchIdParamsSchema = Type.Object({ batch_id: Type.String({ minLength: 1, maxLength: 128 }) });
export type BatchIdParams = Static<typeof BatchIdParamsSchema>;
