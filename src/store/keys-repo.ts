// Organizations and their API keys (only the keys' SHA-256 hashes; api-keys.ts), and the admin flag
// of a key (it may read every organization's usage).

import { randomUUID } from 'node:crypto';
import { flag, type Row, type Sql } from './sql-driver.js';
import type { KeyRepository, Organization } from './store.js';
import { keyInfo } from './store-rows.js';

const KEY_SELECT = 'SELECT k.*, o.name AS org_name FROM api_keys k JOIN organizations o ON o.id = k.org_id';

const organization = (row: Row): Organization =>
  ({ id: row['id'] as string, name: row['name'] as string, createdAt: row['created_at'] as number });

export function keyRepository(db: Sql): KeyRepository {
  const orgByName = (name: string) => db.one('SELECT * FROM organizations WHERE name = :name', { name });
  return {
    async ensureOrganization(name) {
      // The unique name settles a race of two first uses: one insert wins, both read its row.
      await db.run('INSERT INTO organizations (id, name, created_at) VALUES (:id, :name, :at) ON CONFLICT (name) DO NOTHING',
        { id: `org_${randomUUID().replace(/-/g, '')}`, name, at: Math.floor(Date.now() / 1000) });
      return organization((await orgByName(name))!);
    },

    async getOrganizationByName(name) {
      const row = await orgByName(name);
      return row && organization(row);
    },

    async insertApiKey(key) {
      await db.run('INSERT INTO api_keys (id, org_id, hash, prefix, created_at) VALUES (:id, :orgId, :hash, :prefix, :createdAt)', key);
    },

    async findActiveKeyByHash(hash) {
      const row = await db.one(`${KEY_SELECT} WHERE k.hash = :hash AND k.revoked_at IS NULL`, { hash });
      return row && keyInfo(row);
    },

    async listApiKeys() {
      return (await db.all(`${KEY_SELECT} ORDER BY k.created_at, k.id COLLATE "C"`)).map(keyInfo);
    },

    async revokeApiKey(idOrHash, at) {
      return (await db.run('UPDATE api_keys SET revoked_at = :at WHERE (id = :idOrHash OR hash = :idOrHash) AND revoked_at IS NULL',
        { at, idOrHash })) > 0;
    },

    async countActiveApiKeys() {
      return (await db.one('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL'))!['n'] as number;
    },

    async setApiKeyAdmin(keyId, admin) {
      return (await db.run('UPDATE api_keys SET admin = :admin WHERE id = :keyId', { admin, keyId })) === 1;
    },

    async isAdminKey(keyId) {
      return flag((await db.one('SELECT admin FROM api_keys WHERE id = :keyId AND revoked_at IS NULL', { keyId }))?.['admin']);
    },
  };
}
