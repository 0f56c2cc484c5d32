// Schemas of the Files API (spec: File, endpoints 6-10). The upload body is multipart, read as a
// stream by the route; its schema here only documents the form for the OpenAPI document.

import Type, { type Static } from 'typebox';

/** Purposes accepted as-is. Only `batch` files are checked (as JSONL batch input); the rest are stored opaque. */
export const FILE_PURPOSES = ['batch', 'assistants', 'fine-tune', 'vision', 'user_data', 'evals'] as const;
export type FilePurpose = (typeof FILE_PURPOSES)[number];

export const FileObjectSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('file'),
  bytes: Type.Integer({ minimum: 0 }),
  created_at: Type.Integer({ description: 'Upload time, Unix seconds.' }),
  filename: Type.String(),
  purpose: Type.String(),
  status: Type.String({ description: 'Always `uploaded`.' }),
  status_details: Type.Union([Type.String(), Type.Null()]),
}, { additionalProperties: false });
export type FileObject = Static<typeof FileObjectSchema>;

export const FileListSchema = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(FileObjectSchema),
  has_more: Type.Boolean(),
  first_id: Type.Union([Type.String(), Type.Null()]),
  last_id: Type.Union([Type.String(), Type.Null()]),
}, { additionalProperties: false });

export const FileDeletedSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('file'),
  deleted: Type.Boolean(),
}, { additionalProperties: false });

/** Default and largest page of GET /files (OpenAI's bounds). */
export const MAX_FILE_LIST_LIMIT = 10_000;

export const ListFilesQuerySchema = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_FILE_LIST_LIMIT, default: MAX_FILE_LIST_LIMIT })),
  purpose: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })),
  after: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'A file id: list the files uploaded before it.' })),
});
export type ListFilesQuery = Static<typeof ListFilesQuerySchema>;

export const FileIdParamsSchema = Type.Object({ file_id: Type.String({ minLength: 1, maxLength: 128 }) });
export type FileIdParams = Static<typeof FileIdParamsSchema>;

/** Documentation only: the route parses the multipart stream itself. */
export const UploadFileFormSchema = Type.Object({
  file: Type.String({ format: 'binary', description: 'The file; a `batch` file is JSONL, one request per line, each line at most 28 MiB.' }),
  purpose: Type.Union(FILE_PURPOSES.map((p) => Type.Literal(p))),
}, { additionalProperties: false });

/** The content route's 200: raw bytes. */
export const FileContentSchema = Type.String({ format: 'binary' });
