// The store's schema migrations, one list for SQLite and PostgreSQL. Append new steps; never edit
// a released one: databases written by earlier versions must keep opening, with their rows.
//
// Written in PostgreSQL's spelling; sqliteDdl() renders a step for SQLite: BIGINT and BOOLEAN are
// INTEGER there (flags 0/1, DEFAULT FALSE is DEFAULT 0), an identity key is INTEGER PRIMARY KEY
// AUTOINCREMENT, and `/*sqlite: ...*/` (a comment to PostgreSQL) is SQLite's alone. Integers
// PostgreSQL keeps as INTEGER (status codes, attempts, ranks, chunk numbers) are INTEGER in both.
// JSON is the exact TEXT written (webhook bodies are POSTed byte for byte); money exact decimal TEXT.
//
// Version numbers. SQLite counts each step (PRAGMA user_version = steps applied). The PostgreSQL
// store began at step 7's schema: its version 1 ("initial") is steps 1-7 applied at once, and each
// later step is one version (PostgreSQL version = step - 6), recorded by name in schema_migrations.
// Rows that only an SQLite database can hold (written before step 7) are repaired in /*sqlite:*/.

export interface Migration {
  name: string;
  sql: string;
}

const STEPS: readonly Migration[] = [
  { name: 'organizations, keys, responses, files, idempotency records', sql: `
  CREATE TABLE organizations (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
  );
  CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES organizations(id),
    hash       TEXT NOT NULL UNIQUE,          -- hex SHA-256 of the key
    prefix     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
  );
  CREATE TABLE responses (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES organizations(id),
    status     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    body       TEXT NOT NULL                  -- the response object as JSON
  );
  CREATE INDEX responses_status ON responses(status);
  CREATE TABLE files (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- upload order (newest first = seq DESC)
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
    status_code  INTEGER,                     -- NULL while the first request runs
    body         TEXT,
    PRIMARY KEY (org_id, scope, key)
  );` },
  { name: 'batches, one row each, and one row per finished request line until the batch is terminal', sql: `
  CREATE TABLE batches (
    seq                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- creation order (newest first = seq DESC)
    id                 TEXT NOT NULL UNIQUE,
    org_id             TEXT NOT NULL REFERENCES organizations(id),
    org_name           TEXT NOT NULL,       -- the caller's organization and key, for model access
    key_id             TEXT NOT NULL,
    endpoint           TEXT NOT NULL,
    input_file_id      TEXT NOT NULL,
    completion_window  TEXT NOT NULL,       -- as given (24h included)
    status             TEXT NOT NULL,
    errors             TEXT,                -- JSON list of {code, message, line, param}, or NULL
    output_file_id     TEXT,
    error_file_id      TEXT,
    metadata           TEXT,                -- JSON object of strings, or NULL
    total              BIGINT NOT NULL DEFAULT 0,
    completed          BIGINT NOT NULL DEFAULT 0,
    failed             BIGINT NOT NULL DEFAULT 0,
    next_line          BIGINT NOT NULL DEFAULT 1,  -- every line before it has a batch_results row (or is blank)
    next_offset        BIGINT NOT NULL DEFAULT 0,  -- byte offset of next_line in the input file
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
    line_no   BIGINT NOT NULL,              -- 1-based line of the input file
    ok        BOOLEAN NOT NULL,             -- true: output file, false: error file
    line      TEXT NOT NULL,                -- the JSONL result line, without its newline
    PRIMARY KEY (batch_id, line_no)
  ) /*sqlite: WITHOUT ROWID*/;` },
  { name: 'completion webhook deliveries, kept with their state after the last attempt', sql: `
  CREATE TABLE webhook_deliveries (
    id                 TEXT PRIMARY KEY,
    org_id             TEXT NOT NULL,
    object_id          TEXT NOT NULL,         -- id of the response / chat completion sent
    url                TEXT NOT NULL,
    token              TEXT,                  -- NULL: no Authorization header
    body               TEXT NOT NULL,         -- the exact JSON text POSTed
    state              TEXT NOT NULL,         -- pending | delivered | failed
    attempts           INTEGER NOT NULL,
    next_attempt_at_ms BIGINT NOT NULL,       -- Unix ms; the claim lease while an attempt runs
    last_error         TEXT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL
  );
  CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_attempt_at_ms);` },
  { name: 'background responses still to run (or running): what a restart resumes', sql: `
  CREATE TABLE background_jobs (
    response_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL,
    deadline_at BIGINT NOT NULL,             -- Unix seconds; in_progress past it fails with timeout
    request     TEXT NOT NULL,               -- the GenerationRequest as JSON
    created_at  BIGINT NOT NULL
  );` },
  { name: 'the usage ledger (append-only, one row per billed request) and admin keys', sql: `
  CREATE TABLE usage_ledger (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- insertion order
    id             TEXT NOT NULL UNIQUE,
    org_id         TEXT NOT NULL,
    org_name       TEXT NOT NULL,
    key_id         TEXT NOT NULL,
    model          TEXT NOT NULL,
    tier           TEXT NOT NULL,
    surface        TEXT NOT NULL,         -- responses | chat.completions | messages | batch
    request_id     TEXT NOT NULL,         -- object id, or <batch id>:<line number>
    input_tokens   BIGINT NOT NULL,       -- cached included
    cached_tokens  BIGINT NOT NULL,
    output_tokens  BIGINT NOT NULL,
    input_cost     TEXT NOT NULL,         -- exact USD decimal strings (never rounded)
    cached_cost    TEXT NOT NULL,
    output_cost    TEXT NOT NULL,
    cost           TEXT NOT NULL,
    long_context   BOOLEAN NOT NULL,      -- long-context multipliers applied
    completed_at_ms BIGINT NOT NULL,      -- Unix ms
    UNIQUE (surface, request_id)          -- exactly one row per request, whichever replica writes it
  );
  CREATE INDEX usage_ledger_completed ON usage_ledger(completed_at_ms);
  ALTER TABLE api_keys ADD COLUMN admin BOOLEAN NOT NULL DEFAULT FALSE;  -- may read every organization's usage` },
  // Fair webhook claims (the receiver host of each delivery, and leases that count as in flight),
  // and webhook tokens scrubbed from everything but pending deliveries. Older rows get their host
  // from the URL text (scheme://HOST/...), which is all the fairness caps need.
  { name: 'webhook receiver hosts and claim leases; tokens scrubbed', sql: `
  ALTER TABLE webhook_deliveries ADD COLUMN host TEXT NOT NULL /*sqlite: DEFAULT ''*/;  -- URL host[:port]: per-host cap
  ALTER TABLE webhook_deliveries ADD COLUMN leased_until_ms BIGINT;                    -- Unix ms; set while an attempt runs
  CREATE INDEX webhook_deliveries_leased ON webhook_deliveries(leased_until_ms) WHERE leased_until_ms IS NOT NULL;
  /*sqlite:
  UPDATE webhook_deliveries SET host = (
    SELECT lower(substr(rest, 1, instr(rest || '/', '/') - 1)) FROM (SELECT substr(url, instr(url, '://') + 3) AS rest)
  );
  UPDATE webhook_deliveries SET token = NULL WHERE state <> 'pending';
  UPDATE webhook_deliveries SET body = json_remove(body, '$.metadata.webhook_token')
    WHERE CASE WHEN json_valid(body) THEN json_type(body, '$.metadata.webhook_token') END IS NOT NULL;
  UPDATE responses SET body = json_remove(body, '$.metadata.webhook_token')
    WHERE CASE WHEN json_valid(body) THEN json_type(body, '$.metadata.webhook_token') END IS NOT NULL;
  UPDATE batch_results SET line = json_remove(line, '$.response.body.metadata.webhook_token')
    WHERE CASE WHEN json_valid(line) THEN json_type(line, '$.response.body.metadata.webhook_token') END IS NOT NULL;
  */` },
  { name: 'the input items of each response (GET /v1/responses/{id}/input_items, previous_response_id)', sql: `
  CREATE TABLE response_inputs (
    response_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES organizations(id),
    items       TEXT NOT NULL                 -- the request's input items as JSON, in order
  );` },
  // Leases on background jobs and in-progress idempotency keys (leases.ts): the replica running
  // each, until when, and the completion window a claim orders by (asap 0 < standard 1 < flex 2).
  { name: 'background and idempotency leases', sql: `
  ALTER TABLE background_jobs ADD COLUMN window_rank INTEGER NOT NULL DEFAULT 1;
  ALTER TABLE background_jobs ADD COLUMN lease_owner TEXT;                        -- replica id, NULL: free
  ALTER TABLE background_jobs ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0; -- Unix ms
  CREATE INDEX background_jobs_claim ON background_jobs(window_rank, created_at);
  CREATE INDEX background_jobs_lease ON background_jobs(lease_owner);             -- renewals and hand-backs
  ALTER TABLE idempotency ADD COLUMN lease_owner TEXT;
  ALTER TABLE idempotency ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
  CREATE INDEX idempotency_lease ON idempotency(lease_owner) WHERE status_code IS NULL; -- in-progress keys only` },
  // Batches split into chunks of lines, each claimed under a lease, so that replicas share a
  // batch's lines; the batch row's own lease covers validation and the end (files, final status).
  { name: 'batch chunks', sql: `
  ALTER TABLE batches ADD COLUMN window_rank INTEGER NOT NULL DEFAULT 2;
  UPDATE batches SET window_rank = CASE completion_window WHEN 'asap' THEN 0 WHEN 'standard' THEN 1 ELSE 2 END;
  ALTER TABLE batches ADD COLUMN lease_owner TEXT;
  ALTER TABLE batches ADD COLUMN lease_until_ms BIGINT NOT NULL DEFAULT 0;
  ALTER TABLE batches ADD COLUMN num_chunks INTEGER;  -- NULL until its lines are split into chunks
  CREATE TABLE batch_chunks (
    batch_id       TEXT NOT NULL,
    chunk_no       INTEGER NOT NULL,          -- 0-based, in file order
    first_line     BIGINT NOT NULL,           -- 1-based line number of its first line
    start_offset   BIGINT NOT NULL,           -- byte offset of its first line
    end_offset     BIGINT NOT NULL,           -- byte offset just past its last line
    last_line      BIGINT NOT NULL,           -- 1-based line number of its last line
    num_lines      INTEGER NOT NULL,
    window_rank    INTEGER NOT NULL,          -- the batch's: claim order
    created_at     BIGINT NOT NULL,           -- the batch's: claim order within a window
    done           BOOLEAN NOT NULL DEFAULT FALSE,
    lease_owner    TEXT,
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, chunk_no)
  );
  CREATE INDEX batch_chunks_claim ON batch_chunks(done, window_rank, created_at);
  CREATE INDEX batch_chunks_undone ON batch_chunks(batch_id, done);` },
  // The process holding a webhook delivery's lease, so that it renews the lease while its attempt
  // runs and its outcome is written only while it still holds it.
  { name: 'webhook delivery lease owners', sql: `
  ALTER TABLE webhook_deliveries ADD COLUMN lease_owner TEXT;   -- replica id while an attempt runs
  CREATE INDEX webhook_deliveries_owner ON webhook_deliveries(lease_owner) WHERE lease_owner IS NOT NULL;` },
];

/** A step in SQLite's types (see the top of this file). */
export function sqliteDdl(sql: string): string {
  return sql
    .replace(/\/\*sqlite:([\s\S]*?)\*\//g, (_, own: string) => own.trim())
    .replace(/BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY/g, 'INTEGER PRIMARY KEY AUTOINCREMENT')
    .replace(/\b(BIGINT|BOOLEAN)\b/g, 'INTEGER')
    .replace(/DEFAULT FALSE/g, 'DEFAULT 0');
}

/** SQLite's migrations: step n is user_version n. */
export const SQLITE_MIGRATIONS: readonly string[] = STEPS.map((step) => sqliteDdl(step.sql));

/** Steps that PostgreSQL's version 1 applies at once (its schema when the PostgreSQL store began). */
const POSTGRES_INITIAL_STEPS = 7;

/** PostgreSQL's migrations: entry n is schema_migrations version n + 1. */
export const POSTGRES_MIGRATIONS: readonly Migration[] = [
  { name: 'initial', sql: STEPS.slice(0, POSTGRES_INITIAL_STEPS).map((step) => step.sql).join('\n') },
  ...STEPS.slice(POSTGRES_INITIAL_STEPS),
];
