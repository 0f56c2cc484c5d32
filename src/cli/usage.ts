// `sluice usage`: the usage ledger's totals per organization × model × tier, from the data
// directory's store; the same report GET /v1/admin/usage returns (--json prints it as is).

import { parseSince, summarizeUsage, usageReport, type UsageReport, type UsageTotals } from '../billing/usage-report.js';
import { databaseUrlFlag, openCliStore } from './database-flag.js';
import { commandFlags } from './args.js';
import { SluiceError } from '../errors.js';
import { storeExists, warnNoStore } from './store-check.js';

export const USAGE_HELP = `usage: sluice usage [options]

  Totals of the usage ledger per organization, model and tier: requests, tokens by kind (input
  includes cached) and cost in USD, summed exactly (never rounded).

  --org NAME        one organization only
  --since DATE      requests completed at or after DATE: YYYY-MM-DD (UTC midnight) or an ISO 8601 date-time
  --data-dir DIR    the service's data directory (default ./data)
  --database-url URL  the deployment's PostgreSQL database instead of the data directory's SQLite
                    file (or SLUICE_DATABASE_URL, keeping the password off the command line)
  --json            the report as JSON (costs as exact decimal strings)
`;

/**
 * --since as Unix milliseconds. parseSince's message names the query parameter of GET
 * /v1/admin/usage (`since`); on the command line it names the flag.
 */
function sinceFlag(raw: string): number {
  try {
    return parseSince(raw);
  } catch (err) {
    const why = (err as Error).message.replace(/^since /, '');
    throw new SluiceError('invalid_argument', `usage: --since ${why} (see sluice usage --help)`, { param: 'since' });
  }
}

/** The flags usage accepts (README's CLI synopsis and --help list each; test/readme.test.ts checks). */
export const USAGE_OPTIONS = {
  org: { type: 'string' },
  since: { type: 'string' },
  'data-dir': { type: 'string' },
  'database-url': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export async function runUsage(args: string[]): Promise<void> {
  const values = commandFlags(args, USAGE_OPTIONS, 'usage', USAGE_HELP);
  if (values === undefined) return;
  const sinceMs = values.since === undefined ? undefined : sinceFlag(values.since);
  const dataDir = values['data-dir'] ?? 'data';
  const filter = { ...(values.org !== undefined && { orgName: values.org }), ...(sinceMs !== undefined && { sinceMs }) };
  const databaseUrl = databaseUrlFlag(values['database-url']);
  if (databaseUrl === undefined && !storeExists(dataDir)) {
    // A mistyped --data-dir must not quietly become a new, empty store: warn, and report nothing.
    warnNoStore(dataDir);
    printReport(summarizeUsage([], filter), values.json === true);
    return;
  }
  const store = await openCliStore(databaseUrl, dataDir);
  try {
    printReport(await usageReport(store, filter), values.json === true);
  } finally {
    await store.close();
  }
}

function printReport(report: UsageReport, json: boolean): void {
  if (json) {
    process.stdout.write(`${JSON.stringify(report)}\n`);
    return;
  }
  const cells = (t: UsageTotals) => [t.requests, t.input_tokens, t.cached_tokens, t.output_tokens, t.cost].join('\t');
  process.stdout.write('organization\tmodel\ttier\trequests\tinput_tokens\tcached_tokens\toutput_tokens\tcost_usd\n');
  for (const row of report.data) process.stdout.write(`${row.organization}\t${row.model}\t${row.tier}\t${cells(row)}\n`);
  process.stdout.write(`total\t\t\t${cells(report.total)}\n`);
}
