// Sealed reasoning (src/serving/reasoning-seal.ts): round trips, every kind of tampering, another
// organization's blob, key rotation and retirement, the key file's mode, and two starts agreeing.
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

import { SluiceError } from '../src/errors.js';
import { MAX_SEALED_LENGTH, ReasoningSeal } from '../src/serving/reasoning-seal.js';

let dir: string;
beforeEach(() => { dir = mkdtempSync(join(os.tmpdir(), 'sluice-seal-')); });
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const refused = (fn: () => unknown, message: RegExp) => {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(SluiceError);
  expect((err as SluiceError).code).toBe('invalid_request');
  expect((err as SluiceError).param).toBe('input[1].encrypted_content');
  expect((err as SluiceError).message).toMatch(message);
};

describe('reasoning seal', () => {
  it('round trips for its organization and refuses any change or another organization', () => {
    const seal = ReasoningSeal.open(dir);
    const blob = seal.seal('org_a', 'first, think — ünïcode');
    expect(seal.unseal('org_a', blob, 'input[1].encrypted_content')).toBe('first, think — ünïcode');
    expect(seal.seal('org_a', 'same')).not.toBe(seal.seal('org_a', 'same'));  // a fresh nonce each time
    refused(() => seal.unseal('org_b', blob, 'input[1].encrypted_content'), /another organization/);
    const raw = Buffer.from(blob, 'base64url');
    // Every byte: the version, the key id's length and bytes, nonce, tag, ciphertext.
    for (let i = 0; i < raw.length; i++) {
      const bad = Buffer.from(raw);
      bad[i] ^= 0x01;
      refused(() => seal.unseal('org_a', bad.toString('base64url'), 'input[1].encrypted_content'), /cannot be opened/);
    }
    refused(() => seal.unseal('org_a', raw.subarray(0, 20).toString('base64url'), 'input[1].encrypted_content'), /truncated|key/);
    refused(() => seal.unseal('org_a', 'not a blob!', 'input[1].encrypted_content'), /not a sealed/);
    refused(() => seal.unseal('org_a', 'A'.repeat(MAX_SEALED_LENGTH + 1), 'input[1].encrypted_content'), /not a sealed/);
    refused(() => ReasoningSeal.open(mkdtempSync(join(os.tmpdir(), 'sluice-seal-other-'))).unseal('org_a', blob, 'input[1].encrypted_content'), /key this server does not have/);
  });

  it('rotates keys (old blobs still open) and retires them (their blobs no longer do)', () => {
    const before = ReasoningSeal.open(dir);
    const old = before.seal('org', 'old');
    const id = ReasoningSeal.rotate(dir);
    const after = ReasoningSeal.open(dir);
    expect(after.unseal('org', old, 'input[1].encrypted_content')).toBe('old');
    const fresh = after.seal('org', 'new');
    const keyIdOf = (b: string) => { const r = Buffer.from(b, 'base64url'); return r.subarray(2, 2 + r[1]!).toString('ascii'); };
    expect(keyIdOf(fresh)).toBe(id);
    expect(keyIdOf(old)).not.toBe(id);
    expect(() => ReasoningSeal.retire(dir, id)).toThrow(/current reasoning key/);
    ReasoningSeal.retire(dir, keyIdOf(old));
    const retired = ReasoningSeal.open(dir);
    refused(() => retired.unseal('org', old, 'input[1].encrypted_content'), /does not have/);
    expect(retired.unseal('org', fresh, 'input[1].encrypted_content')).toBe('new');
  });

  it('keeps its keys in a 0600 file that two starts share', () => {
    const a = ReasoningSeal.open(dir);
    const b = ReasoningSeal.open(dir);
    expect(b.unseal('org', a.seal('org', 'x'), 'input[1].encrypted_content')).toBe('x');
    expect(statSync(join(dir, 'reasoning-keys.json')).mode & 0o777).toBe(0o600);
  });
});
