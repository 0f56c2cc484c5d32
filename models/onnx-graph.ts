// A small ONNX graph builder: nodes with generated output names, constants, and initializers whose
// bytes stream into one external-data file beside model.onnx (the layout optimum writes for models
// over protobuf's 2 GiB limit; used here for every size so that small and large exports look alike).

import { closeSync, openSync, writeSync } from 'node:fs';
import { basename } from 'node:path';
import {
  AttributeType, DataType, encodeModel,
  type AttributeMessage, type DataTypeCode, type NodeMessage, type TensorMessage, type ValueInfoMessage,
} from './onnx-proto.js';

export type AttrValue = number | number[] | string | { float: number } | { floats: number[] };
/** A symbolic or fixed dimension of a graph input or output. */
export type Dim = number | string;

/** Tensors below this many bytes stay inside model.onnx. */
const INLINE_BYTES = 1024;
/** External tensors start at multiples of this (lets onnxruntime map them when it wants to). */
const ALIGN = 64;

export class GraphBuilder {
  private readonly nodes: NodeMessage[] = [];
  private readonly initializers: TensorMessage[] = [];
  private readonly inputs: ValueInfoMessage[] = [];
  private readonly outputs: ValueInfoMessage[] = [];
  private readonly names = new Map<string, number>();
  private readonly constants = new Map<string, string>();
  private fd: number | undefined;
  private offset = 0;

  /** `dataPath`: the external-data file (created, truncated). */
  constructor(private readonly dataPath: string) {
    this.fd = openSync(dataPath, 'w');
  }

  private fresh(base: string): string {
    const n = this.names.get(base) ?? 0;
    this.names.set(base, n + 1);
    return n === 0 ? base : `${base}_${n}`;
  }

  input(name: string, elemType: DataTypeCode, dims: Dim[]): string {
    this.inputs.push(valueInfo(name, elemType, dims));
    return name;
  }

  output(name: string, elemType: DataTypeCode, dims: Dim[]): void {
    this.outputs.push(valueInfo(name, elemType, dims));
  }

  /** Adds a node; returns its output names (`numOutputs` of them, or the given names). */
  node(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {},
    out: number | string[] = 1, domain = ''): string[] {
    const base = opType.toLowerCase();
    const outputs = typeof out === 'number' ? Array.from({ length: out }, () => this.fresh(base)) : out;
    this.nodes.push({
      name: this.fresh(`node_${base}`), opType, domain, input: inputs, output: outputs,
      attribute: Object.entries(attrs).map(([name, v]) => attribute(name, v)),
    });
    return outputs;
  }

  /** One-output node. */
  op(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}, domain = ''): string {
    return this.node(opType, inputs, attrs, 1, domain)[0]!;
  }

  /** A named initializer; its bytes go to the external file unless tiny. */
  initializer(name: string, dataType: DataTypeCode, dims: number[], bytes: Uint8Array): string {
    const t: TensorMessage = { name, dims, dataType };
    if (bytes.byteLength < INLINE_BYTES) {
      t.rawData = bytes;
    } else {
      const pad = (ALIGN - (this.offset % ALIGN)) % ALIGN;
      if (pad > 0) this.write(new Uint8Array(pad));
      t.dataLocation = 1;
      t.externalData = [
        { key: 'location', value: basename(this.dataPath) },
        { key: 'offset', value: String(this.offset) },
        { key: 'length', value: String(bytes.byteLength) },
      ];
      this.write(bytes);
    }
    this.initializers.push(t);
    return name;
  }

  floatTensor(name: string, dims: number[], data: Float32Array): string {
    return this.initializer(name, DataType.FLOAT, dims, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
  }

  /** A shared int64 constant (e.g. a shape or axes list); scalar when `scalar`. */
  int64s(values: number[], scalar = false): string {
    const key = `i64${scalar ? 's' : ''}:${values.join(',')}`;
    let name = this.constants.get(key);
    if (name === undefined) {
      name = this.fresh('const_i64');
      const bytes = new Uint8Array(new BigInt64Array(values.map(BigInt)).buffer);
      this.initializer(name, DataType.INT64, scalar ? [] : [values.length], bytes);
      this.constants.set(key, name);
    }
    return name;
  }

  /** A shared float constant (scalar). */
  float(value: number): string {
    const key = `f32:${value}`;
    let name = this.constants.get(key);
    if (name === undefined) {
      name = this.fresh('const_f32');
      this.initializer(name, DataType.FLOAT, [], new Uint8Array(new Float32Array([value]).buffer));
      this.constants.set(key, name);
    }
    return name;
  }

  private write(bytes: Uint8Array): void {
    if (this.fd === undefined) throw new Error('GraphBuilder: already finished');
    let done = 0;
    while (done < bytes.byteLength) done += writeSync(this.fd, bytes, done, bytes.byteLength - done, this.offset + done);
    this.offset += bytes.byteLength;
  }

  /** Closes the external file and returns the serialized model. */
  finish(meta: { name: string; opsets: Record<string, number>; metadata: Record<string, string> }): Uint8Array {
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
    return encodeModel({
      irVersion: 8,
      producerName: 'sluice',
      producerVersion: '1',
      opsetImport: Object.entries(meta.opsets).map(([domain, version]) => ({ domain, version })),
      metadataProps: Object.entries(meta.metadata).map(([key, value]) => ({ key, value })),
      graph: { name: meta.name, node: this.nodes, initializer: this.initializers, input: this.inputs, output: this.outputs },
    });
  }

  /** Closes the external file without encoding (on failure). */
  abandon(): void {
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }
}

function valueInfo(name: string, elemType: DataTypeCode, dims: Dim[]): ValueInfoMessage {
  return {
    name,
    type: { tensorType: { elemType, shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
  };
}

function attribute(name: string, v: AttrValue): AttributeMessage {
  if (typeof v === 'number') return { name, type: AttributeType.INT, i: v };
  if (typeof v === 'string') return { name, type: AttributeType.STRING, s: new TextEncoder().encode(v) };
  if (Array.isArray(v)) return { name, type: AttributeType.INTS, ints: v };
  if ('float' in v) return { name, type: AttributeType.FLOAT, f: v.float };
  return { name, type: AttributeType.FLOATS, floats: v.floats };
}
