// The scheduler's book of sequences: who waits (in the policy's order), who runs (holds, or is
// being given, a native sequence), and which native sequences the next plan must free. The
// planner and the batcher move sequences between these states only through this class, so a
// sequence is always in exactly one place and every native sequence it leaves behind is freed.

import type { SchedulingPolicy } from './policy.js';
import type { Sequence, SequenceOutcome } from './sequence.js';

export class Roster {
  /** Running sequences in admission order (oldest first). */
  running: Sequence[] = [];
  /** Native seqId -> running sequence. */
  readonly bySeqId = new Map<number, Sequence>();
  /** Native sequences the next plan frees (ended or preempted since the last plan). */
  pendingFrees: number[] = [];
  /** Estimated KV blocks those frees give back. */
  pendingFreedBlocks = 0;
  private nextSeqId = 1;
  private numAdmissions = 0;

  constructor(readonly policy: SchedulingPolicy, readonly blockSize: number) {}

  waiting(): readonly Sequence[] {
    return this.policy.waiting() as readonly Sequence[];
  }

  /** Everyone not done, running first. */
  all(): Sequence[] {
    return [...this.running, ...this.waiting()];
  }

  blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }

  /** KV blocks the sequence will hold once its in-flight rows have run (an estimate from reported counts). */
  predictedBlocks(seq: Sequence): number {
    return Math.max(seq.reportedBlocks, this.blocksFor(seq.predicted().computed));
  }

  /** Waiting -> running: the planner puts its add in the step being planned (not yet confirmed). */
  startAdmission(seq: Sequence): void {
    this.policy.remove(seq, true);
    while (this.bySeqId.has(this.nextSeqId) || this.nextSeqId === 0) this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    seq.seqId = this.nextSeqId;
    this.nextSeqId = (this.nextSeqId + 1) >>> 0;
    seq.state = 'running';
    seq.admittedOrder = this.numAdmissions++;
    seq.reportedComputed = 0;
    seq.reportedPending = seq.numPromptTokens + seq.numGeneratedTokens;
    seq.reportedBlocks = 0;
    seq.inFlight.length = 0;
    this.running.push(seq);
    this.bySeqId.set(seq.seqId, seq);
  }

  /** The add prompt: the request's prompt and what was generated before a preemption. */
  promptOf(seq: Sequence): Int32Array {
    const out = new Int32Array(seq.numPromptTokens + seq.numGeneratedTokens);
    out.set(seq.request.promptTokenIds);
    out.set(seq.generatedTokenIds, seq.numPromptTokens);
    return out;
  }

  /**
   * Running -> waiting, its output kept: preempted (its KV is freed and recomputed later), or its
   * add did not fit. Results still in flight for its old native id are dropped: recomputing
   * samples the same tokens (the draw depends only on the seed and the position).
   */
  requeue(seq: Sequence): void {
    this.detach(seq);
    seq.state = 'waiting';
    this.policy.enqueue(seq, true);
  }

  /** Ends a sequence (idempotent): frees its native sequence and tells its sink, once. */
  end(seq: Sequence, outcome: SequenceOutcome): void {
    if (seq.state === 'done') return;
    if (seq.state === 'running') this.detach(seq);
    else this.policy.remove(seq);
    seq.state = 'done';
    seq.removeAbortListener();
    try {
      seq.request.sink.onEnd(outcome);
    } catch {
      // NOTE: onEnd must not throw; if it does there is no one left to tell.
    }
  }

  /** Running -> not running: its native sequence goes to the next plan's frees. */
  private detach(seq: Sequence): void {
    if (seq.state !== 'running') return;
    this.pendingFrees.push(seq.seqId);
    this.pendingFreedBlocks += this.predictedBlocks(seq);
    this.bySeqId.delete(seq.seqId);
    this.running = this.running.filter((s) => s !== seq);
    seq.inFlight.length = 0;
  }
}
