// Schema migrations of the SQLite store, applied in order. PRAGMA user_version records how many
// have run; each runs in its own transaction. Append new migrations; never edit a released one.

export const SQLITE_MIGRATIONS: readonly string[] = [
  // 1: organizations, keys, responses, files, idempotency records.
  `
  CREATE TABLE organizations (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL
  );
  CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES organizations(id),
    hash       TEXT NOT NULL UNIQUE,          -- hex SHA-256 of the key
    prefix     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
  );
  CREATE TABLE responses (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES organizations(id),
    status     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    body       TEXT NOT NULL                  -- the response object as JSON
  );
  CREATE INDEX responses_status ON responses(status);
  CREATE TABLE files (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,  -- upload order (newest first = seq DESC)
    id             TEXT NOT NULL UNIQUE,
    org_id         TEXT NOT NULL REFERENCES organizations(id),
    bytes          INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
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
    created_at   INTEGER NOT NULL,
    status_code  INTEGER,                     -- NULL while the first request runs
    body         TEXT,
    PRIMARY KEY (org_id, scope, key)
  );
  `,
];
