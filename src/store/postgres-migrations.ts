// Schema migrations of the PostgreSQL store, applied in order. The schema_migrations table records
// each one applied (its version, name and time); each runs in its own transaction together with its
// row, and every start migrates under a session advisory lock, so replicas starting at once apply
// each migration exactly once and the others wait, then find nothing to do. Append new migrations;
// never edit a released one.
//
// The tables are those of the SQLite store (migrations.ts) as they stand after its last migration,
// in PostgreSQL types: every integer SQLite keeps (Unix seconds and milliseconds, token counts,
// byte sizes and offsets) is BIGINT, read back as an exact JS number (postgres-store.ts); flags are
// BOOLEAN; JSON is kept as the exact TEXT written (webhook bodies are POSTed byte for byte);
// money stays exact decimal strings (TEXT); insertion order is a BIGINT identity column.

import type { PoolClient } from 'pg';

export interface PostgresMigration {
  name: string;
  sql: string;
}

export const POSTGRES_MIGRATIONS: readonly PostgresMigration[] = [
  {
    name: 'initial',
    sql: `
    CREATE TABLE organizations (
      id         TEXT PRIMARY KEY,
      name       TEXT NOT NULL UNIQUE,
      created_at BIGINT NOT NULL
    );
    CREATE TABLE api_keys (
      id         TEXT PRIMARY KEY,
      org_id     TEXT NOT NULL REFERENCES organizations(id),
      hash       TEXT NOT NULL UNIQUE,             -- hex SHA-256 of the key
      prefix     TEXT NOT NULL,
      created_at BIGINT NOT NULL,
      revoked_at BIGINT,
      admin      BOOLEAN NOT NULL DEFAULT FALSE    -- may read every organization's usage
    );
    CREATE TABLE responses (
      id         TEXT PRIMARY KEY,
      org_id     TEXT NOT NULL REFERENCES organizations(id),
      status     TEXT NOT NULL,
      created_at BIGINT NOT NULL,
      updated_at BIGINT NOT NULL,
      body       TEXT NOT NULL                     -- the response object as JSON
    );
    CREATE INDEX responses_status ON responses(status);
    CREATE TABLE response_inputs (
      response_id TEXT PRIMARY KEY,
      org_id      TEXT NOT NULL REFERENCES organizations(id),
      items       TEXT NOT NULL                    -- the request's input items as JSON, in order
    );
    CREATE TABLE files (
      seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- upload order
      id             TEXT NOT NULL UNIQUE,
      org_id         TEXT NOT NULL REFERENCES organizations(id),
      bytes          BIGINT NOT NULL,
      created_at     BIGINT NOT NULL,
      filename       TEXT NOT NULL,
      purpose        TEXT NOT NULL,
      status         TEXT NOT NULL,
      status_details TEXT
    );
    CREATE INDEX files_org ON files(org_id, seq);
    CREATE TABLE idempotency (
      org_id       TEXT NOT NULL,
      scope        TEXT NOT NULL,
      key          TEXT NOT NULL,
      request_hash TEXT NOT NULL,
      created_at   BIGINT NOT NULL,
      status_code  INTEGER,                        -- NULL while the first request runs
      body         TEXT,
      PRIMARY KEY (org_id, scope, key)
    );
    CREATE TABLE batches (
      seq                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- creation order
      id                 TEXT NOT NULL UNIQUE,
      org_id             TEXT NOT NULL REFERENCES organizations(id),
      org_name           TEXT NOT NULL,
      key_id             TEXT NOT NULL,
      endpoint           TEXT NOT NULL,
      input_file_id      TEXT NOT NULL,
      completion_window  TEXT NOT NULL,
      status             TEXT NOT NULL,
      errors             TEXT,                     -- JSON list, or NULL
      output_file_id     TEXT,
      error_file_id      TEXT,
      metadata           TEXT,                     -- JSON object of strings, or NULL
      total              BIGINT NOT NULL DEFAULT 0,
      completed          BIGINT NOT NULL DEFAULT 0,
      failed             BIGINT NOT NULL DEFAULT 0,
      next_line          BIGINT NOT NULL DEFAULT 1,
      next_offset        BIGINT NOT NULL DEFAULT 0,
      created_at         BIGINT NOT NULL,
      in_progress_at     BIGINT,
      expires_at         BIGINT NOT NULL,
      finalizing_at      BIGINT,
      completed_at       BIGINT,
      failed_at          BIGINT,
      expired_at         BIGINT,
      cancelling_at      BIGINT,
      cancelled_at       BIGINT
    );
    CREATE INDEX batches_org ON batches(org_id, seq);
    CREATE INDEX batches_status ON batches(status);
    CREATE TABLE batch_results (
      batch_id  TEXT NOT NULL,
      line_no   BIGINT NOT NULL,                   -- 1-based line of the input file
      ok        BOOLEAN NOT NULL,                  -- true: output file, false: error file
      line      TEXT NOT NULL,
      PRIMARY KEY (batch_id, line_no)
    );
    CREATE TABLE webhook_deliveries (
      id                 TEXT PRIMARY KEY,
      org_id             TEXT NOT NULL,
      object_id          TEXT NOT NULL,
      url                TEXT NOT NULL,
      host               TEXT NOT NULL,            -- URL host[:port]: per-host cap
      token              TEXT,                     -- NULL: no Authorization header; forgotten at the end
      body               TEXT NOT NULL,            -- the exact JSON text POSTed
      state              TEXT NOT NULL,            -- pending | delivered | failed
      attempts           INTEGER NOT NULL,
      next_attempt_at_ms BIGINT NOT NULL,
      leased_until_ms    BIGINT,                   -- Unix ms; set while an attempt runs
      last_error         TEXT,
      created_at         BIGINT NOT NULL,
      updated_at         BIGINT NOT NULL
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_attempt_at_ms);
    CREATE INDEX webhook_deliveries_leased ON webhook_deliveries(leased_until_ms) WHERE leased_until_ms IS NOT NULL;
    CREATE TABLE background_jobs (
      response_id TEXT PRIMARY KEY,
      org_id      TEXT NOT NULL,
      deadline_at BIGINT NOT NULL,
      request     TEXT NOT NULL,                   -- the GenerationRequest as JSON
      created_at  BIGINT NOT NULL
    );
    CREATE TABLE usage_ledger (
      seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- insertion order
      id              TEXT NOT NULL UNIQUE,
      org_id          TEXT NOT NULL,
      org_name        TEXT NOT NULL,
      key_id          TEXT NOT NULL,
      model           TEXT NOT NULL,
      tier            TEXT NOT NULL,
      surface         TEXT NOT NULL,
      request_id      TEXT NOT NULL,
      input_tokens    BIGINT NOT NULL,
      cached_tokens   BIGINT NOT NULL,
      output_tokens   BIGINT NOT NULL,
      input_cost      TEXT NOT NULL,               -- exact USD decimal strings (never rounded)
      cached_cost     TEXT NOT NULL,
      output_cost     TEXT NOT NULL,
      cost            TEXT NOT NULL,
      long_context    BOOLEAN NOT NULL,
      completed_at_ms BIGINT NOT NULL,
      UNIQUE (surface, request_id)                 -- exactly one row per request, whichever replica
    );
    CREATE INDEX usage_ledger_completed ON usage_ledger(completed_at_ms);
    `,
  },
  {
    // Leases on background jobs and in-progress idempotency keys (store/leases.ts).
    name: 'background and idempotency leases',
    sql: `
    ALTER TABLE background_jobs ADD COLUMN window_rank INTEGER NOT NULL DEFAULT 1;  -- asap 0, standard 1, flex 2
    ALTER TABLE background_jobs ADD COLUMN lease_owner TEXT;                        -- replica id, NULL: free
    ALTER TABLE background_jobs ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0; -- Unix ms
    CREATE INDEX background_jobs_claim ON background_jobs(window_rank, created_at);
    CREATE INDEX background_jobs_lease ON background_jobs(lease_owner);              -- renewals and hand-backs
    ALTER TABLE idempotency ADD COLUMN lease_owner TEXT;
    ALTER TABLE idempotency ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
    CREATE INDEX idempotency_lease ON idempotency(lease_owner) WHERE status_code IS NULL; -- in-progress keys only
    `,
  },
  {
    // Batches split into chunks of lines claimed under leases; the batch row's lease covers
    // validation and the end.
    name: 'batch chunks',
    sql: `
    ALTER TABLE batches ADD COLUMN window_rank INTEGER NOT NULL DEFAULT 2;
    UPDATE batches SET window_rank = CASE completion_window WHEN 'asap' THEN 0 WHEN 'standard' THEN 1 ELSE 2 END;
    ALTER TABLE batches ADD COLUMN lease_owner TEXT;
    ALTER TABLE batches ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE batches ADD COLUMN num_chunks INTEGER;  -- NULL until its lines are split into chunks
    CREATE TABLE batch_chunks (
      batch_id       TEXT NOT NULL,
      chunk_no       INTEGER NOT NULL,               -- 0-based, in file order
      first_line     BIGINT NOT NULL,                -- 1-based line number of its first line
      start_offset   BIGINT NOT NULL,                -- byte offset of its first line
      end_offset     BIGINT NOT NULL,                -- byte offset just past its last line
      last_line      BIGINT NOT NULL,                -- 1-based line number of its last line
      num_lines      INTEGER NOT NULL,
      window_rank    INTEGER NOT NULL,               -- the batch's: claim order
      created_at     BIGINT NOT NULL,                -- the batch's: claim order within a window
      done           BOOLEAN NOT NULL DEFAULT FALSE,
      lease_owner    TEXT,
      lease_until_ms BIGINT NOT NULL DEFAULT 0,
      PRIMARY KEY (batch_id, chunk_no)
    );
    CREATE INDEX batch_chunks_claim ON batch_chunks(done, window_rank, created_at);
    CREATE INDEX batch_chunks_undone ON batch_chunks(batch_id, done);
    `,
  },
  {
    // The process holding a webhook delivery's lease: it renews the lease while its attempt runs,
    // and its outcome is written only while it still holds it.
    name: 'webhook delivery lease owners',
    sql: `
    ALTER TABLE webhook_deliveries ADD COLUMN lease_owner TEXT;   -- replica id while an attempt runs
    CREATE INDEX webhook_deliveries_owner ON webhook_deliveries(lease_owner) WHERE lease_owner IS NOT NULL;
    `,
  },
];

/** The advisory lock (two-key form) held while migrating: the schema's name is the second key. */
const MIGRATION_LOCK = 0x51c3;

/**
 * Applies the migrations not yet recorded in the current schema (the connection's search_path),
 * each in its own transaction with its schema_migrations row, under a session advisory lock keyed
 * by the schema. `createSchema` (the search_path's schema, when it may not exist yet) is created
 * under the same lock, so concurrent first starts do not collide on it either.
 * Throws when the schema records a version this code does not know (a newer sluice wrote it).
 */
export async function migratePostgres(client: PoolClient, migrations: readonly PostgresMigration[] = POSTGRES_MIGRATIONS,
  createSchema?: string): Promise<void> {
  const { rows: named } = await client.query<{ s: string }>(`SELECT COALESCE($1::text, current_schema(), '') AS s`, [createSchema ?? null]);
  const lockName = named[0]!.s;
  await client.query('SELECT pg_advisory_lock($1, hashtext($2))', [MIGRATION_LOCK, lockName]);
  try {
    if (createSchema !== undefined) await client.query(`CREATE SCHEMA IF NOT EXISTS ${client.escapeIdentifier(createSchema)}`);
    await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version    INTEGER PRIMARY KEY,
      name       TEXT NOT NULL,
      applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ v: number | null }>('SELECT MAX(version) AS v FROM schema_migrations');
    const current = rows[0]?.v ?? 0;
    if (current > migrations.length) {
      throw new Error(`the database was written by a newer sluice (schema version ${current}, this one knows ${migrations.length})`);
    }
    for (let v = current; v < migrations.length; v++) {
      const m = migrations[v]!;
      await client.query('BEGIN');
      try {
        await client.query(m.sql);
        await client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [v + 1, m.name]);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK');
        throw err;
      }
    }
  } finally {
    await client.query('SELECT pg_advisory_unlock($1, hashtext($2))', [MIGRATION_LOCK, lockName]);
  }
}
