// Exact money. A Decimal is `units / 10^scale` with a BigInt coefficient: rates, multipliers and
// costs are all Decimals, so adding and multiplying them is exact and NOTHING IS EVER ROUNDED.
// Rates and multipliers arrive as JSON numbers; each is converted once, from its shortest decimal
// string (String(n): "0.15", "1e-7", "1.5e+21"), which is the decimal the catalog author wrote.
// A cost crosses the API, the ledger and the CLI as that exact decimal string (formatDecimal); a
// JavaScript number of it is only ever a convenience copy, never summed.

export interface Decimal {
  /** value = units / 10^scale; scale >= 0. */
  readonly units: bigint;
  readonly scale: number;
}

export const ZERO: Decimal = { units: 0n, scale: 0 };

const DECIMAL_RE = /^([+-]?)(\d+)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$|^([+-]?)\.(\d+)(?:[eE]([+-]?\d+))?$/;

/** Parses a plain or exponent-form decimal string ("0.15", "1.5e-7", "-2", ".5"). */
export function parseDecimal(text: string): Decimal {
  const m = DECIMAL_RE.exec(text.trim());
  if (!m) throw new Error(`not a decimal number: ${JSON.stringify(text)}`);
  const sign = m[1] ?? m[5] ?? '';
  const whole = m[2] ?? '0';
  const fraction = m[3] ?? m[6] ?? '';
  const exponent = Number(m[4] ?? m[7] ?? '0');
  let units = BigInt(whole + fraction);
  let scale = fraction.length - exponent;
  if (scale < 0) {
    units *= 10n ** BigInt(-scale);
    scale = 0;
  }
  return normalize({ units: sign === '-' ? -units : units, scale });
}

/** The exact decimal a JSON number stands for (its shortest round-trip string). */
export function decimalFromNumber(n: number): Decimal {
  if (!Number.isFinite(n)) throw new Error(`not a finite number: ${n}`);
  return parseDecimal(String(n));
}

/** Same value, fewest digits (no trailing fractional zeros). */
export function normalize(d: Decimal): Decimal {
  let { units, scale } = d;
  if (units === 0n) return ZERO;
  while (scale > 0 && units % 10n === 0n) {
    units /= 10n;
    scale -= 1;
  }
  return { units, scale };
}

function rescale(d: Decimal, scale: number): bigint {
  return d.units * 10n ** BigInt(scale - d.scale);
}

export function add(a: Decimal, b: Decimal): Decimal {
  const scale = Math.max(a.scale, b.scale);
  return normalize({ units: rescale(a, scale) + rescale(b, scale), scale });
}

export function sum(values: Iterable<Decimal>): Decimal {
  let total = ZERO;
  for (const v of values) total = add(total, v);
  return total;
}

export function mul(a: Decimal, b: Decimal): Decimal {
  return normalize({ units: a.units * b.units, scale: a.scale + b.scale });
}

/** a × an integer count (tokens). */
export function mulInt(a: Decimal, count: number | bigint): Decimal {
  if (typeof count === 'number' && !Number.isSafeInteger(count)) throw new Error(`not an integer count: ${count}`);
  return normalize({ units: a.units * BigInt(count), scale: a.scale });
}

/** a / 10^k, exact (per-1M rates become per-token rates with k = 6). */
export function divPow10(a: Decimal, k: number): Decimal {
  return normalize({ units: a.units, scale: a.scale + k });
}

export function compare(a: Decimal, b: Decimal): number {
  const scale = Math.max(a.scale, b.scale);
  const x = rescale(a, scale);
  const y = rescale(b, scale);
  return x < y ? -1 : x > y ? 1 : 0;
}

export function isZero(d: Decimal): boolean {
  return d.units === 0n;
}

/**
 * The exact value as a plain decimal string (never exponent form), with at least
 * `minFractionDigits` fractional digits (padding with zeros only: never rounds).
 */
export function formatDecimal(d: Decimal, minFractionDigits = 0): string {
  const n = normalize(d);
  const negative = n.units < 0n;
  let digits = (negative ? -n.units : n.units).toString();
  const scale = Math.max(n.scale, minFractionDigits);
  digits = (digits + '0'.repeat(scale - n.scale)).padStart(scale + 1, '0');
  const whole = digits.slice(0, digits.length - scale);
  const fraction = digits.slice(digits.length - scale);
  return `${negative ? '-' : ''}${whole}${scale > 0 ? `.${fraction}` : ''}`;
}

/** A JavaScript number near the value, for display and convenience fields only. */
export function toNumber(d: Decimal): number {
  return Number(formatDecimal(d));
}
