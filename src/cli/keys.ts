// `sluice keys create|list|revoke`: API keys in the data directory's store.

import { SluiceError } from '../errors.js';
import { createApiKey, revokeApiKey } from '../store/api-keys.js';
import { databaseUrlFlag, openCliStore } from './database-flag.js';
import { noStoreMessage, storeExists, warnNoStore } from './store-check.js';
import { commandFlags } from './args.js';
import { ReasoningSeal } from '../serving/reasoning-seal.js';

export const KEYS_HELP = `usage: sluice keys <create|list|revoke|rotate-reasoning-key|retire-reasoning-key> [options]

  sluice keys create --org NAME     make a key for an organization (created if new); prints it once
                    [--admin]       the key may also read every organization's usage (GET /v1/admin/usage)
  sluice keys list                  every key: id, organization, admin, prefix, created, revoked
  sluice keys revoke ID|KEY         revoke a key by its id (key_...) or the key itself
  sluice keys rotate-reasoning-key  add a new key for sealed reasoning (encrypted_content); older
                                    keys still open their blobs. Takes effect at the next start
  sluice keys retire-reasoning-key ID
                                    remove an older reasoning key: its blobs can no longer be replayed

  --data-dir DIR    the service's data directory (default ./data; the reasoning keys are there)
  --database-url URL  the deployment's PostgreSQL database instead of the data directory's SQLite
                    file (or SLUICE_DATABASE_URL, keeping the password off the command line)
  --json            machine-readable output
`;

const LIST_HEADER = 'id\torganization\tadmin\tprefix\tcreated\trevoked';

/** The flags keys accepts, whatever the action (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const KEYS_OPTIONS = {
  org: { type: 'string' },
  admin: { type: 'boolean' },
  'data-dir': { type: 'string' },
  'database-url': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runKeys(args: string[]): Promise<void> {
  const [action, ...rest] = args;
  if (action === undefined || action === '--help' || action === '-h') {
    process.stdout.write(KEYS_HELP);
    return;
  }
  const positional = rest[0] !== undefined && !rest[0].startsWith('-') ? rest.shift() : undefined;
  const values = commandFlags(rest, KEYS_OPTIONS, `keys ${action}`, KEYS_HELP);
  if (values === undefined) return;
  const dataDir = values['data-dir'] ?? 'data';
  if (action === 'rotate-reasoning-key') {
    process.stdout.write(`${ReasoningSeal.rotate(dataDir)}\n`);
    process.stderr.write('a new reasoning key is current from the next start; older keys still open their blobs\n');
    return;
  }
  if (action === 'retire-reasoning-key') {
    if (positional === undefined) throw new SluiceError('invalid_argument', 'keys retire-reasoning-key: give the key id');
    ReasoningSeal.retire(dataDir, positional);
    process.stdout.write('retired\n');
    return;
  }
  const databaseUrl = databaseUrlFlag(values['database-url']);
  if (databaseUrl === undefined && !storeExists(dataDir)) {
    // A mistyped --data-dir must not quietly become a new, empty store.
    if (action === 'list') {
      warnNoStore(dataDir);
      process.stdout.write(values.json ? '[]\n' : `${LIST_HEADER}\n`);
      return;
    }
    if (action === 'revoke') throw new SluiceError('invalid_argument', `keys revoke: ${noStoreMessage(dataDir)}`, { param: 'data-dir' });
    if (action === 'create') process.stderr.write(`sluice: ${noStoreMessage(dataDir)}; making a new one for this key\n`);
  }
  const store = await openCliStore(databaseUrl, dataDir);
  try {
    switch (action) {
      case 'create': {
        const org = values.org;
        if (org === undefined || org.trim() === '') {
          throw new SluiceError('invalid_argument', 'keys create: --org NAME is required', { param: 'org' });
        }
        const created = await createApiKey(store, org.trim(), { admin: values.admin === true });
        if (values.json) {
          process.stdout.write(`${JSON.stringify({ key: created.key, id: created.info.id, organization: created.info.orgName })}\n`);
        } else {
          process.stdout.write(`${created.key}\n`);
          process.stderr.write(`key ${created.info.id} for organization "${created.info.orgName}"; it is shown only now\n`);
        }
        return;
      }
      case 'list': {
        const keys = await Promise.all((await store.listApiKeys()).map(async (k) => ({ ...k, admin: await store.isAdminKey(k.id) })));
        if (values.json) {
          process.stdout.write(`${JSON.stringify(keys.map((k) => ({
            id: k.id, organization: k.orgName, admin: k.admin, prefix: k.prefix, created_at: k.createdAt, revoked_at: k.revokedAt,
          })))}\n`);
          return;
        }
        const iso = (s: number | null) => (s === null ? '-' : new Date(s * 1000).toISOString());
        process.stdout.write(`${LIST_HEADER}\n`);
        for (const k of keys) {
          process.stdout.write(`${k.id}\t${k.orgName}\t${k.admin ? 'admin' : '-'}\t${k.prefix}…\t${iso(k.createdAt)}\t${iso(k.revokedAt)}\n`);
        }
        return;
      }
      case 'revoke': {
        if (positional === undefined) throw new SluiceError('invalid_argument', 'keys revoke: give the key id (key_...) or the key');
        if (!(await revokeApiKey(store, positional))) {
          throw new SluiceError('invalid_argument', `keys revoke: no active key matches "${positional.slice(0, 20)}"`);
        }
        process.stdout.write(`revoked\n`);
        return;
      }
      default:
        throw new SluiceError('invalid_argument', `keys: unknown action "${action}"\n\n${KEYS_HELP}`);
    }
  } finally {
    await store.close();
  }
}
