// The Files API: POST /v1/files (multipart upload), GET /v1/files, GET /v1/files/{file_id},
// GET /v1/files/{file_id}/content and DELETE /v1/files/{file_id}.
//
// An upload streams to a temp file (never whole in memory), is checked while it streams (purpose
// `batch`: JSONL batch requests, batch-file.ts), is renamed into place and only then recorded in
// the store. Any failure on the way (bad field, bad batch line, size limit, client gone, store
// error) removes the temp file or the renamed one, so a failed upload leaves no bytes and no row.

import { randomBytes } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import multipart, { type MultipartFile } from '@fastify/multipart';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { BatchFileValidator, type BatchFileProblem } from '../../files/batch-file.js';
import { FileStorage, type TempFile } from '../../files/file-storage.js';
import type { FileRecord } from '../../store/store.js';
import type { Runtime } from '../../runtime.js';
import { ApiError, invalidRequest, notFound } from '../../surfaces/errors.js';
import { errorResponses, ErrorEnvelopeSchema } from '../../surfaces/common-schema.js';
import {
  FILE_PURPOSES, FileContentSchema, FileDeletedSchema, FileIdParamsSchema, FileListSchema, FileObjectSchema,
  ListFilesQuerySchema, MAX_FILE_LIST_LIMIT, UploadFileFormSchema,
  type FileIdParams, type FileObject, type ListFilesQuery,
} from '../schemas/files.js';

/**
 * Upload limits, read at each upload. maxFileBytes is the spec's "500 MB" taken as decimal
 * megabytes (500 * 1000 * 1000): the spec writes MiB where it means binary units (the 28 MiB line
 * cap). Mutable so that tests can lower it; a deployment leaves it alone.
 */
export const fileUploadLimits = { maxFileBytes: 500 * 1000 * 1000 };

/**
 * Room for the form around the file (boundaries, part headers, purpose) when judging a declared
 * Content-Length: a body longer than maxFileBytes plus this cannot hold a file within the limit.
 */
const FORM_OVERHEAD_BYTES = 2 * 1024 * 1024;

/** After a refused upload, how much of the rest of the body is read and dropped before the connection is cut. */
const MAX_DRAIN_BYTES = 16 * 1024 * 1024;

const PURPOSE_LIST = FILE_PURPOSES.map((p) => `"${p}"`).join(', ');

function toFileObject(f: FileRecord): FileObject {
  return {
    id: f.id, object: 'file', bytes: f.bytes, created_at: f.createdAt, filename: f.filename,
    purpose: f.purpose, status: f.status, status_details: f.statusDetails,
  };
}

function checkPurpose(value: string): string {
  if (!(FILE_PURPOSES as readonly string[]).includes(value)) {
    throw invalidRequest(`purpose must be one of ${PURPOSE_LIST} (got ${JSON.stringify(value.slice(0, 64))})`, 'purpose', 'invalid_request');
  }
  return value;
}

/** A Content-Type's non-empty `boundary` parameter, quoted or not. */
const MULTIPART_BOUNDARY = /;\s*boundary\s*=\s*(?:"[^"]+"|[^;\s"]+)/i;

const batchFileError = (problem: BatchFileProblem) => invalidRequest(`invalid batch file: ${problem.message}`, 'file', 'invalid_batch_file');

const fileTooLarge = (maxBytes: number) =>
  new ApiError(413, 'request_too_large', `the file is larger than the limit of ${maxBytes} bytes`, 'file', 'file_too_large');

/** C0 control characters and DEL: never part of a file's name (PostgreSQL text cannot even hold NUL). */
const CONTROL_CHARACTER = /[\u0000-\u001f\u007f]/;

/** Refuses a filename the stores could not keep as given, the same on SQLite and PostgreSQL. */
function checkFilename(filename: string): void {
  const bad = CONTROL_CHARACTER.exec(filename);
  if (bad) {
    const at = bad[0].codePointAt(0)!.toString(16).padStart(4, '0');
    throw invalidRequest(`the file's filename contains the control character U+${at.toUpperCase()}; rename the file`, 'file', 'invalid_request');
  }
}

interface ReceivedUpload {
  temp: TempFile;
  filename: string;
  bytes: number;
  purpose: string;
}

/**
 * Reads the form: `purpose` may come before or after `file`. A batch file's lines are checked as
 * they stream; when `purpose` is not known yet the check runs anyway and its verdict is applied
 * once it is. Throws ApiError; on any throw the temp file is already gone.
 */
async function receiveUpload(request: FastifyRequest, storage: FileStorage): Promise<ReceivedUpload> {
  const maxFileBytes = fileUploadLimits.maxFileBytes;
  // Refuse a body that is too long by its own account before writing any of it.
  const declaredBytes = Number(request.headers['content-length'] ?? 0);
  if (declaredBytes > maxFileBytes + FORM_OVERHEAD_BYTES) throw fileTooLarge(maxFileBytes);
  let purpose: string | undefined;
  let temp: TempFile | undefined;
  let received: { filename: string; bytes: number; problem: BatchFileProblem | null } | undefined;
  try {
    const parts = request.parts({ limits: { fileSize: maxFileBytes, fields: 8, fieldSize: 1024, parts: 16 } });
    for await (const part of parts) {
      const name = part.fieldname;
      if (part.type === 'field') {
        if (name === 'file') throw invalidRequest('file must be sent as a file (a form part with a filename)', 'file', 'invalid_request');
        if (name !== 'purpose') throw invalidRequest(`${name} is not a recognised field here (send file and purpose)`, name, 'invalid_request');
        if (purpose !== undefined) throw invalidRequest('purpose is given twice', 'purpose', 'invalid_request');
        purpose = checkPurpose(String(part.value));
        if (purpose === 'batch' && received?.problem) throw batchFileError(received.problem);
        continue;
      }
      if (name !== 'file') throw invalidRequest(`${name} is not a recognised field here (send file and purpose)`, name, 'invalid_request');
      if (temp) throw invalidRequest('only one file may be uploaded per request', 'file', 'invalid_request');
      checkFilename(part.filename);
      temp = storage.createTemp();
      received = await streamToTemp(part, temp, purpose);
      if (part.file.truncated) throw fileTooLarge(maxFileBytes);
    }
    if (!temp || !received) throw invalidRequest('file is required', 'file', 'invalid_request');
    if (purpose === undefined) throw invalidRequest('purpose is required', 'purpose', 'invalid_request');
    if (purpose === 'batch' && received.problem) throw batchFileError(received.problem);
    return { temp, filename: received.filename, bytes: received.bytes, purpose };
  } catch (err) {
    if (temp) await storage.discardTemp(temp);
    if (request.raw.destroyed && !(err instanceof ApiError)) {
      // The client went away mid-upload; nobody reads the reply, but keep it out of the error log.
      throw invalidRequest('the upload was interrupted', 'file', 'upload_interrupted');
    }
    throw err;
  }
}

/**
 * Copies one file part to the temp file, counting bytes and checking batch lines on the way. Stops
 * at the first bad line only when purpose is already known to be `batch`; otherwise the problem is
 * returned for the caller to judge once purpose is known.
 */
async function streamToTemp(part: MultipartFile, temp: TempFile, known: string | undefined) {
  const validator = known === undefined || known === 'batch' ? new BatchFileValidator() : undefined;
  let bytes = 0;
  let problem: BatchFileProblem | null = null;
  await pipeline(part.file, async function* check(source: AsyncIterable<Buffer>) {
    for await (const chunk of source) {
      bytes += chunk.length;
      if (validator && !problem) {
        problem = validator.push(chunk);
        if (problem && known === 'batch') throw batchFileError(problem);
      }
      yield chunk;
    }
  }, temp.stream);
  // A truncated part is refused by the caller; its lines were never all seen, so judge nothing.
  if (validator && !problem && !part.file.truncated) problem = validator.finish();
  return { filename: part.filename, bytes, problem };
}

/**
 * A refused upload may leave part of the body unread. Reading and dropping it lets the client finish
 * sending and read the error on a connection that stays usable; past MAX_DRAIN_BYTES it is cut.
 */
function drainRequest(request: FastifyRequest): void {
  const raw = request.raw;
  if (raw.readableEnded || raw.destroyed) return;
  raw.unpipe();
  let drained = 0;
  raw.on('data', (chunk: Buffer) => {
    drained += chunk.length;
    if (drained > MAX_DRAIN_BYTES) raw.destroy();
  });
  raw.resume();
}

export async function registerFileRoutes(app: FastifyInstance, ctx: Runtime): Promise<void> {
  const storage = await FileStorage.open(ctx.dataDir, ctx.filesDir !== undefined ? { filesDir: ctx.filesDir } : {});

  const getOwned = async (request: FastifyRequest<{ Params: FileIdParams }>): Promise<FileRecord> => {
    const id = request.params.file_id;
    const record = FileStorage.isFileId(id) ? await ctx.store.getFile(request.caller.orgId, id) : undefined;
    if (!record) throw notFound(`no file with id "${id}"`, 'file_id');
    return record;
  };

  // Its own scope, so the multipart parser exists for these routes only.
  await app.register(async (scope) => {
    await scope.register(multipart);

    scope.post('/files', {
      schema: {
        summary: 'Upload a file',
        consumes: ['multipart/form-data'],
        body: UploadFileFormSchema,
        response: { 200: FileObjectSchema, ...errorResponses, 413: ErrorEnvelopeSchema },
      },
      // The body is a stream the handler reads; the schema above documents the form, it validates nothing.
      validatorCompiler: () => () => true,
    }, async (request) => {
      if (!request.isMultipart()) {
        throw new ApiError(415, 'invalid_request_error', 'POST /files takes multipart/form-data with file and purpose', null, 'unsupported_media_type');
      }
      // Without a boundary the form cannot be read (the multipart parser throws a plain Error, a 500).
      if (!MULTIPART_BOUNDARY.test(request.headers['content-type'] ?? '')) {
        throw invalidRequest('the Content-Type multipart/form-data needs a boundary parameter (multipart/form-data; boundary=...)',
          null, 'invalid_multipart');
      }
      let upload: ReceivedUpload;
      try {
        upload = await receiveUpload(request, storage);
      } catch (err) {
        drainRequest(request);
        throw err;
      }
      const record: FileRecord = {
        id: `file-${randomBytes(12).toString('hex')}`,
        orgId: request.caller.orgId,
        bytes: upload.bytes,
        createdAt: Math.floor(Date.now() / 1000),
        filename: upload.filename,
        purpose: upload.purpose,
        status: 'uploaded',
        statusDetails: null,
      };
      try {
        await storage.commit(upload.temp, record.id);
      } catch (err) {
        await storage.discardTemp(upload.temp);
        throw err;
      }
      try {
        await ctx.store.insertFile(record);
      } catch (err) {
        await storage.remove(record.id);
        throw err;
      }
      return toFileObject(record);
    });

    scope.get<{ Querystring: ListFilesQuery }>('/files', {
      schema: {
        summary: 'List files, newest first',
        querystring: ListFilesQuerySchema,
        response: { 200: FileListSchema, ...errorResponses },
      },
    }, async (request) => {
      const { orgId } = request.caller;
      const { limit = MAX_FILE_LIST_LIMIT, purpose, after } = request.query;
      // An unknown cursor would otherwise list from the top again, which loops a paginating client.
      if (after !== undefined && !(await ctx.store.getFile(orgId, after))) {
        throw invalidRequest(`after: no file with id "${after}"`, 'after', 'invalid_request');
      }
      const rows = await ctx.store.listFiles(orgId, { limit: limit + 1, purpose, after });
      const data = rows.slice(0, limit).map(toFileObject);
      return { object: 'list' as const, data, has_more: rows.length > limit, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null };
    });

    scope.get<{ Params: FileIdParams }>('/files/:file_id', {
      schema: {
        summary: 'Retrieve a file',
        params: FileIdParamsSchema,
        response: { 200: FileObjectSchema, ...errorResponses },
      },
    }, async (request) => toFileObject(await getOwned(request)));

    scope.get<{ Params: FileIdParams }>('/files/:file_id/content', {
      schema: {
        summary: "Download a file's bytes",
        params: FileIdParamsSchema,
        response: {
          200: { description: 'The raw bytes.', content: { 'application/octet-stream': { schema: FileContentSchema } } },
          ...errorResponses,
        },
      },
    }, async (request, reply) => {
      const record = await getOwned(request);
      const opened = await storage.openRead(record.id);
      // The row was there but the bytes are gone: a delete won the race.
      if (!opened) throw notFound(`no file with id "${record.id}"`, 'file_id');
      return reply.type('application/octet-stream').header('content-length', opened.bytes).send(opened.stream);
    });

    scope.delete<{ Params: FileIdParams }>('/files/:file_id', {
      schema: {
        summary: 'Delete a file',
        params: FileIdParamsSchema,
        response: { 200: FileDeletedSchema, ...errorResponses },
      },
    }, async (request) => {
      const record = await getOwned(request);
      // Row first: once it is gone nobody can start a new read; a read in progress keeps its descriptor.
      if (!(await ctx.store.deleteFile(request.caller.orgId, record.id))) throw notFound(`no file with id "${record.id}"`, 'file_id');
      await storage.remove(record.id);
      return { id: record.id, object: 'file' as const, deleted: true };
    });
  });
}
