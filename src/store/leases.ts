// Leases: how replicas sharing one database split the work that outlives a request (background
// responses, batch chunks, in-progress idempotency keys) so that each piece runs in one place at a
// time and a dead replica's pieces go to the others.
//
// A lease is a pair of columns on the leased row: `lease_owner` (the replica id) and
// `lease_until_ms` (Unix ms). A replica claims rows whose lease is free or expired (on PostgreSQL
// with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent claims never take the same row), renews
// the leases it holds every ttl/3 with one UPDATE per table, and every write that ends a piece of
// work checks that its lease is still this replica's (a fence: a replica that stalled past its
// lease cannot finish work another replica has taken over). A draining or closing replica hands
// its leases back (owner NULL, expiry 0), so the others take them at once instead of after ttl.
//
// With SQLite the process owns the store alone (store.shared is false): leases still fence, and
// the leases of the process before are released at start.

import { randomBytes } from 'node:crypto';
import type { CompletionWindow } from '../config/catalog.js';

/** This replica's identity and lease length. */
export interface LeaseConfig {
  /** `rpl_` + random hex, new for every process. */
  owner: string;
  /** How long a claim or a renewal holds, in ms. */
  ttlMs: number;
}

/** 15 s: a dead replica's work moves within 15-20 s; renewals (every 5 s) cost one UPDATE per table. */
export const DEFAULT_LEASE_TTL_MS = 15_000;
/** Shortest lease accepted (tests use ~1-2 s). */
export const MIN_LEASE_TTL_MS = 200;
/** Longest lease accepted: 10 minutes. */
export const MAX_LEASE_TTL_MS = 600_000;

export function newReplicaId(): string {
  return `rpl_${randomBytes(8).toString('hex')}`;
}

export function leaseConfig(ttlMs: number = DEFAULT_LEASE_TTL_MS, owner: string = newReplicaId()): LeaseConfig {
  if (!Number.isInteger(ttlMs) || ttlMs < MIN_LEASE_TTL_MS || ttlMs > MAX_LEASE_TTL_MS) {
    throw new RangeError(`a lease must last an integer number of ms in [${MIN_LEASE_TTL_MS}, ${MAX_LEASE_TTL_MS}], got ${ttlMs}`);
  }
  return { owner, ttlMs };
}

/** Claim order of completion windows: asap before standard before flex (lower first). */
export const WINDOW_RANK: Record<CompletionWindow, number> = { asap: 0, standard: 1, flex: 2 };

/** Completion windows by rank (the inverse of WINDOW_RANK). */
export const WINDOW_OF_RANK: readonly CompletionWindow[] = ['asap', 'standard', 'flex'];

/** A lease taken or renewed at `nowMs` by `owner`, until `untilMs` (Unix ms): what the store's lease methods take. */
export interface LeaseTerm {
  owner: string;
  nowMs: number;
  untilMs: number;
}

/** The term of a lease taken now under `lease`. */
export function leaseTerm(lease: LeaseConfig, nowMs: number = Date.now()): LeaseTerm {
  return { owner: lease.owner, nowMs, untilMs: nowMs + lease.ttlMs };
}
