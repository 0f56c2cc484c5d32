// What an image processor's rescale and normalise make of each 8-bit value, as transformers
// computes it: value / 255 in double, to float32, then (x - mean) / std in float32.

/** [3 * 256] float32: the value of byte v in channel c at c * 256 + v. */
export function normalizeTables(mean: readonly [number, number, number], std: readonly [number, number, number]): Float32Array {
  const tables = new Float32Array(3 * 256);
  for (let ch = 0; ch < 3; ch++) {
    const m = Math.fround(mean[ch]!), s = Math.fround(std[ch]!);
    for (let v = 0; v < 256; v++) tables[ch * 256 + v] = Math.fround(Math.fround(Math.fround(v * (1 / 255)) - m) / s);
  }
  return tables;
}
