// One batched decode run of an ONNX decoder export: each row feeds one token after its own past.
// Pasts of different lengths are left-padded to the longest (attention_mask 0 on the padding,
// position_ids each row's own), and each row's present is cut back out without the padding.

import type * as Ort from 'onnxruntime-node';
import type { NativeModelInfo } from '../native-types.js';

/** Per layer l: [2l] key, [2l + 1] value, each [1, kvHeads, tokens, headDim] row-major. */
export type PastKv = Float32Array[];

export interface DecodeRow {
  token: number;
  /** Tokens already in `past` (= this token's position). */
  position: number;
  past: PastKv;
}

export async function decodeBatch(ort: typeof Ort, session: Ort.InferenceSession,
  info: Pick<NativeModelInfo, 'numLayers' | 'numKvHeads' | 'headDim' | 'vocabSize'>, takesPositionIds: boolean,
  rows: DecodeRow[]): Promise<Array<{ logits: Float32Array; present: PastKv }>> {
  const { numLayers, numKvHeads: nKv, headDim: d, vocabSize } = info;
  const R = rows.length;
  const maxPast = Math.max(...rows.map((r) => r.position));
  const total = maxPast + 1;
  const attention = new BigInt64Array(R * total);
  rows.forEach((row, r) => attention.fill(1n, r * total + (maxPast - row.position), (r + 1) * total));
  const feeds: Record<string, Ort.Tensor> = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(rows, (row) => BigInt(row.token)), [R, 1]),
    attention_mask: new ort.Tensor('int64', attention, [R, total]),
  };
  if (takesPositionIds) feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from(rows, (row) => BigInt(row.position)), [R, 1]);
  const padded = R === 1 ? undefined : new Array<Float32Array>(2 * numLayers);
  for (let t = 0; t < 2 * numLayers; t++) {
    let data: Float32Array;
    if (padded === undefined) data = rows[0]!.past[t]!;
    else {
      // [R, nKv, maxPast, d]: row r, head h starts its keys at maxPast - position.
      data = new Float32Array(R * nKv * maxPast * d);
      rows.forEach((row, r) => {
        const p = row.position;
        for (let h = 0; h < nKv; h++) {
          data.set(row.past[t]!.subarray(h * p * d, (h + 1) * p * d), ((r * nKv + h) * maxPast + (maxPast - p)) * d);
        }
      });
    }
    feeds[`past_key_values.${t >> 1}.${t & 1 ? 'value' : 'key'}`] = new ort.Tensor('float32', data, [R, nKv, maxPast, d]);
  }
  const out = await session.run(feeds);
  const logits = out.logits!.data as Float32Array;  // [R, 1, vocab]
  return rows.map((row, r) => {
    const present: PastKv = [];
    for (let t = 0; t < 2 * numLayers; t++) {
      const all = out[`present.${t >> 1}.${t & 1 ? 'value' : 'key'}`]!.data as Float32Array;  // [R, nKv, total, d]
      if (R === 1) {
        present.push(all);
        continue;
      }
      const len = row.position + 1;
      const mine = new Float32Array(nKv * len * d);
      for (let h = 0; h < nKv; h++) {
        const from = ((r * nKv + h) * total + (maxPast - row.position)) * d;
        mine.set(all.subarray(from, from + len * d), h * len * d);
      }
      present.push(mine);
    }
    return { logits: logits.slice(r * vocabSize, (r + 1) * vocabSize), present };
  });
}
