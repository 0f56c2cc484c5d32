// The dialect layer: what the store's repositories (keys-repo.ts, responses-repo.ts, ...) need
// from a SQL database, so that every statement is written once for SQLite and PostgreSQL.
// sqlite-store.ts implements it over better-sqlite3, postgres-store.ts over pg.
//
// Statements are written in the PostgreSQL spelling with named parameters (`:owner`), and each
// driver compiles them once (cached by text):
//   :name                  -> $n (PostgreSQL: a name used twice is one parameter) or ? (SQLite)
//   x = ANY(:list)         -> SQLite: x IN (SELECT value FROM json_each(?)), the array bound as JSON
//   GREATEST( / LEAST(     -> SQLite: MAX( / MIN( (their scalar forms; the columns are NOT NULL)
//   FOR UPDATE [OF t] [SKIP LOCKED] -> SQLite: dropped (its transactions are BEGIN IMMEDIATE:
//                             writers are serial, no other holds a row lock to wait for or skip)
//   COLLATE "C"            -> SQLite: COLLATE BINARY (both compare bytes)
// Both accept the rest as written: INSERT ... ON CONFLICT (upserts and "insert or ignore"),
// UPDATE ... RETURNING, TRUE / FALSE, CAST(:x AS TEXT) (PostgreSQL needs a type for a parameter
// only compared with NULL). Values: booleans bind as 1/0 on SQLite; BIGINT comes back from
// PostgreSQL as exact JS numbers (postgres-store.ts), BOOLEAN columns as 0/1 from SQLite (flag()).

export type Dialect = 'sqlite' | 'postgres';
/** A row as either driver returns it: column name -> value. */
export type Row = Record<string, unknown>;
/** Named parameters: `:name` in the text -> value. */
export type Params = Record<string, unknown>;

/** Where statements run: the store's database, or one open transaction on it. */
export interface Sql {
  all(text: string, params?: Params): Promise<Row[]>;
  one(text: string, params?: Params): Promise<Row | undefined>;
  /** Runs a statement that returns no rows; how many rows it changed. */
  run(text: string, params?: Params): Promise<number>;
  /**
   * Runs `fn` in one transaction: committed when it returns, rolled back when it throws. On a
   * transaction it joins that one (repositories compose into a unit of work, sql-store.ts).
   */
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T>;
  /**
   * Inside a transaction: waits until no other transaction holds `key`, then holds it until this
   * one ends (PostgreSQL: an advisory lock of this schema). SQLite: nothing, writers are serial.
   */
  advisoryLock(key: number): Promise<void>;
}

/** A store's database: statements, and what differs per engine beyond them. */
export interface SqlDriver extends Sql {
  /** Store.shared: other processes use this database too. */
  readonly shared: boolean;
  /** Hands the space of deleted rows of `table` back (Store.reclaimSpace). */
  reclaimSpace(table: string): Promise<void>;
  close(): Promise<void>;
}

/** A statement compiled for one dialect: its text and the parameter name of each position. */
export interface Compiled {
  text: string;
  names: string[];
}

const SQLITE_REWRITES: [RegExp, string][] = [
  [/=\s*ANY\((:\w+)\)/g, 'IN (SELECT value FROM json_each($1))'],
  [/\bGREATEST\(/g, 'MAX('],
  [/\bLEAST\(/g, 'MIN('],
  [/\s+FOR UPDATE(?: OF \w+)?(?: SKIP LOCKED)?/g, ''],
  [/COLLATE "C"/g, 'COLLATE BINARY'],
];

/** A quoted string (left alone) or a named parameter (not the second colon of a `::` cast). */
const TOKEN = /'(?:[^']|'')*'|(?<![:\w]):([A-Za-z_]\w*)/g;

export function compile(text: string, dialect: Dialect): Compiled {
  let sql = text;
  if (dialect === 'sqlite') for (const [pattern, replacement] of SQLITE_REWRITES) sql = sql.replace(pattern, replacement);
  const names: string[] = [];
  sql = sql.replace(TOKEN, (token, name: string | undefined) => {
    if (name === undefined) return token;
    if (dialect === 'sqlite') {
      // better-sqlite3 binds numbered parameters (?2) by name, not position: one ? per occurrence.
      names.push(name);
      return '?';
    }
    const seen = names.indexOf(name);
    return `$${seen >= 0 ? seen + 1 : names.push(name)}`;
  });
  return { text: sql, names };
}

/** The positional values of `compiled` from `params`, each converted by `bind`; a missing name is a bug. */
export function values(compiled: Compiled, params: Params, bind: (value: unknown) => unknown): unknown[] {
  return compiled.names.map((name) => {
    if (!(name in params)) throw new Error(`SQL parameter :${name} has no value`);
    return bind(params[name]);
  });
}

/** A per-driver cache of compiled statements (statement texts are constants, or a few shapes each). */
export function compiler(dialect: Dialect): (text: string) => Compiled {
  const cache = new Map<string, Compiled>();
  return (text) => {
    let compiled = cache.get(text);
    if (!compiled) cache.set(text, (compiled = compile(text, dialect)));
    return compiled;
  };
}

/** A BOOLEAN column as either driver returns it (PostgreSQL: true/false, SQLite: 1/0). */
export const flag = (value: unknown): boolean => value === true || value === 1;
