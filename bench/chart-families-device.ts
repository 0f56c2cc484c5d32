// Charts for the device check's own results: torch.matmul on a model's projections
// (bench/peer_torch_matmul.py), our GEMMs beside it (bench/gemm-vs-torch.ts), and the device
// check's phases (scripts/device-check.sh, recorded as bench/results/device-check-<device>.json).
import { barChart, datum, type Chart } from './chart-kit.js';
import { arr, header, num, obj, optNum, optStr, str, type Json } from './chart-shape.js';

/** bench/results/torch-matmul-*.json: TFLOP/s of torch.matmul by projection and tokens. */
export function torchMatmulCharts(r: Json, file: string): Chart[] {
  const data = arr(r.rows, 'rows').map((row, i) => {
    const o = obj(row, `rows[${i}]`);
    return datum(num(o.T, `rows[${i}].T`), str(o.op, `rows[${i}].op`), num(o.tflops, `rows[${i}].tflops`));
  });
  const h = header('torch-matmul', r, file, optStr(r.device), [`${optStr(r.shape) ?? '?'} projections, torch ${optStr(r.torch) ?? '?'}`]);
  return [barChart({
    name: 'tflops', what: 'torch.matmul TFLOP/s by projection and tokens', header: h, data, log: true,
    categoryTitle: 'tokens (T)', valueTitle: 'TFLOP/s', seriesTitle: 'projection',
  })];
}

/** bench/results/gemm-vs-torch-*.json: our kernel and cuBLASLt over torch.matmul, by projection at each T. */
export function gemmVsTorchCharts(r: Json, file: string): Chart[] {
  const data = arr(r.rows, 'rows').flatMap((row, i) => {
    const o = obj(row, `rows[${i}]`);
    const x = `${str(o.op, `rows[${i}].op`).replace(/^gemm /, '')} T=${num(o.T, `rows[${i}].T`)}`;
    const ours = optNum(o.oursOverTorch, `rows[${i}].oursOverTorch`);
    const lt = optNum(o.cublasLtOverTorch, `rows[${i}].cublasLtOverTorch`);
    return [...(ours === null ? [] : [datum(x, 'our mma.sync kernel', ours)]), ...(lt === null ? [] : [datum(x, 'cuBLASLt', lt)])];
  });
  const h = header('gemm-vs-torch', r, file, optStr(r.device), [
    `${optStr(r.shape) ?? '?'} projections over torch.matmul (1.0 = torch)`,
    `cuBLASLt >= 0.9x at every T >= 256: ${r.cublasLtQualifiesForAuto === true ? 'yes' : 'no'}`,
  ]);
  return [barChart({
    name: 'ratio', what: 'GEMM TFLOP/s over torch.matmul', header: h, data, horizontal: true,
    categoryTitle: 'projection and tokens', valueTitle: 'TFLOP/s / torch.matmul TFLOP/s', seriesTitle: 'GEMM',
  })];
}

/** bench/results/device-check-*.json: seconds each phase of one device check took, by outcome. */
export function deviceCheckCharts(r: Json, file: string): Chart[] {
  const data = arr(r.phases, 'phases').flatMap((p, i) => {
    const o = obj(p, `phases[${i}]`);
    const seconds = optNum(o.seconds, `phases[${i}].seconds`);
    return seconds === null ? [] : [datum(str(o.phase, `phases[${i}].phase`), str(o.status, `phases[${i}].status`), seconds)];
  });
  const h = header('device-check', r, file, optStr(r.device), [optStr(r.command) ?? '']);
  return [barChart({
    name: 'phases', what: 'seconds per phase, by outcome', header: h, data, horizontal: true,
    categoryTitle: 'phase', valueTitle: 'seconds', seriesTitle: 'outcome',
  })];
}
