// `sluice usage`: the usage ledger's totals per organization × model × tier, from the data
// directory's store; the same report GET /v1/admin/usage returns (--json prints it as is).

import { parseSince, usageReport, type UsageTotals } from '../billing/usage-report.js';
import { SqliteStore } from '../store/sqlite-store.js';
import { storePath } from '../service.js';
import { parseFlags } from './args.js';

export const USAGE_HELP = `usage: sluice usage [options]

  Totals of the usage ledger per organization, model and tier: requests, tokens by kind (input
  includes cached) and cost in USD, summed exactly (never rounded).

  --org NAME        one organization only
  --since DATE      requests completed at or after DATE: YYYY-MM-DD (UTC midnight) or an ISO 8601 date-time
  --data-dir DIR    the service's data directory (default ./data)
  --json            the report as JSON (costs as exact decimal strings)
`;

export async function runUsage(args: string[]): Promise<void> {
  const { values } = parseFlags(args, {
    org: { type: 'string' },
    since: { type: 'string' },
    'data-dir': { type: 'string' },
    json: { type: 'boolean' },
    help: { type: 'boolean', short: 'h' },
  }, 'usage');
  if (values.help) {
    process.stdout.write(USAGE_HELP);
    return;
  }
  const sinceMs = values.since === undefined ? undefined : parseSince(values.since);
  const store = new SqliteStore(storePath(values['data-dir'] ?? 'data'));
  try {
    const report = await usageReport(store, {
      ...(values.org !== undefined && { orgName: values.org }), ...(sinceMs !== undefined && { sinceMs }),
    });
    if (values.json) {
      process.stdout.write(`${JSON.stringify(report)}\n`);
      return;
    }
    const cells = (t: UsageTotals) => [t.requests, t.input_tokens, t.cached_tokens, t.output_tokens, t.cost].join('\t');
    process.stdout.write('organization\tmodel\ttier\trequests\tinput_tokens\tcached_tokens\toutput_tokens\tcost_usd\n');
    for (const row of report.data) process.stdout.write(`${row.organization}\t${row.model}\t${row.tier}\t${cells(row)}\n`);
    process.stdout.write(`total\t\t\t${cells(report.total)}\n`);
  } finally {
    await store.close();
  }
}
