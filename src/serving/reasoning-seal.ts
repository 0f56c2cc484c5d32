// Sealed reasoning: with store=false a Responses reasoning item carries its text as
// encrypted_content, which only this deployment can open, and only for the organization it was
// made for. AES-256-GCM under a key kept in <data-dir>/reasoning-keys.json (0600); the blob names
// its key, so keys can rotate (new blobs use the newest key, old keys still open old blobs until
// they are retired). The organization id is authenticated data: another organization's blob, or a
// changed byte anywhere, fails authentication (a 400).
//
// Blob: base64url( version 1 | key id length | key id | nonce (12) | tag (16) | ciphertext ).

import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SluiceError } from '../errors.js';

const FILE = 'reasoning-keys.json';
const VERSION = 1;
/** The largest blob accepted, in characters (about 750 KB of reasoning). */
export const MAX_SEALED_LENGTH = 1_000_000;

interface StoredKey {
  id: string;
  key: string;
  created_at: string;
}

const newKey = (): StoredKey => ({ id: randomBytes(4).toString('hex'), key: randomBytes(32).toString('base64'), created_at: new Date().toISOString() });

function readKeys(path: string): StoredKey[] {
  const parsed = JSON.parse(readFileSync(path, 'utf8')) as { keys?: unknown };
  const keys = parsed.keys;
  if (!Array.isArray(keys) || keys.length === 0 || !keys.every((k: StoredKey) =>
    typeof k?.id === 'string' && /^[0-9a-f]{8}$/.test(k.id) && typeof k.key === 'string' && Buffer.from(k.key, 'base64').length === 32)) {
    throw new SluiceError('invalid_argument', `${path} must hold {"keys": [{id (8 hex digits), key (32 bytes, base64), created_at}]}; ` +
      'delete it to make a new one (blobs sealed with its keys can then no longer be opened)');
  }
  return keys as StoredKey[];
}

function writeKeys(path: string, keys: StoredKey[]): void {
  const temp = `${path}.${process.pid}.tmp`;
  writeFileSync(temp, `${JSON.stringify({ keys }, null, 2)}\n`, { mode: 0o600 });
  renameSync(temp, path);
}

export class ReasoningSeal {
  private constructor(private readonly keys: Map<string, Buffer>, private readonly current: string) {}

  /** Loads the data dir's keys, making the first one on first use (two starts agree on it). */
  static open(dataDir: string): ReasoningSeal {
    const path = join(dataDir, FILE);
    try {
      writeFileSync(path, `${JSON.stringify({ keys: [newKey()] }, null, 2)}\n`, { flag: 'wx', mode: 0o600 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const keys = readKeys(path);
    return new ReasoningSeal(new Map(keys.map((k) => [k.id, Buffer.from(k.key, 'base64')])), keys[keys.length - 1]!.id);
  }

  /** Adds a new current key (old ones still open their blobs). Returns its id. Restart to use it. */
  static rotate(dataDir: string): string {
    const path = join(dataDir, FILE);
    ReasoningSeal.open(dataDir);
    const key = newKey();
    writeKeys(path, [...readKeys(path), key]);
    return key.id;
  }

  /** Removes a key that is not the current one: blobs sealed with it can no longer be opened. */
  static retire(dataDir: string, id: string): void {
    const path = join(dataDir, FILE);
    const keys = readKeys(path);
    const at = keys.findIndex((k) => k.id === id);
    if (at < 0) throw new SluiceError('invalid_argument', `no reasoning key with id ${id} in ${path}`);
    if (at === keys.length - 1) throw new SluiceError('invalid_argument', `${id} is the current reasoning key: rotate first, then retire it`);
    writeKeys(path, keys.filter((k) => k.id !== id));
  }

  seal(orgId: string, text: string): string {
    const nonce = randomBytes(12);
    const id = Buffer.from(this.current, 'ascii');
    const cipher = createCipheriv('aes-256-gcm', this.keys.get(this.current)!, nonce);
    cipher.setAAD(aad(orgId, this.current));
    const body = Buffer.concat([cipher.update(JSON.stringify({ text }), 'utf8'), cipher.final()]);
    return Buffer.concat([Buffer.of(VERSION, id.length), id, nonce, cipher.getAuthTag(), body]).toString('base64url');
  }

  /** The reasoning text of a blob sealed for `orgId`; invalid_request naming `param` otherwise. */
  unseal(orgId: string, blob: string, param: string): string {
    const refuse = (why: string) => new SluiceError('invalid_request', `${param} cannot be opened: ${why}`, { param });
    if (typeof blob !== 'string' || blob.length > MAX_SEALED_LENGTH || !/^[A-Za-z0-9_-]+$/.test(blob)) throw refuse('it is not a sealed reasoning blob');
    const raw = Buffer.from(blob, 'base64url');
    if (raw.length < 2 || raw[0] !== VERSION) throw refuse('it is not a sealed reasoning blob of a version this server reads');
    const idLength = raw[1]!;
    const id = raw.subarray(2, 2 + idLength).toString('ascii');
    const rest = raw.subarray(2 + idLength);
    const key = this.keys.get(id);
    if (key === undefined) throw refuse('it was sealed with a key this server does not have (retired, or another deployment\'s)');
    if (rest.length < 28) throw refuse('it is truncated');
    try {
      const decipher = createDecipheriv('aes-256-gcm', key, rest.subarray(0, 12));
      decipher.setAAD(aad(orgId, id));
      decipher.setAuthTag(rest.subarray(12, 28));
      const text = Buffer.concat([decipher.update(rest.subarray(28)), decipher.final()]).toString('utf8');
      const parsed = JSON.parse(text) as { text?: unknown };
      if (typeof parsed.text !== 'string') throw new Error('no text');
      return parsed.text;
    } catch {
      throw refuse('it was changed, or sealed for another organization');
    }
  }
}

const aad = (orgId: string, keyId: string) => Buffer.from(`sluice-reasoning\0${VERSION}\0${keyId}\0${orgId}`, 'utf8');
