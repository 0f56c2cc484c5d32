// Reading a bench result whose shape is only promised: each accessor names the path it wanted,
// so a result that does not fit its family is reported ("serve.json: mixed[0].windows is not an
// array"), never charted from undefined.
import { basename } from 'node:path';

import type { ChartHeader } from './chart-kit.js';

/** A result that does not have the shape its family's charts read. */
export class ShapeError extends Error {}

export type Json = Record<string, unknown>;

export function obj(v: unknown, path: string): Json {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new ShapeError(`${path} is not an object`);
  return v as Json;
}

export function arr(v: unknown, path: string): unknown[] {
  if (!Array.isArray(v)) throw new ShapeError(`${path} is not an array`);
  return v;
}

export function num(v: unknown, path: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new ShapeError(`${path} is not a number`);
  return v;
}

/** A number that a result may leave out or set to null (e.g. TTFT of background requests). */
export function optNum(v: unknown, path: string): number | null {
  return v === null || v === undefined ? null : num(v, path);
}

export function str(v: unknown, path: string): string {
  if (typeof v !== 'string') throw new ShapeError(`${path} is not a string`);
  return v;
}

export function optStr(v: unknown): string | null {
  return typeof v === 'string' && v.length > 0 ? v : null;
}

/** "AMD EPYC, 2 cores" from a result's `machine` (bench/machine.ts), or null without one. */
export function machineLabel(machine: unknown): string | null {
  if (machine === null || typeof machine !== 'object') return null;
  const m = machine as Json;
  const cpu = optStr(m.cpu);
  if (cpu === null) return null;
  return typeof m.cores === 'number' ? `${cpu}, ${m.cores} cores` : cpu;
}

/**
 * The subtitle every chart of a result carries: where it ran (machine, then device), what it
 * ran, and the file and date it came from.
 */
export function header(bench: string, result: Json, file: string, device: string | null, settings: string[]): ChartHeader {
  const where = [machineLabel(result.machine), device].filter((s): s is string => s !== null);
  const date = optStr(result.date)?.slice(0, 10);
  return {
    bench,
    subtitle: [
      where.length > 0 ? where.join(' · ') : 'machine and device not recorded in the result',
      ...settings.filter((s) => s.length > 0),
      `${basename(file)}${date ? ` · ${date}` : ''}`,
    ],
  };
}

/** "1 engine thread", "2 engine threads", "? engine threads" when the result leaves it out. */
export function count(n: unknown, noun: string): string {
  return typeof n === 'number' ? `${n} ${noun}${n === 1 ? '' : 's'}` : `? ${noun}s`;
}
