// AWQ and GPTQ checkpoints for the float64 reference: each module's packed codes, zeros and f16
// scales ("<m>.qweight", "<m>.qzeros", "<m>.scales", GPTQ's "<m>.g_idx") replaced by "<m>.weight"
// [out, in] = scale * (q - zero), from the config's quantization_config. Written from the formats'
// descriptions (independent of native/ and models/). G: group_size (-1: all inputs one group).
// - AWQ (AutoAWQ, version "gemm", zero_point): qweight I32 [in, out / 8] and qzeros I32
//   [in / G, out / 8], nibble i (bits 4i..4i+3) of word [r, c] holding column c * 8 + ORDER[i],
//   ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; scales F16 [in / G, out]; input k is in group k / G.
// - GPTQ: qweight I32 [in * bits / 32, out], bits [i * bits, (i + 1) * bits) of word [r, j] holding
//   input r * 32 / bits + i of output j; qzeros I32 [groups, out * bits / 32], value i of word [g, c]
//   the zero of output c * 32 / bits + i; checkpoint_format "gptq" (v1, the default) stores zero - 1
//   and the zero is the stored value + 1, unmasked (a stored 2^bits - 1 is a zero of 2^bits: the
//   format's quirk), "gptq_v2" stores the zero; scales F16 [ceil(in / G), out]; g_idx I32 [in]
//   each input's group (act-order: any assignment), k / G where the checkpoint has none.

import type { RefTensor } from './safetensors-reader.js';

interface IntQuantizationConfig {
  quant_method?: string;
  bits?: number;
  w_bit?: number;
  group_size?: number;
  q_group_size?: number;
  zero_point?: boolean;
  version?: string;
  checkpoint_format?: string;
}

/** Field `i` of `bits` bits of an int32 word (held as its signed value). */
const field = (word: number, i: number, bits: number) => (word >>> (i * bits)) & ((1 << bits) - 1);

const AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7];

/**
 * Replaces every quantized module of `tensors` (in place) by its dequantized weight, labelled F32:
 * an f16 scale times an integer below 2^9 is exact in f32 (and computed exactly in double).
 */
export function dequantizeAwqGptq(tensors: Map<string, RefTensor>, raw: Record<string, any>): void {
  const modules = [...tensors.keys()].filter((n) => n.endsWith('.qweight')).map((n) => n.slice(0, -'.qweight'.length));
  if (modules.length === 0) return;
  const q = (raw['quantization_config'] ?? raw['text_config']?.['quantization_config']) as IntQuantizationConfig | undefined;
  const method = q?.quant_method;
  if (method !== 'awq' && method !== 'gptq') throw new Error(`reference: ${modules[0]}.qweight but quant_method is ${String(method)}`);
  const bits = q!.bits ?? q!.w_bit ?? 4;
  const groupSize = q!.group_size ?? q!.q_group_size ?? 128;
  if (method === 'awq') {
    if (bits !== 4) throw new Error(`reference: AWQ with ${bits} bits`);
    if ((q!.version ?? 'gemm').toLowerCase() !== 'gemm') throw new Error(`reference: AWQ version ${String(q!.version)} (only "gemm")`);
    if (q!.zero_point === false) throw new Error('reference: AWQ without zero_point');
  } else {
    if (![2, 4, 8].includes(bits)) throw new Error(`reference: GPTQ with ${bits} bits`);
    const format = q!.checkpoint_format ?? 'gptq';
    if (format !== 'gptq' && format !== 'gptq_v2') throw new Error(`reference: GPTQ checkpoint_format ${format}`);
  }
  const v1 = method === 'gptq' && (q!.checkpoint_format ?? 'gptq') === 'gptq';
  const per = 32 / bits;

  for (const m of modules) {
    const get = (suffix: string, dtype: string): RefTensor => {
      const t = tensors.get(`${m}.${suffix}`);
      if (!t) throw new Error(`reference: ${m}.qweight has no ${m}.${suffix}`);
      if (t.dtype !== dtype) throw new Error(`reference: ${m}.${suffix} is ${t.dtype}, expected ${dtype}`);
      return t;
    };
    const qweight = get('qweight', 'I32'), qzeros = get('qzeros', 'I32'), scales = get('scales', 'F16');
    if (qweight.shape.length !== 2) throw new Error(`reference: ${m}.qweight has shape [${qweight.shape}]`);
    const [qRows, qCols] = qweight.shape as [number, number];
    const inp = method === 'awq' ? qRows : qRows * per;
    const out = method === 'awq' ? qCols * per : qCols;
    const g = groupSize === -1 ? inp : groupSize;
    const groups = Math.ceil(inp / g);
    const expectShape = (t: RefTensor, suffix: string, shape: number[]) => {
      if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
        throw new Error(`reference: ${m}.${suffix} has shape [${t.shape}], expected [${shape}]`);
      }
    };
    expectShape(scales, 'scales', [groups, out]);
    expectShape(qzeros, 'qzeros', [groups, out / per]);

    // group[k]: the group of input k; code(k, j), zero(g, j) from the packed words.
    const group = new Int32Array(inp);
    const gIdx = method === 'gptq' ? tensors.get(`${m}.g_idx`) : undefined;
    if (gIdx) {
      if (gIdx.dtype !== 'I32') throw new Error(`reference: ${m}.g_idx is ${gIdx.dtype}, expected I32`);
      expectShape(gIdx, 'g_idx', [inp]);
      for (let k = 0; k < inp; k++) {
        const gk = gIdx.data[k]!;
        if (!(gk >= 0 && gk < groups)) throw new Error(`reference: ${m}.g_idx[${k}] is ${gk}, not a group of ${groups}`);
        group[k] = gk;
      }
    } else {
      if (method === 'awq' && inp % g !== 0) throw new Error(`reference: ${m}: ${inp} inputs are not a multiple of group_size ${g}`);
      for (let k = 0; k < inp; k++) group[k] = Math.floor(k / g);
    }
    const code = method === 'awq'
      ? (k: number, j: number) => field(qweight.data[k * qCols + Math.floor(j / 8)]!, AWQ_ORDER.indexOf(j % 8), 4)
      : (k: number, j: number) => field(qweight.data[Math.floor(k / per) * qCols + j]!, k % per, bits);
    const zero = method === 'awq'
      ? (gr: number, j: number) => field(qzeros.data[gr * (out / 8) + Math.floor(j / 8)]!, AWQ_ORDER.indexOf(j % 8), 4)
      : (gr: number, j: number) => field(qzeros.data[gr * (out / per) + Math.floor(j / per)]!, j % per, bits) + (v1 ? 1 : 0);

    const w = new Float64Array(out * inp);
    for (let j = 0; j < out; j++) {
      for (let k = 0; k < inp; k++) {
        const gr = group[k]!;
        w[j * inp + k] = scales.data[gr * out + j]! * (code(k, j) - zero(gr, j));
      }
    }
    for (const suffix of ['qweight', 'qzeros', 'scales', 'g_idx']) tensors.delete(`${m}.${suffix}`);
    tensors.set(`${m}.weight`, { dtype: 'F32', shape: [out, inp], data: w });
  }
}
