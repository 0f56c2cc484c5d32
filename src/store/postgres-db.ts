// What the PostgreSQL store's modules share: the connection type they run statements on (the pool,
// or the client of an open transaction) and how integers come back.
//
// BIGINT (int8) columns, and COUNT(*)/MAX() over them, arrive from the server as text. They are
// parsed into JS numbers exactly: a value outside Number.MAX_SAFE_INTEGER (2^53 - 1) throws instead
// of being rounded. Nothing the store keeps comes near that (Unix milliseconds are about 2^41; token
// counts and byte sizes are far below it; money is stored as exact decimal text, never as a number).

import pg from 'pg';

import type { Row } from './store-rows.js';

export type { Row };

/** Something statements run on: the pool (each statement on its own) or a transaction's client. */
export interface Db {
  query(text: string, values?: unknown[]): Promise<{ rows: Row[]; rowCount: number | null }>;
}

const INT8_OID = 20;

/** Parses an int8 exactly, or throws: never a silently rounded number. */
export function parseBigint(text: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n)) throw new RangeError(`integer ${text} from PostgreSQL is beyond JavaScript's exact integers`);
  return n;
}

/** Type parsers for the store's pool only (pg's global parsers are left as they are). */
export const STORE_TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === INT8_OID && format !== 'binary' ? parseBigint : pg.types.getTypeParser(oid, format as 'text')) as pg.CustomTypesConfig['getTypeParser'],
};
